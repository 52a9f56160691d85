//! What a benchmark run reports beyond its rows: fitted scaling exponents, the crossover
//! against exact softmax, the floors with the run's final bandwidth probe, and the files
//! (`bench.csv`, `bench.json`, `time_vs_n.png`) under `--out`.

use super::{BenchConfig, BenchReport, BenchRow, Crossover, Fit};
use crate::error::{RaceError, Result};
use crate::plot::{line_plot, LinePlot, Series};
use crate::stats::loglog_slope;

/// The series a row belongs to in the fits, the crossovers and the plot: `race (P,L)` (with
/// ` causal` for the causal rows of a `causal_ratio` run) or the reference's name.
fn series_name(r: &BenchRow, causal_ratio: bool) -> String {
    match (r.p, r.l) {
        (Some(p), Some(l)) if causal_ratio && r.causal => format!("race ({p},{l}) causal"),
        (Some(p), Some(l)) => format!("race ({p},{l})"),
        _ => r.method.clone(),
    }
}

/// Fitted `t ∝ N^e` per series, on the upper half of its sizes (where fixed costs no longer
/// dominate).
pub(super) fn fits(rows: &[BenchRow], cfg: &BenchConfig) -> Vec<Fit> {
    let name = |r: &BenchRow| series_name(r, cfg.causal_ratio);
    series_names(rows, cfg)
        .iter()
        .filter_map(|s| {
            let pts: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| &name(r) == s)
                .map(|r| (r.n as f64, r.seconds))
                .collect();
            let tail: Vec<(f64, f64)> = pts.iter().skip(pts.len() / 2).cloned().collect();
            (tail.len() >= 2).then(|| Fit {
                series: s.clone(),
                exponent: loglog_slope(&tail),
                points: tail.len(),
            })
        })
        .collect()
}

fn series_names(rows: &[BenchRow], cfg: &BenchConfig) -> Vec<String> {
    let mut names: Vec<String> = rows
        .iter()
        .map(|r| series_name(r, cfg.causal_ratio))
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The smallest N at which each RACE series beats exact softmax; only against a timed
/// softmax reference (without one there is nothing to cross).
pub(super) fn crossovers(rows: &[BenchRow], cfg: &BenchConfig) -> Vec<Crossover> {
    let name = |r: &BenchRow| series_name(r, cfg.causal_ratio);
    let softmax_timed = rows.iter().any(|x| x.method == "softmax");
    series_names(rows, cfg)
        .iter()
        .filter(|s| softmax_timed && s.starts_with("race"))
        .map(|s| {
            let hit = rows.iter().filter(|r| &name(r) == s).find(|r| {
                rows.iter()
                    .any(|x| x.method == "softmax" && x.n == r.n && x.seconds > r.seconds)
            });
            let note = if cfg.backward {
                "kernel forward+backward vs exact softmax forward only (conservative)"
            } else {
                "forward vs forward"
            };
            Crossover {
                series: s.clone(),
                n: hit.map(|r| r.n),
                note: note.to_string(),
            }
        })
        .collect()
}

pub(super) fn write_outputs(
    dir: &std::path::Path,
    rep: &BenchReport,
    cfg: &BenchConfig,
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| RaceError::io(dir, e))?;
    let mut csv = String::from("method,device,n,p,l,heads,d,causal,backward,seconds,tokens_per_s,peak_rss_bytes,bytes_moved,floor_seconds,ratio_to_floor,flop_floor_seconds,ratio_to_run_floor\n");
    for r in &rep.rows {
        csv += &format!(
            "{},{:?},{},{},{},{},{},{},{},{:.6e},{:.6e},{},{:.6e},{:.6e},{:.4},{},{:.4}\n",
            r.method,
            r.device,
            r.n,
            r.p.map(|x| x.to_string()).unwrap_or_default(),
            r.l.map(|x| x.to_string()).unwrap_or_default(),
            r.heads,
            r.d,
            r.causal,
            r.backward,
            r.seconds,
            r.tokens_per_s,
            r.peak_rss_bytes,
            r.bytes_moved,
            r.floor_seconds,
            r.ratio_to_floor,
            r.flop_floor_seconds
                .map(|x| format!("{x:.6e}"))
                .unwrap_or_default(),
            r.ratio_to_run_floor
        );
    }
    let p = dir.join("bench.csv");
    crate::io::write_atomic(&p, csv.as_bytes())?;
    let p = dir.join("bench.json");
    crate::io::write_atomic(
        &p,
        serde_json::to_string_pretty(rep)
            .unwrap_or_default()
            .as_bytes(),
    )?;
    let cmd: Vec<String> = std::env::args().collect();
    let p = dir.join("COMMAND.txt");
    crate::io::write_atomic(
        &p,
        format!("{}\n{}\n", cmd.join(" "), rep.provenance.line()).as_bytes(),
    )?;
    let name = |r: &BenchRow| series_name(r, cfg.causal_ratio);
    let mut names: Vec<String> = rep.rows.iter().map(name).collect();
    names.sort();
    names.dedup();
    let mut series: Vec<Series> = names
        .iter()
        .map(|s| {
            let pts = rep
                .rows
                .iter()
                .filter(|r| &name(r) == s)
                .map(|r| (r.n as f64, r.seconds))
                .collect();
            Series::new(s.clone(), pts)
        })
        .collect();
    if let Some(first) = rep
        .rows
        .iter()
        .find(|r| r.method == "race" && r.p == Some(cfg.pl[0].0))
    {
        let pts = rep
            .rows
            .iter()
            .filter(|r| r.method == "race" && name(r) == name(first))
            .map(|r| (r.n as f64, r.floor_seconds))
            .collect();
        series.push(Series::dashed("bandwidth floor (race, first (P,L))", pts));
    }
    let title = format!(
        "time vs N ({}{}, {} heads, d={}, {})",
        match (cfg.causal_ratio, cfg.causal) {
            (true, _) => "causal and non-causal ",
            (false, true) => "causal ",
            (false, false) => "",
        },
        if cfg.backward { "fwd+bwd" } else { "fwd" },
        cfg.heads,
        cfg.d,
        rep.provenance.cpu
    );
    line_plot(
        &dir.join("time_vs_n"),
        &LinePlot {
            title: &title,
            xlabel: "N (tokens)",
            ylabel: "seconds",
            logx: true,
            logy: true,
        },
        &series,
    )
}
