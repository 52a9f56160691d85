//! `racelab tradeoff`: what P, L and beta buy. For each (P, L, beta): error against
//! angular attention with `γ = P` and against softmax attention (logit scale
//! `softmax_scale` on unit Q/K), the measured f32 kernel time (forward, non-causal, at
//! `time_n` tokens), and the state size `L·R·(d+1)`. The Pareto front minimises (error vs
//! softmax, state size). At matched state (`m = L·R` features) soft RACE is compared with
//! Performer (m random features) and linear attention (m = d, fixed).

use super::{
    data, f, fig, load_config, quantile, read_csv, write_csv, Claim, Ctx, ExpResult, Verdict,
};
use crate::analysis::metrics::{frob, rms_row_err};
use crate::cpu::{detected_isa, soft_forward, Heads, PlanesF32, SoftMap};
use crate::error::Result;
use crate::hashing::Planes;
use crate::params::Combine;
use crate::plot::{line_plot, LinePlot, Series};
use crate::reference::angular::angular_attention;
use crate::reference::baselines::{linear_attention, performer_attention, performer_omega};
use crate::reference::race::soft_race;
use crate::reference::softmax::softmax_attention;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct Config {
    pub n: usize,
    pub d: usize,
    pub dv: usize,
    pub ps: Vec<usize>,
    pub ls: Vec<usize>,
    pub betas: Vec<f64>,
    pub softmax_scale: f64,
    pub clusters: usize,
    pub noise: f64,
    pub time_n: usize,
    pub time_runs: usize,
    pub seeds: usize,
}

/// Indices of the Pareto-optimal points minimising both coordinates.
pub fn pareto(points: &[(f64, f64)]) -> Vec<bool> {
    points
        .iter()
        .map(|&(a, b)| {
            !points
                .iter()
                .any(|&(c, d)| (c <= a && d <= b) && (c < a || d < b))
        })
        .collect()
}

