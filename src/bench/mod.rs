//! `racelab bench`: the fast kernels timed against the exact quadratic references and the
//! machine's measured limits, in one run.
//!
//! Each row reports the median of `runs` (≥ 3) timings (of more for a row whose runs would
//! add up to less than [`SHORT_ROW_SECONDS`]), tokens/s, peak RSS (reset per row), the
//! minimum bytes the operation must move, and `floor_seconds = bytes_moved / bandwidth` with
//! the bandwidth measured in the same run; RACE rows also report the arithmetic floor
//! `flops / measured FMA peak`.
//!
//! The bandwidth is probed at the start and at the end of the run; the larger reading floors
//! every row (`ratio_to_run_floor`). CPU RACE rows that move at least
//! [`ADJACENT_PROBE_BYTES`] (`row_probe_bytes`) are also bracketed by their own probes, taken
//! just before and just after the row's runs (consecutive rows share the probe between
//! them), and their `ratio_to_floor` uses the larger of those two: this machine switches
//! between about 42 and 73 GB/s within minutes, and a row a minute away from a probe can run
//! in the other state (run-wide probes of 48–49 and 70–73 GB/s have been seen around a
//! non-causal `(2, 2)` row that ran at the slow state's speed). Rows without their own probes use the run-wide floor for both ratios.
//!
//! Afterwards: fitted scaling exponents (least squares of log t on log N) and the crossover
//! N against exact softmax (only when softmax was timed).
//!
//! The CPU RACE rows run once untimed first ([`WARMUP_RUNS`]): their output and context
//! buffers are reused across runs, and the first run is the one that faults their pages in
//! and sizes the context (at N = 2^20, `(2, 2)`, a first run takes 0.44–0.69 s non-causal
//! and 0.77–0.94 s causal, the later ones 0.37–0.49 and 0.53–0.65 s; without the warm-up the
//! median of three runs would be the slower of the two later ones). The references are not warmed up (one run of
//! the largest takes about 30 s).
//!
//! With `causal_ratio` (`racelab bench --causal-ratio`) each `(P, L)` is timed causal and
//! non-causal in one pass, their runs alternated (non-causal, causal, non-causal, …) after
//! one warm-up of each, and the report adds [`CausalRatio`]: the ratio within each adjacent
//! pair, their median (the headline), and the ratio of the two rows' medians. This machine's memory state drifts over minutes
//! (the probes read 47–73 GB/s in one run, and the non-causal `(2, 2)` row takes 0.37–0.49
//! s depending on it), so two rows timed a minute apart, as two separate invocations
//! are, can compare a fast state with a slow one; alternated runs a second apart see the
//! same state.

pub mod accuracy;
pub mod gpu;
pub mod machine;

use crate::backend::{Heads, PlanesF32};
use crate::cpu::exact::{exact_attention, Exact};
use crate::cpu::{self, soft_backward_into, soft_forward_into, SoftMap};
use crate::error::{RaceError, Result};
use crate::hashing::Planes;
use crate::plot::{line_plot, LinePlot, Series};
use crate::provenance::{available_memory_bytes, peak_rss_bytes, reset_peak_rss, Provenance};
use serde::Serialize;
use std::path::PathBuf;
use std::time::Instant;

pub use crate::backend::Device;

/// What to benchmark.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    pub ns: Vec<usize>,
    pub pl: Vec<(usize, usize)>,
    pub heads: usize,
    pub d: usize,
    pub causal: bool,
    pub backward: bool,
    pub reference: bool,
    pub device: Device,
    pub beta: f64,
    pub seed: u64,
    pub runs: usize,
    /// Stop timing a reference once its next run is predicted to exceed this many seconds.
    pub ref_budget_s: f64,
    /// Time every `(P, L)` causal and non-causal, runs alternated, and report their ratio
    /// ([`CausalRatio`]); excludes `causal` and `reference`.
    pub causal_ratio: bool,
    /// CPU RACE rows moving at least this many bytes get their own bandwidth probes
    /// (default [`ADJACENT_PROBE_BYTES`]).
    pub row_probe_bytes: f64,
    pub out: Option<PathBuf>,
}

impl Default for BenchConfig {
    fn default() -> Self {
        BenchConfig {
            ns: (10..=20).map(|e| 1usize << e).collect(),
            pl: vec![(2, 2), (3, 3), (4, 4)],
            heads: 4,
            d: 128,
            causal: false,
            backward: false,
            reference: false,
            device: Device::Cpu,
            beta: 8.0,
            seed: 0,
            runs: 3,
            ref_budget_s: 30.0,
            causal_ratio: false,
            row_probe_bytes: ADJACENT_PROBE_BYTES,
            out: None,
        }
    }
}

