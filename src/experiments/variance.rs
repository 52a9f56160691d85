//! `racelab variance`: the sampling error of soft RACE with the bias removed. `Ō` is
//! attention with the exact expected kernel `E[Ŝ_ij] = g(θ_ij)^P` (tabulated quadrature), so
//! `‖Ô − Ō‖` holds only the error from drawing L tables (plus the O(1/L) ratio bias).
//! Measured on sampled query rows, relative to the RMS row norm of `Ō`, with quantiles over
//! seeds (planes redrawn, inputs fixed). Theory: `~ sqrt(log N / L)`.

use super::{
    data, f, fig, load_config, quantile, read_csv, write_csv, Claim, Ctx, ExpResult, Measure,
};
use crate::backend::Backend;
use crate::backend::{Heads, PlanesF32};
use crate::cpu::CpuRace;
use crate::error::Result;
use crate::hashing::Planes;
use crate::params::{Beta, RaceParams};
use crate::params::{Bits, Seed, Tables};
use crate::plot::{line_plot, LinePlot, Series};
use crate::reference::angular::kappa;
use crate::reference::expected::GTable;
use crate::stats::loglog_slope;
use crate::tensor::Mat;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct Config {
    pub d: usize,
    pub dv: usize,
    pub p: usize,
    pub beta: f64,
    pub n_for_l: usize,
    pub ls: Vec<usize>,
    pub l_for_n: usize,
    pub ns: Vec<usize>,
    pub seeds: usize,
    pub sample_rows: usize,
    pub n_theta: usize,
    pub clusters: usize,
    pub noise: f64,
}

/// Inputs rounded to f32 (what the kernel sees) and their exact f64 images.
struct Problem {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    rows: Vec<usize>,
    obar: Vec<f64>,
    scale: f64,
}

fn problem(cfg: &Config, n: usize, seed: u64, table: &GTable) -> Problem {
    let r32 = |m: &Mat<f64>| -> Vec<f32> { m.data.iter().map(|&x| x as f32).collect() };
    let q = r32(&data::clustered_unit(
        n,
        cfg.d,
        cfg.clusters,
        cfg.noise,
        seed,
        31,
    ));
    let km = data::clustered_unit(n, cfg.d, cfg.clusters, cfg.noise, seed, 32);
    let k = r32(&km);
    let v = r32(&data::values_from_keys(&km, cfg.dv, seed + 33));
    let m = cfg.sample_rows.min(n);
    let rows: Vec<usize> = (0..m).map(|i| i * n / m).collect();
    let (d, dv, p) = (cfg.d, cfg.dv, cfg.p as i32);
    let up = |x: &[f32]| -> Vec<f64> { x.iter().map(|&t| t as f64).collect() };
    let obar: Vec<f64> = rows
        .par_iter()
        .flat_map_iter(|&i| {
            let qi = up(&q[i * d..(i + 1) * d]);
            let (mut num, mut den) = (vec![0.0; dv], 0.0);
            for j in 0..n {
                let kap = kappa(&qi, &up(&k[j * d..(j + 1) * d]));
                let w = table.g(std::f64::consts::PI * (1.0 - kap)).powi(p);
                den += w;
                for c in 0..dv {
                    num[c] += w * v[j * dv + c] as f64;
                }
            }
            num.into_iter().map(move |x| x / den)
        })
        .collect();
    let scale = (obar.iter().map(|x| x * x).sum::<f64>() / m as f64).sqrt();
    Problem {
        q,
        k,
        v,
        rows,
        obar,
        scale,
    }
}

fn error(cfg: &Config, pr: &Problem, n: usize, l: usize, seed: u64) -> Result<f64> {
    let planes = PlanesF32::from_planes(&Planes::gaussian(
        Bits(cfg.p),
        Tables(l),
        cfg.d,
        Seed(seed),
    )?);
    let params = RaceParams::new(Bits(cfg.p), Tables(l), Beta(cfg.beta))?;
    let out = CpuRace::detected().forward(
        &params,
        &planes,
        Heads::new(1, n, cfg.d, &pr.q)?,
        Heads::new(1, n, cfg.d, &pr.k)?,
        Heads::new(1, n, cfg.dv, &pr.v)?,
    )?;
    let dv = cfg.dv;
    let mut s = 0.0;
    for (t, &i) in pr.rows.iter().enumerate() {
        for c in 0..dv {
            let e = out.o[i * dv + c] as f64 - pr.obar[t * dv + c];
            s += e * e;
        }
    }
    Ok((s / pr.rows.len() as f64).sqrt() / pr.scale)
}

