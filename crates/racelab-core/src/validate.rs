//! The one validation every entry point makes before it allocates: [`check`].
//!
//! `attend` (library and command line), every backend of the soft-RACE contract (through
//! [`crate::backend::check`]), the Python binding, `bench` and `--distributed` all reach it. In
//! order:
//!
//! 1. the method's own options ([`Method::check`]: P, L, β, γ, the Performer's features, the
//!    logit scale, given planes or features of the inputs' `d`);
//! 2. the shapes of `q` `[.., N, d]`, `k` `[.., M, d]`, `v` `[.., M, dv]` (and the upstream
//!    gradient `g`, shaped like the output), no empty axis, `N = M` when causal;
//! 3. finiteness of every input;
//! 4. for the angular methods (angular, hard LSH), no zero row (an angle needs a direction);
//!    for softmax and the Performer, logits that the kernels' type holds: `|s·qᵀk| ≤
//!    s·‖q‖·‖k‖` (softmax) and `|ωᵀx' − ‖x'‖²/2| ≤ s·‖x‖²/2 + √s·‖ω‖·‖x‖` with `x' = √s·x`
//!    (Performer), each at most a quarter of the type's largest value, so that the shift by the
//!    largest logit cannot overflow either (an overflowing logit made NaN rows);
//! 5. for the f32 kernels, the hashing methods' projections `|w·x| ≤ ‖w‖·√d·max|x|` within a
//!    quarter of f32's largest value, and values whose weighted sums f32 holds (the
//!    magnitudes come from step 3's scan): every method's kernels add
//!    `w_ij·v_j` with the weights' sum bounded by `W` (keys `M`, tables `L`): `L·M` for soft
//!    RACE and hard LSH (each key's features sum to 1 per table), `M` for softmax, angular
//!    (weights scaled to at most 1 by the row's largest) and the Performer (features shifted
//!    to at most `1/√m`), `M·max_i Σ_c(|q_ic| + 1)·(max|k| + 1)` for linear attention
//!    (`elu(x) + 1 ≤ |x| + 1`); `W·max(1, max|v|)`, times `dv·max|g|` for a backward's
//!    `G_i·B_r`, must be at most a quarter of f32's largest value (V near f32's limit made
//!    every row of every method non-finite);
//! 6. memory: the call's estimate ([`crate::memory::Work`]) against `--max-memory` or what the
//!    machine has available, less what the caller already holds in the kernels' type
//!    ([`Held`]).

#![deny(missing_docs)]

use crate::error::{RaceError, Result};
use crate::memory::{Kernels, Work};
use crate::method::{FeatureSpec, Method, MethodKind, PlaneSpec};
use crate::tensor::{check_finite_max, check_nonzero_rows, qkv_shape, AttnShape, TensorRef};

/// What a caller already holds in memory as the kernels read it, which the estimate does not
/// count again.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Held {
    /// Nothing: every buffer is counted (`attend` copies or converts its inputs).
    #[default]
    Nothing,
    /// The f32 inputs `q`, `k`, `v` (and `g`) handed to an f32 backend.
    Inputs,
    /// The inputs, the forward's output and what it saved: a backward after its forward.
    Forward,
}

/// What memory a call may use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Budget {
    /// Bytes (`None`: what the machine has available).
    pub max_memory: Option<u64>,
    /// What the caller already holds (not counted again).
    pub held: Held,
}

impl Budget {
    /// The machine's available memory, with `held` already in it.
    pub fn holding(held: Held) -> Self {
        Budget {
            max_memory: None,
            held,
        }
    }
    /// No memory check (a caller that counts memory itself).
    pub fn unchecked() -> Self {
        Budget {
            max_memory: Some(u64::MAX),
            held: Held::Inputs,
        }
    }
}

/// One call, as the validation sees it.
#[derive(Debug, Clone, Copy)]
pub struct Call<'c, 'a, T> {
    /// The operator and its options.
    pub method: &'c Method,
    /// Causal masking (soft RACE: Algorithm 2).
    pub causal: bool,
    /// Queries `[.., N, d]`.
    pub q: &'c TensorRef<'a, T>,
    /// Keys `[.., M, d]`.
    pub k: &'c TensorRef<'a, T>,
    /// Values `[.., M, dv]`.
    pub v: &'c TensorRef<'a, T>,
    /// The upstream gradient `∂ℓ/∂Ô` of a backward, shaped like the output.
    pub g: Option<&'c TensorRef<'a, T>>,
    /// Which kernels compute (their buffers are what is counted).
    pub kernels: Kernels,
    /// The memory the call may use.
    pub budget: Budget,
}

