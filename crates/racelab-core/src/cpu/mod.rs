//! Production f32 kernels: rayon over (batch × heads × segments), SIMD with runtime dispatch
//! and an always-tested scalar twin (`simd`), two-level f32/f64 accumulation (`state`).
//!
//! - `soft`: the production soft-RACE paths (`soft_forward`, `soft_backward`): blocks
//!   of tokens as small register-tiled products (`gemm`, bank read once per block), an
//!   AVX-512 projection kernel, the next block prefetched; causal as chunked linear attention;
//!   split by phase (bit probabilities, block workspace, banks, forward, backward, causal
//!   forward, causal backward);
//! - `token`: the per-token engine for every "features, then sums over keys" estimator:
//!   the production path of hard LSH, linear attention and Performer, and the soft-RACE
//!   *twin* (`token::forward`, `token::soft_backward`) that checks `soft`;
//! - `saved`: what a forward keeps for its backward (`Ctx`), shared by both engines;
//! - `recompute`: exact log-domain finish of the rows whose denominator f32 cannot hold;
//! - `gemm`: `D (=|+=) α A B` with strided `A` (so `Φᵀ` is free), written once over the
//!   `simd::Simd` primitives (AVX-512/AVX2 register tiles; the scalar twin);
//! - `decode`: recurrent state with `step(q, k, v) -> o`;
//! - `exact`: blocked, SIMD, parallel softmax and angular attention (quadratic baselines);
//! - `mem`: prefetch of the next block, streaming stores of large outputs, aligned
//!   (huge-page) buffers.
//!
//! Memory: inputs, outputs and gradients plus `O(L·R·d)` state per head and segment, and
//! `2·L·P + 1` floats per token saved by the forward for the backward (the denominator and
//! `u = tanh(Wq)`, `u = tanh(Wk)`: 4–16 floats against `d = 128` for a row of Q); never an
//! `N × R × d` intermediate. Every kernel is tested against [`crate::reference`] on the same
//! (f32-rounded) planes.
//!
//! What a caller outside the crate reaches is [`CpuRace`] (through the backend contract, which
//! checks shapes, planes and values before any kernel runs), [`Isa`], [`ABuf`] and the checked
//! constructors of [`SoftMap`]. The kernels' modules take shapes on trust and are the crate's
//! own (the unstable `bench-internals` feature opens `exact`, `gemm`, `simd` and `token` to
//! the developer tools); none of the calls that reached memory outside their buffers can be
//! written outside it:
//!
//! ```compile_fail
//! // gemm's strided operands (`Gemm { a: Strided { rs: 1 << 61, .. }, .. }.run(isa)`)
//! use racelab_core::cpu::gemm::{Gemm, Strided};
//! ```
//!
//! ```compile_fail
//! // `transpose_into(isa, &[1.0], 9, 1, 1 << 61, &mut [0.0; 9], 1)`
//! use racelab_core::cpu::gemm::transpose_into;
//! ```
//!
//! ```compile_fail
//! // `rows_combine(.., w = 1 << 61, ..)` through a user `Kernel` and `dispatch`
//! use racelab_core::cpu::simd::{dispatch, Kernel};
//! ```
//!
//! ```compile_fail
//! // `Behind::produce(usize::MAX - 3, 4, ..)` and overlapping ranges
//! use racelab_core::cpu::mem::{Behind, Out};
//! ```
//!
//! and the one buffer type that stays public sizes its allocation without wrapping:
//!
//! ```
//! let too_many = (usize::MAX >> 2) + 2; // 4 bytes each: wraps to 4 in usize arithmetic
//! assert!(std::panic::catch_unwind(|| racelab_core::cpu::ABuf::zeroed(too_many)).is_err());
//! let b = racelab_core::cpu::ABuf::zeroed(3);
//! assert_eq!(&b[..], &[0.0; 3]);
//! ```
//!
//! (The same calls inside the crate are refused at run time: `cpu::extent`'s tests.)

#![deny(missing_docs)]
// Off x86-64 the AVX-512 fast paths are configured out, and with them the helpers and
// imports only they use; the portable paths run there (NEON through LLVM's vectoriser).
#![cfg_attr(
    not(target_arch = "x86_64"),
    allow(unused_imports, dead_code, unused_variables)
)]

// The kernels and their helpers are the crate's own: what a caller reaches is the operator
// behind the backend contract ([`CpuRace`]), the proof of an instruction set ([`Isa`]) and
// the aligned output buffer ([`ABuf`]). Each of these checks what it is given before any
// unchecked access; the modules below trust their (crate-internal) callers' shapes.
pub(crate) mod bank16;
pub(crate) mod decode;
pub(crate) mod extent;
pub(crate) mod features;
pub mod machine;
pub(crate) mod mem;
pub(crate) mod native;
mod partial;
pub(crate) mod recompute;
pub(crate) mod saved;
pub(crate) mod soft;
pub(crate) mod state;
#[cfg(test)]
mod tests;
pub(crate) mod v16;

