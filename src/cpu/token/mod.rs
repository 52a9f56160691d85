//! The per-token engine for every "features, then sums over keys" estimator,
//! `O_i = φ(q_i)ᵀ B / φ(q_i)ᵀ A` with `A = Σ_j φ(k_j)`, `B = Σ_j φ(k_j) v_jᵀ`: the production
//! path of hard LSH, linear attention and Performer ([`forward`]), and the soft-RACE twin of
//! [`crate::cpu::soft`] (the same [`forward`] with a [`SoftMap`](crate::cpu::SoftMap), and
//! [`soft_backward`]), written token by token so the blocked paths have an independent check.

pub mod backward;
pub mod forward;

pub use backward::{soft_backward, soft_backward_into};
pub use forward::{forward, forward_into};
