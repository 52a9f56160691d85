//! Exact quadratic attention in f32, blocked, SIMD and parallel: the honest baselines the
//! linear kernels are timed against.
//!
//! - softmax: FlashAttention-style online softmax over key blocks. `S = s·Q_b K_bᵀ` and
//!   `O_b += P V_b` are faer GEMMs (its AVX-512/AVX2 micro-kernels); each row keeps its running
//!   max `m` and sum `ℓ`, rescaling `O_b` by `exp(m_old − m_new)`; exponentials use a
//!   vectorisable Cody–Waite + degree-6 polynomial `exp` (relative error < 2e-7).
//! - angular: `C = Q̂_b K̂_bᵀ` by GEMM, `κ = 1 − acos(C)/π` with the Abramowitz–Stegun
//!   4.4.46 `acos` (error ≤ 2e-8), `S = (κ/κ_max)^γ` against the row's running largest `κ`
//!   (rescaled as softmax's running max is, so no weight underflows at large γ),
//!   `O_b += S V_b`, `den += S 1`.
//!
//! Parallel over (head, query block); causal runs skip key blocks entirely above the diagonal.

use super::simd::{dispatch, exp_f32, Isa, Kernel, Token};
use super::state::split_out;
use crate::backend::Heads;
use faer::linalg::matmul::matmul;
use faer::{Accum, MatMut, MatRef, Par};
use rayon::prelude::*;

const BQ: usize = 256;
const BK: usize = 512;

/// `acos(x)` for `x ∈ [−1, 1]` (Abramowitz–Stegun 4.4.46, |error| ≤ 2e-8 before rounding).
#[inline(always)]
pub fn acos_f32(x: f32) -> f32 {
    let a = x.abs().min(1.0);
    // The leading coefficient is A–S's 1.5707963050, not π/2 (1.5707963268): as f32 it rounds
    // to 1.57079625, one step below `FRAC_PI_2`.
    #[allow(clippy::approx_constant, clippy::excessive_precision)]
    let p = 1.570_796_305_f32
        + a * (-0.214_598_8
            + a * (0.088_978_99
                + a * (-0.050_174_3
                    + a * (0.030_891_88
                        + a * (-0.017_088_126 + a * (0.006_670_09 + a * -0.001_262_491))))));
    let r = (1.0 - a).sqrt() * p;
    if x < 0.0 {
        std::f32::consts::PI - r
    } else {
        r
    }
}

/// `x^γ`, exact repeated squaring for small integer γ.
#[inline(always)]
fn pow_gamma(x: f32, gamma: f32, int_gamma: Option<u32>) -> f32 {
    match int_gamma {
        Some(e) => {
            // A fixed seven-bit loop (γ ≤ 64 < 2^7), so loops over x vectorise.
            let (mut base, mut acc) = (x, 1.0f32);
            for bit in 0..7 {
                acc *= if (e >> bit) & 1 == 1 { base } else { 1.0 };
                base *= base;
            }
            acc
        }
        None => x.powf(gamma),
    }
}

/// Which exact kernel.
#[derive(Debug, Clone, Copy)]
pub enum Exact {
    /// Softmax attention, `softmax_j(scale · q_i·k_j)`.
    Softmax {
        /// The logit scale (usually `1/√d`).
        scale: f32,
    },
    /// Angular attention, weights `κ(q_i, k_j)^γ` normalised over `j`.
    Angular {
        /// The power `γ`.
        gamma: f32,
    },
}

struct RowsTask<'a> {
    kind: Exact,
    s: &'a mut [f32],
    rows: usize,
    cols: usize,
    /// First query index and first key index of the block (for the causal mask).
    i0: usize,
    j0: usize,
    causal: bool,
    m: &'a mut [f32],
    l: &'a mut [f32],
    alpha: &'a mut [f32],
}

