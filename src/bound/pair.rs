//! The per-pair bias bound `|g(θ) − κ(θ)| ≤ ε_β(θ)` for unit q, k, every θ ∈ [0, π] and every
//! β > 0 (proofs-notes/soft-bias.md, "The per-pair bound, proved").
//!
//! With `e(t) = σ(2β tanh t) − 1[t > 0]`, `(X, Y)` standard normal with correlation
//! `ρ = cos θ ≥ 0` and `s = sin θ`: `g − κ = 4E[e(X)1[Y>0]] + 2E[e(X)e(Y)]`, the first term
//! ≤ 0 and the second ≥ 0, so `|g − κ| ≤ max(B_eh, B_ee)` with
//!
//! - `B_eh = min(4J, 4ρI/(πs))`, `J = ∫₀^∞ σ(−2β tanh x)φ(x)dx`,
//!   `I = ∫₀^∞ x σ(−2β tanh x)e^{−x²/2}dx`;
//! - `B_ee = min(2E₂, 4ρM²/(πs³))`, `E₂ = E[e(X)²]`, `M = ∫₀^∞ x σ(−2β tanh x)e^{−x²/4}dx`.
//!
//! Substituting `t = tanh x` turns `I`, `J`, `E₂` into `∫₀^1 σ(−2βt)^{1 or 2}·F(t)dt` with
//! `F ≤` a polynomial in t (the four certified inequalities of
//! `proofs-notes/certificates/pair_bias.json`), hence closed forms in the moments
//! `∫₀^∞ uⁿσ(−u)du = (1 − 2⁻ⁿ)·n!·ζ(n+1)` and `∫₀^∞ uⁿσ(−u)²du`. `M` is bounded by the
//! concavity of tanh. For θ > π/2, `g(π − θ) = 1 − g(θ)` folds the angle.
//!
//! Leading order: `ε → π·cot θ/(12β²)` away from ties, `4J → 2 ln 2·φ(0)/β` at a tie (the tie
//! itself has `1 − g(0) ≈ φ(0)/β`: the bound is ×1.39 loose there).

use std::f64::consts::{LN_2, PI};

/// `ζ(3)` and `ζ(5)`.
const ZETA3: f64 = 1.202_056_903_159_594_2;
const ZETA5: f64 = 1.036_927_755_143_37;

/// `mom(n) = ∫₀^∞ uⁿ σ(−u) du = (1 − 2⁻ⁿ)·n!·ζ(n+1)` (`ln 2` at n = 0).
pub(crate) const MOM: [f64; 6] = [
    LN_2,
    PI * PI / 12.0,
    1.5 * ZETA3,
    7.0 * PI * PI * PI * PI / 120.0,
    22.5 * ZETA5,
    // (31/32)·120·ζ(6), ζ(6) = π⁶/945
    31.0 / 32.0 * 120.0 * PI * PI * PI * PI * PI * PI / 945.0,
];

/// `∫₀^∞ uⁿ σ(−u)² du = mom(n) − ∫₀^∞ uⁿ σ'(u) du` (σ(−u)² = σ(−u) − σ'(u); the second is half
/// the logistic distribution's n-th moment): n = 0, 2, 4.
pub(crate) const MOM2: [f64; 3] = [
    LN_2 - 0.5,
    1.5 * ZETA3 - PI * PI / 6.0,
    22.5 * ZETA5 - 7.0 * PI * PI * PI * PI / 30.0,
];

/// The certified majorants, as `(power of t, coefficient)`: `x e^{−x²/2} cosh²x` (for `I`)
/// and `e^{−x²/2} cosh²x` (for `J`, `E₂`) with `t = tanh x`. The coefficients are dyadic, so
/// these f64 values are the certificate's rationals exactly.
pub(crate) const F1_MAJORANTS: [&[(usize, f64)]; 2] = [
    &[(1, 1.0), (3, 27.0 / 32.0), (5, 85.0 / 32.0)],
    &[(1, 1.0), (3, 27.0 / 8.0)],
];
pub(crate) const F2_MAJORANTS: [&[(usize, f64)]; 2] = [
    &[(0, 1.0), (2, 33.0 / 32.0)],
    &[(0, 1.0), (2, 17.0 / 32.0), (4, 9.0 / 16.0)],
];

