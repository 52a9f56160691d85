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
//! The rows become one [`Summary`] per model (`summary.rs`: mean and standard error over the
//! training seeds, β per layer, the tuning's edges); the claims' quantities are computed from
//! the summaries (`measures.rs`).

mod measures;
mod summary;

pub use measures::*;
pub use summary::*;

use super::{
    col, f, fig, read_csv, split_csv, verdict::Committed, write_csv, Claim, Ctx, ExpResult, Measure,
};
use crate::error::{RaceError, Result};
use crate::plot::{line_plot, LinePlot, Series};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The folder of the MQAR outputs under the report's folder.
pub const DIR: &str = "mqar";

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
                x.edge.clone(),
                f(x.state),
                x.seeds.to_string(),
                f(x.accuracy),
                f(x.se),
                f(x.beta_final),
                f(x.dlog2_beta),
                join_f64(&x.beta_layers),
                join_f64(&x.dlog2_layers),
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
            "edge",
            "state_floats",
            "seeds",
            "accuracy",
            "se",
            "beta_final",
            "dlog2_beta",
            "beta_layers",
            "dlog2_layers",
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
    let mut stems = beta_figure(ctx, &s)?;
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
    stems.insert(0, stem.into());
    Ok(stems)
}

/// The learned-β picture per layer: `log2(β_j / validated β)` against state for each layer j
/// and each learned mode, with the claim's band ±2 dashed (none drawn when no learned row or
/// no validated β is there).
fn beta_figure(ctx: &Ctx, s: &[Summary]) -> Result<Vec<String>> {
    let tradeoff = tradeoff_betas(ctx);
    let mut series = Vec::new();
    for (mode, from) in [(AUTHORS, "from 1/√d"), ("learned", "from validated")] {
        let layers = race(s, mode)
            .map(|x| x.beta_layers.len())
            .max()
            .unwrap_or(0);
        for j in 0..layers {
            let points: Vec<(f64, f64)> = race(s, mode)
                .filter_map(|x| {
                    let t = tradeoff.get(&(x.p, x.l))?;
                    Some((x.state, (x.beta_layers.get(j)? / t).log2()))
                })
                .filter(|(st, y)| *st > 0.0 && y.is_finite())
                .collect();
            series.push(Series::new(format!("layer {j}, learned {from}"), points));
        }
    }
    series.retain(|x| !x.points.is_empty());
    let xs: Vec<f64> = series
        .iter()
        .flat_map(|x| x.points.iter().map(|p| p.0))
        .collect();
    if xs.is_empty() {
        return Ok(vec![]);
    }
    let lo = xs
        .iter()
        .cloned()
        .fold(f64::INFINITY, crate::stats::nan_min);
    let hi = xs.iter().cloned().fold(0.0, crate::stats::nan_max);
    for y in [2.0, -2.0] {
        series.push(Series::dashed(
            format!("claim's band ({y:+})"),
            vec![(lo, y), (hi, y)],
        ));
    }
    let stem = "mqar/beta_per_layer";
    line_plot(
        &fig(ctx, stem),
        &LinePlot {
            title: "MQAR: learned β per layer against the validated β",
            xlabel: "state per layer (floats)",
            ylabel: "log2(learned β of the layer / validated β)",
            logx: true,
            logy: false,
        },
        &series,
    )?;
    Ok(vec![stem.into()])
}

/// The claims, from the summary CSV (and the trade-off study's validated β).
fn claims(ctx: &Ctx, provenance: &Committed) -> Result<(Vec<Claim>, serde_json::Value)> {
    let (h, r) = read_csv(ctx, SUMMARY)?;
    let s = summarise_back(&h, &r);
    let edges = tuning_edges(&s);
    let tuning = if edges.is_empty() {
        "; every model's chosen setting interior to its tuning grid".to_string()
    } else {
        format!(
            "; tuned on an edge of its grid (the ladder ends there): {}",
            edges.join(", ")
        )
    };
    let note = |extra: &str| format!("{}{tuning}{extra}", provenance.text);
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
    .map(|c| c.from_committed(provenance.clone()))
    .collect();
    let headline = serde_json::json!({
        "models": s.len(),
        "softmax": s.iter().find(|x| x.model == "softmax").map(|x| x.accuracy),
        "tuned_on_an_edge": edges,
    });
    Ok((claims, headline))
}

/// The provenance of the trained rows: the training seeds they hold (the `seed` column), the
/// revision and machine of the run (`mqar.meta.json`).
fn committed(header: &[String], rows: &[Vec<String>], meta: &serde_json::Value) -> Committed {
    let mut seeds: Vec<u64> = col(header, rows, "seed")
        .into_iter()
        .filter(|x| x.is_finite() && *x >= 0.0)
        .map(|x| x as u64)
        .collect();
    seeds.sort_unstable();
    seeds.dedup();
    let revision = meta["revision"].as_str().unwrap_or("?").to_string();
    Committed {
        text: format!(
            "trained by experiments/mqar/mqar.py ({} grid, seeds {}, revision {}, {}, torch {}; {} s)",
            meta["grid"].as_str().unwrap_or("?"),
            meta["seeds"],
            revision,
            meta["machine"].as_str().unwrap_or("?"),
            meta["torch"].as_str().unwrap_or("?"),
            meta["seconds"]
        ),
        seeds,
        revision,
    }
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
    let (header, rows) = split_csv(&text);
    let s = summarise(&header, &rows);
    let meta = training_meta(&source)?;
    let provenance = committed(&header, &rows, &meta);
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
