//! Exact angular attention: `κ(q,k) = 1 − arccos(q̂ᵀk̂)/π ∈ [0,1]`, `S_ij = κ^γ` for any real
//! `γ > 0`, `O = diag(S1)^{-1} S V`. Zero rows have no angle and are rejected upstream.

use super::kernels::kernel_attention;
use super::HeadOutput;
use crate::hashing::dot;
use crate::tensor::{Mat, MatRef};

/// The angular similarity `κ(q,k)`. The cosine is clamped to [−1, 1] against rounding.
#[inline]
pub fn kappa(q: &[f64], k: &[f64]) -> f64 {
    let c = dot(q, k) / (dot(q, q).sqrt() * dot(k, k).sqrt());
    1.0 - c.clamp(-1.0, 1.0).acos() / std::f64::consts::PI
}

/// The N × M matrix `S_ij = κ(q_i, k_j)^γ`.
pub fn angular_matrix(q: MatRef<f64>, k: MatRef<f64>, gamma: f64) -> Mat<f64> {
    let mut s = Mat::zeros(q.rows, k.rows);
    for i in 0..q.rows {
        for j in 0..k.rows {
            s.data[i * k.rows + j] = kappa(q.row(i), k.row(j)).powf(gamma);
        }
    }
    s
}

/// Angular attention of one head. Each row's weights are taken against its largest `κ`
/// (over the keys it sees), `(κ/κ_max)^γ`: the same ratios as `κ^γ`, whose values underflow
/// f64 at large γ (`0.4^1000 = 1e-398`), which had left rows empty.
pub fn angular_attention(
    q: MatRef<f64>,
    k: MatRef<f64>,
    v: MatRef<f64>,
    gamma: f64,
    causal: bool,
) -> HeadOutput {
    let mut s = Mat::zeros(q.rows, k.rows);
    for i in 0..q.rows {
        let seen = if causal { (i + 1).min(k.rows) } else { k.rows };
        let row: Vec<f64> = (0..seen).map(|j| kappa(q.row(i), k.row(j))).collect();
        let top = row.iter().copied().fold(0.0, f64::max);
        for (j, &x) in row.iter().enumerate() {
            // A row whose every κ is 0 has weights 0 (γ > 0), as κ^γ gives.
            s.data[i * k.rows + j] = if top > 0.0 {
                (x / top).powf(gamma)
            } else {
                0.0
            };
        }
    }
    kernel_attention(&s, v, causal)
}
