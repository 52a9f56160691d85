//! Trained models on multi-query associative recall (MQAR; Zoology, Arora et al. 2023): what
//! P, L and β do to a **trained** soft-RACE model, against Performer and linear attention at
//! matched recurrent state, with softmax attention as the ceiling.
//!
//! Training needs PyTorch, so `experiments/mqar/mqar.py` trains the models (through
//! `racelab.torch`) and writes `figures/mqar/mqar.csv` with its provenance
//! (`mqar.meta.json`: parameters, seeds, revision, machine); that CSV is tracked. This step
//! reads it (no torch needed): CSV → summary CSV (mean and standard error of accuracy over
//! seeds per model) → figure (accuracy against state) → claims.
//!
//! State per layer: soft RACE `L·2^P·(dv + 1)`, Performer `m·(dv + 1)`, linear attention
//! `d_head·(dv + 1)`; softmax keeps every key. Every model is tuned the same way before its
//! seeds train: a learning-rate sweep (and, for Performer, its feature scale) chosen on the
//! first seed's validation set; accuracy is on a separate test set. Soft RACE trains in three
//! β modes: `fixed` at the trade-off study's validated β for its (P, L), `learned` from that
//! β, and `learned-authors` from the authors' `1/√d_head`.
//!
//! A difference counts only where a one-sided Student-t test with the seeds' degrees of
//! freedom passes (`margin`; `margins` with Holm–Bonferroni over several): for a difference of
//! means `se = sqrt(se_a² + se_b²)`, and for an average of `K` such differences
//! `se = sqrt(Σ se²)/K`.

use super::{
    col, col_s, f, fig, read_csv, verdict::Cmp, write_csv, Claim, Ctx, ExpResult, Measure,
};
use crate::error::{RaceError, Result};
use crate::plot::{line_plot, LinePlot, Series};
use crate::stats::mean_se;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The folder of the MQAR outputs under the report's folder.
pub const DIR: &str = "mqar";

/// One trained model, summarised over its seeds.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// `softmax`, `linear`, `performer` or `race`.
    pub model: String,
    /// Soft RACE's P and L (0 for the others).
    pub p: usize,
    pub l: usize,
    /// Features of the state: L·2^P, Performer's m, linear's d_head (0 for softmax).
    pub m: usize,
    /// `fixed`, `learned` or `learned-authors` (soft RACE), empty otherwise.
    pub beta_mode: String,
    /// The tuned setting the seeds trained at (`lr=…`, and Performer's `scale=…`), empty
    /// when the CSV does not record it.
    pub setting: String,
    /// Recurrent state per layer in floats (0 for softmax: unbounded).
    pub state: f64,
    pub seeds: usize,
    pub accuracy: f64,
    pub se: f64,
    /// The β the model ended with, mean over seeds and layers (NaN when not soft RACE).
    pub beta_final: f64,
    /// How far training moved β: the mean over seeds and layers of `log2(β_final/β_start)`
    /// (NaN when not soft RACE or when the start is not recorded).
    pub dlog2_beta: f64,
}

/// A learned β that moved less than this (in log2) was not learned in the training budget:
/// its claims are not testable.
pub const MIN_BETA_MOVE_LOG2: f64 = 0.25;

/// Where the trained results are: the report folder's `mqar/mqar.csv`, else the tracked one in
/// the source tree (copied next to the report with its metadata).
fn locate(ctx: &Ctx) -> Result<Option<PathBuf>> {
    let here = ctx.out.join(DIR).join("mqar.csv");
    if here.is_file() {
        return Ok(Some(here));
    }
    let tracked = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("figures")
        .join(DIR)
        .join("mqar.csv");
    if !tracked.is_file() {
        return Ok(None);
    }
    let dir = ctx.out.join(DIR);
    std::fs::create_dir_all(&dir).map_err(|e| RaceError::io(&dir, e))?;
    for name in ["mqar.csv", "mqar.meta.json"] {
        let (from, to) = (tracked.with_file_name(name), dir.join(name));
        if from.is_file() {
            std::fs::copy(&from, &to).map_err(|e| RaceError::io(&to, e))?;
        }
    }
    Ok(Some(here))
}

