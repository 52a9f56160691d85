//! RACE estimators through bucket sums, literally as the paper writes them.
//!
//! Soft RACE, Algorithm 1 (non-causal):
//! `A_l = Σ_j φ_l(k_j)`, `B_l = Σ_j φ_l(k_j) v_jᵀ`,
//! `Num_i = (1/L) Σ_l φ_l(q_i)ᵀ B_l`, `Den_i = (1/L) Σ_l φ_l(q_i)ᵀ A_l`, `Ô_i = Num_i / Den_i`.
//!
//! Algorithm 2 (causal): the same with prefix sums over `j ≤ t`, updated before the read.
//!
//! The authors' released code (`Combine::Authors`) instead returns
//! `Ô_i = Σ_l Σ_r φ_l(q_i)_r B_{l,r} / (A_{l,r} + 1e-6)`.
//!
//! Hard LSH: the same with one-hot features `e_{h_l(x)}`: `A_l[r]` counts keys in bucket r,
//! `B_l[r]` sums their values. A query colliding with no key in any table gets a 0 row.

use super::{axpy, ratio_rows, HeadOutput};
use crate::hashing::{hard_code_bank, soft_feature_bank, Planes};
use crate::params::Combine;
use crate::tensor::{Mat, MatRef};

/// The authors' additive guard on per-bucket masses.
pub const AUTHORS_EPS: f64 = 1e-6;

/// Soft RACE (Algorithm 1, or Algorithm 2 when `causal`) with the given combine rule.
pub fn soft_race(
    q: MatRef<f64>,
    k: MatRef<f64>,
    v: MatRef<f64>,
    planes: &Planes,
    beta: f64,
    causal: bool,
    combine: Combine,
) -> HeadOutput {
    let fq = soft_feature_bank(planes, q.data, q.rows, beta);
    let fk = soft_feature_bank(planes, k.data, k.rows, beta);
    bucket_attention(
        &Features::new(planes.l, q.rows, planes.r(), &fq),
        &Features::new(planes.l, k.rows, planes.r(), &fk),
        v,
        causal,
        combine,
    )
}

/// Per-table bucket features `[L, n, R]` (rows are probability vectors for soft RACE).
#[derive(Debug, Clone, Copy)]
pub struct Features<'a> {
    /// `L`, tables.
    pub l: usize,
    /// Rows per table.
    pub n: usize,
    /// `R`, features per row (`2^P` buckets).
    pub r: usize,
    /// The `L·n·R` values, `[L, n, R]` row-major.
    pub data: &'a [f64],
}

impl<'a> Features<'a> {
    /// `data` as `[L, n, R]` (its length must be `L·n·R`).
    pub fn new(l: usize, n: usize, r: usize, data: &'a [f64]) -> Self {
        assert_eq!(data.len(), l * n * r, "Features: len != L*n*R");
        Features { l, n, r, data }
    }
    /// Row `i` of table `l` (`R` values).
    #[inline]
    pub fn get(&self, l: usize, i: usize) -> &'a [f64] {
        &self.data[(l * self.n + i) * self.r..(l * self.n + i + 1) * self.r]
    }
}

/// Bucket-sum attention from explicit features: the body of Algorithms 1 and 2.
pub fn bucket_attention(
    fq: &Features,
    fk: &Features,
    v: MatRef<f64>,
    causal: bool,
    combine: Combine,
) -> HeadOutput {
    let (l_n, r, dv) = (fq.l, fq.r, v.cols);
    let mut a = vec![0.0; l_n * r];
    let mut b = vec![0.0; l_n * r * dv];
    let add_key = |a: &mut [f64], b: &mut [f64], j: usize| {
        for l in 0..l_n {
            for (rr, &w) in fk.get(l, j).iter().enumerate() {
                a[l * r + rr] += w;
                axpy(
                    &mut b[(l * r + rr) * dv..(l * r + rr + 1) * dv],
                    w,
                    v.row(j),
                );
            }
        }
    };
    if !causal {
        for j in 0..fk.n {
            add_key(&mut a, &mut b, j);
        }
    }
    let mut num = Mat::zeros(fq.n, dv);
    let mut den = vec![0.0; fq.n];
    for i in 0..fq.n {
        if causal {
            add_key(&mut a, &mut b, i);
        }
        let row = num.row_mut(i);
        for l in 0..l_n {
            for (rr, &w) in fq.get(l, i).iter().enumerate() {
                let brow = &b[(l * r + rr) * dv..(l * r + rr + 1) * dv];
                match combine {
                    Combine::Paper => {
                        den[i] += w * a[l * r + rr] / l_n as f64;
                        axpy(row, w / l_n as f64, brow);
                    }
                    Combine::Authors => axpy(row, w / (a[l * r + rr] + AUTHORS_EPS), brow),
                }
            }
        }
        if combine == Combine::Authors {
            den[i] = 1.0;
        }
    }
    ratio_rows(num, &den)
}

/// Hard-LSH RACE estimator (bucket counts and value sums), non-causal or causal.
pub fn hard_lsh(
    q: MatRef<f64>,
    k: MatRef<f64>,
    v: MatRef<f64>,
    planes: &Planes,
    causal: bool,
) -> HeadOutput {
    let r = planes.r();
    let (l_n, dv) = (planes.l, v.cols);
    let hq = hard_code_bank(planes, q.data, q.rows);
    let hk = hard_code_bank(planes, k.data, k.rows);
    let mut a = vec![0.0; l_n * r];
    let mut b = vec![0.0; l_n * r * dv];
    let add_key = |a: &mut [f64], b: &mut [f64], j: usize| {
        for l in 0..l_n {
            let rr = hk[l * k.rows + j];
            a[l * r + rr] += 1.0;
            axpy(
                &mut b[(l * r + rr) * dv..(l * r + rr + 1) * dv],
                1.0,
                v.row(j),
            );
        }
    };
    if !causal {
        for j in 0..k.rows {
            add_key(&mut a, &mut b, j);
        }
    }
    let mut num = Mat::zeros(q.rows, dv);
    let mut den = vec![0.0; q.rows];
    for i in 0..q.rows {
        if causal {
            add_key(&mut a, &mut b, i);
        }
        for l in 0..l_n {
            let rr = hq[l * q.rows + i];
            den[i] += a[l * r + rr] / l_n as f64;
            axpy(
                num.row_mut(i),
                1.0 / l_n as f64,
                &b[(l * r + rr) * dv..(l * r + rr + 1) * dv],
            );
        }
    }
    ratio_rows(num, &den)
}
