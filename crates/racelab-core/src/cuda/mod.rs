//! CUDA backend for soft RACE (cudarc, NVRTC), forward and backward, non-causal and causal.
//!
//! The kernels are CUDA C in [`RACE_CU`] (`src/cuda/race.cu`), compiled at run time by NVRTC
//! twice: for f32 inputs and (with `-DRACE_BF16`) for bf16 inputs; accumulation is f32
//! within chunks of at most [`MAX_CHUNK`] tokens ([`chunk_len`]) and f64 across chunks
//! (`race_scan`). No float atomics, so results are identical run to run.
//!
//! Two kernel families ([`KernelPath`], [`Geometry`]):
//! - **tiled** (the default wherever the tiles fit): one block of 8 warps per chunk, in tiles
//!   of [`TILE`] tokens, every step block-parallel (coalesced row loads, split projections,
//!   one thread per element for the nonlinear steps, register-blocked products: columns over
//!   lanes for the wide ones, a block of outputs per thread for the narrow ones). On an H200
//!   (`docs/performance.md`) it beat warp-per-chunk on every measured row, e.g.
//!   forward+backward at (2,2), 2^20 per head: 15.0 ms against 32.4 ms;
//! - **warp-per-chunk**: one warp walks one chunk of one head token by token with warp-level
//!   steps only; a block holds up to 8 such warps, as many as the shared memory allows when
//!   each keeps a private `L·2^P × (dv+1)` state. It takes any shape the shared memory
//!   allows.
//!
//! With the `cuda` feature (default) the driver is loaded dynamically: the crate builds and
//! its tests run on machines without CUDA, and every entry point first checks that the driver
//! and NVRTC libraries exist and a device opens, returning [`RaceError::NoCuda`] otherwise
//! (never a panic). Without the feature, the same API returns that error immediately.
//!
//! A row whose f32 denominator is below `crate::shared::recompute::den_floor` is flagged by the
//! forward kernels (zero output, saved `DEN = 0`, so the backward kernels give it no share)
//! and recomputed exactly on the host ([`finish_forward`], [`finish_backward`]): the GPU
//! never returns such a row unflagged. A denominator that is not finite is flagged the same
//! way (`den_kept`). Numerators cannot overflow: the one validation ([`crate::validate`],
//! step 5) refuses, before a device is asked for, values whose weighted sums could pass a
//! quarter of f32's largest (`tests/cuda.rs` runs race.cu under the CPU emulation at the top
//! of the accepted range).

#![deny(missing_docs)]

use crate::backend::Recomputed;
use crate::backend::{
    Backend, Decode, Device, Forward, ForwardInputs, Heads, PlanesF32, RaceParams, SoftGrads,
};
use crate::shared::recompute;
use crate::shared::SoftMap;

use crate::error::{RaceError, Result};

/// The CUDA C source of all kernels (compiled with NVRTC at run time).
pub const RACE_CU: &str = include_str!("race.cu");

/// Most tokens per chunk (f32 accumulation happens within a chunk only).
pub const MAX_CHUNK: usize = 1024;
/// Fewest tokens per chunk.
pub const MIN_CHUNK: usize = 32;
/// Chunks wanted per problem: chunks shrink (down to [`MIN_CHUNK`]) until a problem has
/// about this many. The warp-per-chunk kernels run one warp per chunk (4096 is about one wave
/// of an H200 at 32 resident warps per multiprocessor); the tiled ones one block per chunk.
pub const TARGET_CHUNKS: usize = 4096;

/// Chunk length for `heads × n` tokens: the power of two in [MIN_CHUNK, MAX_CHUNK] closest
/// to giving [`TARGET_CHUNKS`] chunks, rounded up. Longer chunks mean fewer partial states
/// to scan (each is `L·2^P·(dv+1)` floats); shorter ones, more parallel work.
pub fn chunk_len(heads: usize, n: usize) -> usize {
    (heads * n)
        .div_ceil(TARGET_CHUNKS)
        .next_power_of_two()
        .clamp(MIN_CHUNK, MAX_CHUNK)
}

