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
/// The machine's limits and the input filler (kept with the kernels, whose SIMD frame they use).
pub use crate::cpu::machine;
mod output;
mod rows;
mod timing;

use crate::cpu::{self};
use crate::error::{RaceError, Result};
use crate::provenance::{available_memory_bytes, Provenance};
use serde::Serialize;
use std::path::PathBuf;

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
            beta: crate::params::DEFAULT_BETA,
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
    /// (`crate::cpu::recompute`), and that recompute's seconds (inside the timed runs on
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

/// FMA count of soft RACE per token and head, times 2 flops (see `cpu::token::backward` docs):
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
pub use timing::{MAX_RUNS, SHORT_ROW_SECONDS, WARMUP_RUNS};

/// CPU RACE rows moving at least this many bytes (a floor of about 0.1 s here) get their own
/// bandwidth probes, about half a second each: at the paper shape forward+backward (4.6 KB
/// per token and head), N ≥ 2^18.
pub const ADJACENT_PROBE_BYTES: f64 = 4e9;

/// Refuse configurations that cannot run, naming the argument.
fn validate(cfg: &BenchConfig) -> Result<()> {
    if cfg.ns.is_empty() || cfg.pl.is_empty() {
        return Err(RaceError::param(
            "n",
            "give at least one N and one (P, L) pair",
        ));
    }
    if cfg.ns.contains(&0) {
        return Err(RaceError::param(
            "n",
            "N = 0 tokens times nothing; give N ≥ 1",
        ));
    }
    if cfg.heads == 0 {
        return Err(RaceError::param(
            "heads",
            format!(
                "0 heads times nothing; give {} or more",
                crate::error::setting("heads", 1)
            ),
        ));
    }
    if cfg.d == 0 {
        return Err(RaceError::param(
            "d",
            format!(
                "d = 0 has no features; give {} or more",
                crate::error::setting("d", 1)
            ),
        ));
    }
    for &(p, l) in &cfg.pl {
        crate::params::validate_pl(p, l)?;
    }
    crate::params::validate_beta(cfg.beta)?;
    if cfg.device == Device::Reference {
        return Err(RaceError::param(
            "device",
            format!(
                "bench times the kernels: use {} or {} ({} also times the exact references)",
                crate::error::setting("device", "cpu"),
                crate::error::setting("device", "cuda"),
                crate::error::arg("reference")
            ),
        ));
    }
    if cfg.causal_ratio && cfg.causal {
        return Err(RaceError::param(
            "causal",
            format!(
                "{} times causal and non-causal rows itself; drop {}",
                crate::error::arg("causal_ratio"),
                crate::error::arg("causal")
            ),
        ));
    }
    if cfg.causal_ratio && cfg.reference {
        return Err(RaceError::param(
            "reference",
            format!(
                "{} times the RACE kernels only; time the references in a separate run",
                crate::error::arg("causal_ratio")
            ),
        ));
    }
    Ok(())
}

/// Run the benchmark: measure the machine's limits, time every row (`rows::Recorder`),
/// probe the bandwidth again and floor every row, summarise and write the outputs.
pub fn run(cfg: &BenchConfig, progress: &dyn Fn(&str)) -> Result<BenchReport> {
    validate(cfg)?;
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
    let mut s = rows::Recorder::new(cfg, progress, isa, bw_start, peak, gpu);
    let mut ns = cfg.ns.clone();
    ns.sort_unstable();
    for &n in &ns {
        let need = s.need_bytes(n);
        // 90%: the estimate is the measured peak (the paper shape at N = 2^20, causal (4,4):
        // 17.65 GiB estimated and 17.65 GiB peak RSS, of 23.5 GiB here), and at 80% that row
        // was skipped whenever the machine had let its page cache grow.
        if need > available_memory_bytes() * 9 / 10 {
            s.skipped.push(format!(
                "N = {n}: needs {:.1} GiB, more than 90% of available memory",
                need as f64 / (1u64 << 30) as f64
            ));
            s.race_step += cfg.pl.len();
            continue;
        }
        let inputs = rows::Inputs::new(cfg, n);
        s.race_rows(&inputs)?;
        s.reference_rows(&inputs)?;
    }
    let fits = output::fits(&s.rows, cfg);
    let crossovers = output::crossovers(&s.rows, cfg);
    // The memory bandwidth is probed again after the rows (a shared machine's bandwidth drifts
    // over minutes) and the floors use the larger reading: the stricter floor.
    progress("measuring memory bandwidth again");
    let bw_end = machine::bandwidth_gbs();
    let bw = bw_start.max(bw_end);
    for r in &mut s.rows {
        let (run_bw, own_bw) = match (&s.gpu, r.device, r.bandwidth_probes_gbs) {
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
        gpu: s.gpu,
        rows: s.rows,
        fits,
        crossovers,
        causal_ratios: s.causal_ratios,
        skipped: s.skipped,
        provenance: Provenance::collect(crate::cpu::detected_isa().name()),
        out_dir: None,
        seed: cfg.seed,
        beta: cfg.beta,
        warmup_runs: WARMUP_RUNS,
    };
    if let Some(dir) = &cfg.out {
        output::write_outputs(dir, &report, cfg)?;
        report.out_dir = Some(dir.display().to_string());
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::median;
    use timing::{runs_for, time_alternated};

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
