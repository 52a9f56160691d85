//! The soft-hash bias at L = ∞, bounded with no fitted constant: proved per pair, certified
//! where the proof needs numbers, and applied row by row to any unit-row Q/K/V.
//!
//! - [`pair`]: `|g(θ) − κ(θ)| ≤ ε_β(θ)` for every θ and every β > 0 (unit q, k), in closed
//!   form; `ε → π·cot θ/(12β²)` away from ties (proofs-notes/soft-bias.md).
//! - [`certificate`]: the replay of the Arb certificate of the four one-variable inequalities
//!   the proof rests on (`proofs-notes/certificates/pair_bias.json`).
//! - [`rows`]: `‖O_∞,i − O_i‖ ≤ Σ_j δ̄_ij‖v_j − O_i‖/(U_i − Σ_j δ̄_ij)` per row beside the
//!   measured bias (proofs-notes/theorem2.md); `racelab bound` and the claim
//!   `theorem2-bias-explicit` call it.

#![deny(missing_docs)]

pub mod certificate;
pub mod pair;
pub mod rows;

pub use pair::{asymptotic_eps, PairBound};
pub use rows::{check_unit_rows, row_bounds, RowBound};

/// The smallest β the per-pair bound covers: the proof holds for every β > 0.
pub const BETA_MIN_COVERED: f64 = 0.0;

/// The β range `racelab bound` takes: the proof covers every β > 0; the quadrature of the
/// measured side is checked from 1e-3 to 1e6.
pub const BETA_RANGE: (f64, f64) = (1e-3, 1e6);

/// How far a measured value goes towards its bound: `(measured − tolerance)⁺/bound`, 0 when the
/// measured value is within its tolerance (whatever the bound), infinite when it is not and the
/// bound is 0. An inequality holds where this is ≤ 1.
pub fn excess_ratio(measured: f64, tolerance: f64, bound: f64) -> f64 {
    let m = (measured - tolerance).max(0.0);
    if m == 0.0 {
        0.0
    } else if bound > 0.0 {
        m / bound
    } else {
        f64::INFINITY
    }
}
