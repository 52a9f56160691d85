//! `racelab causal`: Algorithm 2 (causal soft RACE) against causal angular attention
//! (`γ = P`) and against its own L = ∞ limit, as a function of the prefix position `i`.
//!
//! Row `i` of the causal output averages the values of keys `0..=i` with weights `Ŝ_ij`:
//! `Ô_i = Σ_{j≤i} Ŝ_ij v_j / Σ_{j≤i} Ŝ_ij`. The causal L = ∞ output uses `E[Ŝ_ij] = g(θ_ij)^P`
//! (quadrature), so `‖Ô_i − O_∞,i‖` is the sampling error alone and `‖O_∞,i − O_i‖` the
//! soft-hash bias alone. Errors are row norms divided by the causal target's RMS row norm,
//! pooled (RMS) over log-spaced position bins `[0, 1), [1, 2), [2, 4), …`; the non-causal
//! estimator on the same planes is the reference for "as accurate as Algorithm 1". Row 0
//! has a single key, so every method returns `v_0` there exactly.

use super::theorem::{limit_output, rel_rms};
use super::{
    data, f, fig, load_config, quantile, read_csv, write_csv, Claim, Ctx, ExpResult, Measure,
};
use crate::analysis::metrics::frob;
use crate::error::Result;
use crate::hashing::Planes;
use crate::params::Combine;
use crate::params::{Bits, Seed, Tables};
use crate::plot::{line_plot, LinePlot, Series};
use crate::reference::angular::angular_attention;
use crate::reference::expected::GTable;
use crate::stats::loglog_slope;
use crate::tensor::Mat;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct Config {
    pub n: usize,
    pub d: usize,
    pub dv: usize,
    pub p: usize,
    pub beta: f64,
    pub ls: Vec<usize>,
    pub seeds: usize,
    pub n_theta: usize,
    pub clusters: usize,
    pub noise: f64,
    /// Positions `i < short_prefix` are the short-prefix rows of the claim.
    pub short_prefix: usize,
}

/// RMS over rows `lo..hi` of `|a_i − b_i|`, divided by `scale`.
fn rows_rms(a: &Mat<f64>, b: &Mat<f64>, lo: usize, hi: usize, scale: f64) -> f64 {
    let c = a.cols;
    let s: f64 = a.data[lo * c..hi * c]
        .iter()
        .zip(&b.data[lo * c..hi * c])
        .map(|(x, y)| (x - y) * (x - y))
        .sum();
    (s / (hi - lo).max(1) as f64).sqrt() / scale
}

/// Log-spaced position bins `[0, 1), [1, 2), [2, 4), …` up to `n`.
pub fn position_bins(n: usize) -> Vec<(usize, usize)> {
    let mut b = vec![(0, 1.min(n))];
    let mut lo = 1;
    while lo < n {
        let hi = (2 * lo).min(n);
        b.push((lo, hi));
        lo = hi;
    }
    b
}

