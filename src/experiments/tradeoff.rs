//! `racelab tradeoff`: what P, L and beta buy, with every method tuned the same way.
//!
//! The queries are split in two: even rows are the validation split, odd rows the held-out
//! split (keys and values are shared). Each method gets the same tuning budget, `|grid| ×
//! seeds` evaluations on the validation split: soft RACE tunes beta over `betas` for each
//! (P, L); Performer tunes its logit scale over `performer_scales × softmax_scale` for each
//! feature count m (random draws are averaged over the tuning seeds, not selected). The
//! chosen setting is then run with `eval_seeds` fresh seeds and reported on the held-out rows,
//! against both targets: softmax attention (logit scale `softmax_scale`, unit Q/K) and
//! angular attention with `γ = P`. Errors are relative RMS errors (divided by the target's
//! RMS row norm). The state is `L·R·(dv+1)` floats for RACE and `m·(dv+1)` for Performer,
//! so matched state means `m = L·R`; linear attention (elu + 1) has `d·(dv+1)`. The
//! measured f32 kernel time (forward, non-causal, at `time_n` tokens) and the Pareto front
//! (held-out error vs softmax, state) are reported per (P, L).

use super::{
    claim_id, data, f, fig, load_config, read_csv, verdict::mean_se, write_csv, Claim, Ctx,
    ExpResult, Measure,
};
use crate::analysis::metrics::{frob, rms_row_err};
use crate::backend::{Heads, PlanesF32};
use crate::cpu::{detected_isa, soft_forward, SoftMap};
use crate::error::Result;
use crate::hashing::Planes;
use crate::params::Combine;
use crate::plot::{line_plot, LinePlot, Series};
use crate::reference::angular::angular_attention;
use crate::reference::baselines::{linear_attention, performer_attention, performer_omega};
use crate::reference::softmax::softmax_attention;
use crate::tensor::Mat;
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
    /// Tuning seeds (per grid value).
    pub seeds: usize,
    /// Fresh seeds for the held-out report.
    pub eval_seeds: usize,
    /// Performer's scale grid, as multiples of `softmax_scale` (as many as `betas`: the same
    /// budget).
    pub performer_scales: Vec<f64>,
}

/// Rows `i ≡ parity (mod 2)` of a matrix.
fn rows_of(m: &Mat<f64>, parity: usize) -> Mat<f64> {
    let idx: Vec<usize> = (0..m.rows).filter(|i| i % 2 == parity).collect();
    let mut out = Mat::zeros(idx.len(), m.cols);
    for (a, &i) in idx.iter().enumerate() {
        out.row_mut(a).copy_from_slice(m.row(i));
    }
    out
}

/// Relative RMS error of `o` against `target` on the rows of one split.
fn split_err(o: &Mat<f64>, target: &Mat<f64>, parity: usize) -> f64 {
    let (a, b) = (rows_of(o, parity), rows_of(target, parity));
    rms_row_err(&a.data, &b.data, b.rows) / (frob(&b.data) / (b.rows as f64).sqrt())
}

/// Held-out errors of one tuned setting: (mean, se) against softmax and against angular-P.
type Report = ((f64, f64), (f64, f64));

fn held_out(outs: &[Mat<f64>], soft: &Mat<f64>, ang: &Mat<f64>) -> Report {
    let es: Vec<f64> = outs.iter().map(|o| split_err(o, soft, HELD_OUT)).collect();
    let ea: Vec<f64> = outs.iter().map(|o| split_err(o, ang, HELD_OUT)).collect();
    (mean_se(&es), mean_se(&ea))
}