/// One timed configuration.
#[derive(Debug, Clone, Serialize)]
pub struct BenchRow {
    pub method: String,
    pub device: Device,
    pub n: usize,
    pub p: Option<usize>,
    pub l: Option<usize>,
    pub heads: usize,
    pub d: usize,
    pub causal: bool,
    pub backward: bool,
    pub seconds: f64,
    pub tokens_per_s: f64,
    pub peak_rss_bytes: u64,
    pub bytes_moved: f64,
    pub floor_seconds: f64,
    pub ratio_to_floor: f64,
    /// The probes bracketing this row (GB/s, before and after its runs), when it has its own
    /// (see the module docs); `floor_seconds` then uses the larger.
    pub bandwidth_probes_gbs: Option<[f64; 2]>,
    /// Seconds over the run-wide floor (the larger of the run's first and last probes).
    pub ratio_to_run_floor: f64,
    pub flops: Option<f64>,
    pub flop_floor_seconds: Option<f64>,
    /// Soft RACE: the rows the kernels flagged and recomputed exactly in the last run
    /// ([`crate::cpu::recompute`]), and that recompute's seconds (inside the timed runs on
    /// the CPU; timed once on the host after the kernels' runs on the GPU). None for the
    /// quadratic references.
    pub recomputed_rows: Option<usize>,
    pub recompute_seconds: Option<f64>,
    pub runs: Vec<f64>,
}

/// A fitted `t ∝ N^e`.
#[derive(Debug, Clone, Serialize)]
pub struct Fit {
    pub series: String,
    pub exponent: f64,
    pub points: usize,
}

/// A crossover: the smallest measured N at which the kernel beats exact softmax.
#[derive(Debug, Clone, Serialize)]
pub struct Crossover {
    pub series: String,
    pub n: Option<usize>,
    pub note: String,
}

/// Causal against non-causal time of one `(P, L)` and N, from alternated runs
/// ([`BenchConfig::causal_ratio`]).
#[derive(Debug, Clone, Serialize)]
pub struct CausalRatio {
    pub n: usize,
    pub p: usize,
    pub l: usize,
    /// The median of `pair_ratios`: the headline figure (each pair's two runs are a second
    /// apart, so a change of the machine's memory state between them is rare).
    pub median_pair_ratio: f64,
    /// The causal row's median seconds over the non-causal row's (the medians come from runs
    /// up to several seconds apart).
    pub ratio_of_medians: f64,
    /// Run `i` causal over run `i` non-causal (timed one after the other).
    pub pair_ratios: Vec<f64>,
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    /// The larger of the two probes (before and after the rows): floors use it.
    pub bandwidth_gbs: f64,
    pub bandwidth_probes_gbs: [f64; 2],
    pub fma_peak_gflops: f64,
    pub isa: String,
    /// With `--device cuda`: the GPU's measured ceilings, which floor the GPU rows.
    pub gpu: Option<gpu::DeviceCeilings>,
    pub rows: Vec<BenchRow>,
    pub fits: Vec<Fit>,
    pub crossovers: Vec<Crossover>,
    /// With [`BenchConfig::causal_ratio`]: one entry per `(P, L)` and N.
    pub causal_ratios: Vec<CausalRatio>,
    pub skipped: Vec<String>,
    pub provenance: Provenance,
    pub out_dir: Option<String>,
    /// The seed of the planes and inputs, and beta.
    pub seed: u64,
    pub beta: f64,
    /// Untimed runs before each CPU RACE row's timed ones ([`WARMUP_RUNS`]).
    pub warmup_runs: usize,
}

/// Minimum bytes per token and head (f32) with `lp = L·P` floats per token saved for the
/// backward: the forward reads Q, K, V and writes O, the saved `u` of queries and keys and the
/// denominator; the backward reads G, V (∂ℓ/∂k needs `v`), the saved values, and writes dQ, dK,
/// dV. Q, K and O need not be read again (the kernels do not), so this is below the
/// `4d + 4dv` backward of a re-reading implementation (24 KiB per token at the paper shape,
/// against about 18.4 KiB here). `lp = 0` for the exact references. forward (Q, K, V, O).
pub fn bytes_per_token(d: usize, dv: usize, lp: usize, backward: bool) -> f64 {
    let saved = if lp > 0 { 2 * lp + 1 } else { 0 };
    let fwd = 2 * d + 2 * dv + saved;
    let bwd = 2 * d + 3 * dv + saved;
    4.0 * (if backward { fwd + bwd } else { fwd }) as f64
}

/// FMA count of soft RACE per token and head, times 2 flops (see `cpu::backward` docs):
/// forward `2Pd + 2R(dv+1)` per table (projections of q and k, bank update and read),
/// backward `2Pd + 4R(dv+1)` (the projections are saved, not recomputed: `∂ℓ/∂q`, `∂ℓ/∂k`
/// through `W`, and four bank-sized products).
pub fn race_flops_per_token(p: usize, l: usize, d: usize, dv: usize, backward: bool) -> f64 {
    let r = 1usize << p;
    let fwd = 2 * p * d + 2 * r * (dv + 1);
    let bwd = 2 * p * d + 4 * r * (dv + 1);
    2.0 * (l * if backward { fwd + bwd } else { fwd }) as f64
}

