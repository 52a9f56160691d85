//! The timed rows of one benchmark run: per N, the soft-RACE kernels at every (P, L) (CPU
//! with the runs alternated for `--causal-ratio`, or the GPU), then the exact references
//! while their predicted time fits the budget.

use super::gpu::{self, DeviceCeilings};
use super::timing::{time_alternated, time_runs, time_runs_warm, Timed};
use super::{
    bytes_per_token, machine, race_flops_per_token, BenchConfig, BenchRow, CausalRatio, Device,
};
use crate::backend::{Backend, GradsMut, Heads, PlanesF32, Problem, RaceParams, Saved};
use crate::cpu::ABuf;
use crate::cpu::{self, Isa};
use crate::cpu::{exact_forward, Exact};
use crate::error::Result;
use crate::hashing::Planes;
use crate::params::Combine;
use crate::params::{Bits, Seed, Tables};
use crate::provenance::{peak_rss_bytes, reset_peak_rss};
use crate::stats::median;

/// One N's inputs, filled once and shared by every row at that N.
pub(super) struct Inputs {
    pub n: usize,
    q: ABuf,
    k: ABuf,
    v: ABuf,
    g: ABuf,
}

impl Inputs {
    pub fn new(cfg: &BenchConfig, n: usize) -> Self {
        let (h, d, dv) = (cfg.heads, cfg.d, cfg.d);
        let mut q = ABuf::zeroed(h * n * d);
        let mut k = ABuf::zeroed(h * n * d);
        let mut v = ABuf::zeroed(h * n * dv);
        machine::fill(&mut q, cfg.seed, 0);
        machine::fill(&mut k, cfg.seed + 1, 0);
        machine::fill(&mut v, cfg.seed + 2, 0);
        let g = if cfg.backward {
            let mut g = ABuf::zeroed(h * n * dv);
            machine::fill(&mut g, cfg.seed + 3, 0);
            g
        } else {
            ABuf::zeroed(0)
        };
        Inputs { n, q, k, v, g }
    }
}

/// What a run accumulates: its rows, causal ratios and skipped work, with the machine's
/// measured limits.
pub(super) struct Recorder<'a> {
    pub cfg: &'a BenchConfig,
    pub progress: &'a dyn Fn(&str),
    pub isa: Isa,
    /// The bandwidth probed at the start (GB/s) and the FMA peak (GFLOP/s).
    pub bw: f64,
    pub peak: f64,
    /// With `--device cuda`, the GPU's ceilings.
    pub gpu: Option<DeviceCeilings>,
    pub rows: Vec<BenchRow>,
    pub causal_ratios: Vec<CausalRatio>,
    pub skipped: Vec<String>,
    ref_alive: [bool; 2],
    ref_last: [Option<(usize, f64)>; 2],
    /// Soft-RACE rows begun (or skipped) of the `N × (P, L)` planned, for the progress lines.
    pub race_step: usize,
}

impl<'a> Recorder<'a> {
    pub fn new(
        cfg: &'a BenchConfig,
        progress: &'a dyn Fn(&str),
        isa: Isa,
        bw: f64,
        peak: f64,
        gpu: Option<DeviceCeilings>,
    ) -> Self {
        Recorder {
            cfg,
            progress,
            isa,
            bw,
            peak,
            gpu,
            rows: Vec::new(),
            causal_ratios: Vec::new(),
            skipped: Vec::new(),
            ref_alive: [cfg.reference, cfg.reference],
            ref_last: [None, None],
            race_step: 0,
        }
    }

    /// The bytes a row at `n` tokens needs: inputs, outputs and gradients, what the forward
    /// keeps for the backward for the largest (P, L) (both contexts with `causal_ratio`:
    /// they are alive together), and the kernels' state.
    pub fn need_bytes(&self, n: usize) -> u64 {
        let cfg = self.cfg;
        let (h, d, dv) = (cfg.heads, cfg.d, cfg.d);
        let floats = (if cfg.backward {
            4 * d + 4 * dv + 1
        } else {
            2 * d + 2 * dv + 1
        }) as u64;
        let saved = cfg
            .pl
            .iter()
            .map(|&(p, l)| {
                let ctx = |c| crate::memory::saved_floats_per_token(l, p, dv, c);
                if cfg.causal_ratio {
                    ctx(false) + ctx(true)
                } else {
                    ctx(cfg.causal)
                }
            })
            .fold(0.0, crate::stats::nan_max);
        let state = cfg
            .pl
            .iter()
            .map(|&(p, l)| {
                let features = (l as u64).saturating_mul(1u64 << p);
                crate::memory::kernel_state_bytes(features, h, dv)
            })
            .max()
            .unwrap_or(0);
        ((4.0 * (floats as f64 + saved) * (n * h) as f64) as u64).saturating_add(state)
    }

