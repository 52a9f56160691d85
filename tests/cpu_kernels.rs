//! Fast f32 kernels against the f64 reference on the same (f32-rounded) inputs and planes.
//!
//! Tolerances: forward relative error ≤ 1e-5 (max |Δ| / max |O_ref|); gradients ≤ 1e-4
//! relative to the largest reference gradient; f64 analytic gradients vs central finite
//! differences ≤ 1e-6 relative. Both ISA twins (scalar and the detected SIMD) are run.
mod common;
use common::assert_close;
use racelab::analysis::metrics::rel_max_err;
use racelab::backend::{BackwardInputs, Heads, PlanesF32, SoftGrads};
use racelab::cpu::decode::Decoder;
use racelab::cpu::simd::Level;
use racelab::cpu::{soft_backward, soft_forward, token, HardMap, Isa, LinearMap, SoftMap};
use racelab::reference::backward::soft_race_backward;
use racelab::reference::baselines::{linear_attention, performer_attention, performer_omega};
use racelab::reference::race::{hard_lsh, soft_race};
use racelab::rng::SeededRng;
use racelab::{Combine, Mat, MatRef, Planes};

const FWD_TOL: f64 = 1e-5;
const GRAD_TOL: f64 = 1e-4;

struct Case {
    p: usize,
    l: usize,
    beta: f64,
    d: usize,
    dv: usize,
    n: usize,
    heads: usize,
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            p: 2,
            l: 2,
            beta: 4.0,
            d: 16,
            dv: 8,
            n: 37,
            heads: 2,
        },
        Case {
            p: 3,
            l: 3,
            beta: 1.0,
            d: 8,
            dv: 5,
            n: 1,
            heads: 1,
        },
        Case {
            p: 1,
            l: 1,
            beta: 2.0,
            d: 1,
            dv: 1,
            n: 19,
            heads: 3,
        },
        Case {
            p: 4,
            l: 4,
            beta: 8.0,
            d: 32,
            dv: 16,
            n: 1000,
            heads: 1,
        }, // several segments, flushes
        // One head over several segments: exercises the segment scans in both directions.
        Case {
            p: 2,
            l: 2,
            beta: 2.0,
            d: 8,
            dv: 4,
            n: 700,
            heads: 1,
        },
        // m = 2^11 > 1024: wider than the 1024-float stack buffers of `gemm_ext`'s row sums
        // and `dbank`'s masses (their column-wise fallbacks).
        Case {
            p: 11,
            l: 1,
            beta: 1.0,
            d: 6,
            dv: 3,
            n: 40,
            heads: 1,
        },
        Case {
            p: 2,
            l: 3,
            beta: 0.5,
            d: 64,
            dv: 64,
            n: 300,
            heads: 5,
        },
        // 16 features with no padding lane and P = 4 (the one-vector-per-token paths' widest
        // butterflies), over two blocks of 128 and a partial one.
        Case {
            p: 4,
            l: 1,
            beta: 3.0,
            d: 12,
            dv: 6,
            n: 300,
            heads: 2,
        },
    ]
}

/// Every SIMD level this CPU has (scalar, AVX2, AVX-512 as far as it goes), each once: the
/// AVX2 path most machines take is tested on AVX-512 machines too.
fn isas() -> Vec<Isa> {
    let mut v: Vec<Isa> = [Level::Scalar, Level::Avx2, Level::Avx512]
        .into_iter()
        .map(Isa::at_most)
        .collect();
    v.dedup();
    v
}

#[test]
fn the_kernels_are_tested_at_every_level_the_cpu_has() {
    let best = racelab::cpu::simd::best_supported().level();
    let levels: Vec<Level> = isas().iter().map(|i| i.level()).collect();
    let want: Vec<Level> = [Level::Scalar, Level::Avx2, Level::Avx512]
        .into_iter()
        .filter(|&l| l <= best)
        .collect();
    assert_eq!(levels, want);
}

/// f32 data and its exact f64 image.
fn data(len: usize, seed: u64, scale: f64) -> (Vec<f32>, Vec<f64>) {
    let mut rng = SeededRng::new(seed, 7);
    let f: Vec<f32> = (0..len).map(|_| (rng.normal() * scale) as f32).collect();
    let d = f.iter().map(|&x| x as f64).collect();
    (f, d)
}

fn maxabs(x: &[f64]) -> f64 {
    x.iter().map(|v| v.abs()).fold(0.0, f64::max)
}

/// Concatenate a per-head f64 reference over `heads`.
fn per_head(heads: usize, f: impl Fn(usize) -> Vec<f64>) -> Vec<f64> {
    (0..heads).flat_map(f).collect()
}