/// Compute → CSV `variance`: the sampling error's 10/50/90% quantiles over seeds, against L
/// (at `n_for_l`) and against N (at `l_for_n`).
fn compute_csv(ctx: &Ctx, cfg: &Config) -> Result<String> {
    crate::params::validate_pl(cfg.p, 1)?;
    crate::params::validate_beta(cfg.beta)?;
    let table = GTable::new(cfg.beta, cfg.n_theta);
    let mut rows = Vec::new();
    let pr = problem(cfg, cfg.n_for_l, ctx.seed, &table);
    for &l in &cfg.ls {
        let errs: Vec<f64> = (0..cfg.seeds)
            .map(|s| {
                error(
                    cfg,
                    &pr,
                    cfg.n_for_l,
                    l,
                    ctx.seed * 100_003 + (l * 1009 + s) as u64,
                )
            })
            .collect::<Result<_>>()?;
        rows.push(vec![
            "l".into(),
            cfg.n_for_l.to_string(),
            l.to_string(),
            f(quantile(&errs, 0.1)),
            f(quantile(&errs, 0.5)),
            f(quantile(&errs, 0.9)),
            errs.len().to_string(),
        ]);
    }
    for &n in &cfg.ns {
        let prn = problem(cfg, n, ctx.seed, &table);
        let errs: Vec<f64> = (0..cfg.seeds)
            .map(|s| {
                error(
                    cfg,
                    &prn,
                    n,
                    cfg.l_for_n,
                    ctx.seed * 100_003 + (n * 7 + s) as u64,
                )
            })
            .collect::<Result<_>>()?;
        rows.push(vec![
            "n".into(),
            n.to_string(),
            cfg.l_for_n.to_string(),
            f(quantile(&errs, 0.1)),
            f(quantile(&errs, 0.5)),
            f(quantile(&errs, 0.9)),
            errs.len().to_string(),
        ]);
    }
    write_csv(
        ctx,
        "variance",
        &["sweep", "n", "l", "q10", "q50", "q90", "seeds"],
        &rows,
        &cfg,
    )
}

/// The CSV's two sweeps and what is fitted from them.
struct Sweeps {
    li: Vec<usize>,
    ni: Vec<usize>,
    nc: Vec<f64>,
    lc: Vec<f64>,
    q10: Vec<f64>,
    q50: Vec<f64>,
    q90: Vec<f64>,
    /// Slope of the median in L (L ≥ 4) and in N.
    slope_l: f64,
    slope_n: f64,
}

impl Sweeps {
    fn read(ctx: &Ctx) -> Result<Sweeps> {
        let (h, r) = read_csv(ctx, "variance")?;
        let sw = super::col_s(&h, &r, "sweep");
        let (nc, lc) = (super::col(&h, &r, "n"), super::col(&h, &r, "l"));
        let (q10, q50, q90) = (
            super::col(&h, &r, "q10"),
            super::col(&h, &r, "q50"),
            super::col(&h, &r, "q90"),
        );
        let li: Vec<usize> = (0..r.len()).filter(|&i| sw[i] == "l").collect();
        let ni: Vec<usize> = (0..r.len()).filter(|&i| sw[i] == "n").collect();
        let fit_pts: Vec<(f64, f64)> = li
            .iter()
            .filter(|&&i| lc[i] >= 4.0)
            .map(|&i| (lc[i], q50[i]))
            .collect();
        let slope_l = loglog_slope(&fit_pts);
        let slope_n = loglog_slope(&ni.iter().map(|&i| (nc[i], q50[i])).collect::<Vec<_>>());
        Ok(Sweeps {
            li,
            ni,
            nc,
            lc,
            q10,
            q50,
            q90,
            slope_l,
            slope_n,
        })
    }
    /// The 10%, median and 90% quantiles of one sweep against `x`, with a reference curve.
    fn quantile_plot(
        &self,
        ctx: &Ctx,
        stem: &str,
        plot: &LinePlot,
        (idx, x): (&[usize], &[f64]),
        median: String,
        reference: Series,
    ) -> Result<()> {
        let pts = |y: &[f64]| -> Vec<(f64, f64)> { idx.iter().map(|&i| (x[i], y[i])).collect() };
        line_plot(
            &fig(ctx, stem),
            plot,
            &[
                Series::new("10%", pts(&self.q10)),
                Series::new(median, pts(&self.q50)),
                Series::new("90%", pts(&self.q90)),
                reference,
            ],
        )
    }
}

