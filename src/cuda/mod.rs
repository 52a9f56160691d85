//! CUDA backend placeholder while the cudarc kernels are written: every entry point returns
//! a clear error instead of running.

use crate::cpu::{Heads, PlanesF32};
use crate::error::{RaceError, Result};

/// Check that a CUDA device can be used.
pub fn ensure_device() -> Result<()> {
    Err(RaceError::NoCuda("the CUDA backend is not built into this binary".into()))
}

/// Time soft RACE on the GPU (median seconds, all runs).
pub fn time_soft(_planes: &PlanesF32, _beta: f32, _q: Heads, _k: Heads, _v: Heads, _g: Option<&[f32]>, _causal: bool, _runs: usize) -> Result<(f64, Vec<f64>)> {
    ensure_device()?;
    unreachable!()
}
