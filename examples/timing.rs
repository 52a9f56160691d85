//! Forward and backward time per token and head of the soft-RACE CPU paths, causal and not
//! (developer tool; one thread shows per-core cost):
//! `RAYON_NUM_THREADS=1 cargo run --release --features bench-internals --example timing` (env: `N` tokens, default 2^16;
//! `ENGINE=1` times the per-token engine instead of the production blocked paths; `PL=2|3|4`
//! and `CAUSAL=0|1` pick one row, `REPS` the repeats; `VEC=1` uses plain, unaligned vectors).
//! Needs the unstable `bench-internals` feature (`--features bench-internals`) for the engine.
use racelab::backend::{BackwardInputs, ForwardInputs, GradsMut, Heads, PlanesF32, Problem, Saved};
use racelab::cpu::{detected_isa, token, CpuRace};
use racelab::hashing::Planes;
use racelab::params::{Beta, Bits, Seed, Tables};
use racelab::shared::SoftMap;
use racelab::{Backend, RaceParams};
use std::time::Instant;

fn h(x: &[f32], hd: usize, n: usize, d: usize) -> Heads<'_> {
    Heads::new(hd, n, d, x).unwrap()
}

fn main() {
    let n: usize = std::env::var("N")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1 << 16);
    let engine = std::env::var_os("ENGINE").is_some();
    // Two heads: with one thread that is one segment per head, as in the paper-shape bench.
    let (hd, d, isa) = (2usize, 128usize, detected_isa());
    // Aligned, huge-page buffers as the bench uses (`VEC=1`: plain vectors instead).
    let plain = std::env::var_os("VEC").is_some();
    let fill = |seed: u64| -> Box<dyn std::ops::DerefMut<Target = [f32]>> {
        let len = hd * n * d;
        let mut v: Box<dyn std::ops::DerefMut<Target = [f32]>> = if plain {
            Box::new(vec![0.0f32; len])
        } else {
            Box::new(racelab::cpu::ABuf::zeroed(len))
        };
        v.iter_mut()
            .enumerate()
            .for_each(|(i, x)| *x = racelab::bench::machine::counter_uniform(seed, i as u64));
        v
    };
    let (q, k, v, g) = (fill(1), fill(2), fill(3), fill(4));
    let (mut o, mut dq, mut dk, mut dv) = (fill(5), fill(6), fill(7), fill(8));
    // `PL=2` (or 3, 4) and `CAUSAL=0|1` select one row; `REPS` repeats (default 4), for profilers.
    let only = |k: &str| std::env::var(k).ok().and_then(|s| s.parse::<usize>().ok());
    let reps = only("REPS").unwrap_or(4);
    for (p, l) in [(2, 2), (3, 3), (4, 4)] {
        if only("PL").is_some_and(|x| x != p) {
            continue;
        }
        let planes =
            PlanesF32::from_planes(&Planes::gaussian(Bits(p), Tables(l), d, Seed(0)).unwrap());
        let map = SoftMap::new(&planes, 8.0).unwrap();
        for causal in [false, true] {
            if only("CAUSAL").is_some_and(|x| (x == 1) != causal) {
                continue;
            }
            let (mut tf, mut tb) = (f64::MAX, f64::MAX);
            let x = || ForwardInputs::new(h(&q, hd, n, d), h(&k, hd, n, d), h(&v, hd, n, d));
            if engine {
                let mut reuse = Default::default();
                for _ in 0..reps {
                    let s = Instant::now();
                    let (_, ctx) = token::forward_into(&map, x(), causal, isa, &mut o, reuse);
                    tf = tf.min(s.elapsed().as_secs_f64());
                    let s = Instant::now();
                    let grads = GradsMut {
                        dq: &mut dq,
                        dk: &mut dk,
                        dv: &mut dv,
                    };
                    let db = token::soft_backward_into(
                        &map,
                        &ctx,
                        BackwardInputs::new(
                            h(&q, hd, n, d),
                            h(&k, hd, n, d),
                            h(&v, hd, n, d),
                            h(&o, hd, n, d),
                            h(&g, hd, n, d),
                        ),
                        isa,
                        grads,
                    );
                    tb = tb.min(s.elapsed().as_secs_f64());
                    std::hint::black_box(db);
                    reuse = ctx.den;
                }
            } else {
                // The production paths through the backend contract, validated once.
                let params = RaceParams::new(Bits(p), Tables(l), Beta(8.0))
                    .unwrap()
                    .with_causal(causal);
                let x = x();
                let pb =
                    Problem::with_grad(&params, &planes, x.q, x.k, x.v, h(&g, hd, n, d)).unwrap();
                let cpu = CpuRace { isa };
                let mut reuse = Saved::default();
                for _ in 0..reps {
                    let s = Instant::now();
                    let saved = cpu.forward_into(&pb, &mut o, reuse).unwrap();
                    tf = tf.min(s.elapsed().as_secs_f64());
                    let s = Instant::now();
                    let grads = GradsMut {
                        dq: &mut dq,
                        dk: &mut dk,
                        dv: &mut dv,
                    };
                    let db = cpu.backward_into(&pb, &saved, &o, grads).unwrap();
                    tb = tb.min(s.elapsed().as_secs_f64());
                    std::hint::black_box(db);
                    reuse = saved;
                }
            }
            let c = |x: f64| x * 4.0e9 / (hd * n) as f64;
            println!(
                "({p},{l}) causal={causal:5} cycles/token-head @4GHz: fwd {:.0} bwd {:.0} total {:.0}",
                c(tf),
                c(tb),
                c(tf + tb)
            );
        }
    }
}
