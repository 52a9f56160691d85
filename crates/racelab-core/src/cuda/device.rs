//! The cudarc driver side: device discovery without panics, NVRTC compilation, launches.

use super::{
    check_problem, finish_backward, finish_forward, geometry, Geometry, GpuForward, GpuInput,
    GpuShape, RACE_CU,
};
use crate::backend::{PlanesF32, SoftGrads};
use crate::shared::SoftMap;

use crate::error::{RaceError, Result};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg,
};
use std::sync::{Arc, OnceLock};

struct Kernels {
    partial: CudaFunction,
    scan: CudaFunction,
    fwd: CudaFunction,
    bwd_q: CudaFunction,
    bwd_k: CudaFunction,
    partial_tile: CudaFunction,
    partial_tile_m16: CudaFunction,
    fwd_tile: CudaFunction,
    bwd_q_tile: CudaFunction,
    bwd_k_tile: CudaFunction,
    fwd_tile_causal: CudaFunction,
    bwd_q_tile_causal: CudaFunction,
    bwd_k_tile_causal: CudaFunction,
    fma_peak: CudaFunction,
}

struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    f32k: Kernels,
    bf16k: Kernels,
}

fn cuda_err(what: &str, e: impl std::fmt::Debug) -> RaceError {
    RaceError::Cuda(format!("{what}: {e:?}"))
}

/// A device buffer for a kernel to fill: not zeroed, because every kernel here writes every
/// element of its outputs (zeroing would add a full extra write pass to each timed run).
fn out_buf(st: &Arc<CudaStream>, len: usize, what: &str) -> Result<CudaSlice<f32>> {
    // SAFETY: f32 has no invalid bit patterns, and each caller hands the buffer to a kernel
    // that writes all `len` elements before anything reads them (see the kernels' docs).
    unsafe { st.alloc::<f32>(len) }.map_err(|e| cuda_err(what, e))
}

fn compile(ctx: &Arc<CudaContext>, bf16: bool) -> Result<Kernels> {
    let mut options: Vec<String> = if bf16 {
        vec!["-DRACE_BF16".into()]
    } else {
        vec![]
    };
    // Tuning experiments only: extra NVRTC options, e.g. RACELAB_CUDA_DEFINES="-DAHEAD=8".
    if let Ok(extra) = std::env::var("RACELAB_CUDA_DEFINES") {
        options.extend(extra.split_whitespace().map(String::from));
    }
    let opts = cudarc::nvrtc::CompileOptions {
        options,
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(RACE_CU, opts)
        .map_err(|e| cuda_err("NVRTC compilation of race.cu", e))?;
    let module = ctx
        .load_module(ptx)
        .map_err(|e| cuda_err("loading the PTX module", e))?;
    let f = |name: &str| module.load_function(name).map_err(|e| cuda_err(name, e));
    Ok(Kernels {
        partial: f("race_partial")?,
        scan: f("race_scan")?,
        fwd: f("race_fwd")?,
        bwd_q: f("race_bwd_q")?,
        bwd_k: f("race_bwd_k")?,
        partial_tile: f("race_partial_tile")?,
        partial_tile_m16: f("race_partial_tile_m16")?,
        fwd_tile: f("race_fwd_tile")?,
        bwd_q_tile: f("race_bwd_q_tile")?,
        bwd_k_tile: f("race_bwd_k_tile")?,
        fwd_tile_causal: f("race_fwd_tile_causal")?,
        bwd_q_tile_causal: f("race_bwd_q_tile_causal")?,
        bwd_k_tile_causal: f("race_bwd_k_tile_causal")?,
        fma_peak: f("race_fma_peak")?,
    })
}

fn open() -> std::result::Result<Gpu, RaceError> {
    // SAFETY: `is_culib_present` only tries to dlopen the library and reports whether it could;
    // it has no preconditions. Checking first is what keeps `CudaContext::new` from panicking
    // on machines without a driver.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(RaceError::NoCuda(
            "the CUDA driver library (libcuda) is not installed".into(),
        ));
    }
    // SAFETY: as above, for NVRTC.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(RaceError::NoCuda(
            "the NVRTC library (libnvrtc) is not installed".into(),
        ));
    }
    let ctx = std::panic::catch_unwind(|| CudaContext::new(0))
        .map_err(|_| RaceError::NoCuda("the CUDA driver panicked while opening device 0".into()))?
        .map_err(|e| RaceError::NoCuda(format!("could not open device 0: {e:?}")))?;
    // SAFETY: every launch and copy goes through the one stream below, so the per-buffer
    // events cudarc records for cross-stream ordering are not needed.
    unsafe { ctx.disable_event_tracking() };
    let stream = ctx.default_stream();
    let f32k = compile(&ctx, false)?;
    let bf16k = compile(&ctx, true)?;
    Ok(Gpu {
        ctx,
        stream,
        f32k,
        bf16k,
    })
}