/// A call that passed [`check`]: its shapes and its memory estimate.
#[derive(Debug, Clone, Copy)]
pub struct Checked {
    /// The validated shapes.
    pub shape: AttnShape,
    /// What the call will allocate.
    pub work: Work,
    /// The largest magnitude in `v` (from the finiteness scan).
    pub vmax: f64,
}

/// What `method` asks of `kernels` on inputs of `shape` (forward, or with `backward`).
pub fn work(
    method: &Method,
    shape: &AttnShape,
    causal: bool,
    backward: bool,
    kernels: Kernels,
) -> Work {
    let (p, l, map_features) = method.work_terms(shape.d);
    Work {
        method: method.name(),
        kernels,
        p,
        l,
        heads: shape.batch * shape.heads,
        n: shape.n,
        m: shape.m,
        d: shape.d,
        dv: shape.dv,
        map_features,
        quadratic: method.kind().quadratic(),
        backward,
        causal,
    }
}

/// The validation (module docs): the first problem found, as an error naming the argument
/// and the fix.
pub fn check<T: Copy + Into<f64> + Sync>(c: Call<'_, '_, T>) -> Result<Checked> {
    c.method.check(None)?;
    let shape = qkv_shape(c.q, c.k, c.v, c.causal)?;
    // Finiteness, and the magnitudes step 5 bounds, in one pass over each input.
    let top = [
        check_finite_max("q", c.q.data)?,
        check_finite_max("k", c.k.data)?,
        check_finite_max("v", c.v.data)?,
    ];
    c.method.check(Some(shape.d))?;
    if let Some(g) = c.g {
        let mut want = c.q.shape.clone();
        *want.last_mut().expect("q has a last axis") = shape.dv;
        if g.shape != want {
            return Err(RaceError::shape(
                "g",
                format!("g is {:?} but the output is {want:?}", g.shape),
            ));
        }
    }
    let gmax = c.g.map(|g| check_finite_max("g", g.data)).transpose()?;
    if matches!(c.method.kind(), MethodKind::Angular | MethodKind::Hard) {
        for (h, (qm, km)) in
            c.q.heads("q")?
                .iter()
                .zip(c.k.heads("k")?.iter())
                .enumerate()
        {
            check_nonzero_rows(&format!("q (head {h})"), *qm)?;
            check_nonzero_rows(&format!("k (head {h})"), *km)?;
        }
    }
    check_logit_range(&c, shape.d)?;
    check_value_range(&c, &shape, top, gmax)?;
    let work = work(c.method, &shape, c.causal, c.g.is_some(), c.kernels);
    let held = match c.budget.held {
        Held::Nothing => 0,
        Held::Inputs => work.resident_input_bytes(false),
        Held::Forward => work
            .resident_input_bytes(true)
            .saturating_add(work.saved_bytes()),
    };
    let need = work.bytes().saturating_sub(held);
    crate::memory::check_need(&work, need, c.budget.max_memory)?;
    Ok(Checked {
        shape,
        work,
        vmax: top[2],
    })
}