/// Assert `got` (f32) is within the forward tolerance of `want`, relative to max |want|.
fn assert_fwd(label: &str, got: &[f32], want: &[f64]) {
    let got: Vec<f64> = got.iter().map(|&x| x as f64).collect();
    let err = rel_max_err(&got, want);
    assert!(err <= FWD_TOL, "{label}: rel err {err:.2e}");
}

fn head<'a>(x: &'a [f64], h: usize, n: usize, c: usize) -> MatRef<'a, f64> {
    MatRef::new(n, c, &x[h * n * c..(h + 1) * n * c]).unwrap()
}

#[test]
fn soft_forward_matches_reference() {
    for c in cases() {
        let planes = PlanesF32::from_planes(&Planes::gaussian(c.l, c.p, c.d, 5).unwrap());
        let p64 = planes.to_planes();
        let (qf, q) = data(c.heads * c.n * c.d, 1, 0.5);
        let (kf, k) = data(c.heads * c.n * c.d, 2, 0.5);
        let (vf, v) = data(c.heads * c.n * c.dv, 3, 1.0);
        let map = SoftMap::new(&planes, c.beta as f32).unwrap();
        for causal in [false, true] {
            let mut want = Vec::new();
            for h in 0..c.heads {
                want.extend(
                    soft_race(
                        head(&q, h, c.n, c.d),
                        head(&k, h, c.n, c.d),
                        head(&v, h, c.n, c.dv),
                        &p64,
                        c.beta,
                        causal,
                        Combine::Paper,
                    )
                    .o
                    .data,
                );
            }
            for isa in isas() {
                // The per-token engine and the production (blocked) path on the same inputs.
                for production in [false, true] {
                    let (qh, kh, vh) = (
                        Heads::new(c.heads, c.n, c.d, &qf).unwrap(),
                        Heads::new(c.heads, c.n, c.d, &kf).unwrap(),
                        Heads::new(c.heads, c.n, c.dv, &vf).unwrap(),
                    );
                    let out = if production {
                        soft_forward(&map, qh, kh, vh, causal, isa)
                    } else {
                        token::forward(&map, qh, kh, vh, causal, isa)
                    };
                    let got: Vec<f64> = out.o.iter().map(|&x| x as f64).collect();
                    let err = rel_max_err(&got, &want);
                    assert!(err <= FWD_TOL, "soft fwd (production: {production}) P={} L={} beta={} d={} n={} causal={causal} {isa:?}: rel err {err:.2e}", c.p, c.l, c.beta, c.d, c.n);
                }
            }
        }
    }
}

#[test]
fn soft_backward_matches_reference_gradients() {
    for c in cases().into_iter().filter(|c| c.n <= 700) {
        let planes = PlanesF32::from_planes(&Planes::gaussian(c.l, c.p, c.d, 6).unwrap());
        let p64 = planes.to_planes();
        let (qf, q) = data(c.heads * c.n * c.d, 11, 0.5);
        let (kf, k) = data(c.heads * c.n * c.d, 12, 0.5);
        let (vf, v) = data(c.heads * c.n * c.dv, 13, 1.0);
        let (gf, g) = data(c.heads * c.n * c.dv, 14, 1.0);
        let map = SoftMap::new(&planes, c.beta as f32).unwrap();
        for causal in [false, true] {
            let (mut dq, mut dk, mut dv, mut db) = (Vec::new(), Vec::new(), Vec::new(), 0.0);
            for h in 0..c.heads {
                let gr = soft_race_backward(
                    head(&q, h, c.n, c.d),
                    head(&k, h, c.n, c.d),
                    head(&v, h, c.n, c.dv),
                    head(&g, h, c.n, c.dv),
                    &p64,
                    c.beta,
                    causal,
                );
                dq.extend(gr.dq.data);
                dk.extend(gr.dk.data);
                dv.extend(gr.dv.data);
                db += gr.dbeta;
            }
            for isa in isas() {
                let (qh, kh, vh) = (
                    Heads::new(c.heads, c.n, c.d, &qf).unwrap(),
                    Heads::new(c.heads, c.n, c.d, &kf).unwrap(),
                    Heads::new(c.heads, c.n, c.dv, &vf).unwrap(),
                );
                // Per-token engine, production (blocked) engine, and each backward on the
                // other engine's forward context.
                for (fwd_prod, bwd_prod) in
                    [(false, false), (true, true), (false, true), (true, false)]
                {
                    let fwd = if fwd_prod {
                        soft_forward(&map, qh, kh, vh, causal, isa)
                    } else {
                        token::forward(&map, qh, kh, vh, causal, isa)
                    };
                    let oh = Heads::new(c.heads, c.n, c.dv, &fwd.o).unwrap();
                    let gh = Heads::new(c.heads, c.n, c.dv, &gf).unwrap();
                    let grads = if bwd_prod {
                        soft_backward(&map, &fwd.ctx, BackwardInputs::new(qh, kh, vh, oh, gh), isa)
                    } else {
                        token::soft_backward(
                            &map,
                            &fwd.ctx,
                            BackwardInputs::new(qh, kh, vh, oh, gh),
                            isa,
                        )
                    };
                    let tag = format!(
                    "P={} L={} beta={} d={} n={} causal={causal} {isa:?} production fwd={fwd_prod} bwd={bwd_prod}",
                    c.p, c.l, c.beta, c.d, c.n
                );
                    // Relative to the largest reference gradient, floored at 1e-3·max|G|·max|V|: at
                    // N = 1 the true dQ, dK are exactly 0 and only rounding remains.
                    let floor = 1e-3 * maxabs(&g) * maxabs(&v);
                    for (name, got, want) in [
                        ("dq", &grads.dq, &dq),
                        ("dk", &grads.dk, &dk),
                        ("dv", &grads.dv, &dv),
                    ] {
                        let got: Vec<f64> = got.iter().map(|&x| x as f64).collect();
                        let err = racelab::analysis::metrics::max_abs_diff(&got, want)
                            / maxabs(want).max(floor);
                        assert!(err <= GRAD_TOL, "{name} {tag}: rel err {err:.2e}");
                    }
                    let scale = db.abs().max(1e-3);
                    assert!(
                        (grads.dbeta - db).abs() / scale <= GRAD_TOL * 10.0,
                        "dbeta {tag}: {} vs {db}",
                        grads.dbeta
                    );
                }
            }
        }
    }
}