pub use crate::stats::loglog_slope;
use crate::stats::median;

/// Untimed runs before a CPU RACE row's timed runs (see the module docs).
pub const WARMUP_RUNS: usize = 1;

/// CPU RACE rows moving at least this many bytes (a floor of about 0.1 s here) get their own
/// bandwidth probes, about half a second each: at the paper shape forward+backward (4.6 KB
/// per token and head), N ≥ 2^18.
pub const ADJACENT_PROBE_BYTES: f64 = 4e9;

/// Time `f` `runs` times; returns (median, all).
fn time_runs(runs: usize, mut f: impl FnMut()) -> (f64, Vec<f64>) {
    let mut once = || {
        let t = Instant::now();
        f();
        t.elapsed().as_secs_f64()
    };
    let first = once();
    let mut ts = vec![first];
    ts.extend((1..runs_for(runs, first)).map(|_| once()));
    let all = ts.clone();
    (median(&ts), all)
}

/// Timed runs of a row: at least `runs`, and for a short row as many as make
/// [`SHORT_ROW_SECONDS`] (at most [`MAX_RUNS`]), from the first run's time `first`. The
/// median of three millisecond runs is at the mercy of one interruption: in a quick
/// `racelab reproduce` at its earlier sizes (two heads, d = 64, N ≤ 8192) one
/// such row once took 2.2 ms instead of about 1.1 and turned the fitted exponent of `(2, 2)`
/// from 0.9 into 1.99.
fn runs_for(runs: usize, first: f64) -> usize {
    let runs = runs.max(1);
    if first * runs as f64 >= SHORT_ROW_SECONDS {
        return runs;
    }
    ((SHORT_ROW_SECONDS / first.max(1e-9)).ceil() as usize).clamp(runs, MAX_RUNS)
}

/// See [`runs_for`].
pub const SHORT_ROW_SECONDS: f64 = 0.25;
/// See [`runs_for`].
pub const MAX_RUNS: usize = 101;

/// [`time_runs`] after [`WARMUP_RUNS`] untimed calls of `f`.
fn time_runs_warm(runs: usize, mut f: impl FnMut()) -> (f64, Vec<f64>) {
    (0..WARMUP_RUNS).for_each(|_| f());
    time_runs(runs, f)
}

/// `f(false)` and `f(true)` timed alternately `runs` times each (more for a short pair, see
/// [`runs_for`]), after [`WARMUP_RUNS`] untimed calls of both; returns (median, all) for
/// `false`, then for `true`.
type Timed = (f64, Vec<f64>);
fn time_alternated(runs: usize, mut f: impl FnMut(bool)) -> (Timed, Timed) {
    for _ in 0..WARMUP_RUNS {
        f(false);
        f(true);
    }
    let mut ts = [Vec::new(), Vec::new()];
    let mut pairs = runs.max(1);
    let mut i = 0;
    while i < pairs {
        for (which, t) in ts.iter_mut().enumerate() {
            let t0 = Instant::now();
            f(which == 1);
            t.push(t0.elapsed().as_secs_f64());
        }
        if i == 0 {
            pairs = runs_for(runs, ts[0][0] + ts[1][0]);
        }
        i += 1;
    }
    let [a, b] = ts;
    let (ma, mb) = (median(&a), median(&b));
    ((ma, a), (mb, b))
}

/// The series a row belongs to in the fits, the crossovers and the plot: `race (P,L)` (with
/// ` causal` for the causal rows of a `causal_ratio` run) or the reference's name.
fn series_name(r: &BenchRow, causal_ratio: bool) -> String {
    match (r.p, r.l) {
        (Some(p), Some(l)) if causal_ratio && r.causal => format!("race ({p},{l}) causal"),
        (Some(p), Some(l)) => format!("race ({p},{l})"),
        _ => r.method.clone(),
    }
}