/// Group the per-seed rows of `mqar.csv` into one [`Summary`] per model.
pub fn summarise(header: &[String], rows: &[Vec<String>]) -> Vec<Summary> {
    let (model, mode, beta) = (
        col_s(header, rows, "model"),
        col_s(header, rows, "beta_mode"),
        col_s(header, rows, "beta_final"),
    );
    let start = if header.iter().any(|h| h == "beta_start") {
        col(header, rows, "beta_start")
    } else {
        vec![f64::NAN; rows.len()]
    };
    let (p, l, m, state, acc) = (
        col(header, rows, "p"),
        col(header, rows, "l"),
        col(header, rows, "m_features"),
        col(header, rows, "state_floats"),
        col(header, rows, "accuracy"),
    );
    let optional = |name: &str| {
        if header.iter().any(|h| h == name) {
            col_s(header, rows, name)
        } else {
            vec![String::new(); rows.len()]
        }
    };
    let (lr, scale) = (optional("lr"), optional("performer_scale"));
    let whole = |x: f64| if x.is_finite() { x as usize } else { 0 };
    let mut groups: BTreeMap<(String, usize, usize, usize, String), Vec<usize>> = BTreeMap::new();
    for i in 0..rows.len() {
        let key = (
            model[i].clone(),
            whole(p[i]),
            whole(l[i]),
            whole(m[i]),
            mode[i].clone(),
        );
        groups.entry(key).or_default().push(i);
    }
    groups
        .into_iter()
        .map(|((model, p, l, m, beta_mode), idx)| {
            let accs: Vec<f64> = idx.iter().map(|&i| acc[i]).collect();
            let (accuracy, se) = mean_se(&accs);
            // A field that does not parse is NaN, never dropped: a NaN learned β reaches the
            // verdict as a non-finite value.
            let parse = |b: &str| b.parse::<f64>().unwrap_or(f64::NAN);
            let betas: Vec<f64> = idx
                .iter()
                .flat_map(|&i| beta[i].split(';').filter(|b| !b.is_empty()).map(parse))
                .collect();
            let moves: Vec<f64> = idx
                .iter()
                .flat_map(|&i| {
                    let s0 = start[i];
                    beta[i]
                        .split(';')
                        .filter(|b| !b.is_empty())
                        .map(move |b| (parse(b) / s0).log2())
                })
                .collect();
            let i0 = idx[0];
            let mut setting = Vec::new();
            if !lr[i0].is_empty() {
                setting.push(format!("lr={}", lr[i0]));
            }
            if !scale[i0].is_empty() {
                setting.push(format!("scale={}", scale[i0]));
            }
            Summary {
                model,
                p,
                l,
                m,
                beta_mode,
                setting: setting.join(" "),
                state: if state[idx[0]].is_finite() {
                    state[idx[0]]
                } else {
                    0.0
                },
                seeds: idx.len(),
                accuracy,
                se,
                beta_final: if betas.is_empty() {
                    f64::NAN
                } else {
                    betas.iter().sum::<f64>() / betas.len() as f64
                },
                dlog2_beta: if moves.is_empty() {
                    f64::NAN
                } else {
                    moves.iter().sum::<f64>() / moves.len() as f64
                },
            }
        })
        .collect()
}

/// The β mode learned from the authors' start `1/√d_head`.
pub const AUTHORS: &str = "learned-authors";

fn race<'a>(s: &'a [Summary], mode: &'a str) -> impl Iterator<Item = &'a Summary> + 'a {
    s.iter()
        .filter(move |x| x.model == "race" && x.beta_mode == mode)
}

/// Softmax's mean accuracy (the ceiling the comparison needs near 1).
pub fn softmax_measure(s: &[Summary]) -> (Measure, String) {
    match s.iter().find(|x| x.model == "softmax") {
        Some(x) => (
            Measure::value(x.accuracy),
            format!(
                "softmax accuracy {:.3} ± {:.3} over {} seeds",
                x.accuracy, x.se, x.seeds
            ),
        ),
        None => (
            Measure::NotTestable("no softmax rows in mqar.csv".into()),
            "no softmax rows".into(),
        ),
    }
}

