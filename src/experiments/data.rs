//! Synthetic inputs for the experiments (all seeded).
//!
//! - [`clustered_unit`]: unit rows around `clusters` random centres, ordered by cluster, so
//!   kernel heatmaps show blocks (the structure of the paper's Fig. 3);
//! - [`concentrated_unit`]: unit rows around one shared direction, so every row has kernel
//!   mass `≥ C1·N` for a sizeable `C1` (Theorem 2's row-mass condition);
//! - [`gaussian`]: i.i.d. N(0,1) (values);
//! - [`unit_rows`], [`take_rows`]: the row helpers the experiments share.

use crate::rng::{stream, SeededRng};
use crate::tensor::Mat;

/// Rows scaled to unit norm (zero rows left as they are).
pub fn unit_rows(m: &Mat<f64>) -> Mat<f64> {
    let mut out = m.clone();
    normalise_rows(&mut out);
    out
}

/// The first `n` rows.
pub fn take_rows(m: &Mat<f64>, n: usize) -> Mat<f64> {
    let n = n.min(m.rows);
    Mat::from_vec(n, m.cols, m.data[..n * m.cols].to_vec())
}

fn normalise_rows(m: &mut Mat<f64>) {
    for i in 0..m.rows {
        let row = m.row_mut(i);
        let n = row.iter().map(|x| x * x).sum::<f64>().sqrt();
        if n > 0.0 {
            row.iter_mut().for_each(|x| *x /= n);
        }
    }
}

/// i.i.d. N(0,1) `n × d`.
pub fn gaussian(n: usize, d: usize, seed: u64) -> Mat<f64> {
    let mut rng = SeededRng::new(seed, stream::INPUTS);
    Mat::from_vec(n, d, rng.normals(n * d))
}

/// Unit rows `normalise(c_{⌊i·C/n⌋} + noise · z)` with random unit centres `c`.
pub fn clustered_unit(
    n: usize,
    d: usize,
    clusters: usize,
    noise: f64,
    seed: u64,
    salt: u64,
) -> Mat<f64> {
    let mut centres = gaussian(clusters.max(1), d, seed);
    normalise_rows(&mut centres);
    let mut rng = SeededRng::new(seed ^ salt.wrapping_mul(0x9E37_79B9), stream::INPUTS + 10);
    let mut m = Mat::zeros(n, d);
    for i in 0..n {
        let c = (i * clusters.max(1)) / n.max(1);
        for j in 0..d {
            m.data[i * d + j] = centres.at(c, j) + noise * rng.normal();
        }
    }
    normalise_rows(&mut m);
    m
}

/// Unit rows `normalise(μ + spread · z)` around one random unit direction `μ`.
pub fn concentrated_unit(n: usize, d: usize, spread: f64, seed: u64, salt: u64) -> Mat<f64> {
    clustered_unit(n, d, 1, spread, seed, salt)
}

/// Scale every row to norm `r` (unit rows in, norm-`r` rows out).
pub fn with_norm(m: &Mat<f64>, r: f64) -> Mat<f64> {
    Mat::from_vec(m.rows, m.cols, m.data.iter().map(|x| x * r).collect())
}

/// Values that depend on the keys: `v_j = sqrt(d)·M k_j + 0.1·z_j` with `M ∈ R^{dv×d}` i.i.d.
/// N(0, 1/d). Attention outputs then vary with the query direction (i.i.d. values would
/// The synthetic inputs of the studies on clustered unit Q/K: queries and keys drawn with
/// salts `s` and `s + 1` of `seed`, values from the keys with seed `seed + s + 2`.
pub fn clustered_qkv(
    (n, d, dv): (usize, usize, usize),
    (clusters, noise): (usize, f64),
    seed: u64,
    s: u64,
) -> (Mat<f64>, Mat<f64>, Mat<f64>) {
    let q = clustered_unit(n, d, clusters, noise, seed, s);
    let k = clustered_unit(n, d, clusters, noise, seed, s + 1);
    let v = values_from_keys(&k, dv, seed + s + 2);
    (q, k, v)
}

/// average to ~0 whenever the kernel is spread out, hiding every error).
pub fn values_from_keys(k: &Mat<f64>, dv: usize, seed: u64) -> Mat<f64> {
    let d = k.cols;
    let m = gaussian(dv, d, seed ^ 0xA5A5);
    let noise = gaussian(k.rows, dv, seed ^ 0x5A5A);
    let mut v = Mat::zeros(k.rows, dv);
    for j in 0..k.rows {
        for c in 0..dv {
            let s: f64 = (0..d).map(|t| m.at(c, t) * k.at(j, t)).sum();
            v.data[j * dv + c] = s + 0.1 * noise.at(j, c);
        }
    }
    v
}
