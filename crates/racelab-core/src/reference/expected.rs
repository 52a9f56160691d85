//! The expected soft-RACE kernel, by quadrature (`proofs-notes/soft-bias.md`).
//!
//! Rows of `W` are independent, so `E_W[φ(q)ᵀφ(k)] = g^P` with
//! `g = E[a(X)a(Y) + (1 − a(X))(1 − a(Y))]`, `a(t) = σ(2 beta tanh t)`, where `(X, Y) = (wᵀq, wᵀk)`
//! is bivariate normal with variances `|q|², |k|²` and covariance `qᵀk`. Writing
//! `X = |q| z₁`, `Y = |k|(ρ z₁ + s z₂)` with `ρ = cos θ`, `s = sin θ`:
//!
//! `g = ∫ φ(z₁) [a(X) h(z₁) + (1 − a(X))(1 − h(z₁))] dz₁`, `h(z₁) = ∫ φ(z₂) a(Y) dz₂`.
//!
//! Both integrands are smooth except for a step of width `~1/(2 beta)` where `X = 0` (resp.
//! `Y = 0`), which plain Gauss–Hermite cannot resolve at large beta. Each 1-D integral is
//! therefore composite 16-point Gauss–Legendre on `[−9, 9]` (the normal mass outside is
//! < 1e-18) with panel breaks refined geometrically around the step. The hard-hash limit is
//! `g → κ = 1 − θ/π`. Accuracy is checked against Monte Carlo and by refinement in `bias`.

use crate::hashing::sigmoid;
use std::sync::OnceLock;

/// 16-point Gauss–Legendre nodes and weights on [−1, 1] (Newton on P₁₆, f64).
fn gl16() -> &'static ([f64; 16], [f64; 16]) {
    static GL: OnceLock<([f64; 16], [f64; 16])> = OnceLock::new();
    GL.get_or_init(|| {
        let n = 16;
        let (mut x, mut w) = ([0.0; 16], [0.0; 16]);
        for i in 0..n {
            let mut t = (std::f64::consts::PI * (i as f64 + 0.75) / (n as f64 + 0.5)).cos();
            for _ in 0..100 {
                let (mut p0, mut p1) = (1.0, t);
                for k in 2..=n {
                    let p2 = ((2 * k - 1) as f64 * t * p1 - (k - 1) as f64 * p0) / k as f64;
                    p0 = p1;
                    p1 = p2;
                }
                let dp = n as f64 * (t * p1 - p0) / (t * t - 1.0);
                let dt = p1 / dp;
                t -= dt;
                if dt.abs() < 1e-16 {
                    let (mut q0, mut q1) = (1.0, t);
                    for k in 2..=n {
                        let q2 = ((2 * k - 1) as f64 * t * q1 - (k - 1) as f64 * q0) / k as f64;
                        q0 = q1;
                        q1 = q2;
                    }
                    let dq = n as f64 * (t * q1 - q0) / (t * t - 1.0);
                    x[i] = t;
                    w[i] = 2.0 / ((1.0 - t * t) * dq * dq);
                    break;
                }
            }
        }
        (x, w)
    })
}

const LIM: f64 = 9.0;

/// Panel breaks on [−9, 9]: uniform (width 0.5 / refine) plus geometric refinement around
/// `c` at scale `width` (the step's width in this variable).
fn breaks(c: f64, width: f64, refine: usize) -> Vec<f64> {
    let mut b: Vec<f64> = (0..=36 * refine)
        .map(|i| -LIM + i as f64 * (2.0 * LIM) / (36 * refine) as f64)
        .collect();
    if width.is_finite() && width > 0.0 && c.abs() < LIM {
        let mut s = width / 8.0;
        while s < 4.0 {
            for &t in &[c - s, c + s] {
                if t.abs() < LIM {
                    b.push(t);
                }
            }
            s *= 2.0_f64.powf(1.0 / refine as f64);
        }
        b.push(c);
    }
    b.sort_by(|x, y| x.partial_cmp(y).unwrap());
    b.dedup_by(|a, b| (*a - *b).abs() < 1e-15);
    b
}

