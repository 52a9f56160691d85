//! Every CPU method at the edges of f32's range, against the f64 reference on the same inputs:
//! values near f32's largest (refused, naming `v` and `--device reference`, where the kernels'
//! sums would overflow; right where they hold), angular attention at large γ (weights scaled
//! by the row's largest), linear attention at large q/k (refused, naming `q`) and with
//! features that underflow (rows flagged and recomputed by the reference), subnormal inputs.
mod common;

use common::randn_t;
use racelab_core::attend::attend_with;
use racelab_core::params::{Beta, Bits, Seed, Tables};
use racelab_core::{AttendOptions, Device, FeatureSpec, Method, RaceError, Tensor};

fn methods() -> Vec<Method> {
    vec![
        Method::Softmax { scale: None },
        Method::Angular { gamma: 2.0 },
        Method::Hard {
            planes: racelab_core::PlaneSpec::Draw {
                p: 2,
                l: 2,
                seed: 0,
            },
        },
        Method::soft(Bits(2), Tables(2), Beta(4.0), Seed(0)),
        Method::Linear,
        Method::Performer {
            features: FeatureSpec::Draw { m: 32, seed: 0 },
            scale: None,
        },
    ]
}

fn scaled(t: &Tensor<f64>, s: f64) -> Tensor<f64> {
    Tensor {
        shape: t.shape.clone(),
        data: t.data.iter().map(|x| x * s).collect(),
    }
}

/// Inputs `[2, 64, 16]` and v `[2, 64, 8]`, each rounded to f32 (the kernels' type), so the
/// reference sees exactly what the kernels see.
fn inputs(seed: u64) -> [Tensor<f64>; 3] {
    let f32s = |t: Tensor<f64>| Tensor {
        shape: t.shape,
        data: t.data.iter().map(|&x| x as f32 as f64).collect(),
    };
    [
        f32s(randn_t(&[2, 64, 16], seed)),
        f32s(randn_t(&[2, 64, 16], seed + 1)),
        f32s(randn_t(&[2, 64, 8], seed + 2)),
    ]
}

/// The CPU kernels' output against the reference's: the worst entry over `max|v|` (an output
/// row is a weighted mean of value rows), every entry finite, the same empty rows.
fn against_reference(tag: &str, [q, k, v]: &[Tensor<f64>; 3], opts: &AttendOptions, tol: f64) {
    let r = attend_with(q, k, v, opts, Device::Reference).expect(tag);
    let c = attend_with(q, k, v, opts, Device::Cpu).unwrap_or_else(|e| panic!("{tag}: {e}"));
    assert!(
        c.o.data.iter().all(|x| x.is_finite()),
        "{tag}: non-finite output"
    );
    assert!(
        r.o.data.iter().all(|x| x.is_finite()),
        "{tag}: reference non-finite"
    );
    assert_eq!(c.empty_rows, r.empty_rows, "{tag}: empty rows");
    let vmax = v.data.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    let err =
        c.o.data
            .iter()
            .zip(&r.o.data)
            .fold(0.0f64, |m, (a, b)| m.max((a - b).abs()))
            / vmax;
    assert!(err <= tol, "{tag}: {err:e} > {tol:e}");
}

#[test]
fn values_near_f32s_largest_are_refused_where_the_sums_overflow_and_right_where_they_hold() {
    let [q, k, v] = inputs(1);
    for method in methods() {
        for causal in [false, true] {
            let opts = AttendOptions::new(method.clone()).causal(causal);
            let tag = format!("{} causal {causal}", method.name());
            // 3e38 / max|v|: a finite f32 V at the top of the range.
            let vmax = v.data.iter().fold(0.0f64, |m, x| m.max(x.abs()));
            let big = scaled(&v, 3e38 / vmax);
            let r = attend_with(&q, &k, &big, &opts, Device::Reference).expect(&tag);
            assert!(r.o.data.iter().all(|x| x.is_finite()), "{tag}: reference");
            match attend_with(&q, &k, &big, &opts, Device::Cpu) {
                Err(RaceError::Param { arg, msg }) => {
                    assert_eq!(arg, "v", "{tag}: {msg}");
                    assert!(
                        msg.contains(&racelab_core::error::setting("device", "reference")),
                        "{tag}: {msg}"
                    );
                }
                other => panic!("{tag}: expected a refusal naming v, got {other:?}"),
            }
            // 1e30: the sums hold (64 keys × 2 tables × 1e30 ≪ 3.4e38); the kernels are right.
            let held = [q.clone(), k.clone(), scaled(&v, 1e30 / vmax)];
            against_reference(&format!("{tag} v 1e30"), &held, &opts, 1e-5);
        }
    }
}

