//! One trained model summarised over its training seeds ([`Summary`]): accuracy `mean ± se`
//! (`se = s/√seeds`), the final β per layer as a geometric mean over seeds
//! `β_j = 2^{mean log2 β_j}` and its move `mean log2(β_j,final/β_start)`, and which tuned
//! values sit on an edge of their grid. Read from `mqar.csv` ([`summarise`]) and back from the
//! summary CSV ([`summarise_back`]).

use crate::experiments::{col, col_s, f};
use crate::stats::mean_se;
use std::collections::BTreeMap;

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
    /// Which tuned values of that setting sit on an edge of their final grid (`lr high`,
    /// `scale low`, `;`-separated), empty when every one is interior or the CSV does not say.
    pub edge: String,
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
    /// Per layer j: the β it ended with, geometric mean over seeds `2^{mean log2 β_j}` (the
    /// layers of one model may end octaves apart; empty when not soft RACE).
    pub beta_layers: Vec<f64>,
    /// Per layer j: the mean over seeds of `log2(β_j,final/β_start)` (NaN without a start).
    pub dlog2_layers: Vec<f64>,
}

impl Summary {
    /// The largest move of β in any layer, `max_j |dlog2_layers[j]|` (NaN when a layer's
    /// move is not finite or there is none).
    pub fn most_moved(&self) -> f64 {
        if self.dlog2_layers.is_empty() || self.dlog2_layers.iter().any(|x| !x.is_finite()) {
            return f64::NAN;
        }
        self.dlog2_layers
            .iter()
            .fold(0.0, |m, x| crate::stats::nan_max(m, x.abs()))
    }
}

/// Per layer j, the mean over `rows` (one per seed, a value per layer) of `row[j]` (NaN for
/// a layer a row lacks, so a short row never passes unseen).
pub(super) fn layer_means(rows: &[Vec<f64>]) -> Vec<f64> {
    let layers = rows.iter().map(Vec::len).max().unwrap_or(0);
    (0..layers)
        .map(|j| {
            let xs: Vec<f64> = rows
                .iter()
                .map(|r| r.get(j).copied().unwrap_or(f64::NAN))
                .collect();
            xs.iter().sum::<f64>() / xs.len() as f64
        })
        .collect()
}

/// `a;b;…` as numbers (a field that does not parse is NaN, never dropped).
pub(super) fn split_f64(field: &str) -> Vec<f64> {
    field
        .split(';')
        .filter(|b| !b.is_empty())
        .map(|b| b.parse::<f64>().unwrap_or(f64::NAN))
        .collect()
}

/// Per-layer values as `a;b;…` (the inverse of [`split_f64`]).
pub(super) fn join_f64(xs: &[f64]) -> String {
    xs.iter().map(|&x| f(x)).collect::<Vec<_>>().join(";")
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
    let (lr, scale, edge) = (
        optional("lr"),
        optional("performer_scale"),
        optional("edge"),
    );
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
            let per_row: Vec<Vec<f64>> = idx.iter().map(|&i| split_f64(&beta[i])).collect();
            let log2s: Vec<Vec<f64>> = per_row
                .iter()
                .map(|r| r.iter().map(|b| b.log2()).collect())
                .collect();
            let moved: Vec<Vec<f64>> = idx
                .iter()
                .zip(&per_row)
                .map(|(&i, r)| r.iter().map(|b| (b / start[i]).log2()).collect())
                .collect();
            let betas: Vec<f64> = per_row.concat();
            let moves: Vec<f64> = moved.concat();
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
                edge: edge[i0].clone(),
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
                beta_layers: layer_means(&log2s).iter().map(|x| x.exp2()).collect(),
                dlog2_layers: layer_means(&moved),
            }
        })
        .collect()
}

/// The models tuned at an edge of their grid (the tuning ran out of ladder there), as
/// `performer m=8 (scale low)`; empty when every chosen setting is interior.
pub fn tuning_edges(s: &[Summary]) -> Vec<String> {
    s.iter()
        .filter(|x| !x.edge.is_empty())
        .map(|x| {
            let name = match x.model.as_str() {
                "race" => format!("race ({},{}) {}", x.p, x.l, x.beta_mode),
                "performer" => format!("performer m={}", x.m),
                other => other.to_string(),
            };
            format!("{name} ({})", x.edge.replace(';', ", "))
        })
        .collect()
}

/// The summary CSV's rows as [`Summary`] (the figure reads them back).
pub(super) fn summarise_back(h: &[String], r: &[Vec<String>]) -> Vec<Summary> {
    let (model, mode, setting, edge, bl, dl_layers) = (
        col_s(h, r, "model"),
        col_s(h, r, "beta_mode"),
        col_s(h, r, "setting"),
        col_s(h, r, "edge"),
        col_s(h, r, "beta_layers"),
        col_s(h, r, "dlog2_layers"),
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
            edge: edge[i].clone(),
            state: st[i],
            seeds: seeds[i] as usize,
            accuracy: acc[i],
            se: se[i],
            beta_final: b[i],
            dlog2_beta: dl[i],
            beta_layers: split_f64(&bl[i]),
            dlog2_layers: split_f64(&dl_layers[i]),
        })
        .collect()
}
