//! Real Q/K/V: the directory format written by `experiments/extract_qk.py` (`meta.json` plus
//! `q_L.npy`, `k_L.npy`, `v_L.npy`, each `[heads, N, head_dim]`), and the `real` experiment:
//! softmax vs angular vs RACE heatmaps per head, RACE error against angular and softmax
//! attention on real activations (every error divided by the RMS row norm of V, so errors
//! against different targets compare), and the effect of Q/K norms on soft RACE (tanh
//! saturation) with and without normalising.

use super::data::{take_rows, unit_rows};
use super::{f, quantile, read_csv, verdict::mean_se, write_csv, Claim, Ctx, ExpResult, Measure};
use crate::analysis::metrics::{frob, rms_row_err};
use crate::error::{RaceError, Result};
use crate::hashing::Planes;
use crate::io::read_npy;
use crate::params::Combine;
use crate::params::{Bits, Seed, Tables};
use crate::reference::angular::{angular_attention, angular_matrix};
use crate::reference::kernels::soft_matrix;
use crate::reference::softmax::{softmax_attention, softmax_matrix};
use crate::tensor::Mat;
use rayon::prelude::*;
use std::path::{Path, PathBuf};

/// A directory of real activations.
#[derive(Debug, Clone)]
pub struct RealData {
    pub dir: PathBuf,
    pub model: String,
    pub text_source: String,
    pub layers: Vec<usize>,
    pub heads: usize,
    pub head_dim: usize,
    pub tokens: usize,
    pub scale: f64,
}

fn bad(dir: &Path, msg: impl Into<String>) -> RaceError {
    RaceError::Config {
        path: dir.join("meta.json").display().to_string(),
        msg: msg.into(),
    }
}

/// The bundled sample (`experiments/data/minilm`), looked up from the working directory and
/// then from the crate root.
pub fn bundled() -> Option<PathBuf> {
    let rel = PathBuf::from("experiments/data/minilm");
    if rel.join("meta.json").exists() {
        return Some(rel);
    }
    let abs = Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments/data/minilm");
    abs.join("meta.json").exists().then_some(abs)
}

impl RealData {
    /// Read and validate `meta.json`.
    pub fn open(dir: &Path) -> Result<Self> {
        let p = dir.join("meta.json");
        let text = std::fs::read_to_string(&p).map_err(|e| RaceError::io(&p, e))?;
        let m: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| bad(dir, format!("not JSON: {e}")))?;
        let num = |k: &str| {
            m[k].as_u64()
                .map(|x| x as usize)
                .ok_or_else(|| bad(dir, format!("missing integer `{k}`")))
        };
        let layers: Vec<usize> = m["layers"]
            .as_array()
            .ok_or_else(|| bad(dir, "missing `layers`"))?
            .iter()
            .filter_map(|x| x.as_u64().map(|v| v as usize))
            .collect();
        if layers.is_empty() {
            return Err(bad(dir, "`layers` is empty"));
        }
        Ok(RealData {
            dir: dir.to_path_buf(),
            model: m["model"].as_str().unwrap_or("unknown").to_string(),
            text_source: m["text_source"].as_str().unwrap_or("unknown").to_string(),
            layers,
            heads: num("heads")?,
            head_dim: num("head_dim")?,
            tokens: num("tokens")?,
            scale: m["softmax_scale"]
                .as_f64()
                .ok_or_else(|| bad(dir, "missing `softmax_scale`"))?,
        })
    }

    /// `(q, k, v)` of one layer and head, as `N × head_dim` matrices.
    pub fn head(&self, layer: usize, head: usize) -> Result<(Mat<f64>, Mat<f64>, Mat<f64>)> {
        if head >= self.heads {
            return Err(RaceError::param(
                "head",
                format!("head {head} out of range 0..{}", self.heads),
            ));
        }
        let mut out = Vec::new();
        for part in ["q", "k", "v"] {
            let p = self.dir.join(format!("{part}_{layer}.npy"));
            let t = read_npy(&p)?.tensor;
            let [_, h, n, d] = t.bhnd(&p.display().to_string())?;
            if h != self.heads || d != self.head_dim || n != self.tokens {
                return Err(RaceError::Npy {
                    path: p.display().to_string(),
                    msg: format!(
                        "shape {:?} disagrees with meta.json ([{}, {}, {}])",
                        t.shape, self.heads, self.tokens, self.head_dim
                    ),
                });
            }
            crate::tensor::check_finite(part, &t.data)?;
            out.push(Mat::from_vec(
                n,
                d,
                t.data[head * n * d..(head + 1) * n * d].to_vec(),
            ));
        }
        let v = out.pop().unwrap();
        let k = out.pop().unwrap();
        let q = out.pop().unwrap();
        Ok((q, k, v))
    }

    /// The middle stored layer.
    pub fn mid_layer(&self) -> usize {
        self.layers[self.layers.len() / 2]
    }
}