/// Kernel names the Rust side launches (checked against the source in tests).
pub const KERNELS: [&str; 14] = [
    "race_partial",
    "race_scan",
    "race_fwd",
    "race_bwd_q",
    "race_bwd_k",
    "race_partial_tile",
    "race_partial_tile_m16",
    "race_fwd_tile",
    "race_bwd_q_tile",
    "race_bwd_k_tile",
    "race_fwd_tile_causal",
    "race_bwd_q_tile_causal",
    "race_bwd_k_tile_causal",
    "race_fma_peak",
];

/// The CUDA environment switches that are set, as `NAME=value`.
pub fn switches() -> Vec<String> {
    [
        "RACELAB_CUDA_PATH",
        "RACELAB_CUDA_CHUNK",
        "RACELAB_CUDA_DEFINES",
    ]
    .iter()
    .filter_map(|k| std::env::var(k).ok().map(|v| format!("{k}={v}")))
    .collect()
}

/// Input element type on the device.
#[derive(Debug, Clone, Copy)]
pub enum GpuInput<'a> {
    /// f32 values.
    F32(&'a [f32]),
    /// bf16 as raw 16-bit words (the upper half of an f32).
    Bf16(&'a [u16]),
}

impl GpuInput<'_> {
    /// Elements.
    pub fn len(&self) -> usize {
        match self {
            GpuInput::F32(x) => x.len(),
            GpuInput::Bf16(x) => x.len(),
        }
    }
    /// No elements.
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
    /// Heads (batch × heads).
    pub heads: usize,
    /// Tokens per head (queries = keys).
    pub n: usize,
    /// Query and key width.
    pub d: usize,
    /// Value width.
    pub dv: usize,
}

/// The kernel family a problem at this beta runs on: from
/// `crate::shared::PROJ_F64_BETA` on, the warp-per-chunk kernels, whose projections
/// then accumulate in double (race.cu, `warp_project`); below it the default choice
/// ([`geometry`]).
pub fn path_for(beta: f32) -> Option<KernelPath> {
    (beta >= crate::shared::PROJ_F64_BETA).then_some(KernelPath::Warp)
}

/// Forward output copied back to the host.
#[derive(Debug, Clone)]
pub struct GpuForward {
    /// `Ô`, `[heads, n, dv]`.
    pub o: Vec<f32>,
    /// The saved `Den_i` (with the `1/L`); 0 for a row the kernels flagged.
    pub den: Vec<f32>,
    /// Rows with no key at all (0 in `o`).
    pub empty_rows: usize,
    /// The rows the kernels flagged (denominator below f32's range, see
    /// [`crate::shared::recompute`]), recomputed exactly on the host, and the seconds it took.
    pub recomputed: Recomputed,
}

impl GpuInput<'_> {
    /// The values as f32 (bf16 widened exactly).
    pub fn to_f32(&self) -> std::borrow::Cow<'_, [f32]> {
        match self {
            GpuInput::F32(x) => std::borrow::Cow::Borrowed(x),
            GpuInput::Bf16(x) => std::borrow::Cow::Owned(from_bf16(x)),
        }
    }
}

/// The host's part of a forward: the kernels' outputs, with the rows they flagged (saved
/// `DEN = 0`) recomputed exactly by [`crate::shared::recompute`] on the same inputs.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub fn finish_forward(
    mut o: Vec<f32>,
    den: Vec<f32>,
    map: SoftMap,
    qkv: [&GpuInput; 3],
    s: GpuShape,
    causal: bool,
) -> GpuForward {
    let rows = recompute::flagged(&den);
    if rows.is_empty() {
        return GpuForward {
            o,
            den,
            empty_rows: 0,
            recomputed: Recomputed::default(),
        };
    }
    let [q, k, v] = qkv.map(|x| x.to_f32());
    let x = ForwardInputs::new(
        Heads::of(s.heads, s.n, s.d, &q),
        Heads::of(s.heads, s.n, s.d, &k),
        Heads::of(s.heads, s.n, s.dv, &v),
    );
    let (empty_rows, recomputed) = recompute::forward(&map, x, causal, rows, &mut o);
    GpuForward {
        o,
        den,
        empty_rows,
        recomputed,
    }
}

