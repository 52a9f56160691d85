//! `racelab distributed-model`: the measured scaling runs (JSON rows of `bench --distributed`,
//! written by `experiments/distributed/scaling.sh`) against the time model ([`super::model`]):
//! a CSV of measured and modelled seconds, a figure, and the model's projection to a cluster.

use super::model::{Interconnect, Model};
use crate::error::{RaceError, Result};
use crate::plot::{line_plot, LinePlot, Series};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The fields of a `bench --distributed` row the model reads.
#[derive(Debug, Clone, Deserialize)]
pub struct Measured {
    pub ranks: usize,
    pub threads_per_rank: usize,
    pub n: usize,
    pub weak: bool,
    pub causal: bool,
    pub heads: usize,
    pub d: usize,
    pub p: usize,
    pub l: usize,
    pub seconds: f64,
    pub collective_seconds: f64,
    pub bytes_per_layer: u64,
    pub collectives_per_layer: u64,
    pub peak_rss_bytes: u64,
    #[serde(default)]
    pub one_process_seconds: Option<f64>,
    #[serde(default)]
    pub one_process_ratio: Option<f64>,
    pub provenance: crate::provenance::Provenance,
}

/// One measured row with the model's seconds.
#[derive(Debug, Clone, Serialize)]
pub struct Compared {
    pub revision: String,
    pub machine: String,
    pub scaling: &'static str,
    pub causal: bool,
    pub ranks: usize,
    pub threads_per_rank: usize,
    pub oversubscribed: bool,
    pub n: usize,
    pub seconds: f64,
    pub model_seconds: f64,
    pub collective_seconds: f64,
    pub collective_share: f64,
    pub bytes_per_layer: u64,
    pub collectives_per_layer: u64,
    pub peak_rss_bytes: u64,
    pub one_process_seconds: Option<f64>,
    pub one_process_ratio: Option<f64>,
}

/// Another kind of node to project for: its measured forward+backward seconds per token.
#[derive(Debug, Clone)]
pub struct Node {
    pub name: String,
    pub causal: bool,
    pub seconds_per_token: f64,
}

/// The model's projection of one layer's forward+backward to a cluster.
#[derive(Debug, Clone, Serialize)]
pub struct Projection {
    /// The node: the measured machine, or one given with its seconds per token.
    pub node: String,
    pub causal: bool,
    pub interconnect: &'static str,
    pub tokens: f64,
    pub nodes: usize,
    pub tokens_per_node: f64,
    pub compute_seconds: f64,
    pub communication_seconds: f64,
    pub seconds: f64,
    pub communication_share: f64,
    pub per_token_core_seconds: f64,
    pub cores_per_node: usize,
    pub state_bytes: u64,
}

/// Everything [`run`] computes.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub rows: Vec<Compared>,
    pub projections: Vec<Projection>,
}

/// Read JSON rows (one per line).
pub fn read_rows(path: &Path) -> Result<Vec<Measured>> {
    let text = std::fs::read_to_string(path).map_err(|e| RaceError::io(path, e))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| RaceError::Config {
                path: path.display().to_string(),
                msg: format!(
                    "line {}: {e}; expected a `racelab bench --distributed --json` row",
                    i + 1
                ),
            })
        })
        .collect()
}

/// The model of each (scaling, causal) group, fitted to its one-rank row.
fn fitted(rows: &[Measured], weak: bool, causal: bool) -> Option<(Model, &Measured)> {
    let one = rows
        .iter()
        .find(|r| r.weak == weak && r.causal == causal && r.ranks == 1)?;
    let cores = one.provenance.cores.max(1);
    Some((
        Model::fit(
            one.seconds,
            one.n,
            one.threads_per_rank,
            cores,
            state_bytes(one),
        ),
        one,
    ))
}

/// Bytes per rank of one state collective of `r`'s shape.
fn state_bytes(r: &Measured) -> u64 {
    super::state_bytes(r.heads, r.p, r.l, r.d)
}

