//! The output-level bound at L = ∞, row by row, beside the measured bias (unit rows).
//!
//! With `u_ij = κ_ij^P`, `w_ij = g(θ_ij)^P`, `U_i = Σ_j u_ij`, `W_i = Σ_j w_ij`,
//! `O_i = Σ_j u_ij v_j/U_i` (angular attention, γ = P) and `O_∞,i = Σ_j w_ij v_j/W_i` (soft RACE
//! at L = ∞), exactly `O_∞,i − O_i = Σ_j (w_ij − u_ij)(v_j − O_i)/W_i`. With
//! `δ̄_ij ≥ |w_ij − u_ij|` from the proved pair bound ([`super::pair`]) and
//! `W_i ≥ U_i − Σ_j δ̄_ij`:
//!
//! `‖O_∞,i − O_i‖ ≤ Σ_j δ̄_ij ‖v_j − O_i‖ / (U_i − Σ_j δ̄_ij)`,
//!
//! vacuous (reported as such, never as a number) where `U_i ≤ Σ_j δ̄_ij`. Causal rows sum over
//! `j ≤ i`. The measured side takes `g` from [`GInterp`] (quadrature, error estimate `η`);
//! each row carries the tolerance that error and the f64 sums allow,
//! `2Pη·Σ_j‖v_j − O_∞,i‖/W_i + 8(M + 2)·u·max_j‖v_j‖`.

use super::pair::PairBound;
use crate::error::{RaceError, Result};
use crate::reference::expected::GInterp;
use crate::tensor::MatRef;
use rayon::prelude::*;

/// Rows whose norm is further than this from 1 are not unit rows.
pub const UNIT_TOL: f64 = 1e-6;

/// One row: the measured bias `‖O_∞,i − O_i‖`, its bound (`None`: vacuous,
/// `U_i ≤ Σ_j δ̄_ij`), and the measured value's tolerance.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowBound {
    /// The measured bias `‖O_∞,i − O_i‖`.
    pub measured: f64,
    /// The proved bound on it (`None`: vacuous).
    pub bound: Option<f64>,
    /// The measured value's own error (quadrature, rounding).
    pub tolerance: f64,
}

impl RowBound {
    /// The ratio the inequality is judged by, `(measured − tolerance)⁺/bound` (≤ 1 holds; 0 when
    /// the measured bias is within its own tolerance, as on a causal first row, where
    /// `O_∞,0 = O_0 = v_0` and both sides are rounding); `None` where the bound is vacuous.
    pub fn ratio(&self) -> Option<f64> {
        self.bound
            .map(|b| super::excess_ratio(self.measured, self.tolerance, b))
    }
    /// The stated inequality, within the measured value's tolerance (vacuous rows hold).
    pub fn holds(&self) -> bool {
        self.ratio().is_none_or(|r| r <= 1.0)
    }
}

/// Check that every row of `x` has norm 1 within [`UNIT_TOL`]; `arg` names the input.
pub fn check_unit_rows(x: MatRef<f64>, arg: &str) -> Result<()> {
    for i in 0..x.rows {
        let n = x.row(i).iter().map(|a| a * a).sum::<f64>().sqrt();
        if (n - 1.0).abs() > UNIT_TOL {
            return Err(RaceError::param(
                arg,
                format!("row {i} has norm {n:.9}: the bound is proved for unit rows (proofs-notes/soft-bias.md), and the soft hash does not normalise; normalise the rows (racelab bound --normalize) to bound the unit-row problem"),
            ));
        }
    }
    Ok(())
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn dist(a: &[f64], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y) * (x - y))
        .sum::<f64>()
        .sqrt()
}

/// The measured bias and the proved bound of every row of one head. `q`, `k` unit rows
/// (checked by the caller with [`check_unit_rows`]), `v` as many rows as `k`, `causal` needs
/// as many queries as keys; `g` and `pair` at the same β.
pub fn row_bounds(
    qkv: (MatRef<f64>, MatRef<f64>, MatRef<f64>),
    p: usize,
    causal: bool,
    g: &GInterp,
    pair: &PairBound,
) -> Result<Vec<RowBound>> {
    if g.beta != pair.beta {
        return Err(RaceError::param(
            "beta",
            "the g table and the pair bound disagree on beta",
        ));
    }
    row_bounds_with(qkv, p, causal, g, &|c| pair.power_cos(c, p))
}