/// Values whose weighted sums the f32 kernels hold (module docs, step 5).
fn check_value_range<T: Copy + Into<f64> + Sync>(
    c: &Call<'_, '_, T>,
    shape: &AttnShape,
    [qmax, kmax, vmax]: [f64; 3],
    gmax: Option<f64>,
) -> Result<()> {
    if c.kernels != Kernels::F32 {
        return Ok(());
    }
    let keys = shape.m as f64;
    let largest = f32::MAX as f64;
    // The hashing methods project q and k onto the planes in f32: `|w·x| ≤ ‖w‖·‖x‖ ≤
    // ‖w‖·√d·max|x|` (the entries' largest magnitude, from the finiteness scan: no pass more).
    if let Method::Soft { planes, .. } | Method::Hard { planes } = c.method {
        let d = shape.d;
        let w = match planes {
            PlaneSpec::Given(w) => max_row_norm(&w.w, d),
            // Drawn rows are N(0, I_d): ‖w‖ ≤ √d + 8 but with probability below e^-32.
            PlaneSpec::Draw { .. } => (d as f64).sqrt() + 8.0,
        };
        for (arg, x) in [("q", qmax), ("k", kmax)] {
            let reach = w * (d as f64).sqrt() * x;
            if !(reach.is_finite() && reach <= largest / 4.0) {
                return Err(RaceError::param(
                    arg,
                    format!(
                        "its projections onto the planes can reach {reach:.3e} (entries of {arg} \
                         up to {x:.3e}, d = {d}, planes' rows up to norm {w:.3e}), past a \
                         quarter of f32's largest value ({largest:.3e}), where the f32 \
                         kernels' sums overflow; use {} (f64)",
                        crate::error::setting("device", "reference")
                    ),
                ));
            }
        }
    }
    // Linear attention's q factor per coordinate, against k's (which to name).
    let mut q_factor = 0.0;
    let (weights, why) = match c.method {
        Method::Soft { planes, .. } | Method::Hard { planes } => {
            let l = planes.pl().1 as f64;
            (
                l * keys,
                format!(
                    "{} tables × {} keys, each key's features summing to 1",
                    l, shape.m
                ),
            )
        }
        Method::Softmax { .. } | Method::Angular { .. } | Method::Performer { .. } => {
            (keys, format!("{} keys of weight at most 1", shape.m))
        }
        Method::Linear => {
            let d = shape.d.max(1);
            let q1 =
                c.q.data
                    .chunks_exact(d)
                    .map(|r| r.iter().map(|&x| x.into().abs() + 1.0).sum::<f64>())
                    .fold(0.0, f64::max);
            let k = kmax + 1.0;
            q_factor = q1 / shape.d as f64;
            (
                keys * q1 * k,
                format!(
                    "{} keys weighted by elu(q)+1 · elu(k)+1 ≤ {q1:.3e} × {k:.3e} (q's largest \
                     row 1-norm plus d, k's largest entry plus 1)",
                    shape.m
                ),
            )
        }
    };
    let gfac = gmax.map_or(1.0, |g| (shape.dv as f64 * g).max(1.0));
    let reach = weights * vmax.max(1.0) * gfac;
    if reach.is_finite() && reach <= largest / 4.0 {
        return Ok(());
    }
    let arg = if matches!(c.method, Method::Linear) && weights > largest / 4.0 {
        // The larger of the two factors is the one to name.
        if q_factor >= kmax + 1.0 {
            "q"
        } else {
            "k"
        }
    } else if gfac > 1.0 && weights * vmax.max(1.0) <= largest / 4.0 {
        "g"
    } else {
        "v"
    };
    let reference = crate::error::setting("device", "reference");
    let fix = match arg {
        "q" | "k" => {
            format!("use {reference} (f64): linear attention changes when q or k is rescaled")
        }
        "g" => format!("scale g down (the gradients are linear in g) or use {reference} (f64)"),
        _ => format!("scale v down (the output is linear in v) or use {reference} (f64)"),
    };
    Err(RaceError::param(
        arg,
        format!(
            "{} on the f32 kernels sums weighted values up to about {reach:.3e} ({why}; v up to \
             {vmax:.3e}{}), past a quarter of f32's largest value ({largest:.3e}), where its \
             sums would overflow; {fix}",
            c.method.name(),
            if gfac > 1.0 {
                format!(", × dv·max|g| = {gfac:.3e}")
            } else {
                String::new()
            }
        ),
    ))
}

/// The largest row norm of `data` (rows of `d`).
/// The largest row norm of `data` (rows of `d`); NaN if any entry is NaN (`f64::max` would
/// drop it, and a NaN row would then pass as a norm of 0).
fn max_row_norm<T: Copy + Into<f64>>(data: &[T], d: usize) -> f64 {
    data.chunks_exact(d.max(1))
        .map(|r| r.iter().map(|&x| x.into() * x.into()).sum::<f64>().sqrt())
        .fold(0.0, |a: f64, b| if a.is_nan() || b > a { b } else { a })
}

