//! Feature-map baselines (seed `002_145293eaaebdcc23.txt`):
//! `out_i = φ(q_i)ᵀ S / φ(q_i)ᵀ Z`, `S = Σ_j φ(k_j) v_jᵀ`, `Z = Σ_j φ(k_j)` (causal: prefix sums).
//!
//! - linear attention: `φ(x) = elu(x) + 1` (positive, so `Z > 0`);
//! - Performer FAVOR+: `φ(x) = exp(ωx − |x|²/2)/sqrt(m)` with `ω ∈ R^{m×d}` i.i.d. N(0,1), an
//!   unbiased estimator of `exp(xᵀy)`. Inputs are scaled by `s^{1/2}` each so the target is
//!   `exp(s qᵀk)`, the softmax kernel at scale `s` (default `1/sqrt(d)`). A per-query constant
//!   and one constant for all keys are subtracted in the exponent; both cancel in the ratio.

use super::{axpy, ratio_rows, HeadOutput};
use crate::hashing::dot;
use crate::tensor::{Mat, MatRef};

/// Generic feature attention from explicit feature matrices `phi_q` (N × m), `phi_k` (M × m).
pub fn feature_attention(
    phi_q: MatRef<f64>,
    phi_k: MatRef<f64>,
    v: MatRef<f64>,
    causal: bool,
) -> HeadOutput {
    let (m, dv) = (phi_q.cols, v.cols);
    let mut s = vec![0.0; m * dv];
    let mut z = vec![0.0; m];
    let add_key = |s: &mut [f64], z: &mut [f64], j: usize| {
        for (f, &w) in phi_k.row(j).iter().enumerate() {
            z[f] += w;
            axpy(&mut s[f * dv..(f + 1) * dv], w, v.row(j));
        }
    };
    if !causal {
        (0..phi_k.rows).for_each(|j| add_key(&mut s, &mut z, j));
    }
    let mut num = Mat::zeros(phi_q.rows, dv);
    let mut den = vec![0.0; phi_q.rows];
    for i in 0..phi_q.rows {
        if causal {
            add_key(&mut s, &mut z, i);
        }
        for (f, &w) in phi_q.row(i).iter().enumerate() {
            den[i] += w * z[f];
            axpy(num.row_mut(i), w, &s[f * dv..(f + 1) * dv]);
        }
    }
    ratio_rows(num, &den)
}

/// `elu(x) + 1`, elementwise.
pub fn elu_plus_one(x: MatRef<f64>) -> Mat<f64> {
    Mat::from_vec(
        x.rows,
        x.cols,
        x.data
            .iter()
            .map(|&t| if t > 0.0 { t + 1.0 } else { t.exp() })
            .collect(),
    )
}

/// Linear attention with `φ = elu + 1`.
pub fn linear_attention(
    q: MatRef<f64>,
    k: MatRef<f64>,
    v: MatRef<f64>,
    causal: bool,
) -> HeadOutput {
    feature_attention(elu_plus_one(q).view(), elu_plus_one(k).view(), v, causal)
}

pub use crate::method::performer_omega;

/// Log-features `ωx' − |x'|²/2` with `x' = sqrt(scale)·x`, one row per input row.
fn performer_logits(x: MatRef<f64>, omega: &Mat<f64>, scale: f64) -> Mat<f64> {
    let c = scale.sqrt();
    let mut out = Mat::zeros(x.rows, omega.rows);
    for i in 0..x.rows {
        let xs: Vec<f64> = x.row(i).iter().map(|t| t * c).collect();
        let half_sq = 0.5 * dot(&xs, &xs);
        for f in 0..omega.rows {
            out.data[i * omega.rows + f] = dot(omega.row(f), &xs) - half_sq;
        }
    }
    out
}

/// Performer FAVOR+ features for queries (per-row stabilised) and keys (globally stabilised).
pub fn performer_features(
    q: MatRef<f64>,
    k: MatRef<f64>,
    omega: &Mat<f64>,
    scale: f64,
) -> (Mat<f64>, Mat<f64>) {
    let norm = 1.0 / (omega.rows as f64).sqrt();
    let mut fq = performer_logits(q, omega, scale);
    for i in 0..fq.rows {
        let row = fq.row_mut(i);
        let mx = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        row.iter_mut().for_each(|t| *t = (*t - mx).exp() * norm);
    }
    let mut fk = performer_logits(k, omega, scale);
    let mx = fk.data.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    fk.data.iter_mut().for_each(|t| *t = (*t - mx).exp() * norm);
    (fq, fk)
}

/// Performer attention with `m` positive random features.
pub fn performer_attention(
    q: MatRef<f64>,
    k: MatRef<f64>,
    v: MatRef<f64>,
    omega: &Mat<f64>,
    scale: Option<f64>,
    causal: bool,
) -> HeadOutput {
    let s = scale.unwrap_or(1.0 / (q.cols as f64).sqrt());
    let (fq, fk) = performer_features(q, k, omega, s);
    feature_attention(fq.view(), fk.view(), v, causal)
}
