use super::*;
use crate::params::{Beta, Bits, Seed, Tables};

#[test]
fn exact_quadratic_kernels_match_reference() {
    use crate::cpu::exact::{exact_attention, Exact};
    use crate::reference::{angular::angular_attention, softmax::softmax_attention};
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

/// Outputs of at least `STREAM_MIN_BYTES` are written with non-temporal stores: the production
/// kernels at such a size (2 heads × 32768 tokens × 128) against the per-token engine, whose
/// stores are plain, for both passes, causal and not, with and without the write-behind queue.
#[test]
fn streaming_stores_match_the_per_token_engine() {
    use crate::cpu::mem::{Out, STREAM_MIN_BYTES};
    let isa = crate::cpu::simd::best_supported();
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
        let planes =
            PlanesF32::from_planes(&Planes::gaussian(Bits(p), Tables(l), d, Seed(9)).unwrap());
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
    let planes = PlanesF32::from_planes(&Planes::gaussian(Bits(3), Tables(3), d, Seed(4)).unwrap());
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
    // (1, 5), (2, 2), (3, 2), (4, 1): banks of at most 16 features, every P of the 16-lane
    // backward rows (one instance per P).
    for (p, l) in [(2, 2), (3, 3), (4, 4), (1, 5), (3, 2), (4, 1)] {
        let planes =
            PlanesF32::from_planes(&Planes::gaussian(Bits(p), Tables(l), d, Seed(9)).unwrap());
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
                        let tb = crate::cpu::soft::TB;
                        let w = crate::cpu::state::bank_width(dv);
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
                    let err = crate::analysis::metrics::max_abs_diff(&got, want) / maxabs(want);
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
        for isa in [Isa::SCALAR, crate::cpu::detected_isa()] {
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

/// Non-causal soft RACE with more or fewer keys than queries, through the backend contract:
/// the CPU kernels at every level against the f64 reference backend. (The blocked backward
/// once split the keys' gradients by the queries' segments: with fewer keys it panicked,
/// with more it left the last keys' `dk`, `dv` unwritten.)
#[test]
fn keys_and_queries_of_different_counts_match_the_reference() {
    use crate::backend::{Backend, RaceParams};
    let (heads, d, dv) = (2, 8, 5);
    let planes = PlanesF32::from_planes(&Planes::gaussian(Bits(3), Tables(2), d, Seed(9)).unwrap());
    let params = RaceParams::new(Bits(3), Tables(2), Beta(4.0)).unwrap();
    let reference = crate::attend::for_device(crate::backend::Device::Reference).unwrap();
    for (n, m) in [(9, 2), (5, 300), (300, 40), (1, 700)] {
        let q = data(heads * n * d, 61, 0.5).0;
        let k = data(heads * m * d, 62, 0.5).0;
        let v = data(heads * m * dv, 63, 1.0).0;
        let g = data(heads * n * dv, 64, 1.0).0;
        let (qh, kh, vh, gh) = (
            Heads::new(heads, n, d, &q).unwrap(),
            Heads::new(heads, m, d, &k).unwrap(),
            Heads::new(heads, m, dv, &v).unwrap(),
            Heads::new(heads, n, dv, &g).unwrap(),
        );
        let (rf, rg) = reference
            .forward_backward(&params, &planes, qh, kh, vh, gh)
            .unwrap();
        for isa in isas() {
            let cpu = super::super::CpuRace { isa };
            let (f, gr) = cpu
                .forward_backward(&params, &planes, qh, kh, vh, gh)
                .unwrap();
            let tag = format!("n={n} m={m} {isa:?}");
            let wide = |x: &[f32]| x.iter().map(|&a| a as f64).collect::<Vec<f64>>();
            let fo = rel_max_err(&wide(&f.o), &wide(&rf.o));
            assert!(fo <= FWD_TOL, "{tag}: forward {fo:.2e}");
            // Relative to the largest reference gradient, floored at 1e-3·max|G|·max|V| (as in
            // `soft_backward_matches_reference_gradients`).
            let floor = 1e-3 * maxabs(&wide(&g)) * maxabs(&wide(&v));
            for (name, a, b) in [
                ("dq", &gr.dq, &rg.dq),
                ("dk", &gr.dk, &rg.dk),
                ("dv", &gr.dv, &rg.dv),
            ] {
                let (a, b) = (wide(a), wide(b));
                let err = a
                    .iter()
                    .zip(&b)
                    .map(|(x, y)| (x - y).abs())
                    .fold(0.0, f64::max);
                let e = err / maxabs(&b).max(floor);
                assert!(e <= GRAD_TOL, "{tag} {name}: rel err {e:.2e}");
            }
        }
    }
}