/// The host's part of a backward: the recomputed rows' exact share of every gradient (the
/// kernels gave them none), added to `gr`.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub fn finish_backward(
    fwd: &GpuForward,
    map: SoftMap,
    qkv: [&GpuInput; 3],
    g: &[f32],
    s: GpuShape,
    causal: bool,
    gr: &mut SoftGrads,
) {
    if fwd.recomputed.rows.is_empty() {
        return;
    }
    let [q, k, v] = qkv.map(|x| x.to_f32());
    let x = ForwardInputs::new(
        Heads::of(s.heads, s.n, s.d, &q),
        Heads::of(s.heads, s.n, s.d, &k),
        Heads::of(s.heads, s.n, s.dv, &v),
    );
    let g = Heads::of(s.heads, s.n, s.dv, g);
    let rows = &fwd.recomputed.rows;
    gr.dbeta += recompute::backward(&map, x, g, causal, rows, gr.as_mut());
}

/// Floats of dynamic shared memory a block of `warps` warps needs (the layout `carve` makes
/// in race.cu): each warp's scratch `x [d] | 5 × [L·P] | 2 × [m] | 2 × [dv+1]`, then one
/// `m × (dv+1)` state per warp (`private_state`) or one for the block.
pub fn shared_floats(
    p: usize,
    l: usize,
    d: usize,
    dv: usize,
    warps: usize,
    private_state: bool,
) -> usize {
    let (lp, m, w) = (l * p, l << p, dv + 1);
    let scratch = d + 5 * lp + 2 * m + 2 * w;
    warps * scratch + if private_state { warps } else { 1 } * m * w
}

/// Shared memory one block may use on current NVIDIA GPUs (Hopper: 227 KiB).
pub const MAX_SHARED_BYTES: usize = 227 * 1024;

/// Tokens per tile of the tiled kernels, and their register blocks: features
/// `m ≤ 8·TILE_TM`, bank columns `dv + 1 ≤ 32·TILE_TC` (TILE, TM, TC in race.cu).
pub const TILE: usize = 32;
/// Feature rows per thread of a tile's register block (`m ≤ 8·TILE_TM`).
pub const TILE_TM: usize = 8;
/// Bank columns per lane of a tile's register block (`dv + 1 ≤ 32·TILE_TC`).
pub const TILE_TC: usize = 5;

/// Floats of dynamic shared memory of a tiled kernel's block (the layout `blk_carve` makes
/// in race.cu): `W [L·P·d] | xr [TILE·max(d+1, m, dv+1)] | red [8·TILE·L·P] |` five (six if
/// `causal`) `[TILE·L·P]` | one (two) `φ [TILE·(m+1)]` | one (two) `[TILE·(dv+1)]` | (causal:
/// two `[TILE·(TILE+1)]`) `| [TILE]`, then `states` blocks of `m × (dv+1)`: 0 for the chunk
/// totals, 1 for the forward and the keys' pass (the running state), 2 for the queries' pass
/// (the state and its accumulator of `Σ φ(q) ĝ / L`).
pub fn shared_floats_tiled(
    p: usize,
    l: usize,
    d: usize,
    dv: usize,
    causal: bool,
    states: usize,
) -> usize {
    let (lp, m, w) = (l * p, l << p, dv + 1);
    let k = causal as usize;
    lp * d
        + TILE * (d + 1).max(m).max(w)
        + 8 * TILE * lp
        + (5 + k) * TILE * lp
        + (1 + k) * TILE * (m + 1)
        + (1 + k) * TILE * w
        + 2 * k * TILE * (TILE + 1)
        + TILE
        + states * m * w
}