const VALIDATION: usize = 0;
const HELD_OUT: usize = 1;
/// Seed offset of the evaluation draws (disjoint from the tuning draws).
const EVAL: usize = 1_000;

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
    if cfg.performer_scales.len() != cfg.betas.len() {
        return Err(crate::RaceError::Config {
            path: "experiments/tradeoff.toml".into(),
            msg: format!(
                "`performer_scales` has {} values and `betas` {}: the two methods must get the same tuning budget",
                cfg.performer_scales.len(),
                cfg.betas.len()
            ),
        });
    }
    let (q, k, v, label, stem) = super::real::inputs_or(ctx, "tradeoff", || {
        let q = data::clustered_unit(cfg.n, cfg.d, cfg.clusters, cfg.noise, ctx.seed, 51);
        let k = data::clustered_unit(cfg.n, cfg.d, cfg.clusters, cfg.noise, ctx.seed, 52);
        let v = data::values_from_keys(&k, cfg.dv, ctx.seed + 53);
        (q, k, v, "synthetic clustered unit Q/K".to_string())
    })?;
    let stem = stem.as_str();
    let is_real = stem != "tradeoff";
    let (d, dv) = (q.cols, v.cols);
    let soft = softmax_attention(q.view(), k.view(), v.view(), Some(cfg.softmax_scale), false).o;
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
    let targets: Vec<(usize, Mat<f64>)> = cfg
        .ps
        .iter()
        .map(|&p| {
            (
                p,
                angular_attention(q.view(), k.view(), v.view(), p as f64, false).o,
            )
        })
        .collect();
    let angular = |p: usize| &targets.iter().find(|t| t.0 == p).expect("every P").1;
    let race = |p: usize, l: usize, beta: f64, seed: usize| {
        let planes = Planes::gaussian(l, p, d, ctx.seed * 31337 + (seed * 101 + p * 13 + l) as u64)
            .expect("valid P, L");
        super::soft_out((&q, &k, &v), &planes, beta, false, Combine::Paper)
    };
    // 1. Tuning: validation error vs softmax for every (P, L, beta), mean over tuning seeds.
    let mut jobs: Vec<(usize, usize, f64)> = Vec::new();
    for &p in &cfg.ps {
        for &l in &cfg.ls {
            jobs.extend(cfg.betas.iter().map(|&b| (p, l, b)));
        }
    }
    let tuning: Vec<Vec<String>> = jobs
        .par_iter()
        .map(|&(p, l, beta)| {
            let e: Vec<f64> = (0..cfg.seeds)
                .map(|s| split_err(&race(p, l, beta, s), &soft, VALIDATION))
                .collect();
            vec![p.to_string(), l.to_string(), f(beta), f(mean_se(&e).0)]
        })
        .collect();
    let csv0 = write_csv(
        ctx,
        &format!("{stem}_tuning"),
        &["p", "l", "beta", "validation_err_vs_softmax"],
        &tuning,
        &cfg,
    )?;
    let (ht, rt) = read_csv(ctx, &format!("{stem}_tuning"))?;
    let (tp, tl, tb, te) = (
        super::col(&ht, &rt, "p"),
        super::col(&ht, &rt, "l"),
        super::col(&ht, &rt, "beta"),
        super::col(&ht, &rt, "validation_err_vs_softmax"),
    );
    // 2. Each (P, L) at its chosen beta, on fresh seeds, held-out rows.
    let pls: Vec<(usize, usize)> = cfg
        .ps
        .iter()
        .flat_map(|&p| cfg.ls.iter().map(move |&l| (p, l)))
        .collect();
    let tuned: Vec<(usize, usize, f64, f64, Report)> = pls
        .par_iter()
        .map(|&(p, l)| {
            let (best, val) = (0..rt.len())
                .filter(|&i| tp[i] == p as f64 && tl[i] == l as f64)
                .map(|i| (tb[i], te[i]))
                .min_by(|a, b| a.1.partial_cmp(&b.1).unwrap())
                .unwrap_or((f64::NAN, f64::NAN));
            let outs: Vec<Mat<f64>> = (0..cfg.eval_seeds)
                .map(|s| race(p, l, best, EVAL + s))
                .collect();
            (p, l, best, val, held_out(&outs, &soft, angular(p)))
        })
        .collect();
    let mut rows: Vec<Vec<String>> = tuned
        .iter()
        .map(|&(p, l, beta, val, ((es, ses), (ea, sea)))| {
            let time = times
                .iter()
                .find(|t| t.0 == (p, l))
                .map(|t| t.1)
                .unwrap_or(f64::NAN);
            vec![
                p.to_string(),
                l.to_string(),
                f(beta),
                (l * (1 << p) * (dv + 1)).to_string(),
                f(time),
                f(val),
                f(es),
                f(ses),
                f(ea),
                f(sea),
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
        r[10] = (on as u8).to_string();
    }
    let csv1 = write_csv(
        ctx,
        stem,
        &[
            "p",
            "l",
            "beta_chosen",
            "state_floats",
            "kernel_seconds",
            "validation_err_vs_softmax",
            "err_vs_softmax",
            "se_vs_softmax",
            "err_vs_angular_p",
            "se_vs_angular_p",
            "pareto",
        ],
        &rows,
        &cfg,
    )?;
    // 3. Matched state m = L·R: the best (P, L) by validation error vs Performer(m) tuned
    //    over its scale, and linear attention.
    let lin = linear_attention(q.view(), k.view(), v.view(), false).o;
    let lin_err = split_err(&lin, &soft, HELD_OUT);
    let mut ms: Vec<usize> = pls.iter().map(|&(p, l)| l << p).collect();
    ms.sort();
    ms.dedup();
    let perf = |m: usize, scale: f64, seed: usize| {
        let om = performer_omega(m, d, ctx.seed * 17 + seed as u64);
        performer_attention(q.view(), k.view(), v.view(), &om, Some(scale), false).o
    };
    let matched: Vec<Vec<String>> = ms
        .par_iter()
        .map(|&m| {
            let race_pick = tuned
                .iter()
                .filter(|t| t.1 << t.0 == m)
                .min_by(|a, b| a.3.partial_cmp(&b.3).unwrap())
                .expect("m comes from the grid");
            let (scale, _) = cfg
                .performer_scales
                .iter()
                .map(|&c| {
                    let s = c * cfg.softmax_scale;
                    let e: Vec<f64> = (0..cfg.seeds)
                        .map(|sd| split_err(&perf(m, s, sd), &soft, VALIDATION))
                        .collect();
                    (s, mean_se(&e).0)
                })
                .min_by(|a, b| a.1.partial_cmp(&b.1).unwrap())
                .unwrap_or((cfg.softmax_scale, f64::NAN));
            let outs: Vec<Mat<f64>> = (0..cfg.eval_seeds)
                .map(|sd| perf(m, scale, EVAL + sd))
                .collect();
            let ((ps, pse), (pa, pase)) = held_out(&outs, &soft, angular(race_pick.0));
            let ((rs, rse), (ra, rase)) = race_pick.4;
            vec![
                m.to_string(),
                (m * (dv + 1)).to_string(),
                format!("({};{};{})", race_pick.0, race_pick.1, race_pick.2),
                f(rs),
                f(rse),
                f(ra),
                f(rase),
                f(scale),
                f(ps),
                f(pse),
                f(pa),
                f(pase),
                f(lin_err),
            ]
        })
        .collect();
    let csv2 = write_csv(
        ctx,
        &format!("{stem}_matched"),
        &[
            "m_features",
            "state_floats",
            "race_pick_p_l_beta",
            "race_err_vs_softmax",
            "race_se_vs_softmax",
            "race_err_vs_angular_p",
            "race_se_vs_angular_p",
            "performer_scale",
            "performer_err_vs_softmax",
            "performer_se_vs_softmax",
            "performer_err_vs_angular_p",
            "performer_se_vs_angular_p",
            "linear_err_vs_softmax",
        ],
        &matched,
        &cfg,
    )?;
    // Figures from CSV.
    let (h, r) = read_csv(ctx, stem)?;
    let (st, es, tm, pa, pc) = (
        super::col(&h, &r, "state_floats"),
        super::col(&h, &r, "err_vs_softmax"),
        super::col(&h, &r, "kernel_seconds"),
        super::col(&h, &r, "pareto"),
        super::col(&h, &r, "p"),
    );
    let by_p = |x: &[f64]| -> Vec<Series> {
        cfg.ps
            .iter()
            .map(|&p| {
                Series::new(format!("P={p}"), {
                    let mut v: Vec<(f64, f64)> = (0..r.len())
                        .filter(|&i| pc[i] == p as f64)
                        .map(|i| (x[i], es[i]))
                        .collect();
                    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
                    v
                })
            })
            .collect()
    };
    let mut series = by_p(&st);
    let mut front: Vec<(f64, f64)> = (0..r.len())
        .filter(|&i| pa[i] == 1.0)
        .map(|i| (st[i], es[i]))
        .collect();
    front.sort_by(|a, b| a.partial_cmp(b).unwrap());
    series.push(Series::dashed("Pareto front", front.clone()));
    line_plot(
        &fig(ctx, &format!("{stem}_state")),
        &LinePlot {
            title: "Held-out error vs softmax (beta tuned on validation) against state L*R*(dv+1)",
            xlabel: "state floats",
            ylabel: "relative RMS error vs softmax",
            logx: true,
            logy: true,
        },
        &series,
    )?;
    line_plot(
        &fig(ctx, &format!("{stem}_time")),
        &LinePlot {
            title: &format!(
                "Held-out error vs measured kernel time (N={}, forward)",
                cfg.time_n
            ),
            xlabel: "seconds",
            ylabel: "relative RMS error vs softmax",
            logx: true,
            logy: true,
        },
        &by_p(&tm),
    )?;
    let (hm, rm) = read_csv(ctx, &format!("{stem}_matched"))?;
    let mc = |name: &str| super::col(&hm, &rm, name);
    let (mm, rs, rse, ra, ps, pse, pa2, lm) = (
        mc("state_floats"),
        mc("race_err_vs_softmax"),
        mc("race_se_vs_softmax"),
        mc("race_err_vs_angular_p"),
        mc("performer_err_vs_softmax"),
        mc("performer_se_vs_softmax"),
        mc("performer_err_vs_angular_p"),
        mc("linear_err_vs_softmax"),
    );
    let zip = |y: &[f64]| {
        mm.iter()
            .cloned()
            .zip(y.iter().cloned())
            .collect::<Vec<_>>()
    };
    line_plot(
        &fig(ctx, &format!("{stem}_matched")),
        &LinePlot {
            title: "Matched state (dv+1)*m: held-out error, each method tuned on validation",
            xlabel: "state floats",
            ylabel: "relative RMS error",
            logx: true,
            logy: true,
        },
        &[
            Series::new("soft RACE vs softmax", zip(&rs)),
            Series::new("Performer vs softmax", zip(&ps)),
            Series::dashed("soft RACE vs angular-P", zip(&ra)),
            Series::dashed("Performer vs angular-P", zip(&pa2)),
            Series::dashed(
                format!("linear attention vs softmax (state {})", d * (dv + 1)),
                mm.iter().map(|&m| (m, lm[0])).collect(),
            ),
        ],
    )?;
    let wins = (0..rm.len())
        .filter(|&i| ps[i] - rs[i] > 2.0 * (rse[i].powi(2) + pse[i].powi(2)).sqrt())
        .count();
    let wins_angular = (0..rm.len()).filter(|&i| ra[i] < pa2[i]).count();
    // More buckets: (P, L) → (P + 1, L), held-out error vs softmax.
    let find = |p: usize, l: usize| tuned.iter().find(|t| t.0 == p && t.1 == l);
    let worse: Vec<(usize, usize, f64, f64)> = pls
        .iter()
        .filter_map(|&(p, l)| {
            let (a, b) = (find(p, l)?, find(p + 1, l)?);
            let diff = (b.4).0 .0 - (a.4).0 .0;
            let se = ((a.4).0 .1.powi(2) + (b.4).0 .1.powi(2)).sqrt();
            Some((p, l, diff, se))
        })
        .collect();
    let most = worse
        .iter()
        .cloned()
        .max_by(|a, b| (a.2 / a.3).partial_cmp(&(b.2 / b.3)).unwrap());
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
        Claim::judged(
            &claim_id("tradeoff-matched", is_real),
            format!("[{label}] tuned soft RACE beats tuned Performer by > 2 se at {wins}/{} state sizes vs softmax (closer to angular-P at {wins_angular}/{}); linear attention {:.3} vs softmax", rm.len(), rm.len(), lm[0]),
            Measure::Share { hits: wins, total: rm.len() },
            format!("{} tuning seeds per value, {} evaluation seeds", cfg.seeds, cfg.eval_seeds),
        )?,
        Claim::judged(
            &claim_id("tradeoff-more-buckets", is_real),
            match most {
                Some((p, l, diff, se)) => format!("[{label}] largest rise ({p},{l}) → ({},{l}): {diff:+.4} (se {se:.4}); Pareto-optimal (P,L,beta): {}", p + 1, front_txt.join(" ")),
                None => "no (P, P+1) pair in the grid".into(),
            },
            match most {
                Some((_, _, diff, se)) => Measure::Margin { diff, se },
                None => Measure::NotTestable("no (P, P+1) pair in the grid".into()),
            },
            "",
        )?,
    ];
    let headline = serde_json::json!({"points": r.len(), "pareto_points": front.len(), "race_beats_performer": wins, "matched_sizes": rm.len(), "linear_err": lm[0]});
    Ok(ExpResult {
        name: stem.into(),
        claims,
        figures: vec![
            format!("{stem}_state"),
            format!("{stem}_time"),
            format!("{stem}_matched"),
        ],
        csv: vec![csv0, csv1, csv2],
        headline,
        seconds: t0.elapsed().as_secs_f64(),
        seed: ctx.seed,
    })
}
