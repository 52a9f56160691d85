//! Claims and their verdicts.
//!
//! Every claim the lab checks is stated in `experiments/claims.toml` before it is measured:
//! the sentence, its source, its kind (an **empirical** claim about random draws, or a
//! **computed** check: a quadrature, an identity, a deterministic construction), the quantity
//! measured, the test with its threshold, what each verdict means, the revision it was first
//! measured at (`since`) and every later change (`changed`). An experiment measures the
//! quantity and hands the numbers to [`judge`]; no verdict is written anywhere else. The
//! verdicts:
//!
//! - **holds**: the measured quantity is within the threshold;
//! - **loose**: the bound holds, and its slack factor is reported;
//! - **fails**: the claim is violated or not supported, with the margin reported;
//! - **not testable here**: the data cannot decide it, with the reason (non-finite values,
//!   a zero standard error, too few samples, a timing fit outside its plausible window);
//! - **unstable (k/K hold)**: the independent master seeds of `reproduce` disagree
//!   ([`replicate`]).
//!
//! A verdict whose value lies within one standard error of its threshold is flagged
//! **borderline**.
//!
//! The test families (one verdict function each, all in [`judge`]):
//!
//! - `range`: every measured value `x` satisfies `min ≤ x ≤ max`; the margin is the
//!   distance of the worst value outside.
//! - `bound`: `0 < measured ≤ bound`. Fails when `measured > (1 + tol)·bound` or
//!   `measured ≤ 0` (a bound test of a quantity that should be positive); loose when the
//!   slack `bound/measured` exceeds `slack`; holds otherwise.
//! - `rate_bound`: a one-sided claim on a log-log exponent `e`, "falls at least as fast as
//!   `x^c`" (an upper bound `∝ x^c`). Fails when `e > c + tol`; loose when `e < c − tol`
//!   (it falls faster: the slack grows like `x^(c−e)`); holds otherwise.
//! - `rate`: a two-sided claim, "falls like `x^c`": the exponent must lie in the stated
//!   window `[min, max]`; outside it fails either way.
//!
//!   Both rate kinds take an optional `plausible = [a, b]`: an exponent outside it is not
//!   a finding but noise (a timing fit of −0.06 for time against N), and is **not testable
//!   here**.
//! - `share`: at least `min_share` of `total` points satisfy the stated condition.
//! - `margin`: a comparative claim on one pre-stated comparison: a one-sided Student-t test
//!   of `diff > 0` at level `alpha` with the comparison's degrees of freedom (`diff/se >
//!   t_{1−α, df}`). `se = 0` or fewer than 3 samples (`df < 2`) is not testable.
//! - `margins`: an existential claim over several comparisons ("some pair is worse"): each
//!   comparison's one-sided p-value, corrected by Holm–Bonferroni at family-wise level
//!   `alpha`; the claim holds when at least one comparison survives the correction.

mod claims;
mod judge;

pub use crate::stats::mean_se;
pub use claims::*;
pub use judge::*;

#[cfg(test)]
mod tests;
