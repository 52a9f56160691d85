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
    claim_id, data, f, fig, load_config, read_csv, verdict::mean_se, verdict::Cmp, write_csv,
    Claim, Ctx, ExpResult, Measure,
};
use crate::analysis::metrics::{frob, rms_row_err};
use crate::backend::Backend;
use crate::backend::{Heads, PlanesF32};
use crate::cpu::CpuRace;
use crate::error::Result;
use crate::hashing::Planes;
use crate::params::Combine;
use crate::params::{Bits, Seed, Tables};
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

/// A tuned (P, L): its chosen beta, validation error and held-out report.
type Tuned = (usize, usize, f64, f64, Report);

/// What one trade-off study shares: the inputs, the two targets, the grid.
struct Study<'a> {
    ctx: &'a Ctx,
    cfg: Config,
    q: Mat<f64>,
    k: Mat<f64>,
    v: Mat<f64>,
    label: String,
    stem: String,
    /// Softmax attention, and angular attention with `γ = P` for every P of the grid.
    soft: Mat<f64>,
    targets: Vec<(usize, Mat<f64>)>,
}

impl Study<'_> {
    fn is_real(&self) -> bool {
        self.stem != "tradeoff"
    }
    fn pls(&self) -> Vec<(usize, usize)> {
        let ls = self.cfg.ls.clone();
        self.cfg
            .ps
            .iter()
            .flat_map(|&p| ls.clone().into_iter().map(move |l| (p, l)))
            .collect()
    }
    fn angular(&self, p: usize) -> &Mat<f64> {
        &self.targets.iter().find(|t| t.0 == p).expect("every P").1
    }
    /// Soft RACE (f64 reference) at (P, L, beta) with the planes of draw `seed`.
    fn race(&self, p: usize, l: usize, beta: f64, seed: usize) -> Mat<f64> {
        let d = self.q.cols;
        let planes = Planes::gaussian(
            Bits(p),
            Tables(l),
            d,
            Seed(self.ctx.seed * 31337 + (seed * 101 + p * 13 + l) as u64),
        )
        .expect("valid P, L");
        super::soft_out(
            (&self.q, &self.k, &self.v),
            &planes,
            beta,
            false,
            Combine::Paper,
        )
    }
    fn performer(&self, m: usize, scale: f64, seed: usize) -> Mat<f64> {
        let om = performer_omega(m, self.q.cols, self.ctx.seed * 17 + seed as u64);
        performer_attention(
            self.q.view(),
            self.k.view(),
            self.v.view(),
            &om,
            Some(scale),
            false,
        )
        .o
    }
}

fn study(ctx: &Ctx) -> Result<Study<'_>> {
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
        let (q, k, v) = data::clustered_qkv(
            (cfg.n, cfg.d, cfg.dv),
            (cfg.clusters, cfg.noise),
            ctx.seed,
            51,
        );
        (q, k, v, "synthetic clustered unit Q/K".to_string())
    })?;
    let soft = softmax_attention(q.view(), k.view(), v.view(), Some(cfg.softmax_scale), false).o;
    let targets = cfg
        .ps
        .iter()
        .map(|&p| {
            let a = angular_attention(q.view(), k.view(), v.view(), p as f64, false).o;
            (p, a)
        })
        .collect();
    Ok(Study {
        ctx,
        cfg,
        q,
        k,
        v,
        label,
        stem,
        soft,
        targets,
    })
}

/// Compute: the f32 kernel's forward time per (P, L) at `time_n` tokens (median of
/// `time_runs`; beta does not change the work below the f64-projection threshold).
fn kernel_times(st: &Study) -> Result<Vec<((usize, usize), f64)>> {
    let (cfg, ctx) = (&st.cfg, st.ctx);
    let (d, dv) = (st.q.cols, st.v.cols);
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
    for (p, l) in st.pls() {
        let planes =
            PlanesF32::from_planes(&Planes::gaussian(Bits(p), Tables(l), d, Seed(ctx.seed))?);
        let params = crate::params::RaceParams::new(
            Bits(p),
            Tables(l),
            crate::params::Beta(crate::params::DEFAULT_BETA),
        )?;
        let (qh, vh) = (
            Heads::new(1, cfg.time_n, d, &tq)?,
            Heads::new(1, cfg.time_n, dv, &tv)?,
        );
        let race = CpuRace::detected();
        let ts: Vec<f64> = (0..cfg.time_runs.max(1))
            .map(|_| {
                let t = std::time::Instant::now();
                std::hint::black_box(race.forward(&params, &planes, qh, qh, vh)?);
                Ok(t.elapsed().as_secs_f64())
            })
            .collect::<Result<_>>()?;
        times.push(((p, l), crate::stats::median(&ts)));
    }
    Ok(times)
}