/// ℓ = Σ Ô ⊙ G: the f64 analytic gradients against central differences.
#[test]
fn reference_gradients_match_finite_differences() {
    let (n, d, dv, p, l, beta) = (6, 3, 2, 2, 2, 1.5);
    let planes = Planes::gaussian(l, p, d, 9).unwrap();
    let (_, q) = data(n * d, 21, 0.7);
    let (_, k) = data(n * d, 22, 0.7);
    let (_, v) = data(n * dv, 23, 1.0);
    let (_, g) = data(n * dv, 24, 1.0);
    for causal in [false, true] {
        let loss = |q: &[f64], k: &[f64], v: &[f64], beta: f64| -> f64 {
            let o = soft_race(
                MatRef::new(n, d, q).unwrap(),
                MatRef::new(n, d, k).unwrap(),
                MatRef::new(n, dv, v).unwrap(),
                &planes,
                beta,
                causal,
                Combine::Paper,
            )
            .o;
            o.data.iter().zip(&g).map(|(a, b)| a * b).sum()
        };
        let an = soft_race_backward(
            MatRef::new(n, d, &q).unwrap(),
            MatRef::new(n, d, &k).unwrap(),
            MatRef::new(n, dv, &v).unwrap(),
            MatRef::new(n, dv, &g).unwrap(),
            &planes,
            beta,
            causal,
        );
        let h = 1e-5;
        let fd = |which: usize, idx: usize| -> f64 {
            let (mut qp, mut kp, mut vp, mut bp) = (q.clone(), k.clone(), v.clone(), beta);
            let (mut qm, mut km, mut vm, mut bm) = (q.clone(), k.clone(), v.clone(), beta);
            match which {
                0 => {
                    qp[idx] += h;
                    qm[idx] -= h;
                }
                1 => {
                    kp[idx] += h;
                    km[idx] -= h;
                }
                2 => {
                    vp[idx] += h;
                    vm[idx] -= h;
                }
                _ => {
                    bp += h;
                    bm -= h;
                }
            }
            (loss(&qp, &kp, &vp, bp) - loss(&qm, &km, &vm, bm)) / (2.0 * h)
        };
        for (which, name, an_vals) in [
            (0, "dq", &an.dq.data),
            (1, "dk", &an.dk.data),
            (2, "dv", &an.dv.data),
        ] {
            let num: Vec<f64> = (0..an_vals.len()).map(|i| fd(which, i)).collect();
            let scale = num.iter().map(|x| x.abs()).fold(0.0, f64::max).max(1e-12);
            assert_close(
                &format!("{name} analytic vs FD causal={causal}"),
                an_vals,
                &num,
                1e-6 * scale,
            );
        }
        let num_b = fd(3, 0);
        assert!(
            (an.dbeta - num_b).abs() <= 1e-6 * num_b.abs().max(1e-3),
            "dbeta causal={causal}: {} vs FD {num_b}",
            an.dbeta
        );
    }
}

