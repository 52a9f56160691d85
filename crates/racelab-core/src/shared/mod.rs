//! What every soft-RACE backend shares, below the backends (the CPU kernels, the CUDA kernels
//! and the distributed backend are siblings above it): the checked soft map and its precision
//! switch ([`SoftMap`], [`PROJ_F64_BETA`]), and the exact log-domain recompute of the rows
//! whose f32 denominator falls below the floor ([`recompute`]).

#![deny(missing_docs)]

mod map;
pub mod recompute;

pub use map::{SoftMap, PROJ_F64_BETA};