/// [`row_bounds`] with any per-pair `δ̄(cos θ)` in place of the proved one (a test puts the
/// leading-order expansion there to show it is exceeded).
pub fn row_bounds_with(
    (q, k, v): (MatRef<f64>, MatRef<f64>, MatRef<f64>),
    p: usize,
    causal: bool,
    g: &GInterp,
    delta_of: &(dyn Fn(f64) -> f64 + Sync),
) -> Result<Vec<RowBound>> {
    if q.cols != k.cols {
        return Err(RaceError::shape(
            "k",
            format!("keys have d = {}, queries d = {}", k.cols, q.cols),
        ));
    }
    if v.rows != k.rows {
        return Err(RaceError::shape(
            "v",
            format!("{} value rows for {} keys", v.rows, k.rows),
        ));
    }
    if causal && q.rows != k.rows {
        return Err(RaceError::shape(
            "k",
            format!(
                "causal attention needs as many keys as queries ({} vs {})",
                k.rows, q.rows
            ),
        ));
    }
    let dv = v.cols;
    let vmax = (0..v.rows)
        .map(|j| dot(v.row(j), v.row(j)).sqrt())
        .fold(0.0, crate::stats::nan_max);
    let eta = g.error + 1e-15;
    let pi = std::f64::consts::PI;
    (0..q.rows)
        .into_par_iter()
        .map(|i| {
            let m = if causal { i + 1 } else { k.rows };
            let qi = q.row(i);
            let nq = dot(qi, qi).sqrt();
            let (mut uu, mut ww, mut dd) = (0.0, 0.0, 0.0);
            let (mut ou, mut ow) = (vec![0.0; dv], vec![0.0; dv]);
            let mut delta = Vec::with_capacity(m);
            for j in 0..m {
                let kj = k.row(j);
                // As `reference::angular::kappa` computes it.
                let c = (dot(qi, kj) / (nq * dot(kj, kj).sqrt())).clamp(-1.0, 1.0);
                let theta = c.acos();
                let u = (1.0 - theta / pi).powi(p as i32);
                let w = g.g(theta).powi(p as i32);
                let d = delta_of(c);
                uu += u;
                ww += w;
                dd += d;
                delta.push(d);
                for (t, &x) in v.row(j).iter().enumerate() {
                    ou[t] += u * x;
                    ow[t] += w * x;
                }
            }
            if uu <= 0.0 || ww <= 0.0 {
                return Err(RaceError::param(
                    "q",
                    format!("row {i} is antipodal to every key it sees: κ^P attention is 0/0 there; drop that row"),
                ));
            }
            ou.iter_mut().for_each(|x| *x /= uu);
            ow.iter_mut().for_each(|x| *x /= ww);
            let (mut num, mut spread) = (0.0, 0.0);
            for (j, &d) in delta.iter().enumerate() {
                num += d * dist(v.row(j), &ou);
                spread += dist(v.row(j), &ow);
            }
            let u64 = f64::EPSILON / 2.0;
            let sums = 8.0 * (m as f64 + 2.0) * u64;
            let den_err = sums * (uu + dd);
            let den = uu - dd;
            let bound = (den > den_err).then(|| num * (1.0 + sums) / (den - den_err));
            Ok(RowBound {
                measured: dist(&ow, &ou),
                bound,
                tolerance: 2.0 * p as f64 * eta * spread / ww + sums * vmax,
            })
        })
        .collect()
}

/// Pairs (query × key, all heads) past which the row-wise bound is refused: it is quadratic
/// in N (about 10⁷ pairs a second on 2 cores).
pub const MAX_PAIRS: u64 = 10_000_000_000;

/// The row-wise bound on every head of `[N, d]`, `[H, N, d]` or `[B, H, N, d]` inputs.
#[derive(Debug, Clone)]
pub struct BoundReport {
    /// `P`, bits per table.
    pub p: usize,
    /// `β`.
    pub beta: f64,
    /// Whether each query saw only the keys at or before it.
    pub causal: bool,
    /// Heads (batch × heads).
    pub heads: usize,
    /// Queries per head.
    pub n: usize,
    /// Keys per head.
    pub m: usize,
    /// `rows[h][i]`.
    pub rows: Vec<Vec<RowBound>>,
    /// The a-posteriori error estimate of `g` (see [`GInterp`]).
    pub g_error: f64,
}

