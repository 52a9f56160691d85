use super::*;
use crate::params::{Bits, Seed, Tables};

#[test]
fn soft_forward_matches_reference() {
    for c in cases() {
        let planes = PlanesF32::from_planes(
            &Planes::gaussian(Bits(c.p), Tables(c.l), c.d, Seed(5)).unwrap(),
        );
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
        let planes = PlanesF32::from_planes(
            &Planes::gaussian(Bits(c.p), Tables(c.l), c.d, Seed(6)).unwrap(),
        );
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
                        let err = crate::analysis::metrics::max_abs_diff(&got, want)
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
    let planes = Planes::gaussian(Bits(p), Tables(l), d, Seed(9)).unwrap();
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
/// floor (`crate::shared::recompute::den_floor`); below it (`s = 1e-36`, `1e-41`: subnormal masses) every
/// row is flagged: output 0 and `den = 0`, for the exact recompute to finish.
#[test]
fn denominators_below_the_floor_are_flagged_not_guessed() {
    use crate::cpu::soft::forward::{read_into, QueryOut};
    use crate::cpu::state::KeyTotals;
    use crate::shared::recompute::den_floor;
    let (p, l, d, dv, n) = (2, 2, 8, 4, 70);
    let planes = PlanesF32::from_planes(&Planes::gaussian(Bits(p), Tables(l), d, Seed(4)).unwrap());
    let map = SoftMap::new(&planes, 2.0).unwrap();
    let (m, w) = (l << p, crate::cpu::state::bank_width(dv));
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
    for isa in [Isa::SCALAR, crate::cpu::detected_isa()] {
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
    let planes = PlanesF32::from_planes(&Planes::gaussian(Bits(p), Tables(l), d, Seed(3)).unwrap());
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
        let want = crate::reference::logdomain::soft_race_log(
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
            crate::cpu::detected_isa(),
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
            crate::cpu::detected_isa(),
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
    let planes = PlanesF32::from_planes(&Planes::gaussian(Bits(3), Tables(3), d, Seed(8)).unwrap());
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
            let pm =
                crate::cpu::features::performer_map(omega32.clone(), 64, d, scale as f32, kh, isa);
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
    let planes = PlanesF32::from_planes(&Planes::gaussian(Bits(3), Tables(3), d, Seed(2)).unwrap());
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
        crate::cpu::detected_isa(),
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
