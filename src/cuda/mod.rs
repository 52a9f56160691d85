//! CUDA backend for soft RACE (cudarc, NVRTC), forward and backward, non-causal and causal.
//!
//! The kernels are CUDA C in [`RACE_CU`] (`src/cuda/race.cu`), compiled at run time by NVRTC
//! twice: for f32 inputs and (with `-DRACE_BF16`) for bf16 inputs; accumulation is f32
//! within chunks of [`CHUNK`] tokens and f64 across chunks (`race_scan`). No float atomics,
//! so results are identical run to run.
//!
//! With the `cuda` feature (default) the driver is loaded dynamically: the crate builds and
//! its tests run on machines without CUDA, and every entry point first checks that the driver
//! and NVRTC libraries exist and a device opens, returning [`RaceError::NoCuda`] otherwise
//! (never a panic). Without the feature, the same API returns that error immediately.

use crate::cpu::PlanesF32;
use crate::error::{RaceError, Result};

/// The CUDA C source of all kernels (compiled with NVRTC at run time).
pub const RACE_CU: &str = include_str!("race.cu");

/// Tokens per chunk (f32 accumulation happens within a chunk only).
pub const CHUNK: usize = 256;

/// Kernel names the Rust side launches (checked against the source in tests).
pub const KERNELS: [&str; 6] = [
    "race_partial",
    "race_scan",
    "race_fwd",
    "race_bwd_q",
    "race_bwd_k",
    "race_fma_peak",
];

/// The device's measured limits, against which GPU benchmark rows are floored.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DeviceCeilings {
    /// The device's name as the driver reports it.
    pub name: String,
    /// Device-to-device copy bandwidth, bytes read plus bytes written, GB/s (best of 5 copies
    /// of 2 GiB).
    pub bandwidth_gbs: f64,
    /// FP32 FMA rate, GFLOP/s (best of 5 launches of `race_fma_peak`).
    pub fp32_gflops: f64,
}

/// Input element type on the device.
#[derive(Debug, Clone, Copy)]
pub enum GpuInput<'a> {
    F32(&'a [f32]),
    /// bf16 as raw 16-bit words (the upper half of an f32).
    Bf16(&'a [u16]),
}

impl GpuInput<'_> {
    pub fn len(&self) -> usize {
        match self {
            GpuInput::F32(x) => x.len(),
            GpuInput::Bf16(x) => x.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Round f32 to bf16 (round to nearest even), as raw bits.
pub fn to_bf16(x: &[f32]) -> Vec<u16> {
    x.iter()
        .map(|v| {
            let b = v.to_bits();
            let round = 0x7FFF + ((b >> 16) & 1);
            ((b + round) >> 16) as u16
        })
        .collect()
}

/// Widen bf16 bits to f32 exactly.
pub fn from_bf16(x: &[u16]) -> Vec<f32> {
    x.iter()
        .map(|&b| f32::from_bits((b as u32) << 16))
        .collect()
}

/// Shape of one GPU problem.
#[derive(Debug, Clone, Copy)]
pub struct GpuShape {
    pub heads: usize,
    pub n: usize,
    pub d: usize,
    pub dv: usize,
}

/// Forward output copied back to the host.
#[derive(Debug, Clone)]
pub struct GpuForward {
    pub o: Vec<f32>,
    pub den: Vec<f32>,
    pub empty_rows: usize,
}

/// Floats of dynamic shared memory a block needs (see SH_LAYOUT in race.cu).
pub fn shared_floats(p: usize, l: usize, dv: usize) -> usize {
    let (lp, m, w) = (l * p, l << p, dv + 1);
    4 * lp + m + 2 * w + m + 2 * lp + m * w
}

/// Validate a GPU problem before touching the device.
pub fn check_problem(
    planes: &PlanesF32,
    beta: f32,
    q: &GpuInput,
    k: &GpuInput,
    v: &GpuInput,
    s: GpuShape,
) -> Result<()> {
    crate::params::validate_beta(beta as f64)?;
    if s.heads == 0 || s.n == 0 || s.d == 0 || s.dv == 0 {
        return Err(RaceError::empty("q", "heads, N, d and dv must all be ≥ 1"));
    }
    if planes.d != s.d {
        return Err(RaceError::shape(
            "planes",
            format!("planes have d = {} but inputs have d = {}", planes.d, s.d),
        ));
    }
    for (name, x, want) in [
        ("q", q, s.heads * s.n * s.d),
        ("k", k, s.heads * s.n * s.d),
        ("v", v, s.heads * s.n * s.dv),
    ] {
        if x.len() != want {
            return Err(RaceError::shape(
                name,
                format!(
                    "{} values for [{}, {}, {}]",
                    x.len(),
                    s.heads,
                    s.n,
                    if name == "v" { s.dv } else { s.d }
                ),
            ));
        }
    }
    let bytes = 4 * shared_floats(planes.p, planes.l, s.dv);
    if bytes > 227 * 1024 {
        return Err(RaceError::param(
            "p",
            format!("the CUDA kernels keep L·2^P·(dv+1) floats in shared memory; (P, L, dv) = ({}, {}, {}) needs {} KiB > 227 KiB; lower P, L or dv", planes.p, planes.l, s.dv, bytes / 1024),
        ));
    }
    Ok(())
}

#[cfg(feature = "cuda")]
mod device;
#[cfg(feature = "cuda")]
pub use device::{ceilings, ensure_device, soft_backward, soft_forward, time_soft};

#[cfg(not(feature = "cuda"))]
mod stub;
#[cfg(not(feature = "cuda"))]
pub use stub::{ceilings, ensure_device, soft_backward, soft_forward, time_soft};