    /// The soft-RACE rows at `x.n` tokens, one (or, with `causal_ratio`, two) per (P, L).
    pub fn race_rows(&mut self, x: &Inputs) -> Result<()> {
        let (cfg, progress, isa, bw, peak) =
            (self.cfg, self.progress, self.isa, self.bw, self.peak);
        let (h, d, dv, n) = (cfg.heads, cfg.d, cfg.d, x.n);
        let g = &x.g;
        let (qh, kh, vh) = (
            Heads::new(h, n, d, &x.q)?,
            Heads::new(h, n, d, &x.k)?,
            Heads::new(h, n, dv, &x.v)?,
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
            self.race_step += 1;
            progress(&format!(
                "race (P,L)=({p},{l}) N={n} [{}/{}]",
                self.race_step,
                cfg.ns.len() * cfg.pl.len()
            ));
            let planes =
                PlanesF32::from_planes(&Planes::gaussian(Bits(p), Tables(l), d, Seed(cfg.seed))?);
            // One validated problem per mode (validated once, outside the timed runs).
            let problem = |causal: bool| {
                let params = RaceParams::new(Bits(p), Tables(l), crate::params::Beta(cfg.beta))?
                    .with_combine(Combine::Paper)
                    .with_causal(causal);
                if cfg.backward {
                    let gh = Heads::new(h, n, dv, g)?;
                    Problem::with_grad(&params, &planes, qh, kh, vh, gh)
                } else {
                    Problem::new(&params, &planes, qh, kh, vh)
                }
            };
            let problems = [problem(false)?, problem(true)?];
            let race = cpu::CpuRace { isa };
            reset_peak_rss();
            // Output and gradient buffers are allocated once per row and reused across runs,
            // as a caching allocator would; runs time the kernels, not page faults.
            let mut o = cpu::ABuf::zeroed(h * n * dv);
            let (mut dq, mut dk, mut dvb) = if cfg.backward {
                (
                    cpu::ABuf::zeroed(h * n * d),
                    cpu::ABuf::zeroed(h * n * d),
                    cpu::ABuf::zeroed(h * n * dv),
                )
            } else {
                let z = || cpu::ABuf::zeroed(0);
                (z(), z(), z())
            };
            // What a forward saves (denominators, saved `u`) is recycled the same way, one
            // per mode.
            let mut reuse = [Saved::default(), Saved::default()];
            // What the last run of each mode recomputed.
            let mut recomputed = [crate::backend::Recomputed::default(), Default::default()];
            let mut failed = None;
            let mut once = |causal: bool| {
                let slot = &mut reuse[causal as usize];
                let pb = &problems[causal as usize];
                let mut run = || -> Result<Saved> {
                    let saved = race.forward_into(pb, &mut o, std::mem::take(slot))?;
                    if cfg.backward {
                        let grads = GradsMut {
                            dq: &mut dq,
                            dk: &mut dk,
                            dv: &mut dvb,
                        };
                        std::hint::black_box(race.backward_into(pb, &saved, &o, grads)?);
                    }
                    Ok(saved)
                };
                match run() {
                    Ok(saved) => *slot = saved,
                    Err(e) => failed = Some(e),
                }
            };
            let timed: Vec<(bool, Timed)> = match (cfg.device, cfg.causal_ratio) {
                (Device::Cpu, false) => {
                    let t = time_runs_warm(cfg.runs, || once(cfg.causal));
                    recomputed[cfg.causal as usize] = reuse[cfg.causal as usize].recomputed.clone();
                    vec![(cfg.causal, t)]
                }
                (Device::Cpu, true) => {
                    let (nc, c) = time_alternated(cfg.runs, &mut once);
                    recomputed = [&reuse[0], &reuse[1]].map(|s| s.recomputed.clone());
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
            if let Some(e) = failed {
                return Err(e);
            }
            let flops = race_flops_per_token(p, l, d, dv, cfg.backward) * (n * h) as f64;
            let (row_bw, row_peak) = match &self.gpu {
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
                self.causal_ratios.push(CausalRatio {
                    n,
                    p,
                    l,
                    median_pair_ratio: median(&pair_ratios),
                    ratio_of_medians: c / nc,
                    pair_ratios,
                });
            }
            for (causal, (secs, all)) in timed {
                self.rows.push(BenchRow {
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
        Ok(())
    }

    /// The exact references (softmax, angular) at `x.n` tokens, each while its predicted
    /// time per run (quadratic in N from the last one) fits `ref_budget_s`.
    pub fn reference_rows(&mut self, x: &Inputs) -> Result<()> {
        let (cfg, progress, isa, bw, peak) =
            (self.cfg, self.progress, self.isa, self.bw, self.peak);
        let (h, d, dv, n) = (cfg.heads, cfg.d, cfg.d, x.n);
        let (qh, kh, vh) = (
            Heads::new(h, n, d, &x.q)?,
            Heads::new(h, n, d, &x.k)?,
            Heads::new(h, n, dv, &x.v)?,
        );
        for (ri, name) in ["softmax", "angular"].iter().enumerate() {
            if !self.ref_alive[ri] {
                continue;
            }
            if let Some((n0, t0)) = self.ref_last[ri] {
                let predicted = t0 * (n as f64 / n0 as f64).powi(2);
                if predicted > cfg.ref_budget_s {
                    self.ref_alive[ri] = false;
                    self.skipped.push(format!("{name} reference from N = {n}: predicted {predicted:.0} s per run > {} s budget", cfg.ref_budget_s));
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
            let runs = if self.ref_last[ri]
                .map(|(_, t)| t * 4.0 > 10.0)
                .unwrap_or(false)
            {
                1.max(cfg.runs.min(3))
            } else {
                cfg.runs
            };
            let mut failed = None;
            let (secs, all) = time_runs(runs, || {
                if let Err(e) =
                    std::hint::black_box(exact_forward(kind, qh, kh, vh, cfg.causal, isa))
                {
                    failed = Some(e);
                }
            });
            if let Some(e) = failed {
                return Err(e);
            }
            self.ref_last[ri] = Some((n, secs));
            let rbytes = bytes_per_token(d, dv, 0, false) * (n * h) as f64;
            let floor = rbytes / (bw * 1e9);
            let flops = 4.0
                * (n as f64)
                * (n as f64)
                * (d as f64)
                * h as f64
                * if cfg.causal { 0.5 } else { 1.0 };
            self.rows.push(BenchRow {
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
        Ok(())
    }
}