/// The blocked read folds `1/Den` into the features; banks scaled by `s` must give the same
/// output (`Num/Den` is scale-free) and `den` scaled by `s` while `Den` stays at or above the
/// floor (`recompute::den_floor`); below it (`s = 1e-36`, `1e-41`: subnormal masses) every
/// row is flagged: output 0 and `den = 0`, for the exact recompute to finish.
#[test]
fn denominators_below_the_floor_are_flagged_not_guessed() {
    use racelab::cpu::recompute::den_floor;
    use racelab::cpu::soft::{read_into, KeyTotals, QueryOut};
    let (p, l, d, dv, n) = (2, 2, 8, 4, 70);
    let planes = PlanesF32::from_planes(&Planes::gaussian(l, p, d, 4).unwrap());
    let map = SoftMap::new(&planes, 2.0).unwrap();
    let (m, w) = (l << p, racelab::cpu::state::bank_width(dv));
    let floor = den_floor(m, n);
    let (q, _) = data(n * d, 8, 1.0);
    let (vals, _) = data(m * dv, 9, 1.0);
    let bank = |s: f64| -> Vec<f64> {
        let mut b = vec![0.0f64; m * w];
        for f in 0..m {
            let a = s * (1.0 + f as f64);
            b[f * w + dv] = a;
            (0..dv).for_each(|j| b[f * w + j] = a * vals[f * dv + j] as f64);
        }
        b
    };
    for isa in [Isa::SCALAR, racelab::cpu::detected_isa()] {
        let read = |s: f64| {
            let (mut o, mut den) = (vec![9.0f32; n * dv], vec![9.0f32; n]);
            let q = Heads::new(1, n, d, &q).unwrap();
            let bk = [bank(s)];
            let keys = KeyTotals {
                banks: &bk,
                dv,
                floor,
            };
            let out = QueryOut {
                o: &mut o,
                den: &mut den,
                uq: &mut [],
            };
            let (flagged, _) = read_into(&map, isa, q, keys, out);
            let o64: Vec<f64> = o.iter().map(|&x| x as f64).collect();
            let d64: Vec<f64> = den.iter().map(|&x| x as f64 / s).collect();
            (flagged, o64, d64)
        };
        let (_, o1, d1) = read(1.0);
        let (flagged, o, den) = read(1e-20);
        assert_eq!(flagged, 0, "banks × 1e-20: no row is below the floor");
        assert_close(&format!("{isa:?} o, banks × 1e-20"), &o, &o1, 1e-6);
        assert_close(&format!("{isa:?} den / 1e-20"), &den, &d1, 1e-6);
        for s in [1e-36, 1e-41] {
            let (flagged, o, den) = read(s);
            assert_eq!(flagged, n, "banks × {s:e}: every row is flagged");
            assert!(o.iter().all(|&x| x == 0.0) && den.iter().all(|&x| x == 0.0));
        }
    }
}

/// beta = 1e4 on inputs whose projections are away from 0 (|z| ≥ 0.05): the features are
/// saturated, the kernel must stay finite and agree with the exact reference (its flagged
/// rows recomputed). (Nearer z = 0 the
/// problem itself has condition number ~2·beta, so f32 inputs cannot meet 1e-5 there.)
#[test]
fn large_beta_is_finite_and_correct() {
    let (p, l, d, dv, n, beta) = (3, 2, 8, 4, 64, 1e4);
    let planes = PlanesF32::from_planes(&Planes::gaussian(l, p, d, 3).unwrap());
    let p64 = planes.to_planes();
    let mut rng = SeededRng::new(77, 1);
    let mut rows = |count: usize| -> Vec<f32> {
        let mut out = Vec::new();
        while out.len() < count * d {
            let x: Vec<f32> = (0..d).map(|_| rng.normal() as f32).collect();
            let xs: Vec<f64> = x.iter().map(|&t| t as f64).collect();
            let ok = (0..l).all(|t| {
                let mut z = vec![0.0; p];
                p64.project(t, &xs, &mut z);
                z.iter().all(|zz| zz.abs() >= 0.05)
            });
            if ok {
                out.extend(x);
            }
        }
        out
    };
    let (qf, kf) = (rows(n), rows(n));
    let (vf, v) = data(n * dv, 5, 1.0);
    let (q, k): (Vec<f64>, Vec<f64>) = (
        qf.iter().map(|&x| x as f64).collect(),
        kf.iter().map(|&x| x as f64).collect(),
    );
    let map = SoftMap::new(&planes, beta as f32).unwrap();
    for causal in [false, true] {
        // The exact reference: the plain one underflows here (rows of subnormals).
        let want = racelab::reference::logdomain::soft_race_log(
            MatRef::new(n, d, &q).unwrap(),
            MatRef::new(n, d, &k).unwrap(),
            MatRef::new(n, dv, &v).unwrap(),
            &p64,
            beta,
            causal,
            Combine::Paper,
        )
        .o
        .data;
        let out = token::forward(
            &map,
            Heads::new(1, n, d, &qf).unwrap(),
            Heads::new(1, n, d, &kf).unwrap(),
            Heads::new(1, n, dv, &vf).unwrap(),
            causal,
            racelab::cpu::detected_isa(),
        );
        assert_fwd(&format!("beta=1e4 causal={causal}"), &out.o, &want);
        let (gf, _) = data(n * dv, 6, 1.0);
        let gr = token::soft_backward(
            &map,
            &out.ctx,
            BackwardInputs::new(
                Heads::new(1, n, d, &qf).unwrap(),
                Heads::new(1, n, d, &kf).unwrap(),
                Heads::new(1, n, dv, &vf).unwrap(),
                Heads::new(1, n, dv, &out.o).unwrap(),
                Heads::new(1, n, dv, &gf).unwrap(),
            ),
            racelab::cpu::detected_isa(),
        );
        assert!(
            gr.dq
                .iter()
                .chain(&gr.dk)
                .chain(&gr.dv)
                .all(|x| x.is_finite())
                && gr.dbeta.is_finite()
        );
    }
}

