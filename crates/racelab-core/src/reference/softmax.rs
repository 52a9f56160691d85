//! Exact softmax attention: `O = softmax(s · Q Kᵀ) V`, `s = 1/sqrt(d)` by default; causal
//! masks `j > i`. Each row is max-subtracted, so no logit overflows.

use super::{axpy, ratio_rows, HeadOutput};
use crate::hashing::dot;
use crate::tensor::{Mat, MatRef};

/// Softmax attention of one head. `scale = None` means `1/sqrt(d)`.
pub fn softmax_attention(
    q: MatRef<f64>,
    k: MatRef<f64>,
    v: MatRef<f64>,
    scale: Option<f64>,
    causal: bool,
) -> HeadOutput {
    let s = scale.unwrap_or(1.0 / (q.cols as f64).sqrt());
    let mut num = Mat::zeros(q.rows, v.cols);
    let mut den = vec![0.0; q.rows];
    let mut logits = vec![0.0; k.rows];
    for i in 0..q.rows {
        let m = if causal { i + 1 } else { k.rows };
        for j in 0..m {
            logits[j] = s * dot(q.row(i), k.row(j));
        }
        let mx = logits[..m]
            .iter()
            .cloned()
            .fold(f64::NEG_INFINITY, f64::max);
        for j in 0..m {
            let w = (logits[j] - mx).exp();
            den[i] += w;
            axpy(num.row_mut(i), w, v.row(j));
        }
    }
    ratio_rows(num, &den)
}

/// Row-softmax weights `softmax(s·q_iᵀk_j)` as a matrix.
pub fn softmax_matrix(q: &Mat<f64>, k: &Mat<f64>, s: f64) -> Mat<f64> {
    let mut m = Mat::zeros(q.rows, k.rows);
    for i in 0..q.rows {
        let logits: Vec<f64> = (0..k.rows).map(|j| s * dot(q.row(i), k.row(j))).collect();
        let mx = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = logits.iter().map(|l| (l - mx).exp()).sum();
        for (j, l) in logits.iter().enumerate() {
            m.data[i * k.rows + j] = (l - mx).exp() / z;
        }
    }
    m
}
