//! `racelab bias`: the soft-hash bias `sup_θ |E[Ŝ](θ) − κ(θ)^P|`, with `E[Ŝ] = g^P` from the
//! quadrature in [`crate::reference::expected`] (no Monte Carlo in the bias itself), over
//! P in 1..6 and beta on a log grid; its log-log slope in beta (theory: −1 for large beta)
//! and `bias·beta/P` (theory: bounded). The quadrature is validated against seeded Monte
//! Carlo and by panel refinement. See `proofs-notes/soft-bias.md`.

use super::{f, fig, load_config, read_csv, write_csv, Claim, Ctx, ExpResult, Verdict};
use crate::bench::loglog_slope;
use crate::error::Result;
use crate::plot::{line_plot, LinePlot, Series};
use crate::reference::expected::{expected_g, monte_carlo_g, GTable};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::f64::consts::PI;

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct Config {
    pub ps: Vec<usize>,
    pub betas: Vec<f64>,
    pub n_theta: usize,
    pub fit_from_beta: f64,
    pub norms: Vec<f64>,
    pub norm_betas: Vec<f64>,
    pub norm_theta: usize,
    pub mc_points: Vec<[f64; 2]>,
    pub mc_draws: usize,
}

pub fn run(ctx: &Ctx) -> Result<ExpResult> {
    let t0 = std::time::Instant::now();
    let cfg: Config = load_config(ctx, include_str!("../../experiments/bias.toml"), "bias")?;
    let tables: Vec<GTable> = cfg
        .betas
        .iter()
        .map(|&b| GTable::new(b, cfg.n_theta))
        .collect();
    let mut rows = Vec::new();
    for (t, &beta) in tables.iter().zip(&cfg.betas) {
        for &p in &cfg.ps {
            let (mut sup, mut at) = (0.0f64, 0.0);
            for (i, &g) in t.values.iter().enumerate() {
                let theta = PI * i as f64 / cfg.n_theta as f64;
                let kap = 1.0 - theta / PI;
                let b = (g.powi(p as i32) - kap.powi(p as i32)).abs();
                if b > sup {
                    sup = b;
                    at = theta;
                }
            }
            rows.push(vec![
                f(beta),
                p.to_string(),
                f(sup),
                f(sup * beta / p as f64),
                f(at),
            ]);
        }
    }
    let csv1 = write_csv(
        ctx,
        "bias",
        &["beta", "p", "sup_bias", "bias_beta_over_p", "theta_at_sup"],
        &rows,
        &cfg,
    )?;
    // Non-unit norms (P = 2): the theorem assumes unit Q/K; tanh saturation depends on norms.
    let norm_rows: Vec<Vec<String>> = cfg
        .norm_betas
        .iter()
        .flat_map(|&beta| cfg.norms.iter().map(move |&r| (beta, r)))
        .collect::<Vec<_>>()
        .par_iter()
        .map(|&(beta, r)| {
            let sup = (0..=cfg.norm_theta)
                .map(|i| {
                    let theta = PI * i as f64 / cfg.norm_theta as f64;
                    (expected_g(beta, r, r, theta, 1).powi(2) - (1.0 - theta / PI).powi(2)).abs()
                })
                .fold(0.0, f64::max);
            vec![f(beta), f(r), f(sup)]
        })
        .collect();
    let csv2 = write_csv(
        ctx,
        "bias_norms",
        &["beta", "norm", "sup_bias_p2"],
        &norm_rows,
        &cfg,
    )?;
    // Quadrature validation: Monte Carlo and refinement.
    let mc_rows: Vec<Vec<String>> = cfg
        .mc_points
        .par_iter()
        .enumerate()
        .map(|(i, &[beta, theta])| {
            let g1 = expected_g(beta, 1.0, 1.0, theta, 1);
            let g2 = expected_g(beta, 1.0, 1.0, theta, 2);
            let (mc, se) = monte_carlo_g(beta, 1.0, 1.0, theta, cfg.mc_draws, ctx.seed + i as u64);
            vec![
                f(beta),
                f(theta),
                f(g1),
                f(mc),
                f(se),
                f((g1 - mc) / se),
                f((g1 - g2).abs()),
            ]
        })
        .collect();
    let csv3 = write_csv(
        ctx,
        "bias_quadrature_check",
        &[
            "beta",
            "theta",
            "g_quadrature",
            "g_monte_carlo",
            "mc_stderr",
            "z",
            "refinement_diff",
        ],
        &mc_rows,
        &cfg,
    )?;

    // Figures and fits from the CSV.
    let (h, r) = read_csv(ctx, "bias")?;
    let (bc, pc, sc, nc) = (
        super::col(&h, &r, "beta"),
        super::col(&h, &r, "p"),
        super::col(&h, &r, "sup_bias"),
        super::col(&h, &r, "bias_beta_over_p"),
    );
    let mut series = Vec::new();
    let mut series2 = Vec::new();
    let mut slopes = Vec::new();
    for &p in &cfg.ps {
        let pts: Vec<(f64, f64)> = (0..r.len())
            .filter(|&i| pc[i] == p as f64)
            .map(|i| (bc[i], sc[i]))
            .collect();
        let tail: Vec<(f64, f64)> = pts
            .iter()
            .cloned()
            .filter(|(b, _)| *b >= cfg.fit_from_beta)
            .collect();
        let slope = if tail.len() >= 2 {
            loglog_slope(&tail)
        } else {
            f64::NAN
        };
        slopes.push((p, slope));
        series.push(Series::new(format!("P={p} (slope {slope:.2})"), pts));
        series2.push(Series::new(
            format!("P={p}"),
            (0..r.len())
                .filter(|&i| pc[i] == p as f64)
                .map(|i| (bc[i], nc[i]))
                .collect(),
        ));
    }
    let b0 = cfg.betas[cfg.betas.len() / 2];
    series.push(Series::dashed(
        "slope -1 reference",
        cfg.betas.iter().map(|&b| (b, 0.5 * b0 / b)).collect(),
    ));
    line_plot(
        &fig(ctx, "bias_vs_beta"),
        &LinePlot {
            title: "Soft-hash bias sup|E[S-hat] - kappa^P| (exact quadrature)",
            xlabel: "beta",
            ylabel: "sup-norm bias",
            logx: true,
            logy: true,
        },
        &series,
    )?;
    line_plot(
        &fig(ctx, "bias_beta_over_p"),
        &LinePlot {
            title: "bias * beta / P (theory: bounded)",
            xlabel: "beta",
            ylabel: "bias*beta/P",
            logx: true,
            logy: false,
        },
        &series2,
    )?;
    let (hn, rn) = read_csv(ctx, "bias_norms")?;
    let (nb, nn, ns) = (
        super::col(&hn, &rn, "beta"),
        super::col(&hn, &rn, "norm"),
        super::col(&hn, &rn, "sup_bias_p2"),
    );
    let norm_series: Vec<Series> = cfg
        .norms
        .iter()
        .map(|&nr| {
            Series::new(
                format!("|q|=|k|={nr}"),
                (0..rn.len())
                    .filter(|&i| nn[i] == nr)
                    .map(|i| (nb[i], ns[i]))
                    .collect(),
            )
        })
        .collect();
    line_plot(
        &fig(ctx, "bias_norms"),
        &LinePlot {
            title: "Bias at P=2 for non-unit Q/K (tanh saturation)",
            xlabel: "beta",
            ylabel: "sup-norm bias",
            logx: true,
            logy: true,
        },
        &norm_series,
    )?;

    let slope_ok = slopes.iter().all(|(_, s)| (-1.15..=-0.85).contains(s));
    let large: Vec<f64> = (0..r.len())
        .filter(|&i| bc[i] >= cfg.fit_from_beta)
        .map(|i| nc[i])
        .collect();
    let max_bbp = nc.iter().cloned().fold(0.0, f64::max);
    let last_two: Vec<f64> = cfg
        .ps
        .iter()
        .map(|&p| {
            let v: Vec<f64> = (0..r.len())
                .filter(|&i| pc[i] == p as f64)
                .map(|i| nc[i])
                .collect();
            let n = v.len();
            if n >= 2 {
                (v[n - 1] / v[n - 2] - 1.0).abs()
            } else {
                f64::NAN
            }
        })
        .collect();
    let bounded = last_two.iter().all(|x| *x < 0.2);
    let max_z = mc_rows
        .iter()
        .map(|r| r[5].parse::<f64>().unwrap_or(f64::NAN).abs())
        .fold(0.0, f64::max);
    let max_ref = mc_rows
        .iter()
        .map(|r| r[6].parse::<f64>().unwrap_or(f64::NAN))
        .fold(0.0, f64::max);
    let slope_txt: Vec<String> = slopes
        .iter()
        .map(|(p, s)| format!("P={p}: {s:.3}"))
        .collect();
    let claims = vec![
        Claim::new(
            "bias-slope",
            "Soft-hash bias is O(P/beta): log-log slope of the sup-norm bias in beta is −1 for large beta",
            "Theorem 2 bias term, paper Sec. 6.1 p. 17 (slides: 'Bias falls with beta')",
            format!("slopes for beta ≥ {}: {}", cfg.fit_from_beta, slope_txt.join(", ")),
            if slope_ok { Verdict::Holds } else { Verdict::Fails },
            "exact E[Ŝ] by quadrature, unit Q/K",
        ),
        Claim::new(
            "bias-bounded",
            "bias·beta/P stays bounded as beta grows",
            "Theorem 2 (bias ≤ C·P/beta)",
            format!("max bias·beta/P = {max_bbp:.4} (beta ≥ {}: max {:.4}); change between the two largest beta per P ≤ {:.1}%", cfg.fit_from_beta, large.iter().cloned().fold(0.0, f64::max), 100.0 * last_two.iter().cloned().fold(0.0, f64::max)),
            if bounded { Verdict::Holds } else { Verdict::HoldsWithCaveat },
            "the constant approaches a limit (≈0.2 at P=1: 1 − g(0) ≈ 0.4/beta at θ = 0)",
        ),
        Claim::new(
            "bias-quadrature",
            "The expected soft kernel is a 2-D integral computable to ~1e-12 (bias separated from variance without Monte Carlo)",
            "DESIGN 2.2",
            format!("quadrature vs {} Monte-Carlo draws: max |z| = {max_z:.2}; panel-refinement change ≤ {max_ref:.1e}", cfg.mc_draws),
            if max_z < 4.0 && max_ref < 1e-10 { Verdict::Holds } else { Verdict::Fails },
            "MC standard errors ~2e-4; refinement doubles the panels",
        ),
    ];
    let headline = serde_json::json!({"slopes": slopes.iter().map(|(p, s)| serde_json::json!({"p": p, "slope": s})).collect::<Vec<_>>(), "max_bias_beta_over_p": max_bbp, "mc_max_abs_z": max_z, "refinement_max_diff": max_ref});
    Ok(ExpResult {
        name: "bias".into(),
        claims,
        figures: vec![
            "bias_vs_beta".into(),
            "bias_beta_over_p".into(),
            "bias_norms".into(),
        ],
        csv: vec![csv1, csv2, csv3],
        headline,
        seconds: t0.elapsed().as_secs_f64(),
        seed: ctx.seed,
    })
}