/// Compare the rows with the model, draw the figure to `fig` (`.png`, `.svg`), and project
/// to `nodes` nodes and `tokens` tokens over `net`.
pub fn run(
    rows: &[Measured],
    fig: &Path,
    tokens: f64,
    nodes: &[usize],
    net: &Interconnect,
    other: &[Node],
) -> Result<Report> {
    let mut compared = Vec::new();
    let mut series = Vec::new();
    for weak in [false, true] {
        for causal in [false, true] {
            let Some((model, _)) = fitted(rows, weak, causal) else {
                continue;
            };
            let mut group: Vec<&Measured> = rows
                .iter()
                .filter(|r| r.weak == weak && r.causal == causal)
                .collect();
            group.sort_by_key(|r| r.ranks);
            let name = format!(
                "{}{}",
                if weak { "weak" } else { "strong" },
                if causal { ", causal" } else { "" }
            );
            let (mut meas, mut modl) = (Vec::new(), Vec::new());
            for r in group {
                let m = model.compute_one_node(r.n, r.ranks, r.threads_per_rank)
                    + model.communication(r.ranks, net);
                meas.push((r.ranks as f64, r.seconds));
                modl.push((r.ranks as f64, m));
                compared.push(Compared {
                    revision: r.provenance.git_revision.chars().take(12).collect(),
                    machine: format!("{} {} cores", r.provenance.cpu, r.provenance.cores),
                    scaling: if weak { "weak" } else { "strong" },
                    causal,
                    ranks: r.ranks,
                    threads_per_rank: r.threads_per_rank,
                    oversubscribed: r.ranks * r.threads_per_rank > r.provenance.cores,
                    n: r.n,
                    seconds: r.seconds,
                    model_seconds: m,
                    collective_seconds: r.collective_seconds,
                    collective_share: r.collective_seconds / r.seconds,
                    bytes_per_layer: r.bytes_per_layer,
                    collectives_per_layer: r.collectives_per_layer,
                    peak_rss_bytes: r.peak_rss_bytes,
                    one_process_seconds: r.one_process_seconds,
                    one_process_ratio: r.one_process_ratio,
                });
            }
            series.push(Series::new(format!("{name}: measured"), meas));
            series.push(Series::dashed(format!("{name}: model"), modl));
        }
    }
    if compared.is_empty() {
        return Err(RaceError::param(
            "runs",
            "no one-rank row to fit the model to; run experiments/distributed/scaling.sh",
        ));
    }
    line_plot(
        fig,
        &LinePlot {
            title: "Sequence-parallel RACE on one machine: measured vs modelled (fwd+bwd)",
            xlabel: "ranks",
            ylabel: "seconds",
            logx: false,
            logy: false,
        },
        &series,
    )?;
    let mut projections = Vec::new();
    for causal in [false, true] {
        let Some((model, one)) = fitted(rows, false, causal) else {
            continue;
        };
        let here = format!("{} ({} cores)", one.provenance.cpu, model.cores);
        let mut kinds = vec![(here, model)];
        for o in other.iter().filter(|o| o.causal == causal) {
            // One "core" running the whole node's rate.
            let m = Model {
                per_token_core: o.seconds_per_token,
                cores: 1,
                ..model
            };
            kinds.push((o.name.clone(), m));
        }
        for (name, m) in kinds {
            for &nodes in nodes {
                let compute = tokens / nodes as f64 * m.per_token_core / m.cores as f64;
                let comm = m.communication(nodes, net);
                projections.push(Projection {
                    node: name.clone(),
                    causal,
                    interconnect: net.name,
                    tokens,
                    nodes,
                    tokens_per_node: tokens / nodes as f64,
                    compute_seconds: compute,
                    communication_seconds: comm,
                    seconds: compute + comm,
                    communication_share: comm / (compute + comm),
                    per_token_core_seconds: m.per_token_core,
                    cores_per_node: m.cores,
                    state_bytes: m.state_bytes,
                });
            }
        }
    }
    Ok(Report {
        rows: compared,
        projections,
    })
}

/// Write `rows` as CSV to `path`.
pub fn write_csv<T: Serialize>(path: &Path, rows: &[T]) -> Result<()> {
    let mut out = String::new();
    for (i, r) in rows.iter().enumerate() {
        let v = serde_json::to_value(r).map_err(|e| RaceError::param("csv", e.to_string()))?;
        let obj = v.as_object().cloned().unwrap_or_default();
        if i == 0 {
            out += &obj.keys().cloned().collect::<Vec<_>>().join(",");
            out.push('\n');
        }
        let cells: Vec<String> = obj
            .values()
            .map(|x| match x {
                serde_json::Value::String(s) => s.replace(',', ";"),
                serde_json::Value::Null => String::new(),
                other => other.to_string(),
            })
            .collect();
        out += &cells.join(",");
        out.push('\n');
    }
    crate::io::write_atomic(path, out.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(ranks: usize, threads: usize, weak: bool, n: usize, seconds: f64) -> Measured {
        Measured {
            ranks,
            threads_per_rank: threads,
            n,
            weak,
            causal: false,
            heads: 4,
            d: 128,
            p: 2,
            l: 2,
            seconds,
            collective_seconds: 0.0,
            bytes_per_layer: 0,
            collectives_per_layer: 3,
            peak_rss_bytes: 0,
            one_process_seconds: None,
            one_process_ratio: None,
            provenance: crate::provenance::Provenance {
                cores: 2,
                ..crate::provenance::Provenance::collect(crate::cpu::detected_isa().name())
            },
        }
    }

    /// The model is fitted to the one-rank row (it reproduces it) and predicts no strong
    /// speed-up past the cores; the projection's compute falls as 1/nodes.
    #[test]
    fn the_comparison_fits_the_one_rank_row_and_projects() {
        let rows = vec![
            row(1, 2, false, 1000, 2.0),
            row(2, 1, false, 1000, 2.2),
            row(4, 1, false, 1000, 2.5),
        ];
        let fig = std::env::temp_dir().join(format!("racelab-model-{}", std::process::id()));
        let gpu = Node {
            name: "gpu".into(),
            causal: false,
            seconds_per_token: 1e-8,
        };
        let rep = run(&rows, &fig, 1e12, &[1, 1024], &Interconnect::IB_HDR, &[gpu]).unwrap();
        assert_eq!(rep.projections.len(), 4);
        assert!((rep.projections[3].compute_seconds - 1e12 / 1024.0 * 1e-8).abs() < 1e-9);
        assert_eq!(rep.rows.len(), 3);
        assert!((rep.rows[0].model_seconds - 2.0).abs() < 1e-12);
        assert!(rep.rows[2].oversubscribed && !rep.rows[1].oversubscribed);
        assert!((rep.rows[2].model_seconds - rep.rows[1].model_seconds).abs() < 1e-4);
        let (a, b) = (&rep.projections[0], &rep.projections[1]);
        assert!((a.compute_seconds / b.compute_seconds - 1024.0).abs() < 1e-9);
        assert_eq!(a.communication_seconds, 0.0);
        assert!(b.communication_seconds > 0.0);
        let _ = std::fs::remove_file(fig.with_extension("png"));
        let _ = std::fs::remove_file(fig.with_extension("svg"));
    }
}
