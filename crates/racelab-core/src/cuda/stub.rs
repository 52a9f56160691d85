//! Built without the `cuda` feature: every entry point says so.

use super::{GpuForward, GpuInput, GpuShape};
use crate::backend::{Heads, PlanesF32, SoftGrads};

use crate::error::{RaceError, Result};

fn off() -> RaceError {
    RaceError::NoCuda(
        "racelab was built without the `cuda` feature; rebuild with default features".into(),
    )
}

/// Built without the `cuda` feature: [`RaceError::NoCuda`].
pub fn ensure_device() -> Result<()> {
    Err(off())
}

/// Built without the `cuda` feature: [`RaceError::NoCuda`].
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

/// Built without the `cuda` feature: [`RaceError::NoCuda`].
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

/// Built without the `cuda` feature: no problem can be made resident.
pub struct Resident<'a>(std::marker::PhantomData<&'a ()>);

impl<'a> Resident<'a> {
    /// Built without the `cuda` feature: [`RaceError::NoCuda`].
    pub fn new(
        _: &'a PlanesF32,
        _: f32,
        _: Heads<'a>,
        _: Heads<'a>,
        _: Heads<'a>,
        _: Option<&'a [f32]>,
    ) -> Result<Self> {
        Err(off())
    }
    /// Built without the `cuda` feature: [`RaceError::NoCuda`].
    pub fn run(&mut self, _: bool) -> Result<()> {
        Err(off())
    }
    /// Built without the `cuda` feature: [`RaceError::NoCuda`].
    pub fn recompute(&self, _: bool) -> Result<crate::backend::Recomputed> {
        Err(off())
    }
}

/// Built without the `cuda` feature: [`RaceError::NoCuda`].
pub fn device_name() -> Result<String> {
    Err(off())
}

/// Built without the `cuda` feature: [`RaceError::NoCuda`].
pub fn copy_seconds(_: usize, _: usize) -> Result<Vec<f64>> {
    Err(off())
}

/// Built without the `cuda` feature: [`RaceError::NoCuda`].
pub fn fma_seconds(_: u32, _: u32, _: i32, _: usize) -> Result<Vec<f64>> {
    Err(off())
}
