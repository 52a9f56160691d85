//! `racelab theorem`: Theorem 2 (paper p. 8), `‖Ô − O‖_rms = O(P/beta + sqrt(log(N/δ)/L))·‖V‖_F`
//! for non-causal soft RACE against `O` = angular attention with `γ = P`, unit Q/K with row
//! mass `s_min ≥ C1·N`. `‖A‖_rms = sqrt(Σ_i |A_i|²/N)`. We fit `c` by least squares in log
//! space (`log c = mean(log e − log t)`), report the worst ratio, the share under the fitted
//! bound, and where the bound's shape fails (its `‖V‖_F ∝ sqrt(N)` factor, its P-dependence,
//! and which term dominates). See `proofs-notes/theorem2.md`.

use super::{
    data, f, fig, load_config, quantile, read_csv, write_csv, Claim, Ctx, ExpResult, Verdict,
};
use crate::analysis::metrics::{frob, rms_row_err};
use crate::bench::loglog_slope;
use crate::error::Result;
use crate::hashing::Planes;
use crate::params::Combine;
use crate::plot::{line_plot, LinePlot, Series};
use crate::reference::angular::{angular_attention, kappa};
use crate::reference::race::soft_race;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct Config {
    pub d: usize,
    pub dv: usize,
    pub ps: Vec<usize>,
    pub ls: Vec<usize>,
    pub betas: Vec<f64>,
    pub ns: Vec<usize>,
    pub spread: f64,
    pub delta: f64,
    pub seeds: usize,
}