fn mean_norm(m: &Mat<f64>) -> f64 {
    (0..m.rows)
        .map(|i| m.row(i).iter().map(|x| x * x).sum::<f64>().sqrt())
        .sum::<f64>()
        / m.rows as f64
}

/// Share of soft-hash bits with |tanh(wᵀx)| > 0.99 (saturated: the gradient through tanh and
/// the softness are gone).
fn saturation(planes: &Planes, x: &Mat<f64>) -> f64 {
    let mut z = vec![0.0; planes.p()];
    let (mut sat, mut tot) = (0usize, 0usize);
    for l in 0..planes.l() {
        for i in 0..x.rows {
            planes.project(l, x.row(i), &mut z);
            sat += z.iter().filter(|t| t.tanh().abs() > 0.99).count();
            tot += planes.p();
        }
    }
    sat as f64 / tot as f64
}

/// The soft-RACE settings `(P, L, beta)` of the error study.
const CONFIGS: [(usize, usize, f64); 3] = [(2, 4, 8.0), (4, 4, 8.0), (4, 16, 8.0)];

/// The heads of the error study (every third with `--quick`) and its (layer, head) jobs.
fn study_jobs(ctx: &Ctx, rd: &RealData) -> (Vec<usize>, Vec<(usize, usize)>) {
    let heads: Vec<usize> = if ctx.quick {
        (0..rd.heads).step_by(3).collect()
    } else {
        (0..rd.heads).collect()
    };
    let jobs = rd
        .layers
        .iter()
        .flat_map(|&l| heads.iter().map(move |&h| (l, h)))
        .collect();
    (heads, jobs)
}

/// Compute → CSV → figure `real_heatmaps`: softmax, angular and soft RACE (raw and unit Q/K)
/// for 4 heads of the middle layer, first tokens.
fn heatmaps_csv(ctx: &Ctx, rd: &RealData, dir: &Path) -> Result<String> {
    // 1. Heatmaps: 4 heads of the middle layer, first tokens.
    let show = if ctx.quick { 48 } else { 96 };
    let layer = rd.mid_layer();
    let mut panels = Vec::new();
    for h in 0..rd.heads.min(4) {
        let (q, k, _) = rd.head(layer, h)?;
        let (q, k) = (take_rows(&q, show), take_rows(&k, show));
        panels.push((
            format!("L{layer} h{h} softmax"),
            softmax_matrix(&q, &k, rd.scale),
        ));
        panels.push((
            format!("L{layer} h{h} angular g=4"),
            angular_matrix(q.view(), k.view(), 4.0),
        ));
        let planes = Planes::gaussian(Bits(4), Tables(16), rd.head_dim, Seed(ctx.seed + h as u64))?;
        panels.push((
            format!("L{layer} h{h} soft P=4 L=16 raw"),
            soft_matrix(q.view(), k.view(), &planes, 8.0),
        ));
        panels.push((
            format!("L{layer} h{h} soft P=4 L=16 unit"),
            soft_matrix(unit_rows(&q).view(), unit_rows(&k).view(), &planes, 8.0),
        ));
    }
    super::heatmaps_via_csv(
        ctx,
        "real_heatmaps",
        &format!(
            "{} layer {layer}: rows = queries, columns = keys (first {show} tokens of {})",
            rd.model, rd.text_source
        ),
        &panels,
        None,
        4,
        &serde_json::json!({"dir": dir.display().to_string(), "layer": layer, "tokens_shown": show}),
    )
}

