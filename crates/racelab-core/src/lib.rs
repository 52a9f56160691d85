//! # racelab-core
//!
//! RACE attention (Joshi et al., arXiv:2510.04008) as operators a program can hold: exact
//! softmax and angular attention, the hard-LSH estimator, soft RACE (Algorithm 1 and causal
//! Algorithm 2), linear attention and Performer, computed on the same inputs and hash planes,
//! on an f64 reference, the production f32 CPU kernels or (feature `cuda`) the CUDA kernels.
//! Sequence parallelism over ranks is the `racelab-dist` crate (through [`shared::Partial`]);
//! the lab built on both (experiments, verdicts, figures, benchmarks, the command line) is
//! the `racelab` crate.
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
//! ## Use
//!
//! Each method is an operator object ([`op`]): built by a validating constructor, run on
//! ndarray views of any rank 2 to 4, f32 or f64, the output in the inputs' rank and type.
//!
//! ```
//! use ndarray::Array4;
//! use racelab_core::op::{Beta, Bits, Causal, Seed, SoftRace, Tables};
//! # fn main() -> racelab_core::Result<()> {
//! let q = Array4::<f32>::from_shape_fn((1, 2, 32, 16), |(_, h, i, j)| ((h + i * j) as f32).sin());
//! let op = SoftRace::new(Bits(2), Tables(8), Beta(10.0), Seed(0), 16)?;
//! let o = op.forward(q.view(), q.view(), q.view(), Causal::Yes)?;
//! let exact = racelab_core::softmax(q.view(), q.view(), q.view(), Causal::Yes)?;
//! assert_eq!(o.shape(), exact.shape());
//! # Ok(()) }
//! ```
//!
//! ## Layout
//!
//! The rooms from the base up; each names only rooms below it (the workspace's
//! `tests/module_graph.rs` keeps the graph of files free of circles and of upward arrows).
//!
//! - the base, on plain values: [`error`], [`rng`] (seeded streams), [`stats`], [`tensor`]
//!   (`Mat`, `Tensor`), [`params`] (P, L, β, combine rule), [`hashing`] (planes, soft
//!   features, hard codes), [`provenance`] (machine, revision, peak memory), [`memory`]
//!   (estimates and refusals before allocating), [`method`] (each operator with its own
//!   options), [`validate`] (the one validation every entry point makes), [`io`] (`.npy`),
//!   [`analysis`] (error metrics, rank);
//! - the contract: [`backend`] (the [`Backend`] trait, its input, output and gradient types,
//!   the checks every backend makes);
//! - below the backends, what they share: [`shared`] (the soft map, the exact-row recompute);
//! - the backends, siblings: [`reference`](mod@reference) (f64, literal, obviously correct: the
//!   oracle), [`cpu`] (the production f32 kernels), [`cuda`] (the CUDA kernels);
//! - the operators a user holds: [`op`] (one object per method on ndarray views, on a device)
//!   and [`mod@attend`] (one operator on user inputs, and the backend for a device).

#![deny(missing_docs)]

pub mod analysis;
pub mod attend;
pub mod backend;
pub mod cpu;
pub mod cuda;
pub mod error;
pub mod hashing;
pub mod io;
pub mod memory;
pub mod method;
pub mod op;
pub mod params;
pub mod provenance;
pub mod reference;
pub mod rng;
pub mod shared;
pub mod stats;
pub mod tensor;
pub mod validate;

pub use attend::{AttendOptions, AttendResult};
pub use backend::{Backend, Device};
pub use error::{RaceError, Result};
pub use hashing::Planes;
pub use method::{FeatureSpec, Method, MethodKind, PlaneSpec};
pub use op::{softmax, Causal};
pub use params::{Combine, RaceParams};
pub use tensor::{Mat, MatRef, Tensor};