/// How a problem is launched.
///
/// - Warp-per-chunk kernels (the causal passes, and everything when the tiled ones do not
///   apply): `warps` per block (8 when the shared memory allows, else fewer), `blocks_x`
///   blocks per head, `shared_private` / `shared_block` bytes with a state per warp / per
///   block.
/// - Tiled kernels (`tiled`: the chunk totals and the non-causal passes): one block of 8 warps
///   per chunk, `shared_tile` / `shared_tile_state` / `shared_tile_query` bytes with 0 / 1 / 2
///   bank-sized blocks (chunk totals / forward and keys' pass / queries' pass).
/// - Tiled causal kernels (`tiled_causal`: the causal passes), one block of 8 warps per chunk
///   with `shared_tile_causal` bytes (`shared_tile_causal_query` for the queries' pass).
///
/// The tiled queries' passes also total `Σ φ(q) ĝ / L` per chunk, so those problems skip
/// the separate chunk-totals launch of the backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Warps per block of the warp-per-chunk kernels.
    pub warps: usize,
    /// Tokens per chunk (a power of two).
    pub chunk: usize,
    /// Chunks per head.
    pub nchunks: usize,
    /// Blocks per head of the warp-per-chunk kernels.
    pub blocks_x: usize,
    /// Shared bytes with a state per warp.
    pub shared_private: usize,
    /// Shared bytes with a state per block.
    pub shared_block: usize,
    /// Whether the tiled kernels run the chunk totals and the non-causal passes.
    pub tiled: bool,
    /// Shared bytes of a tiled block with no bank-sized state (chunk totals).
    pub shared_tile: usize,
    /// Shared bytes of a tiled block with one state (forward, keys' pass).
    pub shared_tile_state: usize,
    /// Shared bytes of a tiled block with two states (queries' pass).
    pub shared_tile_query: usize,
    /// Whether the tiled causal kernels run the causal passes.
    pub tiled_causal: bool,
    /// Shared bytes of a tiled causal block.
    pub shared_tile_causal: usize,
    /// Shared bytes of a tiled causal block in the queries' pass.
    pub shared_tile_causal_query: usize,
}

impl Geometry {
    /// The same launch with chunks of `chunk` tokens (a power of two, at least [`TILE`]),
    /// e.g. so that small test problems have several tiles per chunk.
    pub fn with_chunk(mut self, n: usize, chunk: usize) -> Geometry {
        assert!(chunk.is_power_of_two() && chunk >= TILE, "chunk {chunk}");
        self.chunk = chunk;
        self.nchunks = n.div_ceil(chunk);
        self.blocks_x = self.nchunks.div_ceil(self.warps);
        self
    }
}

/// Which kernels a problem runs on (see [`Geometry`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelPath {
    /// Tiled wherever the tiles fit (`m ≤ 8·TILE_TM`, `dv + 1 ≤ 32·TILE_TC`, shared memory),
    /// warp-per-chunk elsewhere: the default.
    Tiled,
    /// Warp-per-chunk kernels for every pass.
    Warp,
}

/// The launch geometry of a problem, or an error naming `p` when even one warp's private
/// state does not fit in shared memory. The environment variable `RACELAB_CUDA_PATH`
/// (`tiled` or `warp`; default `tiled`) picks the [`KernelPath`], a switch for comparing
/// and testing the two kernel families.
pub fn geometry(p: usize, l: usize, s: GpuShape) -> Result<Geometry> {
    let path = match std::env::var("RACELAB_CUDA_PATH").as_deref() {
        Ok("warp") => KernelPath::Warp,
        Ok("tiled") | Err(_) => KernelPath::Tiled,
        Ok(other) => {
            return Err(RaceError::param(
                "RACELAB_CUDA_PATH",
                format!("`{other}` is not a kernel path; use tiled or warp"),
            ))
        }
    };
    let geo = geometry_with(p, l, s, path)?;
    // Testing knob: RACELAB_CUDA_CHUNK=64 (say) gives small problems several tiles per chunk.
    match std::env::var("RACELAB_CUDA_CHUNK") {
        Err(_) => Ok(geo),
        Ok(v) => match v.parse::<usize>() {
            Ok(c) if c.is_power_of_two() && (TILE..=1 << 20).contains(&c) => {
                Ok(geo.with_chunk(s.n, c))
            }
            _ => Err(RaceError::param(
                "RACELAB_CUDA_CHUNK",
                format!("`{v}` is not a chunk length; use a power of two from {TILE} to 2^20"),
            )),
        },
    }
}

