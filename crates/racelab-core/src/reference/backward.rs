//! f64 analytic gradients of soft RACE through the explicit pairwise kernel — a different
//! route from the fast kernels' bucket form, so each checks the other.
//!
//! `Ô_i = Σ_j Ŝ_ij v_j / Den_i`, `Den_i = Σ_j Ŝ_ij` (causal: `j ≤ i`),
//! `Ŝ_ij = (1/L) Σ_l φ_l(q_i)ᵀφ_l(k_j)`. For `ℓ` with `G = ∂ℓ/∂Ô`:
//!
//! - `∂ℓ/∂Ŝ_ij = G_iᵀ(v_j − Ô_i)/Den_i`, `∂ℓ/∂v_j = Σ_i Ŝ_ij G_i/Den_i`;
//! - `∂ℓ/∂φ_l(q_i) = Σ_j ∂ℓ/∂Ŝ_ij φ_l(k_j)/L`, `∂ℓ/∂φ_l(k_j) = Σ_i ∂ℓ/∂Ŝ_ij φ_l(q_i)/L`;
//! - through the literal R-way softmax of logits `beta uᵀv_r`, `u = tanh(W x)`:
//!   `∂ℓ/∂logit_r = φ_r(gφ_r − Σ_s φ_s gφ_s)`, `∂ℓ/∂u_p = beta Σ_r ∂ℓ/∂logit_r v_{r,p}`,
//!   `∂ℓ/∂beta += Σ_r ∂ℓ/∂logit_r uᵀv_r`, `∂ℓ/∂x = Wᵀ(∂ℓ/∂u ⊙ (1 − u²))`.

use super::race::soft_race;
use crate::hashing::{soft_feature_bank, Planes};
use crate::params::Combine;
use crate::tensor::{Mat, MatRef};

/// Gradients of soft RACE (f64).
#[derive(Debug, Clone)]
pub struct SoftGrads64 {
    /// `∂ℓ/∂q`, `N × d`.
    pub dq: Mat<f64>,
    /// `∂ℓ/∂k`, `M × d`.
    pub dk: Mat<f64>,
    /// `∂ℓ/∂v`, `M × dv`.
    pub dv: Mat<f64>,
    /// `∂ℓ/∂β`.
    pub dbeta: f64,
}

/// Back-propagate feature gradients `gphi` (`[L, n, R]`) of the rows of `x` into `dx`.
fn through_features(
    planes: &Planes,
    x: MatRef<f64>,
    phi: &[f64],
    gphi: &[f64],
    beta: f64,
    dx: &mut Mat<f64>,
) -> f64 {
    let (p, r, d) = (planes.p, planes.r(), planes.d);
    let sign = |rr: usize, b: usize| {
        if (rr >> (p - 1 - b)) & 1 == 1 {
            1.0
        } else {
            -1.0
        }
    };
    let mut dbeta = 0.0;
    for l in 0..planes.l {
        for i in 0..x.rows {
            let o = (l * x.rows + i) * r;
            let (ph, gp) = (&phi[o..o + r], &gphi[o..o + r]);
            let mut z = vec![0.0; p];
            planes.project(l, x.row(i), &mut z);
            let u: Vec<f64> = z.iter().map(|t| t.tanh()).collect();
            let gbar: f64 = ph.iter().zip(gp).map(|(a, b)| a * b).sum();
            let dlogit: Vec<f64> = ph.iter().zip(gp).map(|(a, b)| a * (b - gbar)).collect();
            for (rr, &dl) in dlogit.iter().enumerate() {
                dbeta += dl * (0..p).map(|b| u[b] * sign(rr, b)).sum::<f64>();
            }
            for b in 0..p {
                let du = beta
                    * dlogit
                        .iter()
                        .enumerate()
                        .map(|(rr, dl)| dl * sign(rr, b))
                        .sum::<f64>();
                let dz = du * (1.0 - u[b] * u[b]);
                let w = &planes.table(l)[b * d..(b + 1) * d];
                super::axpy(dx.row_mut(i), dz, w);
            }
        }
    }
    dbeta
}

/// Analytic gradients of `ℓ` with `∂ℓ/∂Ô = g` (paper combine rule).
pub fn soft_race_backward(
    q: MatRef<f64>,
    k: MatRef<f64>,
    v: MatRef<f64>,
    g: MatRef<f64>,
    planes: &Planes,
    beta: f64,
    causal: bool,
) -> SoftGrads64 {
    let (n, m, dv, r, lt) = (q.rows, k.rows, v.cols, planes.r(), planes.l);
    let o = soft_race(q, k, v, planes, beta, causal, Combine::Paper).o;
    let fq = soft_feature_bank(planes, q.data, n, beta);
    let fk = soft_feature_bank(planes, k.data, m, beta);
    let s_ij = |i: usize, j: usize| -> f64 {
        (0..lt)
            .map(|l| {
                crate::hashing::dot(
                    &fq[(l * n + i) * r..(l * n + i + 1) * r],
                    &fk[(l * m + j) * r..(l * m + j + 1) * r],
                )
            })
            .sum::<f64>()
            / lt as f64
    };
    let mut gq = vec![0.0; lt * n * r];
    let mut gk = vec![0.0; lt * m * r];
    let mut dvm = Mat::zeros(m, dv);
    for i in 0..n {
        let lim = if causal { i + 1 } else { m };
        let den: f64 = (0..lim).map(|j| s_ij(i, j)).sum();
        if den == 0.0 {
            continue;
        }
        for j in 0..lim {
            let s = s_ij(i, j);
            let ds: f64 = (0..dv)
                .map(|c| g.row(i)[c] * (v.row(j)[c] - o.row(i)[c]))
                .sum::<f64>()
                / den;
            for c in 0..dv {
                dvm.row_mut(j)[c] += s * g.row(i)[c] / den;
            }
            for l in 0..lt {
                for rr in 0..r {
                    gq[(l * n + i) * r + rr] += ds * fk[(l * m + j) * r + rr] / lt as f64;
                    gk[(l * m + j) * r + rr] += ds * fq[(l * n + i) * r + rr] / lt as f64;
                }
            }
        }
    }
    let mut dq = Mat::zeros(n, q.cols);
    let mut dk = Mat::zeros(m, k.cols);
    let dbeta = through_features(planes, q, &fq, &gq, beta, &mut dq)
        + through_features(planes, k, &fk, &gk, beta, &mut dk);
    SoftGrads64 {
        dq,
        dk,
        dv: dvm,
        dbeta,
    }
}