/// Softmax's and the Performer's logits within the kernels' type (module docs, step 4).
fn check_logit_range<T: Copy + Into<f64> + Sync>(c: &Call<'_, '_, T>, d: usize) -> Result<()> {
    let (scale, omega_norm) = match c.method {
        Method::Softmax { scale } => (*scale, None),
        Method::Performer { features, scale } => {
            // Drawn rows are N(0, I_d): ‖ω‖ ≤ √d + 8 but with probability below e^-32.
            let w = match features {
                FeatureSpec::Given(w) => max_row_norm(&w.data, d),
                FeatureSpec::Draw { .. } => (d as f64).sqrt() + 8.0,
            };
            (*scale, Some(w))
        }
        _ => return Ok(()),
    };
    let s = scale.unwrap_or(1.0 / (d as f64).sqrt());
    let (qn, kn) = (max_row_norm(c.q.data, d), max_row_norm(c.k.data, d));
    let bound = match omega_norm {
        None => s * qn * kn,
        Some(w) => {
            let x = qn.max(kn);
            0.5 * s * x * x + s.sqrt() * w * x
        }
    };
    let largest = match c.kernels {
        Kernels::Reference => f64::MAX,
        Kernels::F32 => f32::MAX as f64,
    };
    if bound.is_finite() && bound <= largest / 4.0 && s <= largest / 4.0 {
        return Ok(());
    }
    let given = if scale.is_some() {
        format!("scale = {s:e}")
    } else {
        format!("the default scale 1/sqrt(d) = {s:e}")
    };
    Err(RaceError::param(
        "scale",
        format!(
            "the logits reach about {bound:.3e} ({given}, rows of q up to norm {qn:.3e}, of k up \
             to {kn:.3e}), past a quarter of the largest value {} hold ({largest:.3e}); use a \
             smaller {} or rescale q and k",
            c.kernels.name(),
            crate::error::arg("scale")
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::{Beta, Bits, Seed, Tables};

    fn call<'c, 'a>(
        method: &'c Method,
        qkv: &'c [TensorRef<'a, f64>; 3],
        budget: Budget,
    ) -> Result<Checked> {
        check(Call {
            method,
            causal: false,
            q: &qkv[0],
            k: &qkv[1],
            v: &qkv[2],
            g: None,
            kernels: Kernels::F32,
            budget,
        })
    }

    #[test]
    fn options_shapes_finiteness_and_memory_are_each_refused() {
        let ones = vec![1.0f64; 4 * 8];
        let t = |n: usize, d: usize| TensorRef::new("x", vec![n, d], &ones[..n * d]).unwrap();
        let good = [t(4, 8), t(4, 8), t(4, 8)];
        let soft = Method::soft(Bits(2), Tables(2), Beta(1.0), Seed(0));
        assert!(call(&soft, &good, Budget::default()).is_ok());
        let perf0 = Method::Performer {
            features: FeatureSpec::Draw { m: 0, seed: 0 },
            scale: None,
        };
        let e = call(&perf0, &good, Budget::default()).unwrap_err();
        assert!(e.to_string().contains("features"), "{e}");
        let e = call(&soft, &[t(4, 8), t(4, 4), t(4, 8)], Budget::default()).unwrap_err();
        assert!(e.to_string().contains("k"), "{e}");
        let mut nan = ones.clone();
        nan[3] = f64::NAN;
        let bad = [
            TensorRef::new("q", vec![4, 8], &nan).unwrap(),
            t(4, 8),
            t(4, 8),
        ];
        assert!(matches!(
            call(&soft, &bad, Budget::default()),
            Err(RaceError::NonFinite { .. })
        ));
        let tight = Budget {
            max_memory: Some(16),
            held: Held::Nothing,
        };
        assert!(matches!(
            call(&soft, &good, tight),
            Err(RaceError::TooLarge(_))
        ));
    }

    #[test]
    fn logits_past_the_kernels_type_are_refused_by_scale() {
        let ones = vec![1.0f64; 4 * 8];
        let t = || TensorRef::new("x", vec![4, 8], &ones[..]).unwrap();
        let qkv = [t(), t(), t()];
        let run = |method: Method, kernels: Kernels| {
            check(Call {
                method: &method,
                causal: false,
                q: &qkv[0],
                k: &qkv[1],
                v: &qkv[2],
                g: None,
                kernels,
                budget: Budget::default(),
            })
        };
        let softmax = |s: f64| Method::Softmax { scale: Some(s) };
        let performer = |s: f64| Method::Performer {
            features: FeatureSpec::Draw { m: 4, seed: 0 },
            scale: Some(s),
        };
        // Rows of norm √8: softmax logits up to 8·s, the Performer's up to 4·s + √s·(√8+8)·√8.
        for kernels in [Kernels::F32, Kernels::Reference] {
            assert!(run(softmax(1e3), kernels).is_ok());
            assert!(run(performer(1e3), kernels).is_ok());
        }
        assert!(run(softmax(1e36), Kernels::Reference).is_ok());
        for (m, kernels) in [
            (softmax(1e38), Kernels::F32),
            (performer(1e38), Kernels::F32),
            (softmax(1e308), Kernels::Reference),
            (performer(2e307), Kernels::Reference),
        ] {
            let e = run(m.clone(), kernels).unwrap_err().to_string();
            assert!(
                e.contains("invalid parameter `scale`") && e.contains("smaller `scale`"),
                "{m:?}: {e}"
            );
        }
    }
}
