//! Forward / backward timing of the causal and non-causal production paths (developer tool):
//! `RAYON_NUM_THREADS=1 cargo run --release --example causal_stages`.
use racelab::cpu::{detected_isa, forward_into, soft_backward_into, soft_forward_into, soft_grads_into, Heads, PlanesF32, SoftMap};
use racelab::hashing::Planes;
use std::time::Instant;

fn main() {
    let n: usize = std::env::var("N").ok().and_then(|s| s.parse().ok()).unwrap_or(1 << 17);
    let (d, dv) = (128usize, 128usize);
    let isa = detected_isa();
    let fill = |seed: u64, len: usize| -> Vec<f32> {
        (0..len).map(|i| racelab::bench::machine::counter_uniform(seed, i as u64)).collect()
    };
    // Two heads: with one thread that is one segment per head, as in the paper-shape bench.
    let hd = 2;
    let (q, k, v, g) = (fill(1, hd * n * d), fill(2, hd * n * d), fill(3, hd * n * dv), fill(4, hd * n * dv));
    let (qh, kh, vh, gh) = (Heads::new(hd, n, d, &q), Heads::new(hd, n, d, &k), Heads::new(hd, n, dv, &v), Heads::new(hd, n, dv, &g));
    let pls: Vec<(usize, usize)> = match std::env::var("PL").as_deref() { Ok("2") => vec![(2, 2)], Ok("4") => vec![(4, 4)], _ => vec![(2, 2), (3, 3), (4, 4)] };
    for (p, l) in pls {
        let planes = PlanesF32::from_planes(&Planes::gaussian(l, p, d, 0).unwrap());
        let map = SoftMap { planes: &planes, beta: 8.0 };
        for causal in [std::env::var_os("CAUSAL_ONLY").is_some(), true] {
            let (mut tf, mut tb) = (f64::MAX, f64::MAX);
            let mut o = vec![1.0f32; hd * n * dv];
            let (mut dq, mut dk, mut dvv) = (vec![1.0f32; hd * n * d], vec![1.0f32; hd * n * d], vec![1.0f32; hd * n * dv]);
            let mut den = Vec::new();
            for _ in 0..4 {
                let s = Instant::now();
                let engine = std::env::var_os("ENGINE").is_some();
                let (_, ctx) = if engine {
                    forward_into(&map, qh, kh, vh, causal, isa, &mut o, std::mem::take(&mut den))
                } else {
                    soft_forward_into(&map, qh, kh, vh, causal, isa, &mut o, std::mem::take(&mut den))
                };
                tf = tf.min(s.elapsed().as_secs_f64());
                let s = Instant::now();
                let db = if engine {
                    soft_backward_into(&map, &ctx, qh, kh, vh, Heads::new(hd, n, dv, &o), gh, isa, &mut dq, &mut dk, &mut dvv)
                } else {
                    soft_grads_into(&map, &ctx, qh, kh, vh, Heads::new(hd, n, dv, &o), gh, isa, &mut dq, &mut dk, &mut dvv)
                };
                tb = tb.min(s.elapsed().as_secs_f64());
                std::hint::black_box(db);
                den = ctx.den;
            }
            let c = |x: f64| x * 4.0e9 / (hd * n) as f64;
            println!("({p},{l}) causal={causal:5} cycles/token-head @4GHz: fwd {:.0} bwd {:.0} total {:.0}", c(tf), c(tb), c(tf + tb));
        }
    }
}
