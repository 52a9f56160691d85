//! Built without the `cuda` feature: every entry point says so.

use super::{GpuForward, GpuInput, GpuShape};
use crate::cpu::{Heads, PlanesF32, SoftGrads};
use crate::error::{RaceError, Result};

fn off() -> RaceError {
    RaceError::NoCuda(
        "racelab was built without the `cuda` feature; rebuild with default features".into(),
    )
}

pub fn ensure_device() -> Result<()> {
    Err(off())
}

pub fn soft_forward(
    _: &PlanesF32,
    _: f32,
    _: GpuInput,
    _: GpuInput,
    _: GpuInput,
    _: GpuShape,
    _: bool,
) -> Result<GpuForward> {
    Err(off())
}

#[allow(clippy::too_many_arguments)]
pub fn soft_backward(
    _: &PlanesF32,
    _: f32,
    _: GpuInput,
    _: GpuInput,
    _: GpuInput,
    _: &[f32],
    _: GpuShape,
    _: bool,
) -> Result<(GpuForward, SoftGrads)> {
    Err(off())
}

#[allow(clippy::too_many_arguments)]
pub fn time_soft(
    _: &PlanesF32,
    _: f32,
    _: Heads,
    _: Heads,
    _: Heads,
    _: Option<&[f32]>,
    _: bool,
    _: usize,
) -> Result<(f64, Vec<f64>, crate::cpu::recompute::Recomputed)> {
    Err(off())
}

pub fn ceilings() -> Result<super::DeviceCeilings> {
    Err(off())
}
