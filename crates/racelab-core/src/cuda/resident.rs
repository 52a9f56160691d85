//! What a benchmark times on the device: a soft-RACE problem uploaded once
//! ([`Resident`]: inputs and buffers on the card, [`Resident::run`] launches only the
//! kernels), and the probes of the card's limits ([`copy_seconds`], [`fma_seconds`]). The
//! timing loops and the ceilings built from these live in the lab's `racelab::bench::gpu`.

use super::{
    allow_shared, bwd_dev, cuda_err, dims, finish_backward, finish_forward, fwd_dev, gpu, host,
    out_buf, upload, Bufs, Dev, Dims, Gpu,
};
use crate::backend::Recomputed;
use crate::backend::{Heads, PlanesF32, SoftGrads};
use crate::cuda::{check_problem, GpuInput, GpuShape};
use crate::error::{RaceError, Result};
use crate::shared::SoftMap;
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use std::time::Instant;

/// A soft-RACE problem resident on the device: f32 inputs (and `g`) uploaded and every
/// buffer allocated once, so that [`Resident::run`] launches only the kernels (what a
/// benchmark times; see the lab's `racelab::bench::gpu`).
pub struct Resident<'a> {
    g: &'static Gpu,
    planes: &'a PlanesF32,
    beta: f32,
    q: Heads<'a>,
    k: Heads<'a>,
    v: Heads<'a>,
    gr: Option<&'a [f32]>,
    s: GpuShape,
    dm: Dims,
    dev: Dev<f32>,
    gd: Option<CudaSlice<f32>>,
    bf: Bufs,
}

impl<'a> Resident<'a> {
    /// Upload `q`, `k`, `v` (and `gr`, to run the backward too) and allocate the buffers.
    pub fn new(
        planes: &'a PlanesF32,
        beta: f32,
        q: Heads<'a>,
        k: Heads<'a>,
        v: Heads<'a>,
        gr: Option<&'a [f32]>,
    ) -> Result<Self> {
        let s = GpuShape {
            heads: q.heads,
            n: q.n,
            d: q.cols,
            dv: v.cols,
        };
        check_problem(
            planes,
            beta,
            &GpuInput::F32(q.data),
            &GpuInput::F32(k.data),
            &GpuInput::F32(v.data),
            s,
        )?;
        let g = gpu()?;
        let dm = dims(planes, beta, s)?;
        allow_shared(&g.f32k, &dm.geo)?;
        let dev = upload(&g.stream, planes, q.data, k.data, v.data)?;
        let gd = match gr {
            Some(x) => Some(
                g.stream
                    .clone_htod(x)
                    .map_err(|e| cuda_err("copying g", e))?,
            ),
            None => None,
        };
        let bf = Bufs::new(&g.stream, &dm, gd.is_some())?;
        Ok(Resident {
            g,
            planes,
            beta,
            q,
            k,
            v,
            gr,
            s,
            dm,
            dev,
            gd,
            bf,
        })
    }

    /// Launch the forward (and the backward when `g` was given) and wait for them.
    pub fn run(&mut self, causal: bool) -> Result<()> {
        let (g, kn) = (self.g, &self.g.f32k);
        fwd_dev(g, kn, &self.dev, &self.dm, causal, &mut self.bf)?;
        if let Some(gd) = &self.gd {
            bwd_dev(g, kn, &self.dev, &self.dm, causal, gd, &mut self.bf)?;
        }
        g.stream
            .synchronize()
            .map_err(|e| cuda_err("synchronize", e))
    }

    /// After a [`Resident::run`]: the rows the kernels flagged, recomputed exactly on the
    /// host (forward, and backward when `g` was given), with the seconds that took.
    pub fn recompute(&self, causal: bool) -> Result<Recomputed> {
        let t = Instant::now();
        let (planes, beta, s) = (self.planes, self.beta, self.s);
        let qkv = [
            &GpuInput::F32(self.q.data),
            &GpuInput::F32(self.k.data),
            &GpuInput::F32(self.v.data),
        ];
        let st = &self.g.stream;
        let (o, den) = (host(st, &self.bf.o)?, host(st, &self.bf.den)?);
        let map = SoftMap::new(planes, beta)?;
        let mut fwd = finish_forward(o, den, map, qkv, s, causal);
        if let Some(x) = self.gr {
            let mut grads = SoftGrads {
                dq: host(st, &self.bf.dq)?,
                dk: host(st, &self.bf.dk)?,
                dv: host(st, &self.bf.dv)?,
                dbeta: 0.0,
            };
            finish_backward(&fwd, map, qkv, x, s, causal, &mut grads);
        }
        if !fwd.recomputed.rows.is_empty() {
            fwd.recomputed.seconds = t.elapsed().as_secs_f64();
        }
        Ok(fwd.recomputed)
    }
}

/// The device's name.
pub fn device_name() -> Result<String> {
    gpu()?.ctx.name().map_err(|e| cuda_err("device name", e))
}

/// Seconds of one device-to-device copy of `floats` f32 values (which moves twice their
/// bytes: read and written), after a synchronisation.
pub fn copy_seconds(floats: usize, repeats: usize) -> Result<Vec<f64>> {
    let g = gpu()?;
    let st = &g.stream;
    let sync = || st.synchronize().map_err(|e| cuda_err("synchronize", e));
    let src = st
        .alloc_zeros::<f32>(floats)
        .map_err(|e| cuda_err("alloc copy source", e))?;
    let mut dst = out_buf(st, floats, "alloc copy target")?;
    let mut out = Vec::with_capacity(repeats);
    for _ in 0..repeats {
        sync()?;
        let t = Instant::now();
        st.memcpy_dtod(&src, &mut dst)
            .map_err(|e| cuda_err("device copy", e))?;
        sync()?;
        out.push(t.elapsed().as_secs_f64());
    }
    Ok(out)
}

/// Seconds of the FMA probe kernel (`race_fma_peak`: 8 independent chains of `iters` FMAs
/// per thread) on `blocks × threads` threads, per repeat; fails if the probe's outputs are
/// not finite.
pub fn fma_seconds(blocks: u32, threads: u32, iters: i32, repeats: usize) -> Result<Vec<f64>> {
    let g = gpu()?;
    let st = &g.stream;
    let sync = || st.synchronize().map_err(|e| cuda_err("synchronize", e));
    let mut out = out_buf(st, (blocks * threads) as usize, "alloc fma probe")?;
    let mut secs = Vec::with_capacity(repeats);
    for _ in 0..repeats {
        sync()?;
        let t = Instant::now();
        let mut b = st.launch_builder(&g.f32k.fma_peak);
        b.arg(&mut out).arg(&iters);
        let c = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches `race_fma_peak`; `out` holds one float per launched thread.
        unsafe { b.launch(c) }.map_err(|e| cuda_err("race_fma_peak", e))?;
        sync()?;
        secs.push(t.elapsed().as_secs_f64());
    }
    let probe = host(st, &out)?;
    if probe.iter().any(|x| !x.is_finite()) {
        return Err(RaceError::Cuda(
            "the FMA probe produced non-finite values".into(),
        ));
    }
    Ok(secs)
}