/// Compute → CSVs `causal` (per L and prefix-position bin: the median error against causal
/// angular attention and against the causal L = ∞ limit, and the limit's own bias) and
/// `causal_summary` (per L: causal and non-causal error, sampling error, short-prefix ratio).
fn compute_csvs(ctx: &Ctx, cfg: &Config) -> Result<Vec<String>> {
    let n = cfg.n;
    let (q, k, v) =
        data::clustered_qkv((n, cfg.d, cfg.dv), (cfg.clusters, cfg.noise), ctx.seed, 81);
    let p = cfg.p;
    let target = angular_attention(q.view(), k.view(), v.view(), p as f64, true).o;
    let target_full = angular_attention(q.view(), k.view(), v.view(), p as f64, false).o;
    let table = GTable::new(cfg.beta, cfg.n_theta);
    let limit = limit_output(&q, &k, &v, &table, p, true);
    let scale = frob(&target.data) / (n as f64).sqrt();
    let bins = position_bins(n);
    let short = cfg.short_prefix.min(n);
    let zero = Mat::zeros(n, target.cols);
    // One job per (L, seed): per-bin errors, and the overall figures.
    let jobs: Vec<(usize, usize)> = cfg
        .ls
        .iter()
        .flat_map(|&l| (0..cfg.seeds).map(move |s| (l, s)))
        .collect();
    struct Run {
        l: usize,
        bins_ang: Vec<f64>,
        bins_lim: Vec<f64>,
        causal: f64,
        full: f64,
        sampling: f64,
        short_ratio: f64,
        short_ratio_rel: f64,
    }
    let runs: Vec<Run> = jobs
        .par_iter()
        .map(|&(l, s)| {
            let planes = Planes::gaussian(
                Bits(p),
                Tables(l),
                cfg.d,
                Seed(ctx.seed * 7_777 + (s * 211 + l) as u64),
            )
            .expect("valid P, L");
            let oc = super::soft_out((&q, &k, &v), &planes, cfg.beta, true, Combine::Paper);
            let of = super::soft_out((&q, &k, &v), &planes, cfg.beta, false, Combine::Paper);
            Run {
                l,
                bins_ang: bins
                    .iter()
                    .map(|&(a, b)| rows_rms(&oc, &target, a, b, scale))
                    .collect(),
                bins_lim: bins
                    .iter()
                    .map(|&(a, b)| rows_rms(&oc, &limit, a, b, scale))
                    .collect(),
                causal: rel_rms(&oc, &target),
                full: rel_rms(&of, &target_full),
                sampling: rel_rms(&oc, &limit),
                short_ratio: rows_rms(&oc, &target, 0, short, scale)
                    / rows_rms(&oc, &target, n / 2, n, scale),
                short_ratio_rel: (rows_rms(&oc, &target, 0, short, 1.0)
                    / rows_rms(&target, &zero, 0, short, 1.0))
                    / (rows_rms(&oc, &target, n / 2, n, 1.0)
                        / rows_rms(&target, &zero, n / 2, n, 1.0)),
            }
        })
        .collect();
    let med = |l: usize, get: &dyn Fn(&Run) -> f64| {
        quantile(
            &runs
                .iter()
                .filter(|r| r.l == l)
                .map(get)
                .collect::<Vec<_>>(),
            0.5,
        )
    };
    let mut rows = Vec::new();
    for &l in &cfg.ls {
        for (bi, &(a, b)) in bins.iter().enumerate() {
            rows.push(vec![
                l.to_string(),
                a.to_string(),
                b.to_string(),
                f(med(l, &|r| r.bins_ang[bi])),
                f(med(l, &|r| r.bins_lim[bi])),
                f(rows_rms(&limit, &target, a, b, scale)),
            ]);
        }
    }
    let csv1 = write_csv(
        ctx,
        "causal",
        &[
            "l",
            "pos_lo",
            "pos_hi",
            "err_vs_angular",
            "err_vs_limit",
            "limit_vs_angular",
        ],
        &rows,
        &cfg,
    )?;
    let summary: Vec<Vec<String>> = cfg
        .ls
        .iter()
        .map(|&l| {
            vec![
                l.to_string(),
                f(med(l, &|r| r.causal)),
                f(med(l, &|r| r.full)),
                f(med(l, &|r| r.sampling)),
                f(med(l, &|r| r.short_ratio)),
                f(med(l, &|r| r.short_ratio_rel)),
            ]
        })
        .collect();
    let csv2 = write_csv(
        ctx,
        "causal_summary",
        &[
            "l",
            "causal_err",
            "noncausal_err",
            "sampling_err",
            "short_over_long",
            "short_over_long_relative",
        ],
        &summary,
        &cfg,
    )?;
    Ok(vec![csv1, csv2])
}

/// Figure, from `causal.csv`: the error against prefix position.
fn figures(ctx: &Ctx, cfg: &Config) -> Result<Vec<String>> {
    let (p, n) = (cfg.p, cfg.n);
    let (h, r) = read_csv(ctx, "causal")?;
    let (lc, lo, hi, ea, el, ba) = (
        super::col(&h, &r, "l"),
        super::col(&h, &r, "pos_lo"),
        super::col(&h, &r, "pos_hi"),
        super::col(&h, &r, "err_vs_angular"),
        super::col(&h, &r, "err_vs_limit"),
        super::col(&h, &r, "limit_vs_angular"),
    );
    // Bin [lo, hi) is drawn at its end; row 0 (exact up to rounding) is left out.
    let series_for = |l: usize, y: &[f64]| -> Vec<(f64, f64)> {
        (0..r.len())
            .filter(|&i| lc[i] == l as f64 && lo[i] >= 1.0 && y[i] > 0.0)
            .map(|i| (hi[i], y[i]))
            .collect()
    };
    let mut series: Vec<Series> = cfg
        .ls
        .iter()
        .map(|&l| Series::new(format!("L={l} vs causal angular"), series_for(l, &ea)))
        .collect();
    let lmax = cfg.ls[cfg.ls.len() - 1];
    series.push(Series::dashed(
        format!("L={lmax} vs causal L=inf"),
        series_for(lmax, &el),
    ));
    series.push(Series::dashed(
        "L=inf vs causal angular (bias)",
        series_for(lmax, &ba),
    ));
    line_plot(
        &fig(ctx, "causal_vs_position"),
        &LinePlot {
            title: &format!("Algorithm 2: error vs prefix position (P={p}, beta={}, N={n}, median over {} seeds)", cfg.beta, cfg.seeds),
            xlabel: "position i (bin end)",
            ylabel: "RMS row error / RMS row norm of target",
            logx: true,
            logy: true,
        },
        &series,
    )?;
    Ok(vec!["causal_vs_position".into()])
}