#[test]
fn angular_attention_is_right_at_large_gamma() {
    let x = inputs(2);
    for gamma in [64.0, 200.0, 300.0, 1000.0, 1e4] {
        for causal in [false, true] {
            let opts = AttendOptions::new(Method::Angular { gamma }).causal(causal);
            // κ = 1 − θ/π in f32 carries 2^-24 relative error, which γ multiplies in the
            // weights' exponent: the tolerance grows with γ.
            let tol = 1e-6 * gamma.max(10.0);
            against_reference(&format!("gamma {gamma} causal {causal}"), &x, &opts, tol);
        }
    }
}

#[test]
fn linear_attention_refuses_features_past_f32_and_recomputes_rows_that_underflow() {
    let [q, k, v] = inputs(3);
    let opts = AttendOptions::new(Method::Linear);
    // q and k of 1e18: the features' products pass f32's range (named: q or k, the larger).
    let e = attend_with(&scaled(&q, 1e18), &scaled(&k, 1e18), &v, &opts, Device::Cpu)
        .expect_err("refused");
    match e {
        RaceError::Param { arg, msg } => {
            assert!(arg == "q" || arg == "k", "{arg}: {msg}");
            assert!(
                msg.contains(&racelab_core::error::setting("device", "reference")),
                "{msg}"
            );
        }
        other => panic!("expected a refusal naming q or k, got {other:?}"),
    }
    // q and k of 1e6: the features are large and the kernel is right.
    let big = [scaled(&q, 1e6), scaled(&k, 1e6), v.clone()];
    against_reference("linear q, k ×1e6", &big, &opts, 1e-5);
    // Every entry of the first 5 query rows of each head at −120: their features e^{-120}
    // are below f32's range, the rows' denominators 0; they are flagged and recomputed.
    let mut low = q.clone();
    for h in 0..2 {
        for i in 0..5 {
            for c in 0..16 {
                low.data[(h * 64 + i) * 16 + c] = -120.0;
            }
        }
    }
    let x = [low, k.clone(), v.clone()];
    for causal in [false, true] {
        let opts = AttendOptions::new(Method::Linear).causal(causal);
        against_reference(&format!("underflow causal {causal}"), &x, &opts, 1e-5);
        let c = attend_with(&x[0], &x[1], &x[2], &opts, Device::Cpu).unwrap();
        assert_eq!(c.recomputed.rows.len(), 10, "causal {causal}");
    }
}

#[test]
fn subnormal_inputs_are_right_on_every_method() {
    let [q, k, v] = inputs(4);
    // q and k scaled into f32's subnormals keep their directions (angular, RACE); v
    // subnormal: every method's output is a weighted mean of subnormal rows.
    let tiny = 1e-40;
    let qs = scaled(&q, tiny);
    let ks = scaled(&k, tiny);
    let vs = scaled(&v, tiny);
    for method in methods() {
        let opts = AttendOptions::new(method.clone());
        let tag = method.name();
        // A value of 1e-40 holds f32's smallest step 1.4e-45 only: 1.4e-5 of its size (the
        // reference reads the unrounded f64 values).
        let x = [q.clone(), k.clone(), vs.clone()];
        against_reference(&format!("{tag} subnormal v"), &x, &opts, 1e-4);
        if matches!(
            method,
            Method::Angular { .. } | Method::Hard { .. } | Method::Soft { .. }
        ) {
            let x = [qs.clone(), ks.clone(), v.clone()];
            against_reference(&format!("{tag} subnormal q, k"), &x, &opts, 1e-4);
        }
    }
}