/// Modules the developer tools (this crate's `examples/gemm_micro.rs`, the lab's
/// `examples/timing.rs` and `benches/kernels.rs`) time directly: public only with the `bench-internals` feature, which
/// is unstable and not part of the crate's contract (these take shapes on trust).
macro_rules! bench_internals {
    ($($(#[$doc:meta])* $m:ident),* $(,)?) => {$(
        $(#[$doc])*
        #[cfg(feature = "bench-internals")]
        // Unstable tools' access, outside the documented contract.
        #[allow(missing_docs)]
        pub mod $m;
        $(#[$doc])*
        #[cfg(not(feature = "bench-internals"))]
        pub(crate) mod $m;
    )*};
}
bench_internals!(exact, gemm, simd, token);

pub use exact::Exact;
pub(crate) use features::{FeatureMap, HardMap, LinearMap, SoftMap};
pub use mem::ABuf;
pub use partial::SliceSaved;
pub(crate) use saved::{Ctx, ForwardOut};
pub use simd::{detected_isa, Isa, Level};

use crate::backend::{
    Backend, BackwardInputs, Decode, Device, Forward, ForwardInputs, GradsMut, Heads, PlanesF32,
    Problem, RaceParams, Saved, SoftGrads,
};
use crate::error::{RaceError, Result};

/// Production soft-RACE forward: blocked GEMMs, [`soft::forward_into`] (non-causal) or
/// [`soft::causal_forward_into`] (chunked linear attention); rows whose denominator f32 cannot hold are
/// flagged by the kernel and recomputed exactly ([`recompute`], listed in
/// [`Ctx::recomputed`]); the returned count is the rows with no key at all. `reuse` is a previous context whose
/// buffers are recycled (`Ctx::default()` for none): a training loop or a benchmark then
/// does not pay fresh pages for the per-token saved values every step.
pub(crate) fn soft_forward_into(
    map: &SoftMap,
    x: ForwardInputs,
    causal: bool,
    isa: Isa,
    o: &mut [f32],
    reuse: Ctx,
) -> (usize, Ctx) {
    let ForwardInputs { q, k, v } = x;
    let (flagged, mut ctx) = if causal {
        soft::causal_forward_into(map, isa, q, k, v, o, reuse)
    } else {
        soft::forward_into(map, isa, q, k, v, o, reuse)
    };
    let empty = recompute::finish_forward(map, x, causal, flagged, o, &mut ctx);
    (empty, ctx)
}

/// Exact softmax or angular attention (`kind`) with the production f32 kernels at `isa`:
/// `O = normalise(w(Q, K)) V` with `w` the exponentiated scaled logits or `κ^γ`, causal
/// (query i sees keys `0..=i`) or not; `[heads, n, dv]` row-major. `q` and `k` are
/// `[heads, n, d]` and `[heads, nk, d]`, `v` `[heads, nk, dv]`; shapes that disagree (or a
/// causal problem whose query and key counts differ) are refused, naming the argument.
pub fn exact_forward(
    kind: Exact,
    q: Heads,
    k: Heads,
    v: Heads,
    causal: bool,
    isa: Isa,
) -> Result<Vec<f32>> {
    let refuse = |arg: &str, msg: String| Err(RaceError::param(arg, msg));
    if k.heads != q.heads || v.heads != q.heads {
        return refuse(
            "k",
            format!(
                "q, k and v have {}, {} and {} heads; give each the same head count",
                q.heads, k.heads, v.heads
            ),
        );
    }
    if k.cols != q.cols {
        return refuse(
            "k",
            format!(
                "q rows have d = {}, k rows {}; give both the same width",
                q.cols, k.cols
            ),
        );
    }
    if v.n != k.n {
        return refuse(
            "v",
            format!("k has {} rows, v {}; give one value row per key", k.n, v.n),
        );
    }
    if causal && q.n != k.n {
        return refuse(
            "causal",
            format!(
                "causal attention needs as many queries as keys (got {} and {})",
                q.n, k.n
            ),
        );
    }
    Ok(exact::exact_attention(kind, q, k, v, causal, isa))
}

/// [`soft_forward_into`] allocating its output.
#[cfg(test)]
pub(crate) fn soft_forward(
    map: &SoftMap,
    q: Heads,
    k: Heads,
    v: Heads,
    causal: bool,
    isa: Isa,
) -> ForwardOut {
    let mut o = vec![0.0f32; q.heads * q.n * v.cols];
    let x = ForwardInputs::new(q, k, v);
    let (empty_rows, ctx) = soft_forward_into(map, x, causal, isa, &mut o, Ctx::default());
    ForwardOut { o, empty_rows, ctx }
}

/// Production soft-RACE backward for a context from either forward path; the rows the
/// forward recomputed get their exact share of every gradient ([`recompute`]).
pub(crate) fn soft_backward_into(
    map: &SoftMap,
    ctx: &Ctx,
    x: BackwardInputs,
    isa: Isa,
    out: GradsMut,
) -> f64 {
    let mut out = out;
    let dbeta = if ctx.causal {
        soft::causal_backward_into(map, isa, ctx, x, out.reborrow())
    } else {
        soft::backward_into(map, isa, ctx, x, out.reborrow())
    };
    dbeta + recompute::finish_backward(map, ctx, x, out)
}

/// [`soft_backward_into`] allocating its outputs.
#[cfg(test)]
pub(crate) fn soft_backward(map: &SoftMap, ctx: &Ctx, x: BackwardInputs, isa: Isa) -> SoftGrads {
    let mut gr = SoftGrads::zeros(x.q, x.k, x.v);
    gr.dbeta = soft_backward_into(map, ctx, x, isa, gr.as_mut());
    gr
}

/// The production CPU kernels behind the backend contract ([`crate::backend::Backend`]),
/// at one ISA (detected at run time).
#[derive(Debug, Clone, Copy)]
pub struct CpuRace {
    /// The instruction set the kernels run at.
    pub isa: Isa,
}

impl CpuRace {
    /// The kernels at the ISA detection chose ([`detected_isa`]).
    pub fn detected() -> Self {
        CpuRace {
            isa: detected_isa(),
        }
    }

    /// The kernels' map for `params` on `planes` ([`SoftMap::for_params`]).
    pub(crate) fn map<'a>(params: &RaceParams, planes: &'a PlanesF32) -> Result<SoftMap<'a>> {
        SoftMap::for_params(params, planes)
    }
}

impl Backend for CpuRace {
    fn device(&self) -> Device {
        Device::Cpu
    }

    fn forward(
        &self,
        params: &RaceParams,
        planes: &PlanesF32,
        q: Heads,
        k: Heads,
        v: Heads,
    ) -> Result<Forward> {
        let pb = Problem::new(params, planes, q, k, v)?;
        let mut o = vec![0.0f32; pb.output_len()];
        let saved = self.forward_into(&pb, &mut o, Saved::default())?;
        Ok(Forward {
            o,
            empty_rows: saved.empty_rows,
            recomputed: saved.recomputed,
        })
    }

    fn forward_backward(
        &self,
        params: &RaceParams,
        planes: &PlanesF32,
        q: Heads,
        k: Heads,
        v: Heads,
        g: Heads,
    ) -> Result<(Forward, SoftGrads)> {
        let pb = Problem::with_grad(params, planes, q, k, v, g)?;
        let mut o = vec![0.0f32; pb.output_len()];
        let saved = self.forward_into(&pb, &mut o, Saved::default())?;
        let mut grads = SoftGrads::zeros(q, k, v);
        grads.dbeta = self.backward_into(&pb, &saved, &o, grads.as_mut())?;
        let fwd = Forward {
            o,
            empty_rows: saved.empty_rows,
            recomputed: saved.recomputed,
        };
        Ok((fwd, grads))
    }

    /// The production forward (`soft_forward_into`); the state it saves is a `Ctx`, and a
    /// `reuse` holding one has its buffers recycled.
    fn forward_into(&self, pb: &Problem, o: &mut [f32], reuse: Saved) -> Result<Saved> {
        let map = Self::map(pb.params(), pb.planes())?;
        pb.check_output("o", o)?;
        let reuse = reuse.into_state::<Ctx>().unwrap_or_default();
        let causal = pb.params().causal;
        let (empty, ctx) = soft_forward_into(&map, pb.inputs(), causal, self.isa, o, reuse);
        Ok(Saved::new(empty, ctx.recomputed.clone(), ctx))
    }

    /// The production backward (`soft_backward_into`) from the `Ctx` of a forward on the
    /// same problem.
    fn backward_into(
        &self,
        pb: &Problem,
        saved: &Saved,
        o: &[f32],
        grads: GradsMut,
    ) -> Result<f64> {
        let map = Self::map(pb.params(), pb.planes())?;
        let x = pb.backward_inputs(o, &grads)?;
        let ctx = saved.state::<Ctx>().ok_or_else(|| {
            RaceError::param(
                "saved",
                "this context is not from a CPU forward; pass the one CpuRace::forward_into returned",
            )
        })?;
        if ctx.causal != pb.params().causal || ctx.den.len() != x.q.heads * x.q.n {
            return Err(RaceError::param(
                "saved",
                format!(
                    "the context is from a {} forward over {} rows, the problem is {} over {}; \
                     pass the context of this problem's forward",
                    if ctx.causal { "causal" } else { "non-causal" },
                    ctx.den.len(),
                    if pb.params().causal {
                        "causal"
                    } else {
                        "non-causal"
                    },
                    x.q.heads * x.q.n
                ),
            ));
        }
        Ok(soft_backward_into(&map, ctx, x, self.isa, grads))
    }

    fn decoder(
        &self,
        params: &RaceParams,
        planes: &PlanesF32,
        dv: usize,
    ) -> Result<Box<dyn Decode>> {
        Self::map(params, planes)?;
        crate::backend::decoder_fits(params, dv)?;
        Ok(Box::new(decode::Decoder::new(
            planes.clone(),
            params.beta as f32,
            dv,
        )?))
    }
}
