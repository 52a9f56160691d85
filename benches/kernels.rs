//! criterion benches of the CPU kernels (absolute times are this machine's; compare runs,
//! or use `racelab bench` for ratios against the bandwidth floor and exact attention).
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use racelab::backend::{BackwardInputs, Heads, PlanesF32};
use racelab::bench::machine::fill;
use racelab::cpu::exact::{exact_attention, Exact};
use racelab::cpu::{detected_isa, token, Isa};
use racelab::params::{Bits, Seed, Tables};
use racelab::shared::SoftMap;
use racelab::Planes;

fn inputs(heads: usize, n: usize, d: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>) {
    let mut v = vec![vec![0.0f32; heads * n * d]; 4];
    for (i, x) in v.iter_mut().enumerate() {
        fill(x, i as u64, 0);
    }
    let g = v.pop().unwrap();
    let vv = v.pop().unwrap();
    let k = v.pop().unwrap();
    let q = v.pop().unwrap();
    (q, k, vv, g)
}

fn bench_soft(c: &mut Criterion) {
    let (heads, d) = (4, 64);
    let mut group = c.benchmark_group("soft_race");
    group.sample_size(10);
    for &n in &[4096usize, 16384] {
        let (q, k, v, g) = inputs(heads, n, d);
        for &(p, l) in &[(2usize, 2usize), (4, 4)] {
            let planes =
                PlanesF32::from_planes(&Planes::gaussian(Bits(p), Tables(l), d, Seed(0)).unwrap());
            let map = SoftMap::new(&planes, 8.0).unwrap();
            let (qh, kh, vh) = (
                Heads::new(heads, n, d, &q).unwrap(),
                Heads::new(heads, n, d, &k).unwrap(),
                Heads::new(heads, n, d, &v).unwrap(),
            );
            group.throughput(Throughput::Elements(n as u64));
            for causal in [false, true] {
                for isa in [Isa::SCALAR, detected_isa()] {
                    let id = format!(
                        "fwd+bwd P{p}L{l} {} {}",
                        if causal { "causal" } else { "full" },
                        isa.name()
                    );
                    group.bench_with_input(BenchmarkId::new(id, n), &n, |b, _| {
                        b.iter(|| {
                            let f = token::forward(&map, qh, kh, vh, causal, isa);
                            token::soft_backward(
                                &map,
                                &f.ctx,
                                BackwardInputs::new(
                                    qh,
                                    kh,
                                    vh,
                                    Heads::new(heads, n, d, &f.o).unwrap(),
                                    Heads::new(heads, n, d, &g).unwrap(),
                                ),
                                isa,
                            )
                        })
                    });
                }
            }
        }
    }
    group.finish();
}

fn bench_exact(c: &mut Criterion) {
    let (heads, d, n) = (2, 64, 2048);
    let (q, k, v, _) = inputs(heads, n, d);
    let (qh, kh, vh) = (
        Heads::new(heads, n, d, &q).unwrap(),
        Heads::new(heads, n, d, &k).unwrap(),
        Heads::new(heads, n, d, &v).unwrap(),
    );
    let mut group = c.benchmark_group("exact");
    group.sample_size(10);
    group.bench_function("softmax f32 N=2048", |b| {
        b.iter(|| {
            exact_attention(
                Exact::Softmax { scale: 0.125 },
                qh,
                kh,
                vh,
                false,
                detected_isa(),
            )
        })
    });
    group.bench_function("angular f32 N=2048", |b| {
        b.iter(|| {
            exact_attention(
                Exact::Angular { gamma: 2.0 },
                qh,
                kh,
                vh,
                false,
                detected_isa(),
            )
        })
    });
    group.finish();
}

criterion_group!(benches, bench_soft, bench_exact);
criterion_main!(benches);