/// Relative allowance for the f64 rounding of the closed forms (a few dozen operations on
/// positive terms, each within 2⁻⁵³): the bound is raised by this factor.
const ROUNDING: f64 = 1.0 + 1e-12;

/// `∫₀^∞ p(t) σ(−2βt)^k dt` for a majorant `p` (k = 1: moments `MOM`, k = 2: `MOM2`).
fn against(poly: &[(usize, f64)], beta: f64, squared: bool) -> f64 {
    poly.iter()
        .map(|&(n, c)| {
            let m = if squared { MOM2[n / 2] } else { MOM[n] };
            c * m / (2.0 * beta).powi(n as i32 + 1)
        })
        .sum()
}

fn best(polys: &[&[(usize, f64)]], beta: f64, squared: bool) -> f64 {
    polys
        .iter()
        .map(|p| against(p, beta, squared))
        .fold(f64::INFINITY, crate::stats::nan_min)
}

/// `ε_β(θ)` for one β, its θ-free parts computed once.
#[derive(Debug, Clone, Copy)]
pub struct PairBound {
    /// The inverse temperature `β`.
    pub beta: f64,
    /// `4J̄`: the tie value of `B_eh`.
    eh_tie: f64,
    /// `4Ī/π`: `B_eh = min(eh_tie, eh_slope·ρ/s)`.
    eh_slope: f64,
    /// `2Ē₂`.
    ee_tie: f64,
    /// `4M̄²/π`: `B_ee = min(ee_tie, ee_slope·ρ/s³)`.
    ee_slope: f64,
}

impl PairBound {
    /// The bound at `beta` (finite, > 0; the caller validates).
    pub fn new(beta: f64) -> Self {
        let phi0 = 1.0 / (2.0 * PI).sqrt();
        let j = phi0 * best(&F2_MAJORANTS, beta, false);
        let e2 = 2.0 * phi0 * best(&F2_MAJORANTS, beta, true);
        let i = best(&F1_MAJORANTS, beta, false);
        // M ≤ mom(1)/(2βc)² + 2σ(−2β tanh x₀)e^{−x₀²/4}, c = tanh(x₀)/x₀ (tanh x ≥ c·x on
        // [0, x₀] by concavity; σ(−2β tanh x) ≤ σ(−2β tanh x₀) beyond).
        let m = [0.5f64, 1.0, 1.5, 2.0]
            .iter()
            .map(|&x0| {
                let c = x0.tanh() / x0;
                MOM[1] / (2.0 * beta * c).powi(2)
                    + 2.0
                        * crate::hashing::sigmoid(-2.0 * beta * x0.tanh())
                        * (-x0 * x0 / 4.0).exp()
            })
            .fold(f64::INFINITY, crate::stats::nan_min);
        PairBound {
            beta,
            eh_tie: 4.0 * j,
            eh_slope: 4.0 * i / PI,
            ee_tie: 2.0 * e2,
            ee_slope: 4.0 * m * m / PI,
        }
    }

    /// `ε_β` at the pair's cosine `c = q̂ᵀk̂` (clamped to [−1, 1]).
    pub fn eps_cos(&self, c: f64) -> f64 {
        // Fold θ > π/2 onto π − θ: |g − κ| is symmetric about π/2.
        let rho = c.clamp(-1.0, 1.0).abs();
        let s = (1.0 - rho * rho).max(0.0).sqrt();
        let (eh, ee) = if s == 0.0 {
            (self.eh_tie, self.ee_tie)
        } else {
            (
                self.eh_tie.min(self.eh_slope * rho / s),
                self.ee_tie.min(self.ee_slope * rho / (s * s * s)),
            )
        };
        eh.max(ee) * ROUNDING
    }