#[test]
fn other_estimators_on_the_fast_path() {
    let (n, d, dv, heads) = (300, 16, 8, 2);
    let planes = PlanesF32::from_planes(&Planes::gaussian(3, 3, d, 8).unwrap());
    let p64 = planes.to_planes();
    let (qf, q) = data(heads * n * d, 31, 0.5);
    let (kf, k) = data(heads * n * d, 32, 0.5);
    let (vf, v) = data(heads * n * dv, 33, 1.0);
    let omega = performer_omega(64, d, 4);
    let omega32: Vec<f32> = omega.data.iter().map(|&x| x as f32).collect();
    let omega_r = Mat::from_vec(64, d, omega32.iter().map(|&x| x as f64).collect());
    let scale = 1.0 / (d as f64).sqrt();
    for causal in [false, true] {
        for isa in isas() {
            let (qh, kh, vh) = (
                Heads::new(heads, n, d, &qf).unwrap(),
                Heads::new(heads, n, d, &kf).unwrap(),
                Heads::new(heads, n, dv, &vf).unwrap(),
            );
            // Hard LSH.
            let hard = token::forward(&HardMap { planes: &planes }, qh, kh, vh, causal, isa);
            let (mut want, mut empty) = (Vec::new(), 0);
            for h in 0..heads {
                let r = hard_lsh(
                    head(&q, h, n, d),
                    head(&k, h, n, d),
                    head(&v, h, n, dv),
                    &p64,
                    causal,
                );
                empty += r.empty_rows;
                want.extend(r.o.data);
            }
            assert_fwd(&format!("hard causal={causal} {isa:?}"), &hard.o, &want);
            assert_eq!(hard.empty_rows, empty, "hard empty rows");
            // Linear.
            let lin = token::forward(&LinearMap { d }, qh, kh, vh, causal, isa);
            let want = per_head(heads, |h| {
                linear_attention(
                    head(&q, h, n, d),
                    head(&k, h, n, d),
                    head(&v, h, n, dv),
                    causal,
                )
                .o
                .data
            });
            assert_fwd(&format!("linear causal={causal}"), &lin.o, &want);
            // Performer.
            let pm = racelab::cpu::features::performer_map(
                omega32.clone(),
                64,
                d,
                scale as f32,
                kh,
                isa,
            );
            let perf = token::forward(&pm, qh, kh, vh, causal, isa);
            let want = per_head(heads, |h| {
                performer_attention(
                    head(&q, h, n, d),
                    head(&k, h, n, d),
                    head(&v, h, n, dv),
                    &omega_r,
                    Some(scale),
                    causal,
                )
                .o
                .data
            });
            assert_fwd(&format!("performer causal={causal}"), &perf.o, &want);
        }
    }
}

#[test]
fn decoder_equals_causal_forward_row_by_row() {
    let (n, d, dv) = (600, 16, 8);
    let planes = PlanesF32::from_planes(&Planes::gaussian(3, 3, d, 2).unwrap());
    let (qf, _) = data(n * d, 41, 0.5);
    let (kf, _) = data(n * d, 42, 0.5);
    let (vf, _) = data(n * dv, 43, 1.0);
    let map = SoftMap::new(&planes, 3.0).unwrap();
    let fwd = token::forward(
        &map,
        Heads::new(1, n, d, &qf).unwrap(),
        Heads::new(1, n, d, &kf).unwrap(),
        Heads::new(1, n, dv, &vf).unwrap(),
        true,
        racelab::cpu::detected_isa(),
    );
    let mut dec = Decoder::new(planes.clone(), 3.0, dv).unwrap();
    let scale = fwd.o.iter().map(|x| x.abs()).fold(0.0f32, f32::max) as f64;
    for t in 0..n {
        let o = dec
            .step(
                &qf[t * d..(t + 1) * d],
                &kf[t * d..(t + 1) * d],
                &vf[t * dv..(t + 1) * dv],
            )
            .unwrap();
        for (c, &oc) in o.iter().enumerate() {
            let want = fwd.o[t * dv + c];
            let diff = (oc as f64 - want as f64).abs();
            assert!(
                diff <= FWD_TOL * scale,
                "decode row {t} col {c}: {oc} vs {want}"
            );
        }
    }
    assert_eq!(dec.len(), n);
    assert!(dec.step(&qf[..d - 1], &kf[..d], &vf[..dv]).is_err());
}