/// Every drop in accuracy from P to a larger P' at the same L (fixed β), each with its
/// standard error over seeds: the existential claim "some setting trains worse with more
/// buckets" is tested over all these comparisons with Holm–Bonferroni.
pub fn more_buckets_measure(s: &[Summary]) -> (Measure, String) {
    let fixed: Vec<&Summary> = race(s, "fixed").collect();
    let mut cmps = Vec::new();
    let mut best: Option<(f64, &Summary, &Summary)> = None;
    for a in &fixed {
        for b in &fixed {
            if a.l == b.l && b.p > a.p {
                let (diff, se) = (a.accuracy - b.accuracy, a.se.hypot(b.se));
                cmps.push(Cmp {
                    label: format!("({},{}) → ({},{})", a.p, a.l, b.p, b.l),
                    diff,
                    se,
                    df: a.seeds.min(b.seeds) as f64 - 1.0,
                });
                let z = diff / se;
                if best.is_none_or(|(bz, _, _)| z.total_cmp(&bz).is_gt()) {
                    best = Some((z, a, b));
                }
            }
        }
    }
    match best {
        Some((_, a, b)) => (
            Measure::Margins(cmps.clone()),
            format!(
                "{} pairs; the largest drop over its se, ({},{}) → ({},{}): accuracy {:.3} → {:.3} ({})",
                cmps.len(),
                a.p,
                a.l,
                b.p,
                b.l,
                a.accuracy,
                b.accuracy,
                if a.accuracy > b.accuracy { format!("a drop of {:.3}", a.accuracy - b.accuracy) } else { format!("a gain of {:.3}: no pair drops", b.accuracy - a.accuracy) }
            ),
        ),
        None => (
            Measure::NotTestable("no two fixed-β (P, L) share an L".into()),
            "no pair of P at one L".into(),
        ),
    }
}

/// The mean of `K` independent differences `(d, se)` and its standard error `sqrt(Σ se²)/K`,
/// as a comparison with the seeds' degrees of freedom (`seeds − 1`, the fewest of any term),
/// and its text: `{prefix}{parts}; mean difference … (se …)`.
fn mean_difference(
    terms: &[(f64, f64)],
    seeds: usize,
    prefix: &str,
    parts: &[String],
) -> (Measure, String) {
    let k = terms.len() as f64;
    let c = Cmp {
        label: String::new(),
        diff: terms.iter().map(|t| t.0).sum::<f64>() / k,
        se: terms.iter().map(|t| t.1 * t.1).sum::<f64>().sqrt() / k,
        df: seeds as f64 - 1.0,
    };
    let text = format!(
        "{prefix}{}; mean difference {:+.3} (se {:.3})",
        parts.join(", "),
        c.diff,
        c.se
    );
    (Measure::Margin(c), text)
}

/// Mean over matched feature counts m of (soft RACE's mean accuracy over its fixed-β (P, L)
/// with L·2^P = m) − (Performer with m features).
pub fn race_vs_performer_measure(s: &[Summary]) -> (Measure, String) {
    let mut terms = Vec::new();
    let mut parts = Vec::new();
    let mut seeds = usize::MAX;
    for perf in s.iter().filter(|x| x.model == "performer") {
        let at: Vec<&Summary> = race(s, "fixed").filter(|x| x.m == perf.m).collect();
        if at.is_empty() {
            continue;
        }
        let k = at.len() as f64;
        let r = at.iter().map(|x| x.accuracy).sum::<f64>() / k;
        let r_se = at.iter().map(|x| x.se * x.se).sum::<f64>().sqrt() / k;
        terms.push((r - perf.accuracy, r_se.hypot(perf.se)));
        seeds = at
            .iter()
            .map(|x| x.seeds)
            .chain([perf.seeds, seeds])
            .min()
            .unwrap_or(0);
        parts.push(format!(
            "m={}: RACE {:.3} vs Performer {:.3}",
            perf.m, r, perf.accuracy
        ));
    }
    if terms.is_empty() {
        return (
            Measure::NotTestable("no Performer width matches a soft-RACE L·2^P".into()),
            "no matched state".into(),
        );
    }
    mean_difference(&terms, seeds, "", &parts)
}

/// Why the rows learned in `mode` cannot test a claim about learning β: none of them moved β
/// by [`MIN_BETA_MOVE_LOG2`] (or a move is not finite, which the verdict reports itself).
fn beta_not_learned(s: &[Summary], mode: &str) -> Option<String> {
    let moves: Vec<f64> = race(s, mode).map(|a| a.dlog2_beta).collect();
    if moves.is_empty() || moves.iter().any(|m| !m.is_finite()) {
        return None;
    }
    let most = moves
        .iter()
        .fold(0.0f64, |m, x| crate::stats::nan_max(m, x.abs()));
    (most < MIN_BETA_MOVE_LOG2).then(|| {
        format!(
            "training moved log2 β by at most {most:.2} (< {MIN_BETA_MOVE_LOG2}) in every (P, L) learned as `{mode}`: β was not learned in this budget"
        )
    })
}

