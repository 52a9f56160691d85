//! What every soft-RACE backend shares, below the backends (the CPU kernels, the CUDA kernels
//! and the distributed backend are siblings above it): the checked soft map and its precision
//! switch ([`SoftMap`], [`PROJ_F64_BETA`]), and the exact log-domain recompute of the rows
//! whose f32 denominator falls below the floor ([`recompute`]), and the banks' layout and the
//! segment plan ([`layout`]); and the partial-kernel contract a backend implements for
//! callers that hold the sequence in slices ([`partial`]: the distributed backend).

#![deny(missing_docs)]

pub mod layout;
mod map;
pub mod partial;
pub mod recompute;

pub use layout::{bank_width, plan_segments};
pub use map::{SoftMap, PROJ_F64_BETA};
pub use partial::{zero_banks, Banks, Partial};