/// `∫_{−9}^{9} f(z) φ(z) dz` on the given breaks.
fn integrate(br: &[f64], f: impl Fn(f64) -> f64) -> f64 {
    let (x, w) = gl16();
    let norm = 1.0 / (2.0 * std::f64::consts::PI).sqrt();
    let mut total = 0.0;
    for p in br.windows(2) {
        let (a, b) = (p[0], p[1]);
        let (mid, half) = (0.5 * (a + b), 0.5 * (b - a));
        let mut s = 0.0;
        for i in 0..16 {
            let z = mid + half * x[i];
            s += w[i] * f(z) * (-0.5 * z * z).exp() * norm;
        }
        total += half * s;
    }
    total
}

/// `a(t) = σ(2 beta tanh t)`.
#[inline]
fn a(t: f64, beta: f64) -> f64 {
    sigmoid(2.0 * beta * t.tanh())
}

/// `g(q, k)` for vectors of norms `nq`, `nk` at angle `theta`; `refine ≥ 1` multiplies the
/// panel count (1 is the default; 2 is used to check convergence).
pub fn expected_g(beta: f64, nq: f64, nk: f64, theta: f64, refine: usize) -> f64 {
    let (rho, s) = (theta.cos(), theta.sin().abs());
    let outer = breaks(0.0, 1.0 / (2.0 * beta * nq), refine);
    integrate(&outer, |z1| {
        let ax = a(nq * z1, beta);
        let h = if s < 1e-12 {
            a(nk * rho * z1, beta)
        } else {
            let c = -rho * z1 / s;
            let inner = breaks(c, 1.0 / (2.0 * beta * nk * s), refine);
            integrate(&inner, |z2| a(nk * (rho * z1 + s * z2), beta))
        };
        ax * h + (1.0 - ax) * (1.0 - h)
    })
}

/// `g(θ)` for unit vectors tabulated on `n + 1` angles in [0, π], with linear interpolation
/// (unit Q/K: g depends on the angle only). The nodes `θ_i = π(1 − cos(πi/n))/2` are dense
/// near 0 and π, where `g − κ` bends on the scale 1/beta (spacing ≈ π³/(4n²) there, ≈ π²/(2n)
/// in the middle, where `g − κ` is smooth).
#[derive(Debug, Clone)]
pub struct GTable {
    /// The inverse temperature `β` the table is for.
    pub beta: f64,
    /// `g` at the `n + 1` nodes.
    pub values: Vec<f64>,
}

impl GTable {
    /// The table at `β` on `n + 1` nodes (`n ≥ 1`).
    pub fn new(beta: f64, n: usize) -> Self {
        use rayon::prelude::*;
        // g(π − θ) = 1 − g(θ) (k → −k flips every bit: a(−t) = 1 − a(t)), and the nodes are
        // symmetric (node(n − i) = π − node(i)): only the first half is integrated.
        let n = n.max(1);
        let half: Vec<f64> = (0..=n / 2)
            .into_par_iter()
            .map(|i| expected_g(beta, 1.0, 1.0, Self::node(i, n), 1))
            .collect();
        let values = (0..=n)
            .map(|i| {
                if i <= n / 2 {
                    half[i]
                } else {
                    1.0 - half[n - i]
                }
            })
            .collect();
        GTable { beta, values }
    }
    /// The `i`-th of `n + 1` nodes.
    pub fn node(i: usize, n: usize) -> f64 {
        let pi = std::f64::consts::PI;
        0.5 * pi * (1.0 - (pi * i as f64 / n as f64).cos())
    }
    /// The angle of `values[i]`.
    pub fn theta(&self, i: usize) -> f64 {
        Self::node(i, self.values.len() - 1)
    }
    /// Interpolated `g(θ)`.
    pub fn g(&self, theta: f64) -> f64 {
        let pi = std::f64::consts::PI;
        let n = self.values.len() - 1;
        let u = (1.0 - 2.0 * theta.clamp(0.0, pi) / pi)
            .clamp(-1.0, 1.0)
            .acos()
            / pi
            * n as f64;
        let i = (u.floor() as usize).min(n - 1);
        let (a, b) = (self.theta(i), self.theta(i + 1));
        let f = if b > a {
            ((theta - a) / (b - a)).clamp(0.0, 1.0)
        } else {
            0.0
        };
        self.values[i] * (1.0 - f) + self.values[i + 1] * f
    }
}

