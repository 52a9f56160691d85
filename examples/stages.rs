//! Per-stage timing of the non-causal blocked path (developer tool):
//! `RAYON_NUM_THREADS=1 cargo run --release --example stages`.
use racelab::cpu::{blocked, Heads, PlanesF32, SoftMap};
use racelab::hashing::Planes;
use std::time::Instant;

fn main() {
    let isa = racelab::cpu::detected_isa();
    let n: usize = std::env::var("N").ok().and_then(|s| s.parse().ok()).unwrap_or(1 << 17);
    let (d, dv) = (128usize, 128usize);
    let fill = |seed: u64, len: usize| -> Vec<f32> {
        (0..len)
            .map(|i| racelab::bench::machine::counter_uniform(seed, i as u64))
            .collect()
    };
    let (mut q, mut k, mut v, mut g) = (fill(1, n * d), fill(2, n * d), fill(3, n * dv), fill(4, n * dv));
    let mut keep = Vec::new();
    if std::env::var_os("ALIGN").is_some() {
        // Re-home each input at a 64-byte boundary (a Vec<f32> view into an over-allocated buffer).
        for x in [&mut q, &mut k, &mut v, &mut g] {
            let mut buf = vec![0.0f32; x.len() + 16];
            let off = (16 - (buf.as_ptr() as usize / 4) % 16) % 16;
            buf[off..off + x.len()].copy_from_slice(x);
            keep.push((buf, off, x.len()));
        }
    }
    let views: Vec<&[f32]> = keep.iter().map(|(b, o, l)| &b[*o..*o + *l]).collect();
    let (q, k, v, g): (&[f32], &[f32], &[f32], &[f32]) = if views.is_empty() { (&q, &k, &v, &g) } else { (views[0], views[1], views[2], views[3]) };
    let (qh, kh, vh, gh) = (
        Heads::new(1, n, d, q),
        Heads::new(1, n, d, k),
        Heads::new(1, n, dv, v),
        Heads::new(1, n, dv, g),
    );
    let pls: Vec<(usize, usize)> = match std::env::var("PL").as_deref() { Ok("2") => vec![(2, 2)], Ok("4") => vec![(4, 4)], _ => vec![(2, 2), (3, 3), (4, 4)] };
    for (p, l) in pls {
        let planes = PlanesF32::from_planes(&Planes::gaussian(l, p, d, 0).unwrap());
        let map = SoftMap { planes: &planes, beta: 8.0 };
        let mut o = vec![0.0f32; n * dv];
        let mut den = vec![0.0f32; n];
        let (mut dq, mut dk, mut dvv) = (vec![0.0f32; n * d], vec![0.0f32; n * d], vec![0.0f32; n * dv]);
        let mut t = [f64::MAX; 4];
        for _ in 0..(5 * (1 << 17) / n).max(5) {
            let s = Instant::now();
            let banks = blocked::key_banks(&map, isa, kh, vh);
            t[0] = t[0].min(s.elapsed().as_secs_f64());
            let s = Instant::now();
            let (_, segs) = blocked::read_into(&map, isa, qh, &banks, dv, &mut o, &mut den);
            t[1] = t[1].min(s.elapsed().as_secs_f64());
            let s = Instant::now();
            let (db, _) = blocked::query_grads(&map, isa, &banks, &segs, &den, qh, Heads::new(1, n, dv, &o), gh, &mut dq);
            t[2] = t[2].min(s.elapsed().as_secs_f64());
            let s = Instant::now();
            blocked::key_grads(&map, isa, &db, &segs, kh, vh, &mut dk, &mut dvv);
            t[3] = t[3].min(s.elapsed().as_secs_f64());
        }
        let c = |x: f64| x * 4.0e9 / n as f64;
        println!(
            "(P,L)=({p},{l}) cycles/token @4GHz: keys {:.0}  read {:.0}  bwd-q {:.0}  bwd-k {:.0}  total {:.0}",
            c(t[0]), c(t[1]), c(t[2]), c(t[3]), c(t.iter().sum())
        );
    }
}