/// Mean over the (P, L) trained both ways from the same β (`learned` from the validated β,
/// and `fixed` there), whose learned β moved by at least [`MIN_BETA_MOVE_LOG2`], of
/// (learned-β accuracy − fixed-β accuracy).
pub fn learned_vs_fixed_measure(s: &[Summary]) -> (Measure, String) {
    let mut terms = Vec::new();
    let mut parts = Vec::new();
    let mut seeds = usize::MAX;
    if let Some(why) = beta_not_learned(s, "learned") {
        return (Measure::NotTestable(why.clone()), why);
    }
    for a in race(s, "learned")
        .filter(|a| a.dlog2_beta.is_nan() || a.dlog2_beta.abs() >= MIN_BETA_MOVE_LOG2)
    {
        if let Some(b) = race(s, "fixed").find(|b| (b.p, b.l) == (a.p, a.l)) {
            seeds = seeds.min(a.seeds).min(b.seeds);
            terms.push((a.accuracy - b.accuracy, a.se.hypot(b.se)));
            parts.push(format!(
                "({},{}): {:.3} vs {:.3} (Δlog2 β {:+.2})",
                a.p, a.l, a.accuracy, b.accuracy, a.dlog2_beta
            ));
        }
    }
    if terms.is_empty() {
        return (
            Measure::NotTestable("no (P, L) trained with both fixed and learned β".into()),
            "no pair".into(),
        );
    }
    mean_difference(&terms, seeds, "learned vs fixed ", &parts)
}

/// `log2(learned β / the β the fixed-input trade-off study validated)` per (P, L) learned
/// from the authors' start `1/√d_head` (`learned-authors`, far from every validated β, so
/// landing near it is something training did); `tradeoff` maps (P, L) to that β
/// (`beta_chosen` of `tradeoff.csv`).
pub fn learned_beta_measure(
    s: &[Summary],
    tradeoff: &BTreeMap<(usize, usize), f64>,
) -> (Measure, String) {
    let mut logs = Vec::new();
    let mut parts = Vec::new();
    let mut missing = Vec::new();
    if let Some(why) = beta_not_learned(s, AUTHORS) {
        return (Measure::NotTestable(why.clone()), why);
    }
    for a in race(s, AUTHORS)
        .filter(|a| a.dlog2_beta.is_nan() || a.dlog2_beta.abs() >= MIN_BETA_MOVE_LOG2)
    {
        match tradeoff.get(&(a.p, a.l)) {
            // A non-finite learned β is kept: the verdict says it is not finite.
            Some(&t) => {
                logs.push((a.beta_final / t).log2());
                parts.push(format!(
                    "({},{}): learned {:.3} (Δlog2 β {:+.2}) vs validated {}",
                    a.p, a.l, a.beta_final, a.dlog2_beta, t
                ));
            }
            None => missing.push(format!("({},{})", a.p, a.l)),
        }
    }
    if logs.is_empty() {
        return (
            Measure::NotTestable(format!(
                "the trade-off study has no validated β for the learned (P, L) {}",
                missing.join(" ")
            )),
            "no validated β to compare".into(),
        );
    }
    let mut text = parts.join(", ");
    if !missing.is_empty() {
        text += &format!("; not in the trade-off grid: {}", missing.join(" "));
    }
    (Measure::Values(logs), text)
}

/// `beta_chosen` per (P, L) from the trade-off study's CSV in the report folder (empty when
/// that study has not run there).
fn tradeoff_betas(ctx: &Ctx) -> BTreeMap<(usize, usize), f64> {
    let Ok((h, r)) = read_csv(ctx, "tradeoff") else {
        return BTreeMap::new();
    };
    let (p, l, b) = (
        col(&h, &r, "p"),
        col(&h, &r, "l"),
        col(&h, &r, "beta_chosen"),
    );
    (0..r.len())
        .filter(|&i| p[i].is_finite() && l[i].is_finite() && b[i].is_finite())
        .map(|i| ((p[i] as usize, l[i] as usize), b[i]))
        .collect()
}

const SUMMARY: &str = "mqar/mqar_summary";