/// Chebyshev nodes per panel of [`GInterp`].
const CHEB: usize = 12;

/// `g(θ)` for unit vectors to about 1e-12, for every pair of a row-wise bound: Chebyshev
/// interpolation (12 nodes of the second kind per panel, barycentric form) on panels of
/// [0, π/2] that double in width from `min(1/(8β), 1/4)` at θ = 0, where `g` bends on the
/// scale 1/β, up to width 1/4; `g(π − θ) = 1 − g(θ)` beyond π/2. `error` is an a-posteriori
/// estimate, measured as the table is built: the largest difference between the interpolant
/// and [`expected_g`] at two points inside every panel, and between `expected_g` at the
/// default panels and at twice as many (`refine = 2`) at one node of every panel.
#[derive(Debug, Clone)]
pub struct GInterp {
    /// The inverse temperature `β` the table is for.
    pub beta: f64,
    /// `(a, b, g at the panel's nodes)`.
    panels: Vec<(f64, f64, [f64; CHEB])>,
    /// The a-posteriori error estimate of `g`.
    pub error: f64,
}

impl GInterp {
    /// The interpolant at `β`, with its error estimate.
    pub fn new(beta: f64) -> Self {
        use rayon::prelude::*;
        let half = std::f64::consts::FRAC_PI_2;
        let mut edges = vec![0.0];
        let mut w = (1.0 / (8.0 * beta)).min(0.25);
        while *edges.last().unwrap() < half {
            let a = *edges.last().unwrap();
            edges.push((a + w).min(half));
            w = (2.0 * w).min(0.25);
        }
        let node = |a: f64, b: f64, j: usize| {
            let x = (std::f64::consts::PI * j as f64 / (CHEB - 1) as f64).cos();
            0.5 * (a + b) + 0.5 * (b - a) * x
        };
        let panels: Vec<(f64, f64, [f64; CHEB])> = edges
            .windows(2)
            .collect::<Vec<_>>()
            .par_iter()
            .map(|e| {
                let (a, b) = (e[0], e[1]);
                let mut v = [0.0; CHEB];
                for (j, x) in v.iter_mut().enumerate() {
                    *x = expected_g(beta, 1.0, 1.0, node(a, b, j), 1);
                }
                (a, b, v)
            })
            .collect();
        let mut t = GInterp {
            beta,
            panels,
            error: 0.0,
        };
        let checks: Vec<f64> = t
            .panels
            .par_iter()
            .map(|&(a, b, ref v)| {
                let interp = [0.31, 0.77]
                    .iter()
                    .map(|&f| {
                        let th = a + f * (b - a);
                        (t.g(th) - expected_g(beta, 1.0, 1.0, th, 1)).abs()
                    })
                    .fold(0.0, f64::max);
                let quad = (v[3] - expected_g(beta, 1.0, 1.0, node(a, b, 3), 2)).abs();
                interp.max(quad)
            })
            .collect();
        t.error = checks.into_iter().fold(0.0, f64::max);
        t
    }

