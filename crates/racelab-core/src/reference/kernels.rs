//! Explicit N × M kernel matrices (for small N) and attention through them:
//! `O_i = Σ_j S_ij v_j / Σ_j S_ij` (causal: `j ≤ i`).
//!
//! - hard: `Ŝ_ij = (1/L) Σ_l 1[h_l(q_i) = h_l(k_j)]`, with `E[Ŝ_ij] = κ^P` exactly;
//! - soft: `Ŝ_ij = (1/L) Σ_l φ_l(q_i)ᵀ φ_l(k_j)`.
//!
//! These are the pairwise forms of the bucket algorithms in [`super::race`]; tests check that
//! both give the same outputs.

use super::{axpy, ratio_rows, HeadOutput};
use crate::hashing::{hard_code_bank, soft_feature_bank, Planes};
use crate::tensor::{Mat, MatRef};

/// Attention through an explicit kernel matrix `s` (N × M).
pub fn kernel_attention(s: &Mat<f64>, v: MatRef<f64>, causal: bool) -> HeadOutput {
    let mut num = Mat::zeros(s.rows, v.cols);
    let mut den = vec![0.0; s.rows];
    for i in 0..s.rows {
        let m = if causal { i + 1 } else { s.cols };
        for j in 0..m {
            let w = s.at(i, j);
            den[i] += w;
            axpy(num.row_mut(i), w, v.row(j));
        }
    }
    ratio_rows(num, &den)
}

/// Hard-LSH collision-frequency matrix.
pub fn hard_matrix(q: MatRef<f64>, k: MatRef<f64>, planes: &Planes) -> Mat<f64> {
    let hq = hard_code_bank(planes, q.data, q.rows);
    let hk = hard_code_bank(planes, k.data, k.rows);
    let mut s = Mat::zeros(q.rows, k.rows);
    for l in 0..planes.l {
        for i in 0..q.rows {
            for j in 0..k.rows {
                if hq[l * q.rows + i] == hk[l * k.rows + j] {
                    s.data[i * k.rows + j] += 1.0 / planes.l as f64;
                }
            }
        }
    }
    s
}

/// Soft-RACE kernel matrix.
pub fn soft_matrix(q: MatRef<f64>, k: MatRef<f64>, planes: &Planes, beta: f64) -> Mat<f64> {
    let r = planes.r();
    let fq = soft_feature_bank(planes, q.data, q.rows, beta);
    let fk = soft_feature_bank(planes, k.data, k.rows, beta);
    let mut s = Mat::zeros(q.rows, k.rows);
    for l in 0..planes.l {
        for i in 0..q.rows {
            let a = &fq[(l * q.rows + i) * r..(l * q.rows + i + 1) * r];
            for j in 0..k.rows {
                let b = &fk[(l * k.rows + j) * r..(l * k.rows + j + 1) * r];
                s.data[i * k.rows + j] += crate::hashing::dot(a, b) / planes.l as f64;
            }
        }
    }
    s
}
