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
//! 5. memory: the call's estimate ([`crate::memory::Work`]) against `--max-memory` or what the
//!    machine has available, less what the caller already holds in the kernels' type
//!    ([`Held`]).

use crate::error::{RaceError, Result};
use crate::memory::{Kernels, Work};
use crate::method::{Method, MethodKind};
use crate::tensor::{check_finite, check_nonzero_rows, check_qkv, AttnShape, TensorRef};

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
    pub method: &'c Method,
    pub causal: bool,
    pub q: &'c TensorRef<'a, T>,
    pub k: &'c TensorRef<'a, T>,
    pub v: &'c TensorRef<'a, T>,
    /// The upstream gradient `∂ℓ/∂Ô` of a backward, shaped like the output.
    pub g: Option<&'c TensorRef<'a, T>>,
    pub kernels: Kernels,
    pub budget: Budget,
}

/// A call that passed [`check`]: its shapes and its memory estimate.
#[derive(Debug, Clone, Copy)]
pub struct Checked {
    pub shape: AttnShape,
    pub work: Work,
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
    let shape = check_qkv(c.q, c.k, c.v, c.causal)?;
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
        check_finite("g", g.data)?;
    }
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
    Ok(Checked { shape, work })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::method::FeatureSpec;

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
        let soft = Method::soft(2, 2, 1.0, 0);
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
}