/// [`geometry`] on a given [`KernelPath`].
pub fn geometry_with(p: usize, l: usize, s: GpuShape, path: KernelPath) -> Result<Geometry> {
    let bytes = |warps, private| 4 * shared_floats(p, l, s.d, s.dv, warps, private);
    let warps = [8usize, 4, 2, 1]
        .into_iter()
        .find(|&wp| bytes(wp, true) <= MAX_SHARED_BYTES)
        .ok_or_else(|| {
            RaceError::param(
                "p",
                format!(
                    "the CUDA kernels keep one L·2^P × (dv+1) state per warp in shared memory; (P, L, d, dv) = ({p}, {l}, {}, {}) needs {} KiB > {} KiB; lower P, L or dv",
                    s.d,
                    s.dv,
                    bytes(1, true) / 1024,
                    MAX_SHARED_BYTES / 1024
                ),
            )
        })?;
    let chunk = chunk_len(s.heads, s.n);
    let nchunks = s.n.div_ceil(chunk);
    let tile_bytes = |causal, states| 4 * shared_floats_tiled(p, l, s.d, s.dv, causal, states);
    let m = l << p;
    let wanted = path == KernelPath::Tiled;
    let tiles_fit = wanted && m <= 8 * TILE_TM && s.dv < 32 * TILE_TC;
    let tiled = tiles_fit && tile_bytes(false, 2) <= MAX_SHARED_BYTES;
    let tiled_causal = tiles_fit && tile_bytes(true, 2) <= MAX_SHARED_BYTES;
    Ok(Geometry {
        warps,
        chunk,
        nchunks,
        blocks_x: nchunks.div_ceil(warps),
        shared_private: bytes(warps, true),
        shared_block: bytes(warps, false),
        tiled,
        shared_tile: tile_bytes(false, 0),
        shared_tile_state: tile_bytes(false, 1),
        shared_tile_query: tile_bytes(false, 2),
        tiled_causal,
        shared_tile_causal: tile_bytes(true, 1),
        shared_tile_causal_query: tile_bytes(true, 2),
    })
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
    // Planes and shapes are held to their data (again: the crate's own code can set the
    // fields), with products that cannot wrap: the kernels index every buffer by these extents.
    let product = |a: usize, b: usize, c: usize| a.checked_mul(b).and_then(|x| x.checked_mul(c));
    if product(planes.l, planes.p, planes.d) != Some(planes.w.len()) {
        return Err(RaceError::shape(
            "planes",
            format!(
                "{} values for shape [L, P, d] = [{}, {}, {}]",
                planes.w.len(),
                planes.l,
                planes.p,
                planes.d
            ),
        ));
    }
    for (name, x, want) in [
        ("q", q, product(s.heads, s.n, s.d)),
        ("k", k, product(s.heads, s.n, s.d)),
        ("v", v, product(s.heads, s.n, s.dv)),
    ] {
        if Some(x.len()) != want {
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
    for (name, x) in [("q", q), ("k", k), ("v", v)] {
        check_input_finite(name, x)?;
    }
    geometry(planes.p, planes.l, s).map(|_| ())
}

/// NaN or ±∞ anywhere in an input is an error naming it and the first bad index (bf16
/// words: exponent all ones). The scan is parallel: GPU inputs run to tens of GiB.
fn check_input_finite(name: &str, x: &GpuInput) -> Result<()> {
    use rayon::prelude::*;
    let bad = match x {
        GpuInput::F32(a) => a.par_iter().position_first(|v| !v.is_finite()),
        GpuInput::Bf16(a) => a.par_iter().position_first(|&b| b & 0x7f80 == 0x7f80),
    };
    match bad {
        None => Ok(()),
        Some(index) => Err(RaceError::NonFinite {
            arg: name.into(),
            index,
            value: match x {
                GpuInput::F32(a) => a[index] as f64,
                GpuInput::Bf16(a) => from_bf16(&a[index..index + 1])[0] as f64,
            },
        }),
    }
}

/// [`check_input_finite`] for the upstream gradient `g`.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn check_grad_finite(g: &[f32]) -> Result<()> {
    check_input_finite("g", &GpuInput::F32(g))
}

#[cfg(feature = "cuda")]
mod device;
#[cfg(feature = "cuda")]
pub use device::{
    copy_seconds, device_name, ensure_device, fma_seconds, soft_backward, soft_forward, Resident,
};

#[cfg(not(feature = "cuda"))]
mod stub;
#[cfg(not(feature = "cuda"))]
pub use stub::{
    copy_seconds, device_name, ensure_device, fma_seconds, soft_backward, soft_forward, Resident,
};

/// The CUDA kernels behind the backend contract ([`crate::backend::Backend`]): f32 inputs
/// copied to the device, the rows the kernels flag recomputed exactly on the host. Built
/// without the `cuda` feature every call returns the no-device error. The kernels have no
/// recurrent decoder (one token per launch would leave the card idle): [`Backend::decoder`]
/// says so and names the backends that have one.
#[derive(Debug, Clone, Copy, Default)]
pub struct CudaRace;

impl CudaRace {
    fn shape(params: &RaceParams, q: &Heads, k: &Heads, v: &Heads) -> Result<GpuShape> {
        if params.combine != crate::params::Combine::Paper {
            return Err(RaceError::param(
                "combine",
                format!(
                    "the authors' combine rule has no kernel; use {} or {}",
                    crate::error::setting("device", "reference"),
                    crate::error::setting("combine", "paper")
                ),
            ));
        }
        if q.n != k.n {
            return Err(RaceError::shape(
                "k",
                "the CUDA kernels need as many keys as queries",
            ));
        }
        Ok(GpuShape {
            heads: q.heads,
            n: q.n,
            d: q.cols,
            dv: v.cols,
        })
    }
}

impl Backend for CudaRace {
    fn device(&self) -> Device {
        Device::Cuda
    }

    fn forward(
        &self,
        params: &RaceParams,
        planes: &PlanesF32,
        q: Heads,
        k: Heads,
        v: Heads,
    ) -> Result<Forward> {
        crate::backend::check(params, planes, &q, &k, &v, None)?;
        let s = Self::shape(params, &q, &k, &v)?;
        let f = soft_forward(
            planes,
            params.beta as f32,
            GpuInput::F32(q.data),
            GpuInput::F32(k.data),
            GpuInput::F32(v.data),
            s,
            params.causal,
        )?;
        Ok(Forward {
            o: f.o,
            empty_rows: f.empty_rows,
            recomputed: f.recomputed,
        })
    }

    fn forward_backward(
        &self,
        params: &RaceParams,
        planes: &PlanesF32,
        q: Heads,
        k: Heads,
        v: Heads,
        g: Heads,
    ) -> Result<(Forward, SoftGrads)> {
        crate::backend::check(params, planes, &q, &k, &v, Some(&g))?;
        let s = Self::shape(params, &q, &k, &v)?;
        let (f, grads) = soft_backward(
            planes,
            params.beta as f32,
            GpuInput::F32(q.data),
            GpuInput::F32(k.data),
            GpuInput::F32(v.data),
            g.data,
            s,
            params.causal,
        )?;
        let fwd = Forward {
            o: f.o,
            empty_rows: f.empty_rows,
            recomputed: f.recomputed,
        };
        Ok((fwd, grads))
    }

    fn decoder(&self, _: &RaceParams, _: &PlanesF32, _: usize) -> Result<Box<dyn Decode>> {
        ensure_device()?;
        Err(RaceError::param(
            "device",
            format!(
                "the CUDA backend has no recurrent decoder (one token per launch leaves the card \
                 idle); decode with {} or {}",
                crate::error::setting("device", "cpu"),
                crate::error::setting("device", "reference")
            ),
        ))
    }
}