fn gpu() -> Result<&'static Gpu> {
    static GPU: OnceLock<std::result::Result<Gpu, RaceError>> = OnceLock::new();
    GPU.get_or_init(open).as_ref().map_err(|e| e.clone())
}

/// Check that a CUDA device can be used (driver, NVRTC, device 0, kernels compile).
pub fn ensure_device() -> Result<()> {
    gpu().map(|_| ())
}

/// Integer parameters of every launch.
#[derive(Clone, Copy)]
struct Dims {
    n: i32,
    d: i32,
    dv: i32,
    l: i32,
    p: i32,
    beta: f32,
    chunk: i32,
    heads: u32,
    nchunks: u32,
    /// Features `m = L·2^P`, and the bank's `m·(dv+1)` floats.
    m: usize,
    mw: usize,
    geo: Geometry,
}

impl Dims {
    /// The trailing `n, d, dv, L, P, beta, chunk` arguments every chunk kernel takes.
    fn push_shape<'a>(&'a self, b: &mut cudarc::driver::LaunchArgs<'a>) {
        b.arg(&self.n)
            .arg(&self.d)
            .arg(&self.dv)
            .arg(&self.l)
            .arg(&self.p)
            .arg(&self.beta)
            .arg(&self.chunk);
    }
    /// The shape, then the mode argument the warp-per-chunk kernels end with.
    fn push<'a>(&'a self, b: &mut cudarc::driver::LaunchArgs<'a>, last: &'a i32) {
        self.push_shape(b);
        b.arg(last);
    }
}

fn dims(planes: &PlanesF32, beta: f32, s: GpuShape) -> Result<Dims> {
    let geo = match super::path_for(beta) {
        Some(path) => super::geometry_with(planes.p, planes.l, s, path)?,
        None => geometry(planes.p, planes.l, s)?,
    };
    Ok(Dims {
        n: s.n as i32,
        d: s.d as i32,
        dv: s.dv as i32,
        l: planes.l as i32,
        p: planes.p as i32,
        beta,
        chunk: geo.chunk as i32,
        heads: s.heads as u32,
        nchunks: geo.nchunks as u32,
        m: planes.l << planes.p,
        mw: (planes.l << planes.p) * (s.dv + 1),
        geo,
    })
}

/// Warp-per-chunk kernels: `private_state` ones (race_partial, the causal passes) carve one
/// state per warp, the others one per block.
fn cfg(dm: &Dims, private_state: bool) -> LaunchConfig {
    let g = &dm.geo;
    LaunchConfig {
        grid_dim: (g.blocks_x as u32, dm.heads, 1),
        block_dim: (32 * g.warps as u32, 1, 1),
        shared_mem_bytes: if private_state {
            g.shared_private
        } else {
            g.shared_block
        } as u32,
    }
}

/// Tiled kernels: one block of 8 warps per chunk, with `shared` bytes.
fn tile_cfg_bytes(dm: &Dims, shared: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (dm.geo.nchunks as u32, dm.heads, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: shared as u32,
    }
}