    /// `ε_β(θ)`.
    pub fn eps(&self, theta: f64) -> f64 {
        self.eps_cos(theta.cos())
    }

    /// `|g^P − κ^P| ≤ P·min(1, κ + ε)^{P−1}·ε` (mean value theorem, g ≤ κ + ε and g ≤ 1), at
    /// the pair's cosine.
    pub fn power_cos(&self, c: f64, p: usize) -> f64 {
        let kap = 1.0 - c.clamp(-1.0, 1.0).acos() / PI;
        let eps = self.eps_cos(c);
        p as f64 * (kap + eps).min(1.0).powi(p as i32 - 1) * eps
    }
}

/// The leading-order expansion `min(1/(√(2π)β), π|cot θ|/(12β²))`: an approximation, not a
/// bound (it is exceeded by up to 18% at β = 2.5 and 10% at β = 4, towards θ = π/2).
pub fn asymptotic_eps(theta: f64, beta: f64) -> f64 {
    let tie = 1.0 / ((2.0 * PI).sqrt() * beta);
    let away = PI * (1.0 / theta.tan()).abs() / (12.0 * beta * beta);
    tie.min(away)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::expected::expected_g;

    /// `∫₀^∞ f` by composite Simpson on a fine grid (the integrands decay like e^{−u}).
    fn integral(f: impl Fn(f64) -> f64) -> f64 {
        let (n, hi) = (200_000, 80.0);
        let h = hi / n as f64;
        let mut s = f(0.0) + f(hi);
        for i in 1..n {
            s += f(i as f64 * h) * if i % 2 == 1 { 4.0 } else { 2.0 };
        }
        s * h / 3.0
    }

    #[test]
    fn the_moment_constants_are_their_integrals() {
        let sig = |u: f64| crate::hashing::sigmoid(-u);
        for (n, &m) in MOM.iter().enumerate() {
            let q = integral(|u| u.powi(n as i32) * sig(u));
            assert!((q - m).abs() < 1e-9 * m, "mom({n}) = {m}, quadrature {q}");
        }
        for (i, &m) in MOM2.iter().enumerate() {
            let q = integral(|u| u.powi(2 * i as i32) * sig(u) * sig(u));
            assert!(
                (q - m).abs() < 1e-9 * m,
                "mom2({}) = {m}, quadrature {q}",
                2 * i
            );
        }
    }

    /// The proved bound covers the quadrature at every angle and β tried, from β = 0.25 to
    /// 1024, with the certified constants; the leading-order ε does not.
    #[test]
    fn the_proved_pair_bound_covers_the_quadrature_where_the_expansion_does_not() {
        let mut asym_worst: f64 = 0.0;
        for &beta in &[0.25, 1.0, 2.5, 4.0, 16.0, 64.0, 1024.0] {
            let b = PairBound::new(beta);
            let mut worst: f64 = 0.0;
            for i in 0..=48 {
                let theta = PI * i as f64 / 48.0;
                let theta = if i == 0 { 0.0 } else { theta.min(PI) };
                let g = expected_g(beta, 1.0, 1.0, theta, 2);
                let bias = (g - (1.0 - theta / PI)).abs();
                let eps = b.eps(theta);
                assert!(
                    bias <= eps + 1e-13,
                    "beta {beta}, θ {theta}: |g − κ| = {bias:.6e} > ε = {eps:.6e}"
                );
                if eps > 0.0 {
                    worst = worst.max(bias / eps);
                }
                if (1..48).contains(&i) && beta >= 2.5 {
                    asym_worst = asym_worst.max(bias / asymptotic_eps(theta, beta));
                }
            }
            // Not vacuous: within ×3 of the bias somewhere at β ≥ 1, within 1% at β ≥ 16 (and ×53 at β = 0.25, where 4J is loose).
            let floor = if beta >= 16.0 {
                0.99
            } else if beta >= 1.0 {
                0.3
            } else {
                0.01
            };
            assert!(worst > floor, "beta {beta}: {worst}");
        }
        assert!(asym_worst > 1.05, "the expansion is exceeded: {asym_worst}");
    }
}
