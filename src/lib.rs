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
//! ## Use
//!
//! Each method is an operator object ([`op`]): built by a validating constructor, run on
//! ndarray views of any rank 2 to 4, f32 or f64, the output in the inputs' rank and type.
//!
//! ```
//! use ndarray::Array4;
//! use racelab::op::{Beta, Bits, Causal, Seed, SoftRace, Tables};
//! # fn main() -> racelab::Result<()> {
//! let q = Array4::<f32>::from_shape_fn((1, 2, 32, 16), |(_, h, i, j)| ((h + i * j) as f32).sin());
//! let op = SoftRace::new(Bits(2), Tables(8), Beta(10.0), Seed(0), 16)?;
//! let o = op.forward(q.view(), q.view(), q.view(), Causal::Yes)?;
//! let exact = racelab::softmax(q.view(), q.view(), q.view(), Causal::Yes)?;
//! assert_eq!(o.shape(), exact.shape());
//! # Ok(()) }
//! ```
//!
//! ## Layout
//!
//! The rooms from the base up; each names only rooms below it (`tests/module_graph.rs` keeps
//! the graph of files free of circles and of upward arrows).
//!
//! - the base, on plain values: [`error`], [`rng`] (seeded streams), [`stats`], [`tensor`]
//!   (`Mat`, `Tensor`), [`params`] (P, L, β, combine rule), [`hashing`] (planes, soft
//!   features, hard codes), [`provenance`] (machine, revision, peak memory), [`memory`]
//!   (estimates and refusals before allocating), [`method`] (each operator with its own
//!   options), [`validate`] (the one validation every entry point makes), [`io`] (`.npy`),
//!   [`plot`], [`analysis`] (error metrics, rank);
//! - the contract: [`backend`] (the [`Backend`] trait, its input, output and gradient types,
//!   the checks every backend makes);
//! - the operators a user holds: [`op`] (one object per method on ndarray views, on a device);
//! - the backends: [`reference`](mod@reference) (f64, literal, obviously correct: the oracle), [`cpu`] (the
//!   production f32 kernels), [`cuda`] (the CUDA kernels);
//! - above them: [`mod@attend`] (one operator on user inputs, and the backend for a device),
//!   [`bound`] (the soft-hash bias at L = ∞ bounded with no fitted constant: the per-pair bound
//!   proved for every beta, its certificate's replay, the row-wise output bound on any Q/K/V),
//!   [`distributed`] (sequence parallelism over ranks, the streaming scale mode), [`mod@bench`]
//!   (timings against the machine's floors), [`experiments`] (every claim: compute → CSV →
//!   figure → verdict, and `reproduce`);
//! - the command line: `src/bin/racelab/` (`args.rs`, one file per command).
//!
//! Notes proving or checking each claim live in `proofs-notes/`.

pub mod analysis;
pub mod attend;
pub mod backend;
pub mod bench;
pub mod bound;
pub mod cpu;
pub mod cuda;
pub mod distributed;
pub mod error;
pub mod experiments;
pub mod hashing;
pub mod io;
pub mod memory;
pub mod method;
pub mod op;
pub mod params;
pub mod plot;
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