/// The training run's `mqar.meta.json` beside `source` (null where there is none); a file
/// that cannot be read is an I/O error and one that is not JSON a config error, each with
/// its path, never a silently empty provenance.
fn training_meta(source: &Path) -> Result<serde_json::Value> {
    let path = source.with_file_name("mqar.meta.json");
    match std::fs::read_to_string(&path) {
        Ok(t) => serde_json::from_str(&t).map_err(|e| RaceError::Config {
            path: path.display().to_string(),
            msg: format!("not JSON ({e}); rerun `python experiments/mqar/mqar.py`"),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(serde_json::Value::Null),
        Err(e) => Err(RaceError::io(&path, e)),
    }
}

/// Summary CSV from the trained rows.
fn summary_csv(ctx: &Ctx, s: &[Summary], source: &Path) -> Result<String> {
    let rows: Vec<Vec<String>> = s
        .iter()
        .map(|x| {
            vec![
                x.model.clone(),
                x.p.to_string(),
                x.l.to_string(),
                x.m.to_string(),
                x.beta_mode.clone(),
                x.setting.clone(),
                f(x.state),
                x.seeds.to_string(),
                f(x.accuracy),
                f(x.se),
                f(x.beta_final),
                f(x.dlog2_beta),
            ]
        })
        .collect();
    let meta = training_meta(source)?;
    write_csv(
        ctx,
        SUMMARY,
        &[
            "model",
            "p",
            "l",
            "m_features",
            "beta_mode",
            "setting",
            "state_floats",
            "seeds",
            "accuracy",
            "se",
            "beta_final",
            "dlog2_beta",
        ],
        &rows,
        &serde_json::json!({"source": "mqar/mqar.csv", "trained": meta}),
    )
}

/// Accuracy against recurrent state per family (mean over seeds; soft RACE averaged over
/// the (P, L) with the same state), softmax as a dashed ceiling.
fn figure(ctx: &Ctx) -> Result<Vec<String>> {
    let (h, r) = read_csv(ctx, SUMMARY)?;
    let s = summarise_back(&h, &r);
    let series_of = |keep: &dyn Fn(&Summary) -> bool| -> Vec<(f64, f64)> {
        let mut by: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
        for x in s.iter().filter(|x| keep(x) && x.state > 0.0) {
            by.entry(x.state as u64).or_default().push(x.accuracy);
        }
        by.into_iter()
            .map(|(st, a)| (st as f64, a.iter().sum::<f64>() / a.len() as f64))
            .collect()
    };
    let mut series = vec![
        Series::new(
            "soft RACE, fixed β",
            series_of(&|x| x.model == "race" && x.beta_mode == "fixed"),
        ),
        Series::new(
            "soft RACE, learned β (from validated)",
            series_of(&|x| x.model == "race" && x.beta_mode == "learned"),
        ),
        Series::new(
            "soft RACE, learned β (from 1/√d)",
            series_of(&|x| x.model == "race" && x.beta_mode == AUTHORS),
        ),
        Series::new("Performer", series_of(&|x| x.model == "performer")),
        Series::new("linear", series_of(&|x| x.model == "linear")),
    ];
    let xs: Vec<f64> = s
        .iter()
        .filter(|x| x.state > 0.0)
        .map(|x| x.state)
        .collect();
    if let (Some(sm), false) = (s.iter().find(|x| x.model == "softmax"), xs.is_empty()) {
        let lo = xs
            .iter()
            .cloned()
            .fold(f64::INFINITY, crate::stats::nan_min);
        let hi = xs.iter().cloned().fold(0.0, crate::stats::nan_max);
        series.push(Series::dashed(
            "softmax (every key)",
            vec![(lo, sm.accuracy), (hi, sm.accuracy)],
        ));
    }
    series.retain(|x| !x.points.is_empty());
    let stem = "mqar/accuracy_vs_state";
    line_plot(
        &fig(ctx, stem),
        &LinePlot {
            title: "MQAR: recall of trained two-layer models against recurrent state",
            xlabel: "state per layer (floats)",
            ylabel: "accuracy (mean over seeds)",
            logx: true,
            logy: false,
        },
        &series,
    )?;
    Ok(vec![stem.into()])
}

/// The summary CSV's rows as [`Summary`] (the figure reads them back).
fn summarise_back(h: &[String], r: &[Vec<String>]) -> Vec<Summary> {
    let (model, mode, setting) = (
        col_s(h, r, "model"),
        col_s(h, r, "beta_mode"),
        col_s(h, r, "setting"),
    );
    let num = |n: &str| col(h, r, n);
    let (p, l, m, st, seeds, acc, se, b) = (
        num("p"),
        num("l"),
        num("m_features"),
        num("state_floats"),
        num("seeds"),
        num("accuracy"),
        num("se"),
        num("beta_final"),
    );
    let dl = num("dlog2_beta");
    (0..r.len())
        .map(|i| Summary {
            model: model[i].clone(),
            p: p[i] as usize,
            l: l[i] as usize,
            m: m[i] as usize,
            beta_mode: mode[i].clone(),
            setting: setting[i].clone(),
            state: st[i],
            seeds: seeds[i] as usize,
            accuracy: acc[i],
            se: se[i],
            beta_final: b[i],
            dlog2_beta: dl[i],
        })
        .collect()
}

/// The claims, from the summary CSV (and the trade-off study's validated β).
fn claims(ctx: &Ctx, provenance: &str) -> Result<(Vec<Claim>, serde_json::Value)> {
    let (h, r) = read_csv(ctx, SUMMARY)?;
    let s = summarise_back(&h, &r);
    let note = |extra: &str| format!("{provenance}{extra}");
    let (m1, t1) = softmax_measure(&s);
    let (m2, t2) = more_buckets_measure(&s);
    let (m3, t3) = race_vs_performer_measure(&s);
    let (m4, t4) = learned_vs_fixed_measure(&s);
    let (m5, t5) = learned_beta_measure(&s, &tradeoff_betas(ctx));
    let claims: Vec<Claim> = vec![
        Claim::judged("mqar-softmax-ceiling", t1, m1, note(""))?,
        Claim::judged("mqar-more-buckets", t2, m2, note(""))?,
        Claim::judged("mqar-race-vs-performer", t3, m3, note(""))?,
        Claim::judged("mqar-learned-beta", t4, m4, note(""))?,
        Claim::judged(
            "mqar-learned-beta-picture",
            t5,
            m5,
            note("; validated β from this report's tradeoff.csv (unit Q/K, fixed inputs)"),
        )?,
    ]
    .into_iter()
    .map(|c| c.from_committed(provenance))
    .collect();
    let headline = serde_json::json!({
        "models": s.len(),
        "softmax": s.iter().find(|x| x.model == "softmax").map(|x| x.accuracy),
    });
    Ok((claims, headline))
}

/// Not-testable claims when no trained results exist.
fn absent(reason: &str) -> Result<(Vec<Claim>, serde_json::Value)> {
    let ids = [
        "mqar-softmax-ceiling",
        "mqar-more-buckets",
        "mqar-race-vs-performer",
        "mqar-learned-beta",
        "mqar-learned-beta-picture",
    ];
    let claims = ids
        .iter()
        .map(|id| {
            Claim::judged(
                id,
                "no trained results".into(),
                Measure::NotTestable(reason.into()),
                "",
            )
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((claims, serde_json::json!({"models": 0})))
}

/// Read the trained results, summarise, draw, judge.
pub fn run(ctx: &Ctx) -> Result<ExpResult> {
    let t0 = std::time::Instant::now();
    let Some(source) = locate(ctx)? else {
        return Ok(ExpResult::assemble(
            "mqar",
            ctx,
            t0,
            (vec![], vec![]),
            absent(
                "figures/mqar/mqar.csv is missing: run `python experiments/mqar/mqar.py` (needs `pip install ./python`)",
            )?,
        ));
    };
    let text = std::fs::read_to_string(&source).map_err(|e| RaceError::io(&source, e))?;
    let mut lines = text.lines();
    let header: Vec<String> = lines
        .next()
        .unwrap_or("")
        .split(',')
        .map(String::from)
        .collect();
    let rows: Vec<Vec<String>> = lines
        .map(|l| l.split(',').map(String::from).collect())
        .collect();
    let s = summarise(&header, &rows);
    let meta = training_meta(&source)?;
    let provenance = format!(
        "trained by experiments/mqar/mqar.py ({} grid, seeds {}, revision {}, {}, torch {}; {} s)",
        meta["grid"].as_str().unwrap_or("?"),
        meta["seeds"],
        meta["revision"].as_str().unwrap_or("?"),
        meta["machine"].as_str().unwrap_or("?"),
        meta["torch"].as_str().unwrap_or("?"),
        meta["seconds"]
    );
    let csv = vec![format!("{DIR}/mqar.csv"), summary_csv(ctx, &s, &source)?];
    let figures = figure(ctx)?;
    Ok(ExpResult::assemble(
        "mqar",
        ctx,
        t0,
        (csv, figures),
        claims(ctx, &provenance)?,
    ))
}

#[cfg(test)]
mod tests;