/// Compute → CSV `real_errors`: every stored layer and head, each setting, raw and unit Q/K:
/// the errors against angular-P and softmax (over the RMS row norm of V), the tanh saturation
/// and the mean norms.
fn errors_csv(ctx: &Ctx, rd: &RealData, dir: &Path) -> Result<String> {
    let (_, jobs) = study_jobs(ctx, rd);
    let err_rows: Vec<Vec<String>> = jobs
        .par_iter()
        .map(|&(l, h)| -> Result<Vec<Vec<String>>> {
            let (q, k, v) = rd.head(l, h)?;
            let n = q.rows;
            let soft = softmax_attention(q.view(), k.view(), v.view(), Some(rd.scale), false).o;
            // One scale for every error: the RMS row norm of V (outputs are averages of V rows).
            let v_scale = frob(&v.data) / (n as f64).sqrt();
            let (qu, ku) = (unit_rows(&q), unit_rows(&k));
            let (nq, nk) = (mean_norm(&q), mean_norm(&k));
            let rows = CONFIGS
                .iter()
                .flat_map(|&(p, lt, beta)| {
                    let ang = angular_attention(q.view(), k.view(), v.view(), p as f64, false).o;
                    let planes = Planes::gaussian(
                        Bits(p),
                        Tables(lt),
                        q.cols,
                        Seed(ctx.seed * 7 + (l * 100 + h) as u64),
                    )
                    .expect("valid");
                    [("raw", &q, &k), ("unit", &qu, &ku)]
                        .into_iter()
                        .map(|(kind, qq, kk)| {
                            let o =
                                super::soft_out((qq, kk, &v), &planes, beta, false, Combine::Paper);
                            let sat = saturation(&planes, qq);
                            vec![
                                l.to_string(),
                                h.to_string(),
                                p.to_string(),
                                lt.to_string(),
                                f(beta),
                                kind.to_string(),
                                f(rms_row_err(&o.data, &ang.data, n) / v_scale),
                                f(rms_row_err(&o.data, &soft.data, n) / v_scale),
                                f(rms_row_err(&ang.data, &soft.data, n) / v_scale),
                                f(sat),
                                f(nq),
                                f(nk),
                            ]
                        })
                        .collect::<Vec<_>>()
                })
                .collect::<Vec<_>>();
            Ok(rows)
        })
        .collect::<Result<Vec<_>>>()?
        .into_iter()
        .flatten()
        .collect();
    let header = [
        "layer",
        "head",
        "p",
        "l",
        "beta",
        "qk",
        "err_vs_angular_p",
        "err_vs_softmax",
        "angular_vs_softmax",
        "tanh_saturated_share",
        "mean_q_norm",
        "mean_k_norm",
    ];
    write_csv(
        ctx,
        "real_errors",
        &header,
        &err_rows,
        &serde_json::json!({"dir": dir.display().to_string(), "configs": CONFIGS}),
    )
}