impl BoundReport {
    /// The largest [`RowBound::ratio`] over the rows that are not vacuous (`None`: all vacuous).
    pub fn max_ratio(&self) -> Option<f64> {
        self.rows
            .iter()
            .flatten()
            .filter_map(|r| r.ratio())
            .fold(None, |m: Option<f64>, r| {
                Some(m.map_or(r, |m| crate::stats::nan_max(m, r)))
            })
    }
    /// Rows where `U_i ≤ Σ_j δ̄_ij`.
    pub fn vacuous(&self) -> usize {
        self.rows
            .iter()
            .flatten()
            .filter(|r| r.bound.is_none())
            .count()
    }
    /// The first row, `(head, row)`, where the measured bias exceeds the bound by more than
    /// its tolerance.
    pub fn violation(&self) -> Option<(usize, usize, RowBound)> {
        self.rows
            .iter()
            .enumerate()
            .find_map(|(h, rs)| rs.iter().position(|r| !r.holds()).map(|i| (h, i, rs[i])))
    }
}

/// Normalise every row of `x` to unit length (`arg` names it in the refusal of a zero row).
pub fn normalize_rows(x: &mut crate::tensor::Tensor<f64>, arg: &str) -> Result<()> {
    let d = *x.shape.last().unwrap_or(&0);
    if d == 0 {
        return Ok(());
    }
    for (i, row) in x.data.chunks_mut(d).enumerate() {
        let n = row.iter().map(|a| a * a).sum::<f64>().sqrt();
        if n == 0.0 || !n.is_finite() {
            return Err(RaceError::ZeroVector {
                arg: arg.into(),
                row: i,
            });
        }
        row.iter_mut().for_each(|a| *a /= n);
    }
    Ok(())
}

/// Validate the inputs and parameters, then bound every head: `p` in 1..=`MAX_P`, `beta` in
/// [`super::BETA_RANGE`], unit rows of `q` and `k` (see [`normalize_rows`]).
pub fn bound_heads(
    (q, k, v): (
        &crate::tensor::Tensor<f64>,
        &crate::tensor::Tensor<f64>,
        &crate::tensor::Tensor<f64>,
    ),
    p: usize,
    beta: f64,
    causal: bool,
) -> Result<BoundReport> {
    crate::params::validate_pl(p, 1)?;
    crate::params::validate_beta(beta)?;
    let (lo, hi) = super::BETA_RANGE;
    if !(lo..=hi).contains(&beta) {
        return Err(RaceError::param(
            "beta",
            format!("{beta} is outside [{lo:e}, {hi:e}], where the quadrature of g is checked (the proof itself covers every beta > 0)"),
        ));
    }
    let shape = crate::tensor::check_qkv(&q.view(), &k.view(), &v.view(), causal)?;
    let heads = shape.batch * shape.heads;
    let pairs = (heads as u64)
        .saturating_mul(shape.n as u64)
        .saturating_mul(shape.m as u64);
    if pairs > MAX_PAIRS {
        return Err(RaceError::TooLarge(format!(
            "{pairs} query-key pairs ({heads} heads × {} × {}): the row-wise bound is quadratic in N and is refused past {MAX_PAIRS}; give fewer rows ({}, {})",
            shape.n,
            shape.m,
            crate::error::arg("q"),
            crate::error::arg("k")
        )));
    }
    let (qh, kh, vh) = (q.heads("q")?, k.heads("k")?, v.heads("v")?);
    for (h, (qm, km)) in qh.iter().zip(&kh).enumerate() {
        check_unit_rows(*qm, "q").map_err(|e| at_head(e, h, heads))?;
        check_unit_rows(*km, "k").map_err(|e| at_head(e, h, heads))?;
    }
    let g = GInterp::new(beta);
    let pair = PairBound::new(beta);
    let rows = (0..heads)
        .map(|h| row_bounds((qh[h], kh[h], vh[h]), p, causal, &g, &pair))
        .collect::<Result<Vec<_>>>()?;
    Ok(BoundReport {
        p,
        beta,
        causal,
        heads,
        n: shape.n,
        m: shape.m,
        rows,
        g_error: g.error,
    })
}

/// Name the head in a refusal when there is more than one.
fn at_head(e: RaceError, h: usize, heads: usize) -> RaceError {
    match e {
        RaceError::Param { arg, msg } if heads > 1 => RaceError::Param {
            arg,
            msg: format!("head {h}: {msg}"),
        },
        e => e,
    }
}