/// The claims, from `causal_summary.csv`.
fn claims(ctx: &Ctx, cfg: &Config) -> Result<(Vec<Claim>, serde_json::Value)> {
    let (p, n, short) = (cfg.p, cfg.n, cfg.short_prefix.min(cfg.n));
    let (hs, rs) = read_csv(ctx, "causal_summary")?;
    let srr = super::col(&hs, &rs, "short_over_long_relative");
    let (sl, sc, sf, ss, sr) = (
        super::col(&hs, &rs, "l"),
        super::col(&hs, &rs, "causal_err"),
        super::col(&hs, &rs, "noncausal_err"),
        super::col(&hs, &rs, "sampling_err"),
        super::col(&hs, &rs, "short_over_long"),
    );
    let samp_slope = loglog_slope(
        &sl.iter()
            .cloned()
            .zip(ss.iter().cloned())
            .collect::<Vec<_>>(),
    );
    let last = rs.len() - 1;
    let claims = vec![
        Claim::judged(
            "causal-sampling",
            format!("median ‖Ô − O_∞‖/‖O‖ (causal): {}; slope {samp_slope:.3}", (0..rs.len()).map(|i| format!("L={}: {:.3e}", sl[i], ss[i])).collect::<Vec<_>>().join(", ")),
            Measure::Rate(samp_slope),
            format!("synthetic clustered unit Q/K, N = {n}, P = {p}, beta = {}", cfg.beta),
        )?,
        Claim::judged(
            "causal-vs-full",
            format!("at L = {}: causal {:.4} vs non-causal {:.4} (ratio {:.3}); per L: {}", sl[last], sc[last], sf[last], sc[last] / sf[last], (0..rs.len()).map(|i| format!("L={}: {:.2}", sl[i], sc[i] / sf[i])).collect::<Vec<_>>().join(", ")),
            Measure::value(sc[last] / sf[last]),
            "",
        )?,
        Claim::judged(
            "causal-short-prefix",
            format!("at L = {}: relative RMS error (each part divided by its own RMS target norm) over i < {short} / over i ≥ N/2 = {:.3}; per L: {}; unnormalised (early outputs average fewer values, so their norms are larger): {}", sl[last], srr[last], (0..rs.len()).map(|i| format!("L={}: {:.2}", sl[i], srr[i])).collect::<Vec<_>>().join(", "), (0..rs.len()).map(|i| format!("L={}: {:.2}", sl[i], sr[i])).collect::<Vec<_>>().join(", ")),
            Measure::value(srr[last]),
            "row 0 is exact for every method (one key); the bias L = ∞ vs angular is in causal.csv per position",
        )?,
    ];
    let headline = serde_json::json!({
        "sampling_slope": samp_slope,
        "rows": (0..rs.len()).map(|i| serde_json::json!({"l": sl[i], "causal_err": sc[i], "noncausal_err": sf[i], "sampling_err": ss[i], "short_over_long": sr[i]})).collect::<Vec<_>>(),
    });
    Ok((claims, headline))
}

pub fn run(ctx: &Ctx) -> Result<ExpResult> {
    let t0 = std::time::Instant::now();
    let cfg: Config = load_config(ctx, include_str!("../../experiments/causal.toml"), "causal")?;
    let csv = compute_csvs(ctx, &cfg)?;
    let figures = figures(ctx, &cfg)?;
    Ok(ExpResult::assemble(
        "causal",
        ctx,
        t0,
        (csv, figures),
        claims(ctx, &cfg)?,
    ))
}

#[cfg(test)]
mod tests {
    #[test]
    fn bins_cover_every_position_once() {
        for n in [1usize, 2, 7, 64, 100] {
            let b = super::position_bins(n);
            assert_eq!(b[0].0, 0);
            assert_eq!(b.last().unwrap().1, n);
            assert!(b.windows(2).all(|w| w[0].1 == w[1].0 && w[1].0 < w[1].1));
        }
    }
}
