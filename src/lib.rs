//! # racelab
//!
//! A numerical-analysis and theory-verification lab for RACE attention (Joshi et al.,
//! arXiv:2510.04008): exact softmax and angular attention, the hard-LSH estimator, soft RACE
//! (Algorithm 1 and causal Algorithm 2), linear attention and Performer, computed side by
//! side on the same inputs and hash planes.
//!
//! ## The maths in one place
//!
//! - Angular kernel `κ(q,k) = 1 − arccos(q̂ᵀk̂)/π`; P sign hashes collide with probability
//!   `κ^P`, so hard LSH estimates `κ^P`-attention.
//! - Soft RACE features `φ_l(x)_r = softmax_r(beta · tanh(W^(l)x)ᵀ v_r)` factorise into P
//!   sigmoids `a_p = σ(2 beta u_p)` ([`hashing`]).
//! - `Ô_i = Σ_l φ_l(q_i)ᵀ B_l / Σ_l φ_l(q_i)ᵀ A_l` with bucket masses `A_l` and value sums
//!   `B_l` ([`reference::race`]).
//!
//! ## Layout
//!
//! - [`reference`]: f64, literal, obviously correct estimators (the oracle);
//! - [`hashing`]: planes, soft features, hard codes; [`io`]: `.npy`; [`attend`]: dispatch.
//!
//! Notes proving or checking each claim live in `proofs-notes/`.

pub mod analysis;
pub mod attend;
pub mod backend;
pub mod bench;
pub mod cpu;
pub mod cuda;
pub mod distributed;
pub mod error;
pub mod experiments;
pub mod hashing;
pub mod io;
pub mod memory;
pub mod params;
pub mod plot;
pub mod provenance;
pub mod reference;
pub mod rng;
pub mod stats;
pub mod tensor;

pub use attend::{attend, AttendOptions, AttendResult, Method};
pub use backend::{Device, SoftRace};
pub use error::{RaceError, Result};
pub use hashing::Planes;
pub use params::{Combine, RaceParams};
pub use tensor::{Mat, MatRef, Tensor};
