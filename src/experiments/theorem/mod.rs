//! `racelab theorem`: Theorem 2 (paper p. 8), `‖Ô − O‖_rms = O(P/beta + sqrt(log(N/δ)/L))·‖V‖_F`
//! for non-causal soft RACE against `O` = angular attention with `γ = P`, unit Q/K with row
//! mass `s_min ≥ C1·N`, `‖A‖_rms = sqrt(Σ_i |A_i|²/N)`. Three parts:
//!
//! 1. **The bound, calibrated and tested by extrapolation.** Each grid point's error is the
//!    1 − δ quantile over seeds (planes redrawn). `c` is the largest ratio `error / t` over
//!    the odd seeds' quantiles on one side of `L = calibrate_from_l` (`t = (P/beta +
//!    sqrt(log(N/δ)/L))·‖V‖_F`); the claim is tested on the even seeds' quantiles on the
//!    other side, both ways, so a shape that grows too slowly towards few tables (t = 1,
//!    t = L) or falls too fast towards many (t = 1/L, e^−L) is violated. The same splits in
//!    beta and P are reported, with the alternative shapes no split excludes. The per-N
//!    constant's slope in N shows whether `‖V‖_F` keeps up.
//! 2. **Bias without sampling (L = ∞).** `O_∞` is attention with the exact expected kernel
//!    `E[Ŝ_ij] = g(θ_ij)^P` (quadrature, [`crate::reference::expected`]), so
//!    `‖O_∞ − O‖` is the soft-hash bias alone. Fitted slopes in beta per regime (beta < 2,
//!    beta ≥ 4) and per input family: clustered q ≠ k, tied q = k, MiniLM with unit Q/K.
//!    The form the data supports, `C·P/beta²` for beta ≥ 4 without ties, is the lab's own
//!    claim, calibrated on the clustered family on one side of `form_split_beta` (and of
//!    `form_split_p`) and tested on the other side (clustered and MiniLM), in both
//!    directions: a shape too shallow (P/beta, a constant) fails towards small beta, one too
//!    steep (1/beta³) towards large, a wrong P factor across P.
//! 3. **Sampling alone.** `‖Ô − O_∞‖` at finite L, whose 1 − δ quantile over seeds should
//!    fall like L^-1/2 over `L ≥ sampling_from_l`, at every beta.
//!
//! See `proofs-notes/theorem2.md` and `proofs-notes/soft-bias.md`.

mod bound;
mod common;
mod limit;

use super::{load_config, Ctx, ExpResult};
use crate::error::Result;
use bound::{claims, figures, fit, grid_csv, Grid};
pub use common::{limit_output, rel_rms, Config};
use limit::limit_study;
pub use limit::LimitSlope;

/// The study: the grid (compute → CSV), the fit and figures from the CSV, the claims; then,
/// on synthetic inputs, the L = ∞ study.
pub fn run(ctx: &Ctx) -> Result<ExpResult> {
    let t0 = std::time::Instant::now();
    let mut cfg: Config = load_config(
        ctx,
        include_str!("../../../experiments/theorem.toml"),
        "theorem",
    )?;
    let real = crate::experiments::real::unit_inputs(ctx)?;
    if let Some((q, ..)) = &real {
        cfg.ns.retain(|&n| n < q.rows);
        cfg.ns.push(q.rows);
    }
    let is_real = real.is_some();
    let stem = if is_real { "theorem_real" } else { "theorem" };
    let label = real
        .as_ref()
        .map(|r| r.3.clone())
        .unwrap_or_else(|| format!("synthetic concentrated unit Q/K (spread {})", cfg.spread));
    let csv = grid_csv(ctx, &cfg, &real, stem)?;
    let grid = Grid::read(ctx, stem)?;
    let fit = fit(&cfg, &grid)?;
    let mut figures = figures(ctx, &cfg, stem, &grid, &fit)?;
    let mut claims = claims(&cfg, &label, is_real, &fit)?;
    let mut headline = serde_json::json!({"fitted_c": fit.held.c, "held_out_under": fit.held.under, "points": fit.held.total, "c_slope_in_n": fit.c_slope_n, "sampling_slope": fit.samp_slope, "min_c1": fit.c1min});
    let mut csvs = vec![csv];
    if !is_real {
        let (limit_claims, slopes, csv2) = limit_study(ctx, &cfg)?;
        claims.extend(limit_claims);
        headline["limit_slopes"] = serde_json::to_value(&slopes).unwrap_or_default();
        csvs.extend(csv2);
        figures.push("theorem_limit".into());
    }
    Ok(ExpResult {
        name: stem.into(),
        claims,
        figures,
        csv: csvs,
        headline,
        seconds: t0.elapsed().as_secs_f64(),
        seed: ctx.seed,
    })
}

#[cfg(test)]
mod tests;