/// Run the benchmark.
pub fn run(cfg: &BenchConfig, progress: &dyn Fn(&str)) -> Result<BenchReport> {
    if cfg.ns.is_empty() || cfg.pl.is_empty() {
        return Err(RaceError::param(
            "n",
            "give at least one N and one (P, L) pair",
        ));
    }
    if cfg.heads == 0 || cfg.d == 0 {
        return Err(RaceError::param("heads", "heads and d must be ≥ 1"));
    }
    for &(p, l) in &cfg.pl {
        crate::params::validate_pl(p, l)?;
    }
    crate::params::validate_beta(cfg.beta)?;
    if cfg.device == Device::Reference {
        return Err(RaceError::param(
            "device",
            "bench times the kernels: use --device cpu or cuda (--reference also times the exact references)",
        ));
    }
    if cfg.causal_ratio && cfg.causal {
        return Err(RaceError::param(
            "causal",
            "--causal-ratio times causal and non-causal rows itself; drop --causal",
        ));
    }
    if cfg.causal_ratio && cfg.reference {
        return Err(RaceError::param(
            "reference",
            "--causal-ratio times the RACE kernels only; time the references in a separate run",
        ));
    }
    // GPU rows are floored against the GPU's own measured copy bandwidth and FMA rate.
    let gpu = if cfg.device == Device::Cuda {
        crate::cuda::ensure_device()?;
        progress("measuring the GPU's copy bandwidth and FP32 FMA rate");
        Some(gpu::ceilings()?)
    } else {
        None
    };
    let isa = cpu::detected_isa();
    progress("measuring memory bandwidth and FMA peak");
    let bw_start = machine::bandwidth_gbs();
    let peak = machine::fma_peak_gflops(isa);
    // Floors are set below with the larger of this and a second probe after the rows.
    let bw = bw_start;
    let (h, d, dv) = (cfg.heads, cfg.d, cfg.d);
    let mut rows = Vec::new();
    let mut causal_ratios = Vec::new();
    let mut skipped = Vec::new();
    let mut ref_alive = [cfg.reference, cfg.reference];
    let mut ref_last: [Option<(usize, f64)>; 2] = [None, None];
    let mut ns = cfg.ns.clone();
    ns.sort_unstable();
    for &n in &ns {
        let floats = (if cfg.backward {
            4 * d + 4 * dv + 1
        } else {
            2 * d + 2 * dv + 1
        }) as u64;
        // Plus what the forward keeps for the backward, for the largest (P, L) (both
        // contexts with `causal_ratio`: they are alive together).
        let saved = cfg
            .pl
            .iter()
            .map(|&(p, l)| {
                let ctx = |c| cpu::Ctx::floats_per_token(l, p, dv, c);
                if cfg.causal_ratio {
                    ctx(false) + ctx(true)
                } else {
                    ctx(cfg.causal)
                }
            })
            .fold(0.0, f64::max);
        let state = cfg
            .pl
            .iter()
            .map(|&(p, l)| {
                let features = (l as u64).saturating_mul(1u64 << p);
                crate::memory::kernel_state_bytes(features, h, dv)
            })
            .max()
            .unwrap_or(0);
        let need = ((4.0 * (floats as f64 + saved) * (n * h) as f64) as u64).saturating_add(state);
        // 90%: the estimate is the measured peak (the paper shape at N = 2^20, causal (4,4):
        // 17.65 GiB estimated and 17.65 GiB peak RSS, of 23.5 GiB here), and at 80% that row
        // was skipped whenever the machine had let its page cache grow.
        if need > available_memory_bytes() * 9 / 10 {
            skipped.push(format!(
                "N = {n}: needs {:.1} GiB, more than 90% of available memory",
                need as f64 / (1u64 << 30) as f64
            ));
            continue;
        }
        let mut q = cpu::mem::ABuf::zeroed(h * n * d);
        let mut k = cpu::mem::ABuf::zeroed(h * n * d);
        let mut v = cpu::mem::ABuf::zeroed(h * n * dv);
        machine::fill(&mut q, cfg.seed, 0);
        machine::fill(&mut k, cfg.seed + 1, 0);
        machine::fill(&mut v, cfg.seed + 2, 0);
        let g = if cfg.backward {
            let mut g = cpu::mem::ABuf::zeroed(h * n * dv);
            machine::fill(&mut g, cfg.seed + 3, 0);
            g
        } else {
            cpu::mem::ABuf::zeroed(0)
        };
        let (qh, kh, vh) = (
            Heads::new(h, n, d, &q),
            Heads::new(h, n, d, &k),
            Heads::new(h, n, dv, &v),
        );
        // The probe after the previous row, which serves as this row's probe before.
        let mut last_probe: Option<f64> = None;
        for &(p, l) in &cfg.pl {
            let bytes = bytes_per_token(d, dv, l * p, cfg.backward) * (n * h) as f64;
            let own_probes = cfg.device == Device::Cpu && bytes >= cfg.row_probe_bytes;
            let probe_before = if own_probes {
                Some(last_probe.take().unwrap_or_else(|| {
                    progress("measuring memory bandwidth before the row");
                    machine::bandwidth_gbs()
                }))
            } else {
                None
            };
            progress(&format!("race (P,L)=({p},{l}) N={n}"));
            let planes = PlanesF32::from_planes(&Planes::gaussian(l, p, d, cfg.seed)?);
            let map = SoftMap {
                planes: &planes,
                beta: cfg.beta as f32,
            };
            reset_peak_rss();
            // Output and gradient buffers are allocated once per row and reused across runs,
            // as a caching allocator would; runs time the kernels, not page faults.
            let mut o = cpu::mem::ABuf::zeroed(h * n * dv);
            let (mut dq, mut dk, mut dvb) = if cfg.backward {
                (
                    cpu::mem::ABuf::zeroed(h * n * d),
                    cpu::mem::ABuf::zeroed(h * n * d),
                    cpu::mem::ABuf::zeroed(h * n * dv),
                )
            } else {
                let z = || cpu::mem::ABuf::zeroed(0);
                (z(), z(), z())
            };
            // The context's buffers (denominators, saved `u`) are recycled the same way, one
            // context per mode.
            let mut reuse = [cpu::Ctx::default(), cpu::Ctx::default()];
            // What the last run of each mode recomputed (the context holds it).
            let mut recomputed = [cpu::recompute::Recomputed::default(), Default::default()];
            let mut once = |causal: bool| {
                let slot = &mut reuse[causal as usize];
                let (_, ctx) =
                    soft_forward_into(&map, qh, kh, vh, causal, isa, &mut o, std::mem::take(slot));
                if cfg.backward {
                    let db = soft_backward_into(
                        &map,
                        &ctx,
                        qh,
                        kh,
                        vh,
                        Heads::new(h, n, dv, &o),
                        Heads::new(h, n, dv, &g),
                        isa,
                        &mut dq,
                        &mut dk,
                        &mut dvb,
                    );
                    std::hint::black_box(db);
                }
                *slot = ctx;
            };
            let timed: Vec<(bool, Timed)> = match (cfg.device, cfg.causal_ratio) {
                (Device::Cpu, false) => {
                    let t = time_runs_warm(cfg.runs, || once(cfg.causal));
                    recomputed[cfg.causal as usize] = reuse[cfg.causal as usize].recomputed.clone();
                    vec![(cfg.causal, t)]
                }
                (Device::Cpu, true) => {
                    let (nc, c) = time_alternated(cfg.runs, &mut once);
                    recomputed = reuse.clone().map(|c| c.recomputed);
                    vec![(false, nc), (true, c)]
                }
                // On the GPU one mode after the other: `time_soft` times all of a mode's runs
                // in one call (the alternation answers the host's memory-state drift, which
                // was not measured on the GPU machine).
                (_, pair) => {
                    let modes = if pair {
                        vec![false, true]
                    } else {
                        vec![cfg.causal]
                    };
                    modes
                        .into_iter()
                        .map(|causal| {
                            let gr = if cfg.backward { Some(&g[..]) } else { None };
                            let (med, all, rec) = gpu::time_soft(
                                &planes,
                                cfg.beta as f32,
                                qh,
                                kh,
                                vh,
                                gr,
                                causal,
                                cfg.runs,
                            )?;
                            recomputed[causal as usize] = rec;
                            Ok((causal, (med, all)))
                        })
                        .collect::<Result<_>>()?
                }
            };
            let flops = race_flops_per_token(p, l, d, dv, cfg.backward) * (n * h) as f64;
            let (row_bw, row_peak) = match &gpu {
                Some(c) => (c.bandwidth_gbs, c.fp32_gflops),
                None => (bw, peak),
            };
            // Before the probe below, which allocates three arrays of 256 MiB.
            let rss = peak_rss_bytes();
            let probes = probe_before.map(|b| {
                progress("measuring memory bandwidth after the row");
                let a = machine::bandwidth_gbs();
                last_probe = Some(a);
                [b, a]
            });
            let floor = bytes / (row_bw * 1e9);
            if let [(false, (nc, nc_all)), (true, (c, c_all))] = &timed[..] {
                let pair_ratios: Vec<f64> =
                    c_all.iter().zip(nc_all).map(|(c, nc)| c / nc).collect();
                causal_ratios.push(CausalRatio {
                    n,
                    p,
                    l,
                    median_pair_ratio: median(&pair_ratios),
                    ratio_of_medians: c / nc,
                    pair_ratios,
                });
            }
            for (causal, (secs, all)) in timed {
                rows.push(BenchRow {
                    method: "race".into(),
                    device: cfg.device,
                    n,
                    p: Some(p),
                    l: Some(l),
                    heads: h,
                    d,
                    causal,
                    backward: cfg.backward,
                    seconds: secs,
                    tokens_per_s: n as f64 / secs,
                    peak_rss_bytes: rss,
                    bytes_moved: bytes,
                    floor_seconds: floor,
                    ratio_to_floor: secs / floor,
                    bandwidth_probes_gbs: probes,
                    ratio_to_run_floor: secs / floor,
                    flops: Some(flops),
                    flop_floor_seconds: Some(flops / (row_peak * 1e9)),
                    recomputed_rows: Some(recomputed[causal as usize].rows.len()),
                    recompute_seconds: Some(recomputed[causal as usize].seconds),
                    runs: all,
                });
            }
        }
        for (ri, name) in ["softmax", "angular"].iter().enumerate() {
            if !ref_alive[ri] {
                continue;
            }
            if let Some((n0, t0)) = ref_last[ri] {
                let predicted = t0 * (n as f64 / n0 as f64).powi(2);
                if predicted > cfg.ref_budget_s {
                    ref_alive[ri] = false;
                    skipped.push(format!("{name} reference from N = {n}: predicted {predicted:.0} s per run > {} s budget", cfg.ref_budget_s));
                    continue;
                }
            }
            progress(&format!("{name} reference N={n}"));
            let kind = if ri == 0 {
                Exact::Softmax {
                    scale: 1.0 / (d as f32).sqrt(),
                }
            } else {
                Exact::Angular { gamma: 2.0 }
            };
            reset_peak_rss();
            let runs = if ref_last[ri].map(|(_, t)| t * 4.0 > 10.0).unwrap_or(false) {
                1.max(cfg.runs.min(3))
            } else {
                cfg.runs
            };
            let (secs, all) = time_runs(runs, || {
                std::hint::black_box(exact_attention(kind, qh, kh, vh, cfg.causal, isa));
            });
            ref_last[ri] = Some((n, secs));
            let rbytes = bytes_per_token(d, dv, 0, false) * (n * h) as f64;
            let floor = rbytes / (bw * 1e9);
            let flops = 4.0
                * (n as f64)
                * (n as f64)
                * (d as f64)
                * h as f64
                * if cfg.causal { 0.5 } else { 1.0 };
            rows.push(BenchRow {
                method: name.to_string(),
                device: Device::Cpu,
                n,
                p: None,
                l: None,
                heads: h,
                d,
                causal: cfg.causal,
                backward: false,
                seconds: secs,
                tokens_per_s: n as f64 / secs,
                peak_rss_bytes: peak_rss_bytes(),
                bytes_moved: rbytes,
                floor_seconds: floor,
                ratio_to_floor: secs / floor,
                bandwidth_probes_gbs: None,
                ratio_to_run_floor: secs / floor,
                flops: Some(flops),
                flop_floor_seconds: Some(flops / (peak * 1e9)),
                recomputed_rows: None,
                recompute_seconds: None,
                runs: all,
            });
        }
    }
    let name = |r: &BenchRow| series_name(r, cfg.causal_ratio);
    let mut names: Vec<String> = rows.iter().map(name).collect();
    names.dedup();
    names.sort();
    names.dedup();
    let fits: Vec<Fit> = names
        .iter()
        .filter_map(|s| {
            let pts: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| &name(r) == s)
                .map(|r| (r.n as f64, r.seconds))
                .collect();
            // Fit the upper half of the sizes, where fixed costs no longer dominate.
            let tail: Vec<(f64, f64)> = pts.iter().skip(pts.len() / 2).cloned().collect();
            (tail.len() >= 2).then(|| Fit {
                series: s.clone(),
                exponent: loglog_slope(&tail),
                points: tail.len(),
            })
        })
        .collect();
    // Only against a timed softmax reference (without one there is nothing to cross).
    let softmax_timed = rows.iter().any(|x| x.method == "softmax");
    let crossovers: Vec<Crossover> = names
        .iter()
        .filter(|s| softmax_timed && s.starts_with("race"))
        .map(|s| {
            let hit = rows.iter().filter(|r| &name(r) == s).find(|r| {
                rows.iter()
                    .any(|x| x.method == "softmax" && x.n == r.n && x.seconds > r.seconds)
            });
            let note = if cfg.backward {
                "kernel forward+backward vs exact softmax forward only (conservative)"
            } else {
                "forward vs forward"
            };
            Crossover {
                series: s.clone(),
                n: hit.map(|r| r.n),
                note: note.to_string(),
            }
        })
        .collect();
    // The memory bandwidth is probed again after the rows (a shared machine's bandwidth drifts
    // over minutes) and the floors use the larger reading: the stricter floor.
    progress("measuring memory bandwidth again");
    let bw_end = machine::bandwidth_gbs();
    let bw = bw_start.max(bw_end);
    for r in &mut rows {
        let (run_bw, own_bw) = match (&gpu, r.device, r.bandwidth_probes_gbs) {
            (Some(c), Device::Cuda, _) => (c.bandwidth_gbs, c.bandwidth_gbs),
            (_, _, Some([b, a])) => (bw, b.max(a)),
            _ => (bw, bw),
        };
        r.floor_seconds = r.bytes_moved / (own_bw * 1e9);
        r.ratio_to_floor = r.seconds / r.floor_seconds;
        r.ratio_to_run_floor = r.seconds / (r.bytes_moved / (run_bw * 1e9));
    }
    let mut report = BenchReport {
        bandwidth_gbs: bw,
        bandwidth_probes_gbs: [bw_start, bw_end],
        fma_peak_gflops: peak,
        isa: isa.name().to_string(),
        gpu,
        rows,
        fits,
        crossovers,
        causal_ratios,
        skipped,
        provenance: Provenance::collect(),
        out_dir: None,
        seed: cfg.seed,
        beta: cfg.beta,
        warmup_runs: WARMUP_RUNS,
    };
    if let Some(dir) = &cfg.out {
        write_outputs(dir, &report, cfg)?;
        report.out_dir = Some(dir.display().to_string());
    }
    Ok(report)
}