#[test]
fn exact_quadratic_kernels_match_reference() {
    use racelab::cpu::exact::{exact_attention, Exact};
    use racelab::reference::{angular::angular_attention, softmax::softmax_attention};
    let (n, d, dv, heads) = (300, 32, 16, 2);
    let (qf, q) = data(heads * n * d, 51, 1.0);
    let (kf, k) = data(heads * n * d, 52, 1.0);
    let (vf, v) = data(heads * n * dv, 53, 1.0);
    for causal in [false, true] {
        for isa in isas() {
            let (qh, kh, vh) = (
                Heads::new(heads, n, d, &qf).unwrap(),
                Heads::new(heads, n, d, &kf).unwrap(),
                Heads::new(heads, n, dv, &vf).unwrap(),
            );
            let s = exact_attention(
                Exact::Softmax {
                    scale: 1.0 / (d as f32).sqrt(),
                },
                qh,
                kh,
                vh,
                causal,
                isa,
            );
            let want = per_head(heads, |h| {
                softmax_attention(
                    head(&q, h, n, d),
                    head(&k, h, n, d),
                    head(&v, h, n, dv),
                    None,
                    causal,
                )
                .o
                .data
            });
            assert_fwd(&format!("softmax f32 causal={causal} {isa:?}"), &s, &want);
            for gamma in [2.0, 2.5] {
                let a = exact_attention(
                    Exact::Angular {
                        gamma: gamma as f32,
                    },
                    qh,
                    kh,
                    vh,
                    causal,
                    isa,
                );
                let want = per_head(heads, |h| {
                    angular_attention(
                        head(&q, h, n, d),
                        head(&k, h, n, d),
                        head(&v, h, n, dv),
                        gamma,
                        causal,
                    )
                    .o
                    .data
                });
                assert_fwd(
                    &format!("angular f32 gamma={gamma} causal={causal}"),
                    &a,
                    &want,
                );
            }
        }
    }
}

/// Random Q, K (scale 0.5), V, G (scale 1) in f32, `[heads, n, ·]`, from seeds `seed..seed+4`.
struct Qkvg {
    dims: (usize, usize, usize, usize),
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
}

impl Qkvg {
    fn new(heads: usize, n: usize, d: usize, dv: usize, seed: u64) -> Self {
        Qkvg {
            dims: (heads, n, d, dv),
            q: data(heads * n * d, seed, 0.5).0,
            k: data(heads * n * d, seed + 1, 0.5).0,
            v: data(heads * n * dv, seed + 2, 1.0).0,
            g: data(heads * n * dv, seed + 3, 1.0).0,
        }
    }
    fn heads(&self) -> (Heads<'_>, Heads<'_>, Heads<'_>, Heads<'_>) {
        let (h, n, d, dv) = self.dims;
        (
            Heads::new(h, n, d, &self.q).unwrap(),
            Heads::new(h, n, d, &self.k).unwrap(),
            Heads::new(h, n, dv, &self.v).unwrap(),
            Heads::new(h, n, dv, &self.g).unwrap(),
        )
    }
}

/// `dq`, `dk`, `dv` of `got` within `tol` of `want`, relative to the largest entry of `want`.
fn assert_grads_close(tag: &str, got: &SoftGrads, want: &SoftGrads, tol: f64) {
    let f64s = |x: &[f32]| x.iter().map(|&v| v as f64).collect::<Vec<f64>>();
    for (name, a, b) in [
        ("dq", &got.dq, &want.dq),
        ("dk", &got.dk, &want.dk),
        ("dv", &got.dv, &want.dv),
    ] {
        let err = rel_max_err(&f64s(a), &f64s(b));
        assert!(err <= tol, "{tag} {name}: rel err {err:.2e}");
    }
}

