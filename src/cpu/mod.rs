//! Production f32 kernels: rayon over (batch × heads × segments), SIMD with runtime dispatch
//! and an always-tested scalar twin ([`simd`]), two-level f32/f64 accumulation ([`state`]).
//!
//! - [`forward`]: the engine for every "features, then sums over keys" estimator (soft RACE,
//!   hard LSH, linear, Performer), non-causal and causal (chunked scan);
//! - [`backward`]: soft-RACE gradients for Q, K, V and beta, non-causal and causal;
//! - [`decode`]: recurrent state with `step(q, k, v) -> o`;
//! - [`exact`]: blocked, SIMD, parallel softmax and angular attention (quadratic baselines).
//!
//! Memory: inputs, outputs and gradients plus `O(L·R·d)` state per head and segment; never an
//! `N × R × d` intermediate. Every kernel is tested against [`crate::reference`] on the same
//! (f32-rounded) planes.

pub mod backward;
pub mod decode;
pub mod exact;
pub mod features;
pub mod forward;
pub mod simd;
pub mod state;
pub mod stream;

pub use backward::{soft_backward, soft_backward_into, SoftGrads};
pub use features::{FeatureMap, HardMap, LinearMap, PerformerMap, PlanesF32, SoftMap};
pub use forward::{forward, forward_into, Ctx, ForwardOut};
pub use simd::{detected_isa, Isa};
pub use state::Heads;
