//! The per-token engine for every "features, then sums over keys" estimator,
//! `O_i = φ(q_i)ᵀ B / φ(q_i)ᵀ A` with `A = Σ_j φ(k_j)`, `B = Σ_j φ(k_j) v_jᵀ`: the production
//! path of hard LSH, linear attention and Performer ([`forward`]), and the soft-RACE twin of
//! [`crate::cpu::soft`] (the same [`forward`] with a [`SoftMap`](crate::shared::SoftMap), and
//! [`soft_backward`]), written token by token so the blocked paths have an independent check.

// The twin's backward checks the blocked backward in the tests; the developer tools time it.
#[cfg(any(test, feature = "bench-internals"))]
pub mod backward;
pub mod forward;

#[cfg(any(test, feature = "bench-internals"))]
pub use backward::soft_backward;
#[cfg(feature = "bench-internals")]
pub use backward::soft_backward_into;
pub use forward::forward;
#[cfg(feature = "bench-internals")]
pub use forward::forward_into;