/// Compute → CSV `{stem}_tuning`: validation error vs softmax for every (P, L, beta), mean
/// over the tuning seeds.
fn tuning_csv(st: &Study) -> Result<String> {
    let cfg = &st.cfg;
    let jobs: Vec<(usize, usize, f64)> = st
        .pls()
        .into_iter()
        .flat_map(|(p, l)| cfg.betas.iter().map(move |&b| (p, l, b)))
        .collect();
    let rows: Vec<Vec<String>> = jobs
        .par_iter()
        .map(|&(p, l, beta)| {
            let e: Vec<f64> = (0..cfg.seeds)
                .map(|s| split_err(&st.race(p, l, beta, s), &st.soft, VALIDATION))
                .collect();
            vec![p.to_string(), l.to_string(), f(beta), f(mean_se(&e).0)]
        })
        .collect();
    write_csv(
        st.ctx,
        &format!("{}_tuning", st.stem),
        &["p", "l", "beta", "validation_err_vs_softmax"],
        &rows,
        cfg,
    )
}

/// Compute → CSV `{stem}`: each (P, L) at the beta its tuning CSV chose, on fresh seeds,
/// held-out rows; with its state, kernel time and whether it is on the Pareto front.
fn held_out_csv(st: &Study, times: &[((usize, usize), f64)]) -> Result<(String, Vec<Tuned>)> {
    let (cfg, dv) = (&st.cfg, st.v.cols);
    let (ht, rt) = read_csv(st.ctx, &format!("{}_tuning", st.stem))?;
    let (tp, tl, tb, te) = (
        super::col(&ht, &rt, "p"),
        super::col(&ht, &rt, "l"),
        super::col(&ht, &rt, "beta"),
        super::col(&ht, &rt, "validation_err_vs_softmax"),
    );
    let tuned: Vec<Tuned> = st
        .pls()
        .par_iter()
        .map(|&(p, l)| {
            let (best, val) = crate::stats::min_by_float(
                (0..rt.len())
                    .filter(|&i| tp[i] == p as f64 && tl[i] == l as f64)
                    .map(|i| (tb[i], te[i])),
                |x| x.1,
            )
            .unwrap_or((f64::NAN, f64::NAN));
            let outs: Vec<Mat<f64>> = (0..cfg.eval_seeds)
                .map(|s| st.race(p, l, best, EVAL + s))
                .collect();
            (p, l, best, val, held_out(&outs, &st.soft, st.angular(p)))
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
    let csv = write_csv(
        st.ctx,
        &st.stem,
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
        cfg,
    )?;
    Ok((csv, tuned))
}

/// Compute → CSV `{stem}_matched`: at matched state `m = L·R`, the best (P, L) by validation
/// error against Performer(m) tuned over its scale, and linear attention.
fn matched_csv(st: &Study, tuned: &[Tuned]) -> Result<String> {
    let (cfg, dv) = (&st.cfg, st.v.cols);
    let lin = linear_attention(st.q.view(), st.k.view(), st.v.view(), false).o;
    let lin_err = split_err(&lin, &st.soft, HELD_OUT);
    let mut ms: Vec<usize> = st.pls().iter().map(|&(p, l)| l << p).collect();
    ms.sort();
    ms.dedup();
    let rows: Vec<Vec<String>> = ms
        .par_iter()
        .map(|&m| {
            // A non-finite validation error picks nothing: the row's RACE errors are NaN and
            // the claim comes out not testable.
            let race_pick =
                crate::stats::min_by_float(tuned.iter().filter(|t| t.1 << t.0 == m), |t| t.3);
            let scales = cfg.performer_scales.iter().map(|&c| {
                let s = c * cfg.softmax_scale;
                let e: Vec<f64> = (0..cfg.seeds)
                    .map(|sd| split_err(&st.performer(m, s, sd), &st.soft, VALIDATION))
                    .collect();
                (s, mean_se(&e).0)
            });
            let (scale, _) = crate::stats::min_by_float(scales, |x| x.1)
                .unwrap_or((cfg.softmax_scale, f64::NAN));
            let outs: Vec<Mat<f64>> = (0..cfg.eval_seeds)
                .map(|sd| st.performer(m, scale, EVAL + sd))
                .collect();
            let p_ang = race_pick.map_or(cfg.ps[0], |t| t.0);
            let ((ps, pse), (pa, pase)) = held_out(&outs, &st.soft, st.angular(p_ang));
            let nan = (f64::NAN, f64::NAN);
            let ((rs, rse), (ra, rase)) = race_pick.map_or((nan, nan), |t| t.4);
            vec![
                m.to_string(),
                (m * (dv + 1)).to_string(),
                race_pick.map_or("none".into(), |t| format!("({};{};{})", t.0, t.1, t.2)),
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
    write_csv(
        st.ctx,
        &format!("{}_matched", st.stem),
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
        &rows,
        cfg,
    )
}

/// Figures, from the CSVs only: error against state (with the Pareto front), against kernel
/// time, and at matched state.
fn figures(st: &Study) -> Result<Vec<String>> {
    let (ctx, cfg, stem) = (st.ctx, &st.cfg, st.stem.as_str());
    let d = st.q.cols;
    let dv = st.v.cols;
    let (h, r) = read_csv(ctx, stem)?;
    let (sf, es, tm, pa, pc) = (
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
                    crate::stats::sort_by_float(&mut v, |x| x.0);
                    v
                })
            })
            .collect()
    };
    let mut series = by_p(&sf);
    let mut front: Vec<(f64, f64)> = (0..r.len())
        .filter(|&i| pa[i] == 1.0)
        .map(|i| (sf[i], es[i]))
        .collect();
    crate::stats::sort_by_float(&mut front, |x| x.0);
    series.push(Series::dashed("Pareto front", front));
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
    let (mm, rs, ra, ps, pa2, lm) = (
        mc("state_floats"),
        mc("race_err_vs_softmax"),
        mc("race_err_vs_angular_p"),
        mc("performer_err_vs_softmax"),
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
    Ok(vec![
        format!("{stem}_state"),
        format!("{stem}_time"),
        format!("{stem}_matched"),
    ])
}

/// Claims, from the CSVs and the tuned held-out reports: tuned soft RACE against tuned
/// Performer at matched state, and whether more buckets ((P, L) → (P + 1, L)) raise the
/// held-out error.
fn claims(st: &Study, tuned: &[Tuned]) -> Result<(Vec<Claim>, serde_json::Value)> {
    let (ctx, cfg, label, is_real) = (st.ctx, &st.cfg, &st.label, st.is_real());
    let (h, r) = read_csv(ctx, &st.stem)?;
    let pa = super::col(&h, &r, "pareto");
    let (hm, rm) = read_csv(ctx, &format!("{}_matched", st.stem))?;
    let mc = |name: &str| super::col(&hm, &rm, name);
    let (rs, rse, ra, ps, pse, pa2, lm) = (
        mc("race_err_vs_softmax"),
        mc("race_se_vs_softmax"),
        mc("race_err_vs_angular_p"),
        mc("performer_err_vs_softmax"),
        mc("performer_se_vs_softmax"),
        mc("performer_err_vs_angular_p"),
        mc("linear_err_vs_softmax"),
    );
    // One comparison per state size (Performer's error − RACE's): the two methods' evaluation
    // draws are independent, so Welch's standard error and degrees of freedom.
    let n_eval = cfg.eval_seeds;
    let mcol = mc("m_features");
    let size_cmps: Vec<Cmp> = (0..rm.len())
        .map(|i| {
            Cmp::welch(
                format!("m = {}", mcol[i]),
                ps[i] - rs[i],
                (pse[i], n_eval),
                (rse[i], n_eval),
            )
        })
        .collect();
    let testable = size_cmps
        .iter()
        .all(|c| c.df >= 2.0 && c.se > 0.0 && c.diff.is_finite() && c.se.is_finite());
    let wins = if testable {
        let p: Vec<f64> = size_cmps.iter().map(super::verdict::p_one_sided).collect();
        super::verdict::holm(&p, 0.05)
            .iter()
            .filter(|&&w| w)
            .count()
    } else {
        0
    };
    let wins_angular = (0..rm.len()).filter(|&i| ra[i] < pa2[i]).count();
    // More buckets: (P, L) → (P + 1, L), held-out error vs softmax.
    let find = |p: usize, l: usize| tuned.iter().find(|t| t.0 == p && t.1 == l);
    let worse: Vec<(usize, usize, Cmp)> = st
        .pls()
        .iter()
        .filter_map(|&(p, l)| {
            let (a, b) = (find(p, l)?, find(p + 1, l)?);
            let cmp = Cmp::welch(
                format!("({p},{l}) → ({},{l})", p + 1),
                (b.4).0 .0 - (a.4).0 .0,
                ((b.4).0 .1, n_eval),
                ((a.4).0 .1, n_eval),
            );
            Some((p, l, cmp))
        })
        .collect();
    let most = crate::stats::argmax(worse.iter().map(|w| w.2.diff / w.2.se)).map(|i| &worse[i]);
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
    let front = pa.iter().filter(|&&x| x == 1.0).count();
    let claims = vec![
        Claim::judged(
            &claim_id("tradeoff-matched", is_real),
            format!(
                "[{label}] Performer's held-out error − tuned soft RACE's vs softmax per state size (Welch se over {n_eval} evaluation seeds each): {}; RACE closer to angular-P at {wins_angular}/{}; linear attention {:.3} vs softmax",
                size_cmps.iter().map(|c| format!("{}: {:+.4} (se {:.4})", c.label, c.diff, c.se)).collect::<Vec<_>>().join(", "),
                rm.len(),
                lm[0]
            ),
            Measure::Margins(size_cmps.clone()),
            format!("{} tuning seeds per value, {} evaluation seeds", cfg.seeds, cfg.eval_seeds),
        )?,
        Claim::judged(
            &claim_id("tradeoff-more-buckets", is_real),
            match most {
                Some((_, _, c)) => format!("[{label}] largest rise over its se of {} (P, L) → (P+1, L) pairs, {}: {:+.4} (se {:.4}, Welch); Pareto-optimal (P,L,beta): {}", worse.len(), c.label, c.diff, c.se, front_txt.join(" ")),
                None => "no (P, P+1) pair in the grid".into(),
            },
            if worse.is_empty() {
                Measure::NotTestable("no (P, P+1) pair in the grid".into())
            } else {
                Measure::Margins(worse.iter().map(|w| w.2.clone()).collect())
            },
            "",
        )?,
    ];
    let headline = serde_json::json!({"points": r.len(), "pareto_points": front, "race_beats_performer": wins, "matched_sizes": rm.len(), "linear_err": lm[0]});
    Ok((claims, headline))
}

/// The study: compute and write the CSVs, draw the figures from them, judge the claims.
pub fn run(ctx: &Ctx) -> Result<ExpResult> {
    let t0 = std::time::Instant::now();
    let st = study(ctx)?;
    let times = kernel_times(&st)?;
    let csv0 = tuning_csv(&st)?;
    let (csv1, tuned) = held_out_csv(&st, &times)?;
    let csv2 = matched_csv(&st, &tuned)?;
    let figures = figures(&st)?;
    Ok(ExpResult::assemble(
        st.stem.clone(),
        ctx,
        t0,
        (vec![csv0, csv1, csv2], figures),
        claims(&st, &tuned)?,
    ))
}