/// Which kernel family runs a forward or backward pass of this problem.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Family {
    /// Warp-per-chunk kernels (their signatures end with the causal flag).
    Warp,
    /// Tiled non-causal kernels (no k, v in the query passes; no q, o, g, den in the keys').
    Tile,
    /// Tiled causal kernels (the warp kernels' arguments without the flag).
    TileCausal,
}

impl Family {
    fn of(dm: &Dims, causal: bool) -> Family {
        match (causal, dm.geo.tiled, dm.geo.tiled_causal) {
            (true, _, true) => Family::TileCausal,
            (false, true, _) => Family::Tile,
            _ => Family::Warp,
        }
    }
    /// One of three (kernel, name) pairs by family.
    fn pick<'a>(
        self,
        warp: (&'a CudaFunction, &'static str),
        tile: (&'a CudaFunction, &'static str),
        tile_causal: (&'a CudaFunction, &'static str),
    ) -> (&'a CudaFunction, &'static str) {
        match self {
            Family::Warp => warp,
            Family::Tile => tile,
            Family::TileCausal => tile_causal,
        }
    }
    /// The launch of a pass; `query`: the queries' backward pass, whose tiled kernels also
    /// keep an accumulator of `Σ φ(q) ĝ / L`.
    fn config(self, dm: &Dims, causal: bool, query: bool) -> LaunchConfig {
        let g = &dm.geo;
        match (self, query) {
            (Family::Warp, _) => cfg(dm, causal),
            (Family::Tile, false) => tile_cfg_bytes(dm, g.shared_tile_state),
            (Family::Tile, true) => tile_cfg_bytes(dm, g.shared_tile_query),
            (Family::TileCausal, false) => tile_cfg_bytes(dm, g.shared_tile_causal),
            (Family::TileCausal, true) => tile_cfg_bytes(dm, g.shared_tile_causal_query),
        }
    }
}

/// Raise each kernel's dynamic shared-memory limit to what this problem's launches use.
fn allow_shared(k: &Kernels, geo: &Geometry) -> Result<()> {
    use cudarc::driver::sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES as A;
    let warp_bytes = geo.shared_private;
    let tile_bytes = if geo.tiled { geo.shared_tile_query } else { 0 };
    let causal_bytes = if geo.tiled_causal {
        geo.shared_tile_causal_query
    } else {
        0
    };
    for (f, bytes) in [
        (&k.partial, warp_bytes),
        (&k.fwd, warp_bytes),
        (&k.bwd_q, warp_bytes),
        (&k.bwd_k, warp_bytes),
        (&k.partial_tile, tile_bytes),
        (&k.partial_tile_m16, tile_bytes),
        (&k.fwd_tile, tile_bytes),
        (&k.bwd_q_tile, tile_bytes),
        (&k.bwd_k_tile, tile_bytes),
        (&k.fwd_tile_causal, causal_bytes),
        (&k.bwd_q_tile_causal, causal_bytes),
        (&k.bwd_k_tile_causal, causal_bytes),
    ] {
        if bytes > 48 * 1024 {
            f.set_attribute(A, bytes as i32)
                .map_err(|e| cuda_err("raising the shared-memory limit", e))?;
        }
    }
    Ok(())
}

/// Device-resident problem: inputs, planes, and scratch.
struct Dev<T: DeviceRepr> {
    q: CudaSlice<T>,
    k: CudaSlice<T>,
    v: CudaSlice<T>,
    w: CudaSlice<f32>,
}

fn upload<T: DeviceRepr + Copy>(
    st: &Arc<CudaStream>,
    planes: &PlanesF32,
    q: &[T],
    k: &[T],
    v: &[T],
) -> Result<Dev<T>> {
    let up = |x: &[T]| {
        st.clone_htod(x)
            .map_err(|e| cuda_err("copying inputs to the device", e))
    };
    Ok(Dev {
        q: up(q)?,
        k: up(k)?,
        v: up(v)?,
        w: st
            .clone_htod(&planes.w)
            .map_err(|e| cuda_err("copying planes", e))?,
    })
}