/// Outputs of at least `STREAM_MIN_BYTES` are written with non-temporal stores: the production
/// kernels at such a size (2 heads × 32768 tokens × 128) against the per-token engine, whose
/// stores are plain, for both passes, causal and not, with and without the write-behind queue.
#[test]
fn streaming_stores_match_the_per_token_engine() {
    use racelab::cpu::mem::{Out, STREAM_MIN_BYTES};
    let isa = racelab::cpu::simd::best_supported();
    let (heads, n, d, dv) = (2, STREAM_MIN_BYTES / 4 / (2 * 128), 128, 128);
    if !Out::for_len(isa, heads * n * dv).stream {
        println!("skipped: no vector ISA, so no streaming stores to test");
        return;
    }
    let x = Qkvg::new(heads, n, d, dv, 21);
    let (qh, kh, vh, gh) = x.heads();
    let f64s = |x: &[f32]| x.iter().map(|&v| v as f64).collect::<Vec<f64>>();
    // (2, 2): 8 features, outputs queued behind the computation (write-behind); (3, 3): 24
    // features, each block streamed out as soon as it is computed.
    for (p, l) in [(2, 2), (3, 3)] {
        let planes = PlanesF32::from_planes(&Planes::gaussian(l, p, d, 9).unwrap());
        let map = SoftMap::new(&planes, 8.0).unwrap();
        for causal in [false, true] {
            let label = format!("stream ({p},{l}) causal={causal}");
            let prod = soft_forward(&map, qh, kh, vh, causal, isa);
            let twin = token::forward(&map, qh, kh, vh, causal, isa);
            assert_fwd(&format!("{label} o"), &prod.o, &f64s(&twin.o));
            let oh = Heads::new(heads, n, dv, &twin.o).unwrap();
            let gp = soft_backward(
                &map,
                &prod.ctx,
                BackwardInputs::new(qh, kh, vh, oh, gh),
                isa,
            );
            let gt = token::soft_backward(
                &map,
                &twin.ctx,
                BackwardInputs::new(qh, kh, vh, oh, gh),
                isa,
            );
            assert_grads_close(&label, &gp, &gt, GRAD_TOL);
        }
    }
}

/// The production backward uses the forward's saved `u = tanh(Wx)` only when it fits the
/// inputs; a context without it (or with a stale one of another size) recomputes the features
/// from Q and K and gives the same gradients.
#[test]
fn saved_features_are_used_only_when_they_fit() {
    let (heads, n, d, dv) = (2, 300, 16, 8);
    let planes = PlanesF32::from_planes(&Planes::gaussian(3, 3, d, 4).unwrap());
    let map = SoftMap::new(&planes, 5.0).unwrap();
    let x = Qkvg::new(heads, n, d, dv, 31);
    let (qh, kh, vh, gh) = x.heads();
    for isa in isas() {
        for causal in [false, true] {
            let fwd = soft_forward(&map, qh, kh, vh, causal, isa);
            assert_eq!(fwd.ctx.uq.len(), heads * n * 9, "the forward saves u");
            let oh = Heads::new(heads, n, dv, &fwd.o).unwrap();
            let saved = soft_backward(&map, &fwd.ctx, BackwardInputs::new(qh, kh, vh, oh, gh), isa);
            for stale in [0, 5] {
                let mut ctx = fwd.ctx.clone();
                ctx.uq.truncate(stale);
                ctx.uk.truncate(stale);
                let again = soft_backward(&map, &ctx, BackwardInputs::new(qh, kh, vh, oh, gh), isa);
                let tag = format!("causal={causal} {isa:?} stale={stale}");
                assert_grads_close(&tag, &again, &saved, 1e-6);
            }
        }
    }
}