pub fn run(ctx: &Ctx) -> Result<ExpResult> {
    let t0 = std::time::Instant::now();
    let cfg: Config = load_config(
        ctx,
        include_str!("../../experiments/tradeoff.toml"),
        "tradeoff",
    )?;
    let (q, k, v, label, stem) = super::real::inputs_or(ctx, "tradeoff", || {
        let q = data::clustered_unit(cfg.n, cfg.d, cfg.clusters, cfg.noise, ctx.seed, 51);
        let k = data::clustered_unit(cfg.n, cfg.d, cfg.clusters, cfg.noise, ctx.seed, 52);
        let v = data::values_from_keys(&k, cfg.dv, ctx.seed + 53);
        (q, k, v, "synthetic clustered unit Q/K".to_string())
    })?;
    let stem = stem.as_str();
    let (n, d, dv) = (q.rows, q.cols, v.cols);
    let soft = softmax_attention(q.view(), k.view(), v.view(), Some(cfg.softmax_scale), false).o;
    let s_scale = frob(&soft.data) / (n as f64).sqrt();
    // Kernel time per (P, L) (beta does not change the work).
    let tq: Vec<f32> = data::clustered_unit(cfg.time_n, d, cfg.clusters, cfg.noise, ctx.seed, 54)
        .data
        .iter()
        .map(|&x| x as f32)
        .collect();
    let tv: Vec<f32> = data::gaussian(cfg.time_n, dv, ctx.seed + 55)
        .data
        .iter()
        .map(|&x| x as f32)
        .collect();
    let mut times = Vec::new();
    for &p in &cfg.ps {
        for &l in &cfg.ls {
            let planes = PlanesF32::from_planes(&Planes::gaussian(l, p, d, ctx.seed)?);
            let map = SoftMap {
                planes: &planes,
                beta: 8.0,
            };
            let mut ts: Vec<f64> = (0..cfg.time_runs.max(1))
                .map(|_| {
                    let t = std::time::Instant::now();
                    std::hint::black_box(soft_forward(
                        &map,
                        Heads::new(1, cfg.time_n, d, &tq),
                        Heads::new(1, cfg.time_n, d, &tq),
                        Heads::new(1, cfg.time_n, dv, &tv),
                        false,
                        detected_isa(),
                    ));
                    t.elapsed().as_secs_f64()
                })
                .collect();
            ts.sort_by(|a, b| a.partial_cmp(b).unwrap());
            times.push(((p, l), ts[ts.len() / 2]));
        }
    }
    let mut jobs: Vec<(usize, usize, f64)> = Vec::new();
    for &p in &cfg.ps {
        for &l in &cfg.ls {
            jobs.extend(cfg.betas.iter().map(|&b| (p, l, b)));
        }
    }
    let targets: Vec<(usize, crate::tensor::Mat<f64>)> = cfg
        .ps
        .iter()
        .map(|&p| {
            (
                p,
                angular_attention(q.view(), k.view(), v.view(), p as f64, false).o,
            )
        })
        .collect();
    let mut rows: Vec<Vec<String>> = jobs
        .par_iter()
        .map(|&(p, l, beta)| {
            let target = &targets.iter().find(|t| t.0 == p).unwrap().1;
            let a_scale = frob(&target.data) / (n as f64).sqrt();
            let (mut ea, mut es) = (Vec::new(), Vec::new());
            for s in 0..cfg.seeds {
                let planes =
                    Planes::gaussian(l, p, d, ctx.seed * 31337 + (s * 101 + p * 13 + l) as u64)
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
                ea.push(rms_row_err(&o.data, &target.data, n) / a_scale);
                es.push(rms_row_err(&o.data, &soft.data, n) / s_scale);
            }
            let state = l * (1 << p) * (d + 1);
            let time = times
                .iter()
                .find(|t| t.0 == (p, l))
                .map(|t| t.1)
                .unwrap_or(f64::NAN);
            vec![
                p.to_string(),
                l.to_string(),
                f(beta),
                state.to_string(),
                f(time),
                f(quantile(&ea, 0.5)),
                f(quantile(&es, 0.5)),
                "0".into(),
            ]
        })
        .collect();
    let pts: Vec<(f64, f64)> = rows
        .iter()
        .map(|r| {
            (
                r[6].parse().unwrap_or(f64::NAN),
                r[3].parse().unwrap_or(f64::NAN),
            )
        })
        .collect();
    for (r, on) in rows.iter_mut().zip(pareto(&pts)) {
        r[7] = (on as u8).to_string();
    }
    let csv1 = write_csv(
        ctx,
        stem,
        &[
            "p",
            "l",
            "beta",
            "state_floats",
            "kernel_seconds",
            "err_vs_angular_p",
            "err_vs_softmax",
            "pareto",
        ],
        &rows,
        &cfg,
    )?;
    // Matched state: best soft RACE over beta at m = L·R vs Performer(m) vs linear (m = d).
    let lin = linear_attention(q.view(), k.view(), v.view(), false).o;
    let lin_err = rms_row_err(&lin.data, &soft.data, n) / s_scale;
    let mut ms: Vec<usize> = cfg
        .ps
        .iter()
        .flat_map(|&p| cfg.ls.iter().map(move |&l| l << p))
        .collect();
    ms.sort();
    ms.dedup();
    let matched: Vec<Vec<String>> = ms
        .par_iter()
        .map(|&m| {
            let best_soft = rows
                .iter()
                .filter(|r| {
                    r[1].parse::<usize>().unwrap_or(0) << r[0].parse::<usize>().unwrap_or(0) == m
                })
                .map(|r| r[6].parse::<f64>().unwrap_or(f64::NAN))
                .fold(f64::INFINITY, f64::min);
            let perf: Vec<f64> = (0..cfg.seeds.max(3))
                .map(|s| {
                    let om = performer_omega(m, d, ctx.seed * 17 + s as u64);
                    let o = performer_attention(
                        q.view(),
                        k.view(),
                        v.view(),
                        &om,
                        Some(cfg.softmax_scale),
                        false,
                    )
                    .o;
                    rms_row_err(&o.data, &soft.data, n) / s_scale
                })
                .collect();
            vec![
                m.to_string(),
                f(best_soft),
                f(quantile(&perf, 0.5)),
                f(lin_err),
            ]
        })
        .collect();
    let csv2 = write_csv(
        ctx,
        &format!("{stem}_matched"),
        &[
            "m_features",
            "soft_race_best_err",
            "performer_err",
            "linear_err",
        ],
        &matched,
        &cfg,
    )?;
    // Figures from CSV.
    let (h, r) = read_csv(ctx, stem)?;
    let (st, es, tm, pa) = (
        super::col(&h, &r, "state_floats"),
        super::col(&h, &r, "err_vs_softmax"),
        super::col(&h, &r, "kernel_seconds"),
        super::col(&h, &r, "pareto"),
    );
    let pc = super::col(&h, &r, "p");
    let mut series: Vec<Series> = cfg
        .ps
        .iter()
        .map(|&p| {
            Series::new(format!("P={p}"), {
                let mut v: Vec<(f64, f64)> = (0..r.len())
                    .filter(|&i| pc[i] == p as f64)
                    .map(|i| (st[i], es[i]))
                    .collect();
                v.sort_by(|a, b| a.partial_cmp(b).unwrap());
                v
            })
        })
        .collect();
    let mut front: Vec<(f64, f64)> = (0..r.len())
        .filter(|&i| pa[i] == 1.0)
        .map(|i| (st[i], es[i]))
        .collect();
    front.sort_by(|a, b| a.partial_cmp(b).unwrap());
    series.push(Series::dashed("Pareto front", front.clone()));
    line_plot(
        &fig(ctx, &format!("{stem}_state")),
        &LinePlot {
            title: "Error vs softmax against state size L*R*(d+1)",
            xlabel: "state floats",
            ylabel: "relative RMS error vs softmax",
            logx: true,
            logy: true,
        },
        &series,
    )?;
    let time_series: Vec<Series> = cfg
        .ps
        .iter()
        .map(|&p| {
            Series::new(format!("P={p}"), {
                let mut v: Vec<(f64, f64)> = (0..r.len())
                    .filter(|&i| pc[i] == p as f64)
                    .map(|i| (tm[i], es[i]))
                    .collect();
                v.sort_by(|a, b| a.partial_cmp(b).unwrap());
                v
            })
        })
        .collect();
    line_plot(
        &fig(ctx, &format!("{stem}_time")),
        &LinePlot {
            title: &format!("Error vs measured kernel time (N={}, forward)", cfg.time_n),
            xlabel: "seconds",
            ylabel: "relative RMS error vs softmax",
            logx: true,
            logy: true,
        },
        &time_series,
    )?;
    let (hm, rm) = read_csv(ctx, &format!("{stem}_matched"))?;
    let (mm, sm, pm, lm) = (
        super::col(&hm, &rm, "m_features"),
        super::col(&hm, &rm, "soft_race_best_err"),
        super::col(&hm, &rm, "performer_err"),
        super::col(&hm, &rm, "linear_err"),
    );
    line_plot(
        &fig(ctx, &format!("{stem}_matched")),
        &LinePlot {
            title: "Matched state: error vs softmax at m features",
            xlabel: "m = L*R features",
            ylabel: "relative RMS error vs softmax",
            logx: true,
            logy: true,
        },
        &[
            Series::new(
                "soft RACE (best beta)",
                mm.iter().cloned().zip(sm.iter().cloned()).collect(),
            ),
            Series::new(
                "Performer (m features)",
                mm.iter().cloned().zip(pm.iter().cloned()).collect(),
            ),
            Series::dashed(
                format!("linear attention (m = d = {d})"),
                mm.iter().map(|&m| (m, lm[0])).collect(),
            ),
        ],
    )?;
    let race_wins = (0..rm.len()).filter(|&i| sm[i] < pm[i]).count();
    let front_txt: Vec<String> = (0..r.len())
        .filter(|&i| pa[i] == 1.0)
        .take(8)
        .map(|i| {
            format!(
                "({},{},{})",
                r[i][0],
                r[i][1],
                r[i][2].parse::<f64>().unwrap_or(0.0)
            )
        })
        .collect();
    let claims = vec![
        Claim::new(
            if stem == "tradeoff" { "tradeoff-matched" } else { "tradeoff-matched-real" },
            "At matched state capacity, soft RACE vs Performer vs linear attention (open question on the slides)",
            "Slides, 'Discussion' ('What happens at matched state capacity?')",
            format!("[{label}] soft RACE (best beta) beats Performer(m = L·R) at {race_wins}/{} state sizes; linear attention error {:.3}", rm.len(), lm[0]),
            Verdict::HoldsWithCaveat,
            format!("measured on {label} against softmax at a fixed temperature; RACE targets an angular kernel, not softmax"),
        ),
        Claim::new(
            if stem == "tradeoff" { "tradeoff-front" } else { "tradeoff-front-real" },
            "More buckets are not always better: the error/state Pareto front mixes P and L",
            "Slides, 'More buckets do not guarantee better trained models'",
            format!("Pareto-optimal (P,L,beta) by state: {}", front_txt.join(" ")),
            Verdict::HoldsWithCaveat,
            "a fixed-input approximation study, not trained-task quality",
        ),
    ];
    let headline = serde_json::json!({"points": r.len(), "pareto_points": front.len(), "race_beats_performer": race_wins, "matched_sizes": rm.len(), "linear_err": lm[0]});
    Ok(ExpResult {
        name: stem.into(),
        claims,
        figures: vec![
            format!("{stem}_state"),
            format!("{stem}_time"),
            format!("{stem}_matched"),
        ],
        csv: vec![csv1, csv2],
        headline,
        seconds: t0.elapsed().as_secs_f64(),
        seed: ctx.seed,
    })
}