/// Every device buffer one forward+backward writes, allocated once per problem and reused
/// across runs (as a caching allocator would): a fresh multi-GiB allocation per run would
/// time the driver's page mapping, not the kernels.
struct Bufs {
    /// Chunk totals and their scan (forward: keys' `Σ φ [v, 1]`; backward: queries'
    /// `Σ φ ĝ / L`), `heads·nchunks·m·w` floats each (the non-causal scan uses the first
    /// `heads·m·w` of `bases`).
    partials: CudaSlice<f32>,
    bases: CudaSlice<f32>,
    dpartials: CudaSlice<f32>,
    dbases: CudaSlice<f32>,
    o: CudaSlice<f32>,
    den: CudaSlice<f32>,
    dq: CudaSlice<f32>,
    dk: CudaSlice<f32>,
    dv: CudaSlice<f32>,
    /// Per-token `∂ℓ/∂β` of queries and keys (summed on the host in a fixed order).
    dbq: CudaSlice<f32>,
    dbk: CudaSlice<f32>,
    /// A one-float stand-in for the arguments a mode does not read.
    dummy: CudaSlice<f32>,
}

impl Bufs {
    fn new(st: &Arc<CudaStream>, dm: &Dims, backward: bool) -> Result<Self> {
        let total = dm.heads as usize * dm.n as usize;
        let chunks = dm.heads as usize * dm.nchunks as usize * dm.mw;
        let grad = |len: usize, what: &str| out_buf(st, if backward { len } else { 1 }, what);
        Ok(Bufs {
            partials: out_buf(st, chunks, "alloc partials")?,
            bases: out_buf(st, chunks, "alloc bases")?,
            dpartials: grad(chunks, "alloc dpartials")?,
            dbases: grad(chunks, "alloc dbases")?,
            o: out_buf(st, total * dm.dv as usize, "alloc o")?,
            den: out_buf(st, total, "alloc den")?,
            dq: grad(total * dm.d as usize, "alloc dq")?,
            dk: grad(total * dm.d as usize, "alloc dk")?,
            dv: grad(total * dm.dv as usize, "alloc dv")?,
            dbq: grad(total, "alloc dbq")?,
            dbk: grad(total, "alloc dbk")?,
            dummy: st.alloc_zeros::<f32>(1).map_err(|e| cuda_err("alloc", e))?,
        })
    }
}

fn e(what: &'static str) -> impl Fn(cudarc::driver::DriverError) -> RaceError {
    move |x| cuda_err(what, x)
}

/// `race_partial` (or `race_partial_tile`): per-chunk totals into `out`, mode 0
/// `Σ φ(x)[v, 1]`, mode 1 `Σ φ(q) ĝ / L`.
#[allow(clippy::too_many_arguments)]
fn chunk_totals<T: DeviceRepr>(
    g: &Gpu,
    kn: &Kernels,
    x: &CudaSlice<T>,
    v: &CudaSlice<T>,
    gr: &CudaSlice<f32>,
    o: &CudaSlice<f32>,
    den: &CudaSlice<f32>,
    w: &CudaSlice<f32>,
    out: &mut CudaSlice<f32>,
    dm: &Dims,
    mode: i32,
) -> Result<()> {
    let mut b = g.stream.launch_builder(match (dm.geo.tiled, dm.m) {
        (true, m) if m <= 16 => &kn.partial_tile_m16,
        (true, _) => &kn.partial_tile,
        _ => &kn.partial,
    });
    b.arg(x).arg(v).arg(gr).arg(o).arg(den).arg(w).arg(out);
    dm.push(&mut b, &mode);
    let c = if dm.geo.tiled {
        tile_cfg_bytes(dm, dm.geo.shared_tile)
    } else {
        cfg(dm, true)
    };
    // SAFETY: argument order and types match `race_partial` and `race_partial_tile(_m16)` in
    // race.cu; every buffer holds the [heads, n, ·] extents the kernel indexes (checked by
    // `check_problem`; g/o/den are read only in mode 1), `out` heads·nchunks·m·w floats, and
    // the dynamic shared memory is sized by `shared_floats` / `shared_floats_tiled` for the
    // layouts `carve` and `TILE_CHUNK` make.
    unsafe { b.launch(c) }.map_err(e("race_partial"))?;
    Ok(())
}