impl Kernel for RowsTask<'_> {
    type Output = ();
    #[inline(always)]
    fn run<T: Token>(self, _t: T) {
        let int_gamma = match self.kind {
            Exact::Angular { gamma } if gamma.fract() == 0.0 && gamma <= 64.0 => Some(gamma as u32),
            _ => None,
        };
        for r in 0..self.rows {
            let row = &mut self.s[r * self.cols..(r + 1) * self.cols];
            let lim = if self.causal {
                (self.i0 + r + 1).saturating_sub(self.j0).min(self.cols)
            } else {
                self.cols
            };
            match self.kind {
                Exact::Softmax { scale } => {
                    // Scale and take the row max in fixed 16-lane chunks (whole vectors).
                    let mut lanes = [f32::NEG_INFINITY; 16];
                    let mut chunks = row[..lim].chunks_exact_mut(16);
                    for c in &mut chunks {
                        let c: &mut [f32; 16] = c.try_into().unwrap();
                        for l in 0..16 {
                            c[l] *= scale;
                            lanes[l] = lanes[l].max(c[l]);
                        }
                    }
                    for (l, x) in chunks.into_remainder().iter_mut().enumerate() {
                        *x *= scale;
                        lanes[l] = lanes[l].max(*x);
                    }
                    let mx = lanes.iter().fold(self.m[r], |a, &b| a.max(b));
                    let alpha = if self.m[r] == f32::NEG_INFINITY {
                        0.0
                    } else {
                        exp_f32(self.m[r] - mx)
                    };
                    let mut acc = [0.0f32; 16];
                    let mut chunks = row[..lim].chunks_exact_mut(16);
                    for c in &mut chunks {
                        let c: &mut [f32; 16] = c.try_into().unwrap();
                        for l in 0..16 {
                            c[l] = exp_f32(c[l] - mx);
                            acc[l] += c[l];
                        }
                    }
                    for (l, x) in chunks.into_remainder().iter_mut().enumerate() {
                        *x = exp_f32(*x - mx);
                        acc[l] += *x;
                    }
                    let sum: f32 = acc.iter().sum();
                    row[lim..].iter_mut().for_each(|x| *x = 0.0);
                    self.alpha[r] = alpha;
                    self.l[r] = self.l[r] * alpha + sum;
                    self.m[r] = mx;
                }
                Exact::Angular { gamma } => {
                    // Weights `(κ/κ_max)^γ` with `κ_max` the row's running largest κ, so the
                    // largest weight is 1 and none underflows at large γ (`κ^γ` itself is below
                    // f32's range from γ·ln κ < −87); a larger `κ_max` rescales what is summed
                    // by `α = (κ_old/κ_new)^γ`, as softmax's running max does. κ grows with
                    // the cosine, so the block's largest κ is that of its largest cosine.
                    let kappa =
                        |x: f32| 1.0 - acos_f32(x.clamp(-1.0, 1.0)) * std::f32::consts::FRAC_1_PI;
                    let mut lanes = [f32::NEG_INFINITY; 16];
                    let mut chunks = row[..lim].chunks_exact(16);
                    for c in &mut chunks {
                        for l in 0..16 {
                            lanes[l] = lanes[l].max(c[l]);
                        }
                    }
                    for (l, &x) in chunks.remainder().iter().enumerate() {
                        lanes[l] = lanes[l].max(x);
                    }
                    let cmax = lanes.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                    let old = self.m[r];
                    let kmax = if lim == 0 { old } else { old.max(kappa(cmax)) };
                    let alpha = if old > 0.0 && kmax > old {
                        pow_gamma(old / kmax, gamma, int_gamma)
                    } else {
                        1.0
                    };
                    // Every κ of a row whose largest is 0 is 0: weights 0 (γ > 0).
                    let inv = if kmax > 0.0 { 1.0 / kmax } else { 0.0 };
                    let kernel = |x: f32| pow_gamma((kappa(x) * inv).min(1.0), gamma, int_gamma);
                    let mut acc = [0.0f32; 16];
                    let mut chunks = row[..lim].chunks_exact_mut(16);
                    for c in &mut chunks {
                        let c: &mut [f32; 16] = c.try_into().unwrap();
                        for l in 0..16 {
                            c[l] = kernel(c[l]);
                            acc[l] += c[l];
                        }
                    }
                    for (l, x) in chunks.into_remainder().iter_mut().enumerate() {
                        *x = kernel(*x);
                        acc[l] += *x;
                    }
                    let sum: f32 = acc.iter().sum();
                    row[lim..].iter_mut().for_each(|x| *x = 0.0);
                    self.alpha[r] = alpha;
                    self.l[r] = self.l[r] * alpha + sum;
                    self.m[r] = kmax;
                }
            }
        }
    }
}