/// The claims, from `real_errors.csv` (one paired difference per (layer, head)).
fn claims(ctx: &Ctx, rd: &RealData) -> Result<(Vec<Claim>, serde_json::Value)> {
    let (heads, jobs) = study_jobs(ctx, rd);
    let (h2, r2) = read_csv(ctx, "real_errors")?;
    let kind = super::col_s(&h2, &r2, "qk");
    let (ea, es, asm, sat) = (
        super::col(&h2, &r2, "err_vs_angular_p"),
        super::col(&h2, &r2, "err_vs_softmax"),
        super::col(&h2, &r2, "angular_vs_softmax"),
        super::col(&h2, &r2, "tanh_saturated_share"),
    );
    let (nq, nk) = (
        super::col(&h2, &r2, "mean_q_norm"),
        super::col(&h2, &r2, "mean_k_norm"),
    );
    let med = |v: &[f64], k: &str| {
        quantile(
            &(0..r2.len())
                .filter(|&i| kind[i] == k)
                .map(|i| v[i])
                .collect::<Vec<_>>(),
            0.5,
        )
    };
    // One paired difference per (layer, head), averaged over the configurations (unit Q/K).
    let (lc, hc) = (super::col(&h2, &r2, "layer"), super::col(&h2, &r2, "head"));
    let per_head: Vec<f64> = jobs
        .iter()
        .map(|&(l, h)| {
            let idx: Vec<usize> = (0..r2.len())
                .filter(|&i| kind[i] == "unit" && lc[i] == l as f64 && hc[i] == h as f64)
                .collect();
            idx.iter().map(|&i| es[i] - ea[i]).sum::<f64>() / idx.len().max(1) as f64
        })
        .collect();
    let (diff, se) = mean_se(&per_head);
    let claims = vec![
        Claim::judged(
            "real-race-error",
            format!(
                "{} ({} layers × {} heads, {} tokens), errors / RMS row norm of V: median error vs angular-P {:.3} (raw Q/K) / {:.3} (unit), vs softmax {:.3} / {:.3}; angular-P vs softmax itself {:.3}; mean paired difference (unit) {diff:.4}, se {se:.4}",
                rd.model, rd.layers.len(), heads.len(), rd.tokens, med(&ea, "raw"), med(&ea, "unit"), med(&es, "raw"), med(&es, "unit"), med(&asm, "raw")
            ),
            Measure::Margin(super::verdict::Cmp::of_mean("", diff, se, per_head.len())),
            "softmax depends on norms and the scale 1/sqrt(d); angular attention ignores norms",
        )?,
        Claim::judged(
            "real-tanh-saturation",
            format!(
                "mean |q| = {:.2}, |k| = {:.2}; share of saturated bits |tanh| > 0.99: raw {:.1}% vs unit {:.1}%; median error vs angular-P raw {:.3} vs unit {:.3}",
                quantile(&nq, 0.5), quantile(&nk, 0.5), 100.0 * med(&sat, "raw"), 100.0 * med(&sat, "unit"), med(&ea, "raw"), med(&ea, "unit")
            ),
            Measure::value(med(&sat, "raw")),
            "normalising Q/K restores the softness beta sets",
        )?,
    ];
    let headline = serde_json::json!({"model": rd.model, "tokens": rd.tokens, "median_err_vs_angular_raw": med(&ea, "raw"), "median_err_vs_angular_unit": med(&ea, "unit"), "median_err_vs_softmax_raw": med(&es, "raw"), "saturation_raw": med(&sat, "raw"), "saturation_unit": med(&sat, "unit")});
    Ok((claims, headline))
}

/// The `real` experiment on a directory of activations.
pub fn run(ctx: &Ctx, dir: &Path) -> Result<ExpResult> {
    let t0 = std::time::Instant::now();
    let rd = RealData::open(dir)?;
    let csv = vec![heatmaps_csv(ctx, &rd, dir)?, errors_csv(ctx, &rd, dir)?];
    Ok(ExpResult::assemble(
        "real",
        ctx,
        t0,
        (csv, vec!["real_heatmaps".into()]),
        claims(ctx, &rd)?,
    ))
}

/// `(Q, K, V, description)` from [`unit_inputs`].
pub type UnitInputs = (Mat<f64>, Mat<f64>, Mat<f64>, String);

/// Real inputs for the synthetic-input experiments: the middle stored layer, head 0, Q/K
/// scaled to unit rows (the theory's setting), V as extracted; `None` without `ctx.data`.
pub fn unit_inputs(ctx: &Ctx) -> Result<Option<UnitInputs>> {
    let Some(dir) = &ctx.data else {
        return Ok(None);
    };
    let rd = RealData::open(dir)?;
    let layer = rd.mid_layer();
    let (q, k, v) = rd.head(layer, 0)?;
    Ok(Some((
        unit_rows(&q),
        unit_rows(&k),
        v,
        format!(
            "{} layer {layer} head 0, {} tokens, unit Q/K",
            rd.model, rd.tokens
        ),
    )))
}

/// The inputs of a synthetic-input experiment: real ones (and `<stem>_real` file names) when
/// `ctx.data` is set, else those `synthetic` makes. Returns `(q, k, v, label, stem)`.
#[allow(clippy::type_complexity)]
pub fn inputs_or(
    ctx: &Ctx,
    stem: &str,
    synthetic: impl FnOnce() -> (Mat<f64>, Mat<f64>, Mat<f64>, String),
) -> Result<(Mat<f64>, Mat<f64>, Mat<f64>, String, String)> {
    Ok(match unit_inputs(ctx)? {
        Some((q, k, v, label)) => (q, k, v, label, format!("{stem}_real")),
        None => {
            let (q, k, v, label) = synthetic();
            (q, k, v, label, stem.to_string())
        }
    })
}