/// `race_scan` over chunk totals into `bases`: mode 0 exclusive prefix (causal forward),
/// 1 exclusive suffix (causal backward), 2 total per head (non-causal).
fn scan_chunks(
    g: &Gpu,
    kn: &Kernels,
    partials: &CudaSlice<f32>,
    bases: &mut CudaSlice<f32>,
    dm: &Dims,
    mode: i32,
) -> Result<()> {
    let (nch, mw) = (dm.nchunks as i32, dm.mw as i32);
    let mut b = g.stream.launch_builder(&kn.scan);
    b.arg(partials).arg(bases).arg(&nch).arg(&mw).arg(&mode);
    let c = LaunchConfig {
        grid_dim: ((dm.mw as u32).div_ceil(256), dm.heads, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: matches `race_scan` in race.cu; `partials` and `bases` hold heads·nchunks·mw
    // floats (mode 2 writes only the first heads·mw of `bases`).
    unsafe { b.launch(c) }.map_err(e("race_scan"))?;
    Ok(())
}

/// Forward on the device into `bf.o`, `bf.den` (and `bf.bases` for the backward).
fn fwd_dev<T: DeviceRepr>(
    g: &Gpu,
    kn: &Kernels,
    dev: &Dev<T>,
    dm: &Dims,
    causal: bool,
    bf: &mut Bufs,
) -> Result<()> {
    let st = &g.stream;
    let d = &bf.dummy;
    chunk_totals(
        g,
        kn,
        &dev.k,
        &dev.v,
        d,
        d,
        d,
        &dev.w,
        &mut bf.partials,
        dm,
        0,
    )?;
    scan_chunks(
        g,
        kn,
        &bf.partials,
        &mut bf.bases,
        dm,
        if causal { 0 } else { 2 },
    )?;
    let fam = Family::of(dm, causal);
    let (f, name) = fam.pick(
        (&kn.fwd, "race_fwd"),
        (&kn.fwd_tile, "race_fwd_tile"),
        (&kn.fwd_tile_causal, "race_fwd_tile_causal"),
    );
    let mut b = st.launch_builder(f);
    b.arg(&dev.q);
    if fam != Family::Tile {
        b.arg(&dev.k).arg(&dev.v);
    }
    b.arg(&dev.w).arg(&bf.bases).arg(&mut bf.o).arg(&mut bf.den);
    dm.push_shape(&mut b);
    let causal_i = causal as i32;
    if fam == Family::Warp {
        b.arg(&causal_i);
    }
    // SAFETY: the arguments match `race_fwd` (q, k, v, W, bases, o, den, shape, causal),
    // `race_fwd_tile` (q, W, bases, o, den, shape) and `race_fwd_tile_causal` (as race_fwd
    // without the flag); o has heads·n·dv floats, den heads·n, bases heads·m·w (totals) or
    // heads·nchunks·m·w (exclusive prefix); the shared bytes are `Family::config`'s.
    unsafe { b.launch(fam.config(dm, causal, false)) }.map_err(e(name))?;
    Ok(())
}

/// Backward on the device with upstream gradient `gr`, after [`fwd_dev`] filled `bf`: into
/// `bf.dq`, `bf.dk`, `bf.dv` and the per-token `∂ℓ/∂β` in `bf.dbq`, `bf.dbk`.
fn bwd_dev<T: DeviceRepr>(
    g: &Gpu,
    kn: &Kernels,
    dev: &Dev<T>,
    dm: &Dims,
    causal: bool,
    gr: &CudaSlice<f32>,
    bf: &mut Bufs,
) -> Result<()> {
    let st = &g.stream;
    let causal_i = causal as i32;
    let fam = Family::of(dm, causal);
    let (f, name) = fam.pick(
        (&kn.bwd_q, "race_bwd_q"),
        (&kn.bwd_q_tile, "race_bwd_q_tile"),
        (&kn.bwd_q_tile_causal, "race_bwd_q_tile_causal"),
    );
    let mut b = st.launch_builder(f);
    b.arg(&dev.q);
    if fam != Family::Tile {
        b.arg(&dev.k).arg(&dev.v);
    }
    b.arg(&dev.w)
        .arg(&bf.bases)
        .arg(&bf.o)
        .arg(gr)
        .arg(&bf.den)
        .arg(&mut bf.dq)
        .arg(&mut bf.dbq);
    if fam != Family::Warp {
        b.arg(&mut bf.dpartials);
    }
    dm.push_shape(&mut b);
    if fam == Family::Warp {
        b.arg(&causal_i);
    }
    // SAFETY: the arguments match `race_bwd_q` (q, k, v, W, bases, o, g, den, dq, dbq, shape,
    // causal), `race_bwd_q_tile` (without k, v and the flag) and `race_bwd_q_tile_causal`
    // (without the flag), the tiled ones then taking dpartials (heads·nchunks·m·w floats);
    // bases come from the forward of the same shape and mode; dq holds heads·n·d floats, dbq
    // heads·n.
    unsafe { b.launch(fam.config(dm, causal, true)) }.map_err(e(name))?;
    // The tiled queries' passes wrote the chunk totals of Σ φ(q) ĝ / L themselves; otherwise
    // race_partial's mode 1 reads ĝ from (g, o, den) (its V argument is unused: q stands in).
    if fam == Family::Warp {
        chunk_totals(
            g,
            kn,
            &dev.q,
            &dev.q,
            gr,
            &bf.o,
            &bf.den,
            &dev.w,
            &mut bf.dpartials,
            dm,
            1,
        )?;
    }
    scan_chunks(
        g,
        kn,
        &bf.dpartials,
        &mut bf.dbases,
        dm,
        if causal { 1 } else { 2 },
    )?;
    let (f, name) = fam.pick(
        (&kn.bwd_k, "race_bwd_k"),
        (&kn.bwd_k_tile, "race_bwd_k_tile"),
        (&kn.bwd_k_tile_causal, "race_bwd_k_tile_causal"),
    );
    let mut b = st.launch_builder(f);
    if fam != Family::Tile {
        b.arg(&dev.q);
    }
    b.arg(&dev.k).arg(&dev.v).arg(&dev.w).arg(&bf.dbases);
    if fam != Family::Tile {
        b.arg(&bf.o).arg(gr).arg(&bf.den);
    }
    b.arg(&mut bf.dk).arg(&mut bf.dv).arg(&mut bf.dbk);
    dm.push_shape(&mut b);
    if fam == Family::Warp {
        b.arg(&causal_i);
    }
    // SAFETY: the arguments match `race_bwd_k` (q, k, v, W, dbases, o, g, den, dk, dv, dbk,
    // shape, causal), `race_bwd_k_tile` (k, v, W, dbases, dk, dv, dbk, shape) and
    // `race_bwd_k_tile_causal` (as race_bwd_k without the flag); dbases is the exclusive
    // suffix (causal) or total of the queries' Σ φ ĝ / L; dk heads·n·d, dv heads·n·dv,
    // dbk heads·n.
    unsafe { b.launch(fam.config(dm, causal, false)) }.map_err(e(name))?;
    Ok(())
}

fn host<T: DeviceRepr + Default + Clone>(st: &Arc<CudaStream>, x: &CudaSlice<T>) -> Result<Vec<T>> {
    st.clone_dtoh(x)
        .map_err(|e| cuda_err("copying results to the host", e))
}

macro_rules! with_input {
    ($g:expr, $planes:expr, $q:expr, $k:expr, $v:expr, |$dev:ident, $kn:ident| $body:expr) => {
        match ($q, $k, $v) {
            (GpuInput::F32(q), GpuInput::F32(k), GpuInput::F32(v)) => {
                let $dev = upload(&$g.stream, $planes, q, k, v)?;
                let $kn = &$g.f32k;
                $body
            }
            (GpuInput::Bf16(q), GpuInput::Bf16(k), GpuInput::Bf16(v)) => {
                let $dev = upload(&$g.stream, $planes, q, k, v)?;
                let $kn = &$g.bf16k;
                $body
            }
            _ => {
                return Err(RaceError::param(
                    "dtype",
                    "q, k and v must share one dtype (all f32 or all bf16)",
                ))
            }
        }
    };
}

/// Soft-RACE forward on the GPU.
pub fn soft_forward(
    planes: &PlanesF32,
    beta: f32,
    q: GpuInput,
    k: GpuInput,
    v: GpuInput,
    s: GpuShape,
    causal: bool,
) -> Result<GpuForward> {
    check_problem(planes, beta, &q, &k, &v, s)?;
    let g = gpu()?;
    let dm = dims(planes, beta, s)?;
    with_input!(g, planes, q, k, v, |dev, kn| {
        allow_shared(kn, &dm.geo)?;
        let mut bf = Bufs::new(&g.stream, &dm, false)?;
        fwd_dev(g, kn, &dev, &dm, causal, &mut bf)?;
        let (o, den) = (host(&g.stream, &bf.o)?, host(&g.stream, &bf.den)?);
        let map = SoftMap::new(planes, beta)?;
        Ok(finish_forward(o, den, map, [&q, &k, &v], s, causal))
    })
}

/// Soft-RACE forward and backward on the GPU with upstream gradient `g` (`[heads, n, dv]`).
#[allow(clippy::too_many_arguments)]
pub fn soft_backward(
    planes: &PlanesF32,
    beta: f32,
    q: GpuInput,
    k: GpuInput,
    v: GpuInput,
    gr: &[f32],
    s: GpuShape,
    causal: bool,
) -> Result<(GpuForward, SoftGrads)> {
    check_problem(planes, beta, &q, &k, &v, s)?;
    if gr.len() != s.heads * s.n * s.dv {
        return Err(RaceError::shape(
            "g",
            format!("{} values for [{}, {}, {}]", gr.len(), s.heads, s.n, s.dv),
        ));
    }
    super::check_grad_finite(gr)?;
    let g = gpu()?;
    let dm = dims(planes, beta, s)?;
    with_input!(g, planes, q, k, v, |dev, kn| {
        allow_shared(kn, &dm.geo)?;
        let mut bf = Bufs::new(&g.stream, &dm, true)?;
        fwd_dev(g, kn, &dev, &dm, causal, &mut bf)?;
        let gd = g
            .stream
            .clone_htod(gr)
            .map_err(|e| cuda_err("copying g", e))?;
        bwd_dev(g, kn, &dev, &dm, causal, &gd, &mut bf)?;
        let dbeta = host(&g.stream, &bf.dbq)?
            .iter()
            .chain(host(&g.stream, &bf.dbk)?.iter())
            .map(|&x| x as f64)
            .sum();
        let (o, den) = (host(&g.stream, &bf.o)?, host(&g.stream, &bf.den)?);
        let map = SoftMap::new(planes, beta)?;
        let fwd = finish_forward(o, den, map, [&q, &k, &v], s, causal);
        let mut grads = SoftGrads {
            dq: host(&g.stream, &bf.dq)?,
            dk: host(&g.stream, &bf.dk)?,
            dv: host(&g.stream, &bf.dv)?,
            dbeta,
        };
        finish_backward(&fwd, map, [&q, &k, &v], gr, s, causal, &mut grads);
        Ok((fwd, grads))
    })
}

// The resident problem and the probes a benchmark times: a child module, so it reaches the
// context, buffers and launches above without widening their visibility.
#[path = "resident.rs"]
mod resident;
pub use resident::{copy_seconds, device_name, fma_seconds, Resident};