    /// `g` on [0, π/2] from its panel.
    fn g_half(&self, theta: f64) -> f64 {
        let i = self
            .panels
            .partition_point(|p| p.1 < theta)
            .min(self.panels.len() - 1);
        let (a, b, ref v) = self.panels[i];
        let x = ((2.0 * theta - a - b) / (b - a)).clamp(-1.0, 1.0);
        let (mut num, mut den) = (0.0, 0.0);
        for (j, &vj) in v.iter().enumerate() {
            let xj = (std::f64::consts::PI * j as f64 / (CHEB - 1) as f64).cos();
            if x == xj {
                return vj;
            }
            let mut w = if j % 2 == 0 { 1.0 } else { -1.0 };
            if j == 0 || j == CHEB - 1 {
                w *= 0.5;
            }
            let c = w / (x - xj);
            num += c * vj;
            den += c;
        }
        num / den
    }

    /// Interpolated `g(θ)`, θ ∈ [0, π].
    pub fn g(&self, theta: f64) -> f64 {
        let pi = std::f64::consts::PI;
        let theta = theta.clamp(0.0, pi);
        if theta <= 0.5 * pi {
            self.g_half(theta)
        } else {
            1.0 - self.g_half(pi - theta)
        }
    }
}

/// Monte-Carlo estimate of `g` (mean, standard error) from `draws` seeded samples.
pub fn monte_carlo_g(
    beta: f64,
    nq: f64,
    nk: f64,
    theta: f64,
    draws: usize,
    seed: u64,
) -> (f64, f64) {
    let mut rng = crate::rng::SeededRng::new(seed, crate::rng::stream::EXPERIMENT);
    let (rho, s) = (theta.cos(), theta.sin());
    let (mut sum, mut sq) = (0.0, 0.0);
    for _ in 0..draws {
        let (z1, z2) = (rng.normal(), rng.normal());
        let (ax, ay) = (a(nq * z1, beta), a(nk * (rho * z1 + s * z2), beta));
        let v = ax * ay + (1.0 - ax) * (1.0 - ay);
        sum += v;
        sq += v * v;
    }
    let mean = sum / draws as f64;
    (
        mean,
        ((sq / draws as f64 - mean * mean).max(0.0) / draws as f64).sqrt(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table's interpolation error is small against the bias it is used to measure,
    /// at the ends (where g − κ bends on the scale 1/beta) and in the middle.
    #[test]
    fn g_is_antisymmetric_about_a_right_angle() {
        for &(beta, theta) in &[(0.3, 0.4), (8.0, 1.1), (100.0, 0.05)] {
            let a = expected_g(beta, 1.0, 1.0, theta, 1);
            let b = expected_g(beta, 1.0, 1.0, std::f64::consts::PI - theta, 1);
            assert!(
                (a + b - 1.0).abs() < 1e-12,
                "beta {beta}, θ {theta}: {a} + {b}"
            );
        }
    }

    #[test]
    fn table_interpolates_well_below_the_bias() {
        for &beta in &[4.0, 64.0] {
            let t = GTable::new(beta, 512);
            for &theta in &[0.0, 1e-3, 0.013, 0.1, 0.77, 1.6, 3.1] {
                let g = expected_g(beta, 1.0, 1.0, theta, 1);
                let bias = (g - (1.0 - theta / std::f64::consts::PI)).abs();
                let err = (t.g(theta) - g).abs();
                assert!(
                    err < 0.01 * bias + 1e-12,
                    "beta {beta}, θ {theta}: interpolation {err:.2e} vs bias {bias:.2e}"
                );
            }
        }
    }

    #[test]
    fn chebyshev_panels_match_the_quadrature_to_1e_11() {
        for &beta in &[0.01, 1.0, 8.0, 300.0, 1e5] {
            let t = GInterp::new(beta);
            assert!(
                t.error < 1e-11,
                "beta {beta}: error estimate {:.2e}",
                t.error
            );
            for i in 0..40 {
                let theta = std::f64::consts::PI * (i as f64 + 0.37) / 40.0;
                for th in [theta, theta / beta.max(1.0)] {
                    let g = expected_g(beta, 1.0, 1.0, th, 1);
                    let err = (t.g(th) - g).abs();
                    assert!(err < 1e-11, "beta {beta}, θ {th}: {err:.2e}");
                }
            }
        }
    }
}