/// The causal backward's two forms against the f64 reference: one reverse pass from the
/// forward's block-start states (kept when each head is one segment: forced here with a
/// one-thread pool), two passes on the same context with the states dropped, and two passes
/// over several segments per head (a four-thread pool, one head). N = 300: three blocks of
/// 128, the last one short, so sub-blocks are short too.
#[test]
fn causal_backward_one_pass_and_two_passes_match_reference() {
    let (n, d, dv, beta) = (300usize, 16usize, 8usize, 4.0f64);
    let pool = |t: usize| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(t)
            .build()
            .unwrap()
    };
    for (p, l) in [(2, 2), (3, 3), (4, 4), (1, 5)] {
        let planes = PlanesF32::from_planes(&Planes::gaussian(l, p, d, 9).unwrap());
        let p64 = planes.to_planes();
        let map = SoftMap::new(&planes, beta as f32).unwrap();
        for (heads, threads, keep_states) in [(2, 1, true), (2, 1, false), (1, 4, false)] {
            let (qf, q) = data(heads * n * d, 61, 0.5);
            let (kf, k) = data(heads * n * d, 62, 0.5);
            let (vf, v) = data(heads * n * dv, 63, 1.0);
            let (gf, g) = data(heads * n * dv, 64, 1.0);
            let want: Vec<Vec<f64>> = (0..3)
                .map(|which| {
                    per_head(heads, |h| {
                        let gr = soft_race_backward(
                            head(&q, h, n, d),
                            head(&k, h, n, d),
                            head(&v, h, n, dv),
                            head(&g, h, n, dv),
                            &p64,
                            beta,
                            true,
                        );
                        [gr.dq, gr.dk, gr.dv][which].data.clone()
                    })
                })
                .collect();
            for isa in isas() {
                let (qh, kh, vh) = (
                    Heads::new(heads, n, d, &qf).unwrap(),
                    Heads::new(heads, n, d, &kf).unwrap(),
                    Heads::new(heads, n, dv, &vf).unwrap(),
                );
                let tag = format!(
                    "P={p} L={l} heads={heads} threads={threads} states={keep_states} {isa:?}"
                );
                let grads = pool(threads).install(|| {
                    let mut fwd = soft_forward(&map, qh, kh, vh, true, isa);
                    // States are kept exactly when each head is one segment.
                    assert_eq!(fwd.ctx.states.is_empty(), fwd.ctx.segs.len() > 1, "{tag}");
                    if threads > 1 {
                        assert!(fwd.ctx.segs.len() > 1, "{tag}: one segment");
                    }
                    if !keep_states {
                        fwd.ctx.states.clear();
                    } else {
                        // One `m × w` state per block of TB tokens and head.
                        let tb = racelab::cpu::soft::TB;
                        let w = racelab::cpu::state::bank_width(dv);
                        let want = heads * n.div_ceil(tb) * (l << p) * w;
                        assert_eq!(fwd.ctx.states.len(), want, "{tag}: saved states");
                    }
                    let oh = Heads::new(heads, n, dv, &fwd.o).unwrap();
                    let gh = Heads::new(heads, n, dv, &gf).unwrap();
                    soft_backward(&map, &fwd.ctx, BackwardInputs::new(qh, kh, vh, oh, gh), isa)
                });
                for (name, got, want) in [
                    ("dq", &grads.dq, &want[0]),
                    ("dk", &grads.dk, &want[1]),
                    ("dv", &grads.dv, &want[2]),
                ] {
                    let got: Vec<f64> = got.iter().map(|&x| x as f64).collect();
                    let err = racelab::analysis::metrics::max_abs_diff(&got, want) / maxabs(want);
                    assert!(err <= GRAD_TOL, "{name} {tag}: rel err {err:.2e}");
                }
            }
        }
    }
}

/// beta = 1e4 with keys just off every plane: a query whose bits are all on meets keys whose
/// "all on" feature is `σ(−2β tanh z)² ≈ 1e-40`, a subnormal, so every causal `Den_i` is
/// subnormal (and `1/Den` infinite in f32). Every row is flagged and recomputed exactly: the
/// outputs are the running means of the values (all weights equal), on both ISAs, in the
/// blocked production path and the per-token engine (`forward`), at N = 3 and 40.
#[test]
fn causal_subnormal_denominators_give_finite_outputs() {
    let planes = PlanesF32::from_planes(&Planes {
        l: 1,
        p: 2,
        d: 2,
        w: vec![1.0, 0.0, 0.0, 1.0],
    });
    let map = SoftMap::new(&planes, 1e4).unwrap();
    for n in [3usize, 40] {
        let q: Vec<f32> = (0..n).flat_map(|_| [0.5f32, 0.5]).collect();
        let k: Vec<f32> = (0..n).flat_map(|_| [-0.0023f32, -0.0023]).collect();
        let v: Vec<f32> = (0..n)
            .flat_map(|j| [1.0 + j as f32, 2.0 - 0.5 * j as f32, 0.25])
            .collect();
        for isa in [Isa::SCALAR, racelab::cpu::detected_isa()] {
            let (qh, kh, vh) = (
                Heads::new(1, n, 2, &q).unwrap(),
                Heads::new(1, n, 2, &k).unwrap(),
                Heads::new(1, n, 3, &v).unwrap(),
            );
            for (path, out) in [
                ("blocked", soft_forward(&map, qh, kh, vh, true, isa)),
                ("per-token", token::forward(&map, qh, kh, vh, true, isa)),
            ] {
                assert_eq!(out.empty_rows, 0, "n={n} {isa:?} {path}: no row is empty");
                for i in 0..n {
                    for c in 0..3 {
                        let want =
                            (0..=i).map(|j| v[j * 3 + c] as f64).sum::<f64>() / (i + 1) as f64;
                        let got = out.o[i * 3 + c] as f64;
                        assert!(
                            got.is_finite() && (got - want).abs() <= 1e-6 * (1.0 + want.abs()),
                            "n={n} {isa:?} {path}: o[{i}][{c}] = {got}, want {want}"
                        );
                    }
                }
                assert_eq!(
                    out.ctx.recomputed.rows,
                    (0..n).collect::<Vec<_>>(),
                    "n={n} {path}: every row is flagged and recomputed"
                );
            }
        }
    }
}