/// Rows normalised to unit length (angular needs only directions). Each row is first divided
/// by its largest magnitude, so that the squares neither underflow (a row of f32 subnormals
/// had norm 0 and kept its length) nor overflow.
fn normalised(x: Heads) -> Vec<f32> {
    let mut out = x.data.to_vec();
    out.par_chunks_mut(x.cols).for_each(|row| {
        let s = row.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        if s > 0.0 {
            row.iter_mut().for_each(|v| *v /= s);
            let n = row.iter().map(|v| v * v).sum::<f32>().sqrt();
            row.iter_mut().for_each(|v| *v /= n);
        }
    });
    out
}

/// Exact softmax or angular attention of `[heads, n, d]` inputs, f32.
pub fn exact_attention(
    kind: Exact,
    q: Heads,
    k: Heads,
    v: Heads,
    causal: bool,
    isa: Isa,
) -> Vec<f32> {
    let (heads, n, d, dv, nk) = (q.heads, q.n, q.cols, v.cols, k.n);
    let (qn, kn);
    let (qd, kd) = match kind {
        Exact::Angular { .. } => {
            qn = normalised(q);
            kn = normalised(k);
            (&qn[..], &kn[..])
        }
        Exact::Softmax { .. } => (q.data, k.data),
    };
    let blocks: Vec<(usize, usize)> = (0..n.div_ceil(BQ))
        .map(|b| (b * BQ, ((b + 1) * BQ).min(n)))
        .collect();
    let mut o = vec![0.0f32; heads * n * dv];
    let pieces = split_out(&mut o, n, dv, &blocks);
    pieces.into_par_iter().for_each(|(h, b, ob)| {
        let (i0, i1) = blocks[b];
        let rows = i1 - i0;
        let qb = MatRef::from_row_major_slice(&qd[(h * n + i0) * d..(h * n + i1) * d], rows, d);
        let mut s = vec![0.0f32; rows * BK];
        let (mut m, mut l, mut alpha) = (
            vec![f32::NEG_INFINITY; rows],
            vec![0.0f32; rows],
            vec![1.0f32; rows],
        );
        let kend = if causal { i1.min(nk) } else { nk };
        let mut j0 = 0;
        while j0 < kend {
            let j1 = (j0 + BK).min(kend);
            let cols = j1 - j0;
            let kb =
                MatRef::from_row_major_slice(&kd[(h * nk + j0) * d..(h * nk + j1) * d], cols, d);
            let vb = MatRef::from_row_major_slice(
                &v.data[(h * nk + j0) * dv..(h * nk + j1) * dv],
                cols,
                dv,
            );
            {
                let sm = MatMut::from_row_major_slice_mut(&mut s[..rows * cols], rows, cols);
                matmul(sm, Accum::Replace, qb, kb.transpose(), 1.0f32, Par::Seq);
            }
            dispatch(
                isa,
                RowsTask {
                    kind,
                    s: &mut s[..rows * cols],
                    rows,
                    cols,
                    i0,
                    j0,
                    causal,
                    m: &mut m,
                    l: &mut l,
                    alpha: &mut alpha,
                },
            );
            for (r, &a) in alpha.iter().enumerate() {
                if a != 1.0 {
                    ob[r * dv..(r + 1) * dv].iter_mut().for_each(|x| *x *= a);
                }
            }
            let om = MatMut::from_row_major_slice_mut(&mut ob[..], rows, dv);
            matmul(
                om,
                Accum::Add,
                MatRef::from_row_major_slice(&s[..rows * cols], rows, cols),
                vb,
                1.0f32,
                Par::Seq,
            );
            j0 = j1;
        }
        for r in 0..rows {
            let inv = if l[r] > 0.0 { 1.0 / l[r] } else { 0.0 };
            ob[r * dv..(r + 1) * dv].iter_mut().for_each(|x| *x *= inv);
        }
    });
    o
}
