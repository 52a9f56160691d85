//! Singular values and numerical rank.
//!
//! Rank bound (`proofs-notes/rank-bound.md`): `Ŝ = Φ_Q Φ_Kᵀ / L` with `Φ` the
//! `N × LR` stacked features. Each table's features sum to 1, so the `L` blocks of columns
//! all have the same row sums: `Φ (e_l − e_1) = 0` for the block-indicator vectors, `L − 1`
//! independent relations. Hence `rank(Ŝ) ≤ L(R − 1) + 1 ≤ LR`.
//!
//! Numerical rank counts `σ_i > tol`, `tol = max(n, m) · eps · σ_max` (the LAPACK/NumPy rule).

use crate::tensor::Mat;

/// Singular values of `a` in decreasing order (faer SVD, f64).
pub fn singular_values(a: &Mat<f64>) -> Vec<f64> {
    if a.rows == 0 || a.cols == 0 {
        return Vec::new();
    }
    let m = faer::Mat::<f64>::from_fn(a.rows, a.cols, |i, j| a.at(i, j));
    let mut s = m
        .singular_values()
        .expect("SVD of a finite matrix converges");
    crate::stats::sort_by_float(&mut s, |&x| -x);
    s
}

/// The default rank tolerance `max(n, m) · eps · σ_max`.
pub fn default_tol(a: &Mat<f64>, sv: &[f64]) -> f64 {
    a.rows.max(a.cols) as f64 * f64::EPSILON * sv.first().copied().unwrap_or(0.0)
}

/// Numerical rank with the default tolerance.
pub fn numerical_rank(a: &Mat<f64>) -> usize {
    let sv = singular_values(a);
    let tol = default_tol(a, &sv);
    sv.iter().filter(|&&s| s > tol).count()
}

/// The sharp bound `L(R − 1) + 1` on the rank of a RACE kernel matrix.
pub fn sharp_rank_bound(p: usize, l: usize) -> usize {
    l * ((1 << p) - 1) + 1
}
