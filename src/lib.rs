//! # racelab
//!
//! A numerical-analysis and theory-verification lab for RACE attention (Joshi et al.,
//! arXiv:2510.04008), built on the operators of [`racelab_core`]: every claim of the paper
//! computed, measured and judged (compute → CSV → figure → verdict), the benchmarks against the
//! machine's floors, the scaling study and the command line.
//!
//! ## Layout
//!
//! The core (`crates/racelab-core`: the operators, the f64 reference, the CPU and CUDA kernels)
//! and, above it, sequence parallelism (`crates/racelab-dist`: the distributed backend on the
//! core's partial kernels, the streaming mode, MPI) sit below this crate, which neither can
//! name; their modules are re-exported here under the same names ([`op`], [`backend`],
//! [`reference`](mod@reference), [`cpu`], [`cuda`], …, and [`distributed`]). This crate's own
//! rooms:
//!
//! - [`plot`] (figures), [`bound`] (the soft-hash bias at L = ∞ bounded with no fitted
//!   constant: the per-pair bound proved for every beta, its certificate's replay, the
//!   row-wise output bound on any Q/K/V);
//! - [`mod@bench`] (timings against the machine's floors), [`distributed::scaling`] (the
//!   scaling study's fitted model and projection), [`experiments`] (every claim: compute →
//!   CSV → figure → verdict, and `reproduce`);
//! - the command line is the crate `racelab-cli` above this one (`crates/racelab-cli`).
//!
//! `tests/module_graph.rs` keeps each crate's files free of import circles and the core's base
//! free of upward arrows.
//!
//! Notes proving or checking each claim live in `proofs-notes/`.

pub mod bench;
pub mod bound;
pub mod distributed;
pub mod experiments;
pub mod plot;

pub use racelab_core::{
    analysis, attend, backend, cpu, cuda, error, hashing, io, memory, method, op, params,
    provenance, reference, rng, shared, stats, tensor, validate,
};
pub use racelab_core::{
    softmax, AttendOptions, AttendResult, Backend, Causal, Combine, Device, FeatureSpec, Mat,
    MatRef, Method, MethodKind, PlaneSpec, Planes, RaceError, RaceParams, Result, Tensor,
};
