//! Production f32 kernels: rayon over (batch × heads × segments), SIMD with runtime dispatch
//! and an always-tested scalar twin ([`simd`]), two-level f32/f64 accumulation ([`state`]).
//!
//! - [`blocked`], [`blocked_causal`]: the production soft-RACE paths ([`soft_forward`],
//!   [`soft_grads`]): blocks of tokens as small register-tiled products ([`gemm`], bank read
//!   once per block), an AVX-512 projection kernel, the next block prefetched; causal as
//!   chunked linear attention; forward and backward, both ISAs tested against the reference;
//! - [`gemm`]: `D (=|+=) α A B` with strided `A` (so `Φᵀ` is free), written once over the
//!   [`simd::Simd`] primitives (AVX-512/AVX2 register tiles; the scalar twin);
//! - [`forward`]: the per-token engine for every "features, then sums over keys" estimator
//!   (soft RACE, hard LSH, linear, Performer), non-causal and causal (chunked scan), with the
//!   scalar/SIMD twins; [`backward`]: its soft-RACE gradients;
//! - [`decode`]: recurrent state with `step(q, k, v) -> o`;
//! - [`exact`]: blocked, SIMD, parallel softmax and angular attention (quadratic baselines);
//! - [`mem`]: prefetch of the next block, streaming stores of large outputs, aligned
//!   (huge-page) buffers.
//!
//! Memory: inputs, outputs and gradients plus `O(L·R·d)` state per head and segment, and
//! `2·L·P + 1` floats per token saved by the forward for the backward (the denominator and
//! `u = tanh(Wq)`, `u = tanh(Wk)`: 4–16 floats against `d = 128` for a row of Q); never an
//! `N × R × d` intermediate. Every kernel is tested against [`crate::reference`] on the same
//! (f32-rounded) planes.

pub mod backward;
pub mod bank16;
pub mod blocked;
pub mod blocked_causal;
pub mod decode;
pub mod exact;
pub mod features;
pub mod forward;
pub mod gemm;
pub mod mem;
pub mod recompute;
pub mod simd;
pub mod state;
pub mod stream;

pub use backward::{soft_backward, soft_backward_into, SoftGrads};
pub use features::{FeatureMap, HardMap, LinearMap, PerformerMap, PlanesF32, SoftMap};
pub use forward::{forward, forward_into, Ctx, ForwardOut};
pub use simd::{detected_isa, Isa};
pub use state::Heads;

/// Production soft-RACE forward: blocked GEMMs, [`blocked`] (non-causal) or
/// [`blocked_causal`] (chunked linear attention); rows whose denominator f32 cannot hold are
/// flagged by the kernel and recomputed exactly ([`recompute`], listed in
/// [`Ctx::recomputed`]); the returned count is the rows with no key at all. `reuse` is a previous context whose
/// buffers are recycled (`Ctx::default()` for none): a training loop or a benchmark then
/// does not pay fresh pages for the per-token saved values every step.
#[allow(clippy::too_many_arguments)]
pub fn soft_forward_into(
    map: &SoftMap,
    q: Heads,
    k: Heads,
    v: Heads,
    causal: bool,
    isa: Isa,
    o: &mut [f32],
    reuse: Ctx,
) -> (usize, Ctx) {
    let (flagged, mut ctx) = if causal {
        blocked_causal::forward_into(map, isa, q, k, v, o, reuse)
    } else {
        blocked::forward_into(map, isa, q, k, v, o, reuse)
    };
    let empty = recompute::finish_forward(map, q, k, v, causal, flagged, o, &mut ctx);
    (empty, ctx)
}

/// [`soft_forward_into`] allocating its output.
pub fn soft_forward(
    map: &SoftMap,
    q: Heads,
    k: Heads,
    v: Heads,
    causal: bool,
    isa: Isa,
) -> ForwardOut {
    let mut o = vec![0.0f32; q.heads * q.n * v.cols];
    let (empty_rows, ctx) = soft_forward_into(map, q, k, v, causal, isa, &mut o, Ctx::default());
    ForwardOut { o, empty_rows, ctx }
}

/// Production soft-RACE backward for a context from either forward path; the rows the
/// forward recomputed get their exact share of every gradient ([`recompute`]).
#[allow(clippy::too_many_arguments)]
pub fn soft_grads_into(
    map: &SoftMap,
    ctx: &Ctx,
    q: Heads,
    k: Heads,
    v: Heads,
    o: Heads,
    g: Heads,
    isa: Isa,
    dq: &mut [f32],
    dk: &mut [f32],
    dv: &mut [f32],
) -> f64 {
    let dbeta = if ctx.causal {
        blocked_causal::backward_into(map, isa, ctx, q, k, v, o, g, dq, dk, dv)
    } else {
        blocked::backward_into(map, isa, ctx, q, k, v, o, g, dq, dk, dv)
    };
    dbeta + recompute::finish_backward(map, ctx, q, k, v, g, dq, dk, dv)
}

/// [`soft_grads_into`] allocating its outputs.
#[allow(clippy::too_many_arguments)]
pub fn soft_grads(
    map: &SoftMap,
    ctx: &Ctx,
    q: Heads,
    k: Heads,
    v: Heads,
    o: Heads,
    g: Heads,
    isa: Isa,
) -> SoftGrads {
    let mut gr = SoftGrads::zeros(q, k, v);
    gr.dbeta = soft_grads_into(
        map, ctx, q, k, v, o, g, isa, &mut gr.dq, &mut gr.dk, &mut gr.dv,
    );
    gr
}
