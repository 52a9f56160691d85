//! GPU timing: a soft-RACE problem made resident once ([`crate::cuda::Resident`]) and its
//! kernels timed run by run, and the card's ceilings (copy bandwidth and FP32 FMA rate)
//! measured with the probes of [`crate::cuda`], against which GPU rows are floored.

use crate::backend::Recomputed;
use crate::backend::{Heads, PlanesF32};
use crate::error::Result;
use std::time::Instant;

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
    /// The kernel switches in force (`RACELAB_CUDA_PATH`, `RACELAB_CUDA_CHUNK`,
    /// `RACELAB_CUDA_DEFINES`; empty when none is set), so a GPU row says which kernels made it.
    pub switches: Vec<String>,
}

/// Measure the device's copy bandwidth and FP32 FMA rate: the best of 5 timed repeats after
/// one warm-up, a 2 GiB device-to-device copy counting 4 GiB moved, and the FMA probe's
/// `2 · 8 · iters` flops per thread over enough blocks to fill any current GPU.
pub fn ceilings() -> Result<DeviceCeilings> {
    let name = crate::cuda::device_name()?;
    let floats = 1usize << 29;
    let best = |secs: &[f64]| {
        secs[1..]
            .iter()
            .cloned()
            .fold(f64::INFINITY, crate::stats::nan_min)
    };
    let copy = crate::cuda::copy_seconds(floats, 6)?;
    let bandwidth_gbs = 2.0 * 4.0 * floats as f64 / best(&copy) / 1e9;
    let (blocks, threads, iters) = (16384u32, 256u32, 16384i32);
    let fma = crate::cuda::fma_seconds(blocks, threads, iters, 6)?;
    let flops = 2.0 * 8.0 * iters as f64 * (blocks * threads) as f64;
    Ok(DeviceCeilings {
        name,
        bandwidth_gbs,
        fp32_gflops: flops / best(&fma) / 1e9,
        switches: crate::cuda::switches(),
    })
}

/// Time forward (and backward with `g`) on device-resident f32 inputs: the median of `runs`
/// after one warm-up, every run, and the flagged rows recomputed on the host (timed once,
/// outside the runs).
#[allow(clippy::too_many_arguments)]
pub fn time_soft(
    planes: &PlanesF32,
    beta: f32,
    q: Heads,
    k: Heads,
    v: Heads,
    gr: Option<&[f32]>,
    causal: bool,
    runs: usize,
) -> Result<(f64, Vec<f64>, Recomputed)> {
    let mut problem = crate::cuda::Resident::new(planes, beta, q, k, v, gr)?;
    problem.run(causal)?; // warm-up (first launches, page mapping of the buffers)
    let mut ts = Vec::new();
    for _ in 0..runs.max(1) {
        let t = Instant::now();
        problem.run(causal)?;
        ts.push(t.elapsed().as_secs_f64());
    }
    let median = crate::stats::median(&ts);
    Ok((median, ts, problem.recompute(causal)?))
}