fn write_outputs(dir: &std::path::Path, rep: &BenchReport, cfg: &BenchConfig) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| RaceError::io(dir, e))?;
    let mut csv = String::from("method,device,n,p,l,heads,d,causal,backward,seconds,tokens_per_s,peak_rss_bytes,bytes_moved,floor_seconds,ratio_to_floor,flop_floor_seconds,ratio_to_run_floor\n");
    for r in &rep.rows {
        csv += &format!(
            "{},{:?},{},{},{},{},{},{},{},{:.6e},{:.6e},{},{:.6e},{:.6e},{:.4},{},{:.4}\n",
            r.method,
            r.device,
            r.n,
            r.p.map(|x| x.to_string()).unwrap_or_default(),
            r.l.map(|x| x.to_string()).unwrap_or_default(),
            r.heads,
            r.d,
            r.causal,
            r.backward,
            r.seconds,
            r.tokens_per_s,
            r.peak_rss_bytes,
            r.bytes_moved,
            r.floor_seconds,
            r.ratio_to_floor,
            r.flop_floor_seconds
                .map(|x| format!("{x:.6e}"))
                .unwrap_or_default(),
            r.ratio_to_run_floor
        );
    }
    let p = dir.join("bench.csv");
    std::fs::write(&p, csv).map_err(|e| RaceError::io(&p, e))?;
    let p = dir.join("bench.json");
    std::fs::write(&p, serde_json::to_string_pretty(rep).unwrap_or_default())
        .map_err(|e| RaceError::io(&p, e))?;
    let cmd: Vec<String> = std::env::args().collect();
    let p = dir.join("COMMAND.txt");
    std::fs::write(
        &p,
        format!("{}\n{}\n", cmd.join(" "), rep.provenance.line()),
    )
    .map_err(|e| RaceError::io(&p, e))?;
    let name = |r: &BenchRow| series_name(r, cfg.causal_ratio);
    let mut names: Vec<String> = rep.rows.iter().map(name).collect();
    names.sort();
    names.dedup();
    let mut series: Vec<Series> = names
        .iter()
        .map(|s| {
            let pts = rep
                .rows
                .iter()
                .filter(|r| &name(r) == s)
                .map(|r| (r.n as f64, r.seconds))
                .collect();
            Series::new(s.clone(), pts)
        })
        .collect();
    if let Some(first) = rep
        .rows
        .iter()
        .find(|r| r.method == "race" && r.p == Some(cfg.pl[0].0))
    {
        let pts = rep
            .rows
            .iter()
            .filter(|r| r.method == "race" && name(r) == name(first))
            .map(|r| (r.n as f64, r.floor_seconds))
            .collect();
        series.push(Series::dashed("bandwidth floor (race, first (P,L))", pts));
    }
    let title = format!(
        "time vs N ({}{}, {} heads, d={}, {})",
        match (cfg.causal_ratio, cfg.causal) {
            (true, _) => "causal and non-causal ",
            (false, true) => "causal ",
            (false, false) => "",
        },
        if cfg.backward { "fwd+bwd" } else { "fwd" },
        cfg.heads,
        cfg.d,
        rep.provenance.cpu
    );
    line_plot(
        &dir.join("time_vs_n"),
        &LinePlot {
            title: &title,
            xlabel: "N (tokens)",
            ylabel: "seconds",
            logx: true,
            logy: true,
        },
        &series,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The alternation itself: warm-ups of both modes, then non-causal and causal in turn.
    #[test]
    fn time_alternated_interleaves_the_two_modes() {
        let mut calls = Vec::new();
        // The causal calls sleep, so their times (and only theirs) are at least 30 ms; three
        // pairs make 0.09 s, short of SHORT_ROW_SECONDS, so there are more.
        let ((_, a), (mb, b)) = time_alternated(3, |causal| {
            calls.push(causal);
            if causal {
                std::thread::sleep(std::time::Duration::from_millis(30));
            }
        });
        let pairs = a.len();
        assert!(pairs > 3 && pairs <= 9 && b.len() == pairs, "{pairs} pairs");
        let mut want = [false, true].repeat(WARMUP_RUNS);
        want.extend([false, true].repeat(pairs));
        assert_eq!(calls, want);
        assert!(b.iter().all(|&t| t >= 0.03) && mb >= 0.03, "{b:?}");
        // A long row keeps its runs; a short one gets up to the cap.
        assert_eq!(runs_for(3, 1.0), 3);
        assert_eq!(runs_for(3, 0.05), 5);
        assert_eq!(runs_for(5, 1e-6), MAX_RUNS);
    }

    /// A `causal_ratio` run: both rows per `(P, L)` and N, medians of their own runs, the
    /// ratios from exactly those runs, and fits kept apart per mode.
    #[test]
    fn causal_ratio_reports_both_rows_and_their_ratios() {
        let cfg = BenchConfig {
            ns: vec![128, 256, 512, 1024],
            pl: vec![(2, 2)],
            heads: 1,
            d: 8,
            backward: true,
            causal_ratio: true,
            ..Default::default()
        };
        let rep = run(&cfg, &|_| {}).unwrap();
        assert_eq!(rep.rows.len(), 8);
        assert_eq!(rep.causal_ratios.len(), 4);
        for (pair, cr) in rep.rows.chunks(2).zip(&rep.causal_ratios) {
            let (nc, c) = (&pair[0], &pair[1]);
            assert!(!nc.causal && c.causal && nc.n == cr.n && c.n == cr.n);
            for r in pair {
                assert!(r.runs.len() >= cfg.runs && r.runs.len() == pair[0].runs.len());
                assert_eq!(r.seconds, median(&r.runs));
            }
            assert_eq!(cr.ratio_of_medians, c.seconds / nc.seconds);
            let want: Vec<f64> = c.runs.iter().zip(&nc.runs).map(|(a, b)| a / b).collect();
            assert_eq!(cr.pair_ratios, want);
            assert_eq!(cr.median_pair_ratio, median(&want));
        }
        let mut series: Vec<&str> = rep.fits.iter().map(|f| f.series.as_str()).collect();
        series.sort();
        assert_eq!(series, ["race (2,2)", "race (2,2) causal"]);
        assert!(rep.crossovers.is_empty(), "no reference was timed");
    }

    /// Rows with their own probes: a probe before and after each row, shared between
    /// consecutive rows of one N (and by a causal-ratio pair), the floor from the larger of
    /// the two, the run-wide ratio from the larger of the run's probes; rows below the
    /// threshold use the run-wide floor for both.
    #[test]
    fn rows_get_their_own_bandwidth_probes_above_the_threshold() {
        let base = BenchConfig {
            ns: vec![64, 128],
            pl: vec![(2, 2), (3, 1)],
            heads: 1,
            d: 4,
            ..Default::default()
        };
        for causal_ratio in [false, true] {
            let cfg = BenchConfig {
                row_probe_bytes: 0.0,
                causal_ratio,
                ..base.clone()
            };
            let rep = run(&cfg, &|_| {}).unwrap();
            let run_bw = rep.bandwidth_gbs;
            assert_eq!(
                run_bw,
                rep.bandwidth_probes_gbs[0].max(rep.bandwidth_probes_gbs[1])
            );
            let per_n = if causal_ratio { 4 } else { 2 };
            for rows in rep.rows.chunks(per_n) {
                let probes: Vec<[f64; 2]> = rows
                    .iter()
                    .map(|r| r.bandwidth_probes_gbs.unwrap())
                    .collect();
                let step = if causal_ratio { 2 } else { 1 };
                // The second (P, L)'s probe before is the first one's probe after.
                assert_eq!(probes[step][0], probes[0][1]);
                if causal_ratio {
                    assert_eq!(probes[0], probes[1]);
                }
                for (r, [b, a]) in rows.iter().zip(&probes) {
                    let own = r.bytes_moved / (b.max(*a) * 1e9);
                    assert_eq!(r.floor_seconds, own);
                    assert_eq!(r.ratio_to_floor, r.seconds / own);
                    let run = r.seconds / (r.bytes_moved / (run_bw * 1e9));
                    assert_eq!(r.ratio_to_run_floor, run);
                }
            }
            // Between the Ns the inputs are regenerated: a fresh probe.
            assert_ne!(
                rep.rows[per_n].bandwidth_probes_gbs.unwrap()[0],
                rep.rows[per_n - 1].bandwidth_probes_gbs.unwrap()[1]
            );
        }
        let rep = run(&base, &|_| {}).unwrap();
        for r in &rep.rows {
            assert!(r.bandwidth_probes_gbs.is_none());
            assert_eq!(r.ratio_to_floor, r.ratio_to_run_floor);
            assert_eq!(r.floor_seconds, r.bytes_moved / (rep.bandwidth_gbs * 1e9));
        }
    }

    #[test]
    fn causal_ratio_excludes_causal_and_reference() {
        for (cfg, arg) in [
            (
                BenchConfig {
                    causal: true,
                    ..Default::default()
                },
                "`causal`",
            ),
            (
                BenchConfig {
                    reference: true,
                    ..Default::default()
                },
                "`reference`",
            ),
        ] {
            let cfg = BenchConfig {
                causal_ratio: true,
                ns: vec![64],
                ..cfg
            };
            let e = run(&cfg, &|_| {}).unwrap_err().to_string();
            assert!(e.contains(arg), "{e}");
        }
    }
}