/// Figures, from the CSV: the quantiles against L (with `L^-1/2`) and against N (with
/// `c·sqrt(log N)`).
fn figures(ctx: &Ctx, cfg: &Config, sw: &Sweeps) -> Result<Vec<String>> {
    let (li, ni, nc, lc, q50) = (&sw.li, &sw.ni, &sw.nc, &sw.lc, &sw.q50);
    let mid = li[li.len() / 2];
    sw.quantile_plot(
        ctx,
        "variance_vs_l",
        &LinePlot {
            title: &format!(
                "Sampling error vs L (N={}, P={}, beta={}, {} seeds)",
                cfg.n_for_l, cfg.p, cfg.beta, cfg.seeds
            ),
            xlabel: "L",
            ylabel: "||O-hat - O-bar|| / ||O-bar|| (RMS)",
            logx: true,
            logy: true,
        },
        (li, lc),
        format!("median (slope {:.3})", sw.slope_l),
        Series::dashed(
            "L^-1/2",
            li.iter()
                .map(|&i| (lc[i], q50[mid] * (lc[mid] / lc[i]).sqrt()))
                .collect(),
        ),
    )?;
    let base = q50[ni[0]] / nc[ni[0]].ln().sqrt();
    sw.quantile_plot(
        ctx,
        "variance_vs_n",
        &LinePlot {
            title: &format!(
                "Sampling error vs N (L={}, {} seeds)",
                cfg.l_for_n, cfg.seeds
            ),
            xlabel: "N",
            ylabel: "relative RMS error",
            logx: true,
            logy: true,
        },
        (ni, nc),
        "median".into(),
        Series::dashed(
            "c*sqrt(log N)",
            ni.iter()
                .map(|&i| (nc[i], base * nc[i].ln().sqrt()))
                .collect(),
        ),
    )?;
    Ok(vec!["variance_vs_l".into(), "variance_vs_n".into()])
}

/// The claims: the median's slope in L, and its growth in N against `sqrt(log N)`'s.
fn claims(cfg: &Config, sw: &Sweeps) -> Result<(Vec<Claim>, serde_json::Value)> {
    let (ni, nc, q50, slope_l, slope_n) = (&sw.ni, &sw.nc, &sw.q50, sw.slope_l, sw.slope_n);
    // Growth in N: median / sqrt(log N) should be roughly flat.
    let norm: Vec<f64> = ni.iter().map(|&i| q50[i] / nc[i].ln().sqrt()).collect();
    let spread = norm.iter().cloned().fold(0.0, crate::stats::nan_max)
        / norm
            .iter()
            .cloned()
            .fold(f64::INFINITY, crate::stats::nan_min);
    let (first, last) = (ni[0], ni[ni.len() - 1]);
    let growth = q50[last] / q50[first];
    let allowed = (nc[last].ln() / nc[first].ln()).sqrt();
    let claims = vec![
        Claim::judged(
            "variance-l",
            format!("median-error slope in L (L ≥ 4) = {slope_l:.3}"),
            Measure::value(slope_l),
            "bias removed exactly by the quadrature kernel",
        )?,
        Claim::judged(
            "variance-n",
            format!("median error ×{growth:.3} from N = {} to {} against sqrt(log N)'s ×{allowed:.3}; log-log slope in N = {slope_n:.3}; median/sqrt(log N) varies by ×{spread:.2}", cfg.ns[0], cfg.ns[cfg.ns.len() - 1]),
            Measure::Bound { measured: growth, bound: allowed },
            "",
        )?,
    ];
    let headline =
        serde_json::json!({"slope_l": slope_l, "slope_n": slope_n, "sqrt_log_n_spread": spread});
    Ok((claims, headline))
}

pub fn run(ctx: &Ctx) -> Result<ExpResult> {
    let t0 = std::time::Instant::now();
    let cfg: Config = load_config(
        ctx,
        include_str!("../../experiments/variance.toml"),
        "variance",
    )?;
    let csv = compute_csv(ctx, &cfg)?;
    let sweeps = Sweeps::read(ctx)?;
    let figures = figures(ctx, &cfg, &sweeps)?;
    Ok(ExpResult::assemble(
        "variance",
        ctx,
        t0,
        (vec![csv], figures),
        claims(&cfg, &sweeps)?,
    ))
}