pub fn run(ctx: &Ctx) -> Result<ExpResult> {
    let t0 = std::time::Instant::now();
    let cfg: Config = load_config(
        ctx,
        include_str!("../../experiments/theorem.toml"),
        "theorem",
    )?;
    let mut rows = Vec::new();
    let real = super::real::unit_inputs(ctx)?;
    let mut cfg = cfg;
    if let Some((q, ..)) = &real {
        cfg.ns.retain(|&n| n < q.rows);
        cfg.ns.push(q.rows);
    }
    let stem = if real.is_some() {
        "theorem_real"
    } else {
        "theorem"
    };
    let label = real
        .as_ref()
        .map(|r| r.3.clone())
        .unwrap_or_else(|| format!("synthetic concentrated unit Q/K (spread {})", cfg.spread));
    for &n in &cfg.ns {
        let (q, k, v) = match &real {
            Some((q, k, v, _)) => (
                super::real::take_rows(q, n),
                super::real::take_rows(k, n),
                super::real::take_rows(v, n),
            ),
            None => {
                let q = data::concentrated_unit(n, cfg.d, cfg.spread, ctx.seed, 41);
                let k = data::concentrated_unit(n, cfg.d, cfg.spread, ctx.seed, 42);
                let v = data::values_from_keys(&k, cfg.dv, ctx.seed + 43);
                (q, k, v)
            }
        };
        let d = q.cols;
        let vf = frob(&v.data);
        for &p in &cfg.ps {
            let target = angular_attention(q.view(), k.view(), v.view(), p as f64, false).o;
            let c1 = (0..n)
                .map(|i| {
                    (0..n)
                        .map(|j| kappa(q.row(i), k.row(j)).powi(p as i32))
                        .sum::<f64>()
                })
                .fold(f64::INFINITY, f64::min)
                / n as f64;
            let jobs: Vec<(usize, f64)> = cfg
                .ls
                .iter()
                .flat_map(|&l| cfg.betas.iter().map(move |&b| (l, b)))
                .collect();
            let out: Vec<Vec<String>> = jobs
                .par_iter()
                .map(|&(l, beta)| {
                    let errs: Vec<f64> = (0..cfg.seeds)
                        .map(|s| {
                            let planes = Planes::gaussian(
                                l,
                                p,
                                d,
                                ctx.seed * 1_000_003 + (s * 7919 + l * 31 + p) as u64,
                            )
                            .expect("valid P, L");
                            let o = soft_race(
                                q.view(),
                                k.view(),
                                v.view(),
                                &planes,
                                beta,
                                false,
                                Combine::Paper,
                            )
                            .o;
                            rms_row_err(&o.data, &target.data, n)
                        })
                        .collect();
                    let e = quantile(&errs, 0.5);
                    let bias_term = p as f64 / beta;
                    let var_term = ((n as f64 / cfg.delta).ln() / l as f64).sqrt();
                    let t = (bias_term + var_term) * vf;
                    vec![
                        n.to_string(),
                        p.to_string(),
                        l.to_string(),
                        f(beta),
                        f(c1),
                        f(e),
                        f(bias_term),
                        f(var_term),
                        f(vf),
                        f(e / t),
                    ]
                })
                .collect();
            rows.extend(out);
        }
    }
    let header = [
        "n",
        "p",
        "l",
        "beta",
        "c1",
        "err_rms",
        "bias_term",
        "var_term",
        "v_frob",
        "ratio",
    ];
    let csv = write_csv(ctx, stem, &header, &rows, &cfg)?;
    let (h, r) = read_csv(ctx, stem)?;
    let (nc, pc, lc, bc) = (
        super::col(&h, &r, "n"),
        super::col(&h, &r, "p"),
        super::col(&h, &r, "l"),
        super::col(&h, &r, "beta"),
    );
    let (ec, bt, vt, vf, ratio) = (
        super::col(&h, &r, "err_rms"),
        super::col(&h, &r, "bias_term"),
        super::col(&h, &r, "var_term"),
        super::col(&h, &r, "v_frob"),
        super::col(&h, &r, "ratio"),
    );
    let c1s = super::col(&h, &r, "c1");
    let c = (ratio.iter().map(|x| x.ln()).sum::<f64>() / ratio.len() as f64).exp();
    let worst = ratio.iter().cloned().fold(0.0, f64::max);
    let under = ratio.iter().filter(|&&x| x <= c).count();
    // Shape diagnostics.
    let c_per_n: Vec<(f64, f64)> = cfg
        .ns
        .iter()
        .map(|&n| {
            let v: Vec<f64> = (0..r.len())
                .filter(|&i| nc[i] == n as f64)
                .map(|i| ratio[i].ln())
                .collect();
            (n as f64, (v.iter().sum::<f64>() / v.len() as f64).exp())
        })
        .collect();
    let c_slope_n = if c_per_n.len() >= 2 {
        loglog_slope(&c_per_n)
    } else {
        f64::NAN
    };
    // With ‖V‖_F/sqrt(N) (the RMS row norm of V) in place of ‖V‖_F.
    let ratio_rms: Vec<f64> = (0..r.len())
        .map(|i| ec[i] / ((bt[i] + vt[i]) * vf[i] / nc[i].sqrt()))
        .collect();
    let c_rms_per_n: Vec<(f64, f64)> = cfg
        .ns
        .iter()
        .map(|&n| {
            let v: Vec<f64> = (0..r.len())
                .filter(|&i| nc[i] == n as f64)
                .map(|i| ratio_rms[i].ln())
                .collect();
            (n as f64, (v.iter().sum::<f64>() / v.len() as f64).exp())
        })
        .collect();
    let c_rms_slope_n = if c_rms_per_n.len() >= 2 {
        loglog_slope(&c_rms_per_n)
    } else {
        f64::NAN
    };
    let c_per_p: Vec<String> = cfg
        .ps
        .iter()
        .map(|&p| {
            let v: Vec<f64> = (0..r.len())
                .filter(|&i| pc[i] == p as f64)
                .map(|i| ratio[i].ln())
                .collect();
            format!(
                "P={p}: {:.3e}",
                (v.iter().sum::<f64>() / v.len() as f64).exp()
            )
        })
        .collect();
    // Bias-dominated regime: largest L, slope of error in beta.
    let (nmax, lmax, pmid) = (
        cfg.ns[cfg.ns.len() - 1] as f64,
        cfg.ls[cfg.ls.len() - 1] as f64,
        cfg.ps[cfg.ps.len() / 2] as f64,
    );
    let beta_pts: Vec<(f64, f64)> = (0..r.len())
        .filter(|&i| nc[i] == nmax && lc[i] == lmax && pc[i] == pmid)
        .map(|i| (bc[i], ec[i]))
        .collect();
    let bmax = cfg.betas[cfg.betas.len() - 1];
    let l_pts: Vec<(f64, f64)> = (0..r.len())
        .filter(|&i| nc[i] == nmax && bc[i] == bmax && pc[i] == pmid)
        .map(|i| (lc[i], ec[i]))
        .collect();
    let slope_beta = loglog_slope(&beta_pts);
    let slope_l = loglog_slope(&l_pts);
    line_plot(
        &fig(ctx, &format!("{stem}_vs_beta")),
        &LinePlot {
            title: &format!("Theorem 2: error vs beta (N={nmax}, P={pmid})"),
            xlabel: "beta",
            ylabel: "||O-hat - O||_rms",
            logx: true,
            logy: true,
        },
        &cfg.ls
            .iter()
            .map(|&l| {
                Series::new(
                    format!("L={l}"),
                    (0..r.len())
                        .filter(|&i| nc[i] == nmax && lc[i] == l as f64 && pc[i] == pmid)
                        .map(|i| (bc[i], ec[i]))
                        .collect(),
                )
            })
            .collect::<Vec<_>>(),
    )?;
    line_plot(
        &fig(ctx, &format!("{stem}_ratio")),
        &LinePlot {
            title: "Measured error / (P/beta + sqrt(log(N/delta)/L)) ||V||_F",
            xlabel: "predicted t",
            ylabel: "measured / t",
            logx: true,
            logy: true,
        },
        &cfg.ns
            .iter()
            .map(|&n| {
                Series::new(format!("N={n}"), {
                    let mut v: Vec<(f64, f64)> = (0..r.len())
                        .filter(|&i| nc[i] == n as f64)
                        .map(|i| ((bt[i] + vt[i]) * vf[i], ratio[i]))
                        .collect();
                    v.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap());
                    v
                })
            })
            .collect::<Vec<_>>(),
    )?;
    let c1min = c1s.iter().cloned().fold(f64::INFINITY, f64::min);
    let claims = vec![
        Claim::new(
            "theorem2-fit",
            "‖Ô − O‖_rms ≤ c·(P/beta + sqrt(log(N/δ)/L))·‖V‖_F on unit Q/K with row mass ≥ C1·N",
            "Theorem 2, paper p. 8 (Sec. 6.1 p. 17)",
            format!("[{label}] fitted c = {c:.3e}; worst ratio = {worst:.3e} ({:.1}× c); {under}/{} points under c·t; C1 ≥ {c1min:.3}", worst / c, r.len()),
            Verdict::HoldsWithCaveat,
            "a bound of this form always holds with a large enough c; the caveats are in its shape (next rows)",
        ),
        Claim::new(
            "theorem2-vf",
            "The bound's ‖V‖_F factor scales the right way with N",
            "Theorem 2 statement",
            format!("per-N fitted c falls like N^{c_slope_n:.2} with ‖V‖_F; with the RMS row norm ‖V‖_F/sqrt(N) instead: N^{c_rms_slope_n:.2}"),
            if c_slope_n < -0.3 { Verdict::Fails } else { Verdict::HoldsWithCaveat },
            "‖V‖_F grows like sqrt(N) while the RMS error does not: the bound loosens by sqrt(N); the RMS row norm of V is the natural scale",
        ),
        Claim::new(
            "theorem2-terms",
            "Both terms show up: error ∝ 1/beta when bias dominates, ∝ L^(-1/2) when sampling dominates",
            "Theorem 2 (two terms)",
            format!("slope of error in L (beta={bmax}) = {slope_l:.2}; slope in beta (L={lmax}) = {slope_beta:.2}; error at L={lmax}: beta={} → {:.3e}, beta={bmax} → {:.3e}; per-P fitted c: {}", cfg.betas[0], beta_pts.first().map(|x| x.1).unwrap_or(f64::NAN), beta_pts.last().map(|x| x.1).unwrap_or(f64::NAN), c_per_p.join(", ")),
            if (-0.7..=-0.3).contains(&slope_l) && slope_beta < -0.5 { Verdict::Holds } else if (-0.7..=-0.3).contains(&slope_l) { Verdict::HoldsWithCaveat } else { Verdict::Fails },
            if slope_beta < -0.5 { "both terms visible".to_string() } else { "the sampling term is visible; the P/beta term is not the shape of the output error here: small beta smooths the features, lowering variance, and normalisation cancels much of the kernel bias, so the bound is loose in beta".to_string() },
        ),
    ];
    let headline = serde_json::json!({"fitted_c": c, "worst_ratio": worst, "share_under": under as f64 / r.len() as f64, "c_slope_in_n": c_slope_n, "c_rms_slope_in_n": c_rms_slope_n, "slope_beta": slope_beta, "slope_l": slope_l, "min_c1": c1min});
    let name = stem;
    let claims: Vec<Claim> = claims
        .into_iter()
        .map(|mut c| {
            if real.is_some() {
                c.id = format!("{}-real", c.id);
            }
            c
        })
        .collect();
    Ok(ExpResult {
        name: name.into(),
        claims,
        figures: vec![format!("{stem}_vs_beta"), format!("{stem}_ratio")],
        csv: vec![csv],
        headline,
        seconds: t0.elapsed().as_secs_f64(),
        seed: ctx.seed,
    })
}
