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
//! - **unstable (k/K holds)**: the independent master seeds of `reproduce` disagree
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

use crate::error::{RaceError, Result};
use serde::{Deserialize, Serialize};
use statrs::distribution::{ContinuousCDF, StudentsT};
use std::collections::BTreeMap;
use std::sync::OnceLock;

/// The verdict of one claim. In JSON a subcommand's per-claim `verdict` is `holds`, `loose`,
/// `fails`, `not_testable` or `unstable` (`claims.json` has the report's text as well).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Holds,
    Loose,
    Fails,
    NotTestable,
    /// The replicated seeds disagree: `holds` of `total` seeds hold.
    Unstable {
        holds: usize,
        total: usize,
    },
}

impl Serialize for Verdict {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(match self {
            Verdict::Holds => "holds",
            Verdict::Loose => "loose",
            Verdict::Fails => "fails",
            Verdict::NotTestable => "not_testable",
            Verdict::Unstable { .. } => "unstable",
        })
    }
}

/// The documented verdict texts, as REPORT.md prints them (an unstable verdict adds its
/// count: "unstable (2/3 holds)").
pub const VERDICTS: [&str; 5] = ["holds", "loose", "fails", "not testable here", "unstable"];

impl Verdict {
    /// The verdict's name (one of [`VERDICTS`]).
    pub fn name(&self) -> &'static str {
        match self {
            Verdict::Holds => VERDICTS[0],
            Verdict::Loose => VERDICTS[1],
            Verdict::Fails => VERDICTS[2],
            Verdict::NotTestable => VERDICTS[3],
            Verdict::Unstable { .. } => VERDICTS[4],
        }
    }
    /// The verdict as the report prints it.
    pub fn text(&self) -> String {
        match self {
            Verdict::Unstable { holds, total } => format!("unstable ({holds}/{total} holds)"),
            v => v.name().to_string(),
        }
    }
}

/// A claim's pre-stated test.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Test {
    Range {
        #[serde(default)]
        min: Option<f64>,
        #[serde(default)]
        max: Option<f64>,
    },
    Bound {
        slack: f64,
        #[serde(default)]
        tol: f64,
    },
    RateBound {
        claimed: f64,
        tol: f64,
        #[serde(default)]
        plausible: Option<[f64; 2]>,
    },
    Rate {
        min: f64,
        max: f64,
        #[serde(default)]
        plausible: Option<[f64; 2]>,
    },
    Share {
        min_share: f64,
    },
    Margin {
        alpha: f64,
    },
    Margins {
        alpha: f64,
    },
}

impl Test {
    /// The threshold in words, for the report.
    pub fn describe(&self) -> String {
        let plaus = |p: &Option<[f64; 2]>| {
            p.map(|[a, b]| format!("; outside [{a}, {b}] not testable (noise)"))
                .unwrap_or_default()
        };
        match self {
            Test::Range { min, max } => match (min, max) {
                (Some(a), Some(b)) => format!("within [{a}, {b}]"),
                (Some(a), None) => format!("≥ {a}"),
                (None, Some(b)) => format!("≤ {b}"),
                (None, None) => "any value".into(),
            },
            Test::Bound { slack, tol } => {
                format!("0 < measured ≤ (1 + {tol})·bound; loose if bound/measured > {slack}")
            }
            Test::RateBound {
                claimed,
                tol,
                plausible,
            } => format!(
                "bound on the exponent ({claimed}): > {:.2} fails, < {:.2} loose{}",
                claimed + tol,
                claimed - tol,
                plaus(plausible)
            ),
            Test::Rate {
                min,
                max,
                plausible,
            } => format!("rate: exponent within [{min}, {max}]{}", plaus(plausible)),
            Test::Share { min_share } => format!("share ≥ {min_share}"),
            Test::Margin { alpha } => {
                format!("one-sided Student-t, difference > 0 at α = {alpha}")
            }
            Test::Margins { alpha } => format!(
                "some comparison > 0, one-sided Student-t, Holm–Bonferroni at family-wise α = {alpha}"
            ),
        }
    }
}

/// One comparison of a margin test: a difference in the claimed direction, its standard
/// error and degrees of freedom (`n − 1` for a mean of `n` paired differences).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Cmp {
    pub label: String,
    pub diff: f64,
    pub se: f64,
    pub df: f64,
}

impl Cmp {
    /// A comparison from the mean and standard error of `n` samples of the difference.
    pub fn of_mean(label: impl Into<String>, diff: f64, se: f64, n: usize) -> Self {
        Cmp {
            label: label.into(),
            diff,
            se,
            df: n as f64 - 1.0,
        }
    }
    /// The paired comparison of `a − b` over samples that pair by index.
    pub fn paired(label: impl Into<String>, a: &[f64], b: &[f64]) -> Self {
        let d: Vec<f64> = a.iter().zip(b).map(|(x, y)| x - y).collect();
        let (m, se) = crate::stats::mean_se(&d);
        Cmp::of_mean(label, m, se, d.len())
    }
}

/// What was measured, in the shape the claim's test takes.
#[derive(Debug, Clone, PartialEq)]
pub enum Measure {
    /// For `range`: every value must be in range.
    Values(Vec<f64>),
    /// For `bound`.
    Bound { measured: f64, bound: f64 },
    /// For `rate` and `rate_bound`: the measured exponent.
    Rate(f64),
    /// For `share`.
    Share { hits: usize, total: usize },
    /// For `margin`.
    Margin(Cmp),
    /// For `margins`.
    Margins(Vec<Cmp>),
    /// The data cannot decide the claim (any test).
    NotTestable(String),
}

impl Measure {
    pub fn value(x: f64) -> Self {
        Measure::Values(vec![x])
    }
    /// The numbers the measure holds (for the non-finite check).
    fn numbers(&self) -> Vec<f64> {
        match self {
            Measure::Values(xs) => xs.clone(),
            Measure::Bound { measured, bound } => vec![*measured, *bound],
            Measure::Rate(e) => vec![*e],
            Measure::Share { .. } | Measure::NotTestable(_) => vec![],
            Measure::Margin(c) => vec![c.diff, c.se],
            Measure::Margins(cs) => cs.iter().flat_map(|c| [c.diff, c.se]).collect(),
        }
    }
}

/// A constant calibrated on one part of the data and tested on a disjoint part: `c` is the
/// largest ratio `error/shape` over the calibration points, and a held-out point is under
/// the bound when `error ≤ c·shape`. The parts are chosen so that a wrong shape cannot fit
/// both: the held-out points lie beyond the calibrated range (fewer tables, another β range),
/// where a shape that grows too slowly, or the wrong way, is violated.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct HeldOut {
    pub c: f64,
    pub under: usize,
    pub total: usize,
    /// The largest held-out ratio `error/(c·shape)`.
    pub worst: f64,
    /// Calibration and held-out points whose error or shape is not finite (or the shape ≤ 0).
    pub nonfinite: usize,
    pub calibration: usize,
}

impl HeldOut {
    /// Calibrate on `cal` and test on `test`, each a list of `(error, shape)`.
    pub fn fit(cal: &[(f64, f64)], test: &[(f64, f64)]) -> HeldOut {
        let bad = |&(e, t): &(f64, f64)| !(e.is_finite() && t.is_finite() && t > 0.0);
        let nonfinite = cal.iter().chain(test).filter(|x| bad(x)).count();
        let c = crate::stats::max_all(cal.iter().map(|(e, t)| e / t));
        let ratios: Vec<f64> = test.iter().map(|(e, t)| e / (c * t)).collect();
        HeldOut {
            c,
            under: ratios.iter().filter(|&&r| r <= 1.0).count(),
            total: test.len(),
            worst: crate::stats::max_all(ratios.iter().cloned()),
            nonfinite,
            calibration: cal.len(),
        }
    }
    pub fn share(&self) -> f64 {
        self.under as f64 / self.total as f64
    }
    /// Of two held-out tests (the two directions of an extrapolation), the one with the
    /// smaller share under its bound.
    pub fn worse(self, other: HeldOut) -> HeldOut {
        if other.nonfinite > 0 || (self.nonfinite == 0 && other.share() < self.share()) {
            other
        } else {
            self
        }
    }
    /// The share test's measure: not testable with any non-finite point or no calibration.
    pub fn measure(&self) -> Measure {
        if self.nonfinite > 0 {
            Measure::NotTestable(format!(
                "{} non-finite values (or non-positive shapes) in the calibration and held-out points",
                self.nonfinite
            ))
        } else if self.calibration == 0 {
            Measure::NotTestable("no calibration points".into())
        } else {
            Measure::Share {
                hits: self.under,
                total: self.total,
            }
        }
    }
}

/// `x` with three significant digits, in plain notation where that stays short.
pub fn num(x: f64) -> String {
    let a = x.abs();
    if a == 0.0 || (1e-2..1e4).contains(&a) {
        format!("{x:.3}")
    } else {
        format!("{x:.2e}")
    }
}

/// A verdict with its account: the detail (slack, margin or reason), the value the verdict
/// turns on and its threshold, the standard error where one is known, the borderline flag
/// and the multiplicity correction applied.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Judgement {
    pub verdict: Verdict,
    pub detail: String,
    pub value: Option<f64>,
    pub threshold: Option<f64>,
    pub se: Option<f64>,
    pub borderline: bool,
    pub correction: Option<String>,
}

impl Judgement {
    fn new(verdict: Verdict, detail: impl Into<String>) -> Self {
        Judgement {
            verdict,
            detail: detail.into(),
            value: None,
            threshold: None,
            se: None,
            borderline: false,
            correction: None,
        }
    }
    fn at(mut self, value: f64, threshold: f64) -> Self {
        self.value = Some(value);
        self.threshold = Some(threshold);
        self
    }
}

/// The one-sided p-value of `diff > 0` (Student-t with `df` degrees of freedom).
pub fn p_one_sided(c: &Cmp) -> f64 {
    let t = StudentsT::new(0.0, 1.0, c.df).expect("df ≥ 2 is checked before");
    1.0 - t.cdf(c.diff / c.se)
}

/// The critical value `t_{1−α, df}`.
pub fn t_critical(alpha: f64, df: f64) -> f64 {
    StudentsT::new(0.0, 1.0, df)
        .expect("df ≥ 2 is checked before")
        .inverse_cdf(1.0 - alpha)
}

/// Holm–Bonferroni at family-wise level `alpha`: which of the p-values are rejected.
pub fn holm(p: &[f64], alpha: f64) -> Vec<bool> {
    let m = p.len();
    let mut order: Vec<usize> = (0..m).collect();
    order.sort_by(|&a, &b| p[a].total_cmp(&p[b]));
    let mut reject = vec![false; m];
    for (k, &i) in order.iter().enumerate() {
        if p[i] <= alpha / (m - k) as f64 {
            reject[i] = true;
        } else {
            break;
        }
    }
    reject
}

/// Why a comparison cannot be tested, if it cannot.
fn untestable(c: &Cmp) -> Option<String> {
    if c.df < 2.0 {
        Some(format!(
            "{}fewer than 3 samples ({} degrees of freedom)",
            label_of(c),
            c.df
        ))
    } else if c.se <= 0.0 {
        Some(format!(
            "{}standard error {} (difference {}): the samples do not vary",
            label_of(c),
            c.se,
            num(c.diff)
        ))
    } else {
        None
    }
}

fn label_of(c: &Cmp) -> String {
    if c.label.is_empty() {
        String::new()
    } else {
        format!("{}: ", c.label)
    }
}

/// The sign of a difference in words: in the claim's direction, or against it.
fn signed(c: &Cmp) -> String {
    if c.diff > 0.0 {
        format!("{}+{} in the claimed direction", label_of(c), num(c.diff))
    } else {
        format!(
            "{}{} against the claimed direction",
            label_of(c),
            num(c.diff)
        )
    }
}

fn plausible_check(e: f64, plausible: &Option<[f64; 2]>) -> Option<Judgement> {
    let [a, b] = (*plausible)?;
    (e < a || e > b).then(|| {
        Judgement::new(
            Verdict::NotTestable,
            format!("noise: exponent {e:.3} is outside the plausible window [{a}, {b}]"),
        )
        .at(e, a)
    })
}

/// The verdict and its account.
pub fn judge(test: &Test, m: &Measure) -> Result<Judgement> {
    use Verdict::*;
    if let Measure::NotTestable(why) = m {
        return Ok(Judgement::new(NotTestable, why.clone()));
    }
    let bad = m.numbers().iter().filter(|x| !x.is_finite()).count();
    if bad > 0 {
        return Ok(Judgement::new(
            NotTestable,
            format!(
                "{bad} non-finite value{} in the measured quantity",
                if bad == 1 { "" } else { "s" }
            ),
        ));
    }
    Ok(match (test, m) {
        (Test::Range { min, max }, Measure::Values(xs)) => {
            if xs.is_empty() {
                Judgement::new(NotTestable, "no measured values")
            } else {
                let lo = min.unwrap_or(f64::NEG_INFINITY);
                let hi = max.unwrap_or(f64::INFINITY);
                let (worst, out) = xs.iter().map(|&x| (x, (lo - x).max(x - hi))).fold(
                    (f64::NAN, f64::NEG_INFINITY),
                    |a, b| {
                        if b.1 > a.1 {
                            b
                        } else {
                            a
                        }
                    },
                );
                let edge = if (lo - worst) >= (worst - hi) { lo } else { hi };
                if out <= 0.0 {
                    Judgement::new(Holds, format!("inside by {}", num(-out))).at(worst, edge)
                } else {
                    Judgement::new(Fails, format!("outside by {}", num(out))).at(worst, edge)
                }
            }
        }
        (Test::Bound { slack, tol }, Measure::Bound { measured, bound }) => {
            if *bound < 0.0 {
                Judgement::new(Fails, format!("the bound {} is negative", num(*bound)))
            } else if *measured <= 0.0 {
                Judgement::new(
                    Fails,
                    format!(
                        "measured value {} ≤ 0: the quantity a bound limits must be positive",
                        num(*measured)
                    ),
                )
                .at(*measured / bound.max(1e-300), 1.0 + tol)
            } else if *measured > (1.0 + tol) * bound {
                Judgement::new(
                    Fails,
                    format!("violated: measured/bound = {:.3}", measured / bound),
                )
                .at(measured / bound, 1.0 + tol)
            } else if bound / measured > *slack {
                Judgement::new(Loose, format!("slack ×{:.3}", bound / measured))
                    .at(measured / bound, 1.0 + tol)
            } else {
                Judgement::new(Holds, format!("slack ×{:.3}", bound / measured))
                    .at(measured / bound, 1.0 + tol)
            }
        }
        (
            Test::RateBound {
                claimed,
                tol,
                plausible,
            },
            Measure::Rate(e),
        ) => {
            if let Some(j) = plausible_check(*e, plausible) {
                j
            } else if *e > claimed + tol {
                Judgement::new(
                    Fails,
                    format!(
                        "exponent {e:.3} exceeds the bound's {claimed} by {:.3}",
                        e - claimed
                    ),
                )
                .at(*e, claimed + tol)
            } else if *e < claimed - tol {
                Judgement::new(
                    Loose,
                    format!("slack grows like x^{:.2} (exponent {e:.3})", claimed - e),
                )
                .at(*e, claimed + tol)
            } else {
                Judgement::new(Holds, format!("exponent {e:.3}")).at(*e, claimed + tol)
            }
        }
        (
            Test::Rate {
                min,
                max,
                plausible,
            },
            Measure::Rate(e),
        ) => {
            let edge = if (e - min).abs() < (e - max).abs() {
                *min
            } else {
                *max
            };
            if let Some(j) = plausible_check(*e, plausible) {
                j
            } else if *e < *min || *e > *max {
                Judgement::new(
                    Fails,
                    format!(
                        "exponent {e:.3} outside [{min}, {max}] by {:.3}",
                        (min - e).max(e - max)
                    ),
                )
                .at(*e, edge)
            } else {
                Judgement::new(Holds, format!("exponent {e:.3}")).at(*e, edge)
            }
        }
        (Test::Rate { .. }, Measure::Values(es)) => {
            // Several exponents under one window: each must lie in it; the verdict is the
            // worst one's.
            if es.is_empty() {
                return Ok(Judgement::new(NotTestable, "no fitted exponents"));
            }
            let js: Vec<Judgement> = es
                .iter()
                .map(|&e| judge(test, &Measure::Rate(e)))
                .collect::<Result<_>>()?;
            let rank = |v: Verdict| match v {
                NotTestable => 3,
                Fails => 2,
                _ => 1,
            };
            // Among failures the one furthest outside, among the rest the one nearest its edge.
            let key = |j: &Judgement| {
                let dist = (j.value.unwrap_or(0.0) - j.threshold.unwrap_or(0.0)).abs();
                if j.verdict == Fails {
                    dist
                } else {
                    -dist
                }
            };
            let worst = js
                .iter()
                .max_by(|a, b| {
                    rank(a.verdict)
                        .cmp(&rank(b.verdict))
                        .then(key(a).total_cmp(&key(b)))
                })
                .cloned()
                .expect("not empty");
            let mut j = worst;
            j.detail = format!("{} exponents; the worst: {}", es.len(), j.detail);
            j
        }
        (Test::Share { min_share }, Measure::Share { hits, total }) => {
            if *total == 0 {
                Judgement::new(NotTestable, "no points to test")
            } else {
                let s = *hits as f64 / *total as f64;
                let se = (s * (1.0 - s) / *total as f64).sqrt();
                let mut j = if s >= *min_share {
                    Judgement::new(Holds, format!("{hits}/{total}"))
                } else {
                    Judgement::new(
                        Fails,
                        format!(
                            "{hits}/{total}: short of {min_share} by {:.3}",
                            min_share - s
                        ),
                    )
                }
                .at(s, *min_share);
                j.se = Some(se);
                j.borderline = (s - min_share).abs() < se;
                j
            }
        }
        (Test::Margin { alpha }, Measure::Margin(c)) => {
            if let Some(why) = untestable(c) {
                Judgement::new(NotTestable, why)
            } else {
                let crit = t_critical(*alpha, c.df);
                let z = c.diff / c.se;
                let text = format!(
                    "{} = {z:.1} standard errors (t critical {crit:.2} at {} df)",
                    signed(c),
                    c.df
                );
                let mut j = Judgement::new(if z > crit { Holds } else { Fails }, text).at(z, crit);
                j.se = Some(1.0);
                j.borderline = (z - crit).abs() < 1.0;
                j
            }
        }
        (Test::Margins { alpha }, Measure::Margins(cs)) => {
            if cs.is_empty() {
                Judgement::new(NotTestable, "no comparisons")
            } else if let Some(why) = cs.iter().find_map(untestable) {
                Judgement::new(NotTestable, why)
            } else {
                let p: Vec<f64> = cs.iter().map(p_one_sided).collect();
                let rej = holm(&p, *alpha);
                let m = cs.len();
                let best = (0..m).min_by(|&a, &b| p[a].total_cmp(&p[b])).unwrap_or(0);
                let c = &cs[best];
                let crit = t_critical(alpha / m as f64, c.df);
                let z = c.diff / c.se;
                let n_rej = rej.iter().filter(|&&r| r).count();
                let text = format!(
                    "{n_rej} of {m} comparisons survive Holm–Bonferroni; the strongest, {} = {z:.1} standard errors (p = {:.2e}, Holm threshold α/{m} = {:.2e}, t critical {crit:.2})",
                    signed(c),
                    p[best],
                    alpha / m as f64
                );
                let mut j = Judgement::new(if n_rej > 0 { Holds } else { Fails }, text).at(z, crit);
                j.se = Some(1.0);
                j.borderline = (z - crit).abs() < 1.0;
                j.correction = Some(format!("Holm–Bonferroni over {m} comparisons"));
                j
            }
        }
        (t, m) => {
            return Err(RaceError::Config {
                path: "experiments/claims.toml".into(),
                msg: format!("test {t:?} cannot judge a measurement of shape {m:?}"),
            })
        }
    })
}

pub use crate::stats::mean_se;

/// A claim's kind: about random draws, or a deterministic check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// About random inputs or planes: replicated over master seeds.
    #[default]
    Empirical,
    /// A quadrature, an identity or a deterministic construction, checked to a tolerance.
    Computed,
}

/// A change to a claim after its first measurement.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Change {
    /// The revision that made the change (before any run that measures it).
    pub rev: String,
    pub reason: String,
}

/// One claim as stated in `experiments/claims.toml`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimSpec {
    pub claim: String,
    pub source: String,
    #[serde(default)]
    pub kind: Kind,
    pub quantity: String,
    pub test: Test,
    pub holds: String,
    #[serde(default)]
    pub loose: Option<String>,
    pub fails: String,
    #[serde(default)]
    pub not_testable: Option<String>,
    /// The revision the claim was first stated at.
    pub since: String,
    #[serde(default)]
    pub changed: Vec<Change>,
}

/// The text of `experiments/claims.toml` built into the binary.
pub const CLAIMS_TOML: &str = include_str!("../../experiments/claims.toml");

/// Every stated claim, by id.
pub fn specs() -> Result<&'static BTreeMap<String, ClaimSpec>> {
    static SPECS: OnceLock<std::result::Result<BTreeMap<String, ClaimSpec>, String>> =
        OnceLock::new();
    SPECS
        .get_or_init(|| toml::from_str(CLAIMS_TOML).map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| RaceError::Config {
            path: "experiments/claims.toml (built in)".into(),
            msg: e.clone(),
        })
}

/// One seed's verdict of a replicated claim.
#[derive(Debug, Clone, Serialize)]
pub struct SeedVerdict {
    pub seed: u64,
    pub verdict: Verdict,
    pub value: Option<f64>,
    pub detail: String,
}

/// One row of REPORT.md (and one object of `claims.json`).
#[derive(Debug, Clone, Serialize)]
pub struct Claim {
    pub id: String,
    pub claim: String,
    pub source: String,
    pub kind: Kind,
    pub quantity: String,
    pub threshold: String,
    pub measured: String,
    pub verdict: Verdict,
    /// The slack, margin or reason behind the verdict.
    pub detail: String,
    /// The value the verdict turns on and its threshold (see [`Judgement`]).
    pub value: Option<f64>,
    pub threshold_value: Option<f64>,
    pub se: Option<f64>,
    pub borderline: bool,
    pub correction: Option<String>,
    /// What this verdict means for this claim (from the TOML).
    pub meaning: String,
    pub note: String,
    /// The seeds behind the verdict (one until [`replicate`] merges several).
    pub seeds: Vec<SeedVerdict>,
    /// Where the row's numbers come from when not from this run (a committed results file).
    pub provenance: Option<String>,
}

impl Claim {
    /// Judge claim `id` (a `-real` suffix shares the base claim's statement) on `m`.
    pub fn judged(id: &str, measured: String, m: Measure, note: impl Into<String>) -> Result<Self> {
        let spec = spec_of(id)?;
        let j = judge(&spec.test, &m)?;
        Ok(Claim {
            id: id.into(),
            claim: spec.claim.clone(),
            source: spec.source.clone(),
            kind: spec.kind,
            quantity: spec.quantity.clone(),
            threshold: spec.test.describe(),
            measured,
            verdict: j.verdict,
            meaning: meaning(spec, j.verdict),
            detail: j.detail.clone(),
            value: j.value,
            threshold_value: j.threshold,
            se: j.se,
            borderline: j.borderline,
            correction: j.correction,
            note: note.into(),
            seeds: vec![SeedVerdict {
                seed: 0,
                verdict: j.verdict,
                value: j.value,
                detail: j.detail,
            }],
            provenance: None,
        })
    }

    /// The same claim, marked as read from a committed results file rather than this run.
    pub fn from_committed(mut self, provenance: impl Into<String>) -> Self {
        self.provenance = Some(provenance.into());
        self
    }

    /// Record the master seed the claim was measured at.
    pub fn at_seed(mut self, seed: u64) -> Self {
        for s in &mut self.seeds {
            s.seed = seed;
        }
        self
    }
}

fn spec_of(id: &str) -> Result<&'static ClaimSpec> {
    let specs = specs()?;
    let base = id.strip_suffix("-real").unwrap_or(id);
    specs
        .get(id)
        .or_else(|| specs.get(base))
        .ok_or_else(|| RaceError::Config {
            path: "experiments/claims.toml (built in)".into(),
            msg: format!("claim `{id}` is measured but not stated"),
        })
}

fn meaning(spec: &ClaimSpec, v: Verdict) -> String {
    match v {
        Verdict::Holds => spec.holds.clone(),
        Verdict::Loose => spec.loose.clone().unwrap_or_else(|| spec.holds.clone()),
        Verdict::Fails => spec.fails.clone(),
        Verdict::NotTestable => spec.not_testable.clone().unwrap_or_default(),
        Verdict::Unstable { .. } => {
            "the independent seeds disagree: the data cannot settle this claim at this size".into()
        }
    }
}

/// One claim measured at several master seeds, merged: the common verdict where every seed
/// agrees, else **unstable (k/K holds)**. The value is the mean over seeds with its standard
/// error; the claim is borderline when that mean lies within one standard error of the
/// threshold, or when any seed's verdict was borderline. The first run's measured text is
/// kept (its figures are the report's); each seed's verdict, value and detail are listed.
pub fn replicate(runs: &[Claim]) -> Option<Claim> {
    let first = runs.first()?;
    let mut c = first.clone();
    c.seeds = runs.iter().flat_map(|r| r.seeds.clone()).collect();
    let k = c.seeds.len();
    if k <= 1 {
        return Some(c);
    }
    let all_same = c.seeds.iter().all(|s| s.verdict == first.verdict);
    let holds = c
        .seeds
        .iter()
        .filter(|s| s.verdict == Verdict::Holds)
        .count();
    c.verdict = if all_same {
        first.verdict
    } else {
        Verdict::Unstable { holds, total: k }
    };
    let values: Vec<f64> = c.seeds.iter().filter_map(|s| s.value).collect();
    if values.len() == k && values.iter().all(|v| v.is_finite()) {
        let (m, se) = mean_se(&values);
        c.value = Some(m);
        // A margin's value is in standard errors already; its se over seeds is the spread.
        c.se = Some(se);
        if let Some(t) = c.threshold_value {
            c.borderline = (m - t).abs() < se;
        }
    }
    c.borderline |= runs.iter().any(|r| r.borderline);
    c.detail = if all_same {
        format!(
            "{} at all {k} seeds; seed {}: {}",
            first.verdict.text(),
            c.seeds[0].seed,
            first.detail
        )
    } else {
        c.seeds
            .iter()
            .map(|s| format!("seed {}: {} ({})", s.seed, s.verdict.text(), s.detail))
            .collect::<Vec<_>>()
            .join("; ")
    };
    c.meaning = match spec_of(&c.id) {
        Ok(spec) => meaning(spec, c.verdict),
        Err(_) => c.meaning,
    };
    Some(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(t: &Test, m: Measure) -> Verdict {
        judge(t, &m).unwrap().verdict
    }

    #[test]
    fn range_can_hold_and_fail() {
        let t = Test::Range {
            min: Some(-1.15),
            max: Some(-0.85),
        };
        assert_eq!(v(&t, Measure::Values(vec![-1.0, -0.9])), Verdict::Holds);
        assert_eq!(v(&t, Measure::Values(vec![-1.0, -0.08])), Verdict::Fails);
        assert_eq!(v(&t, Measure::Values(vec![-2.0])), Verdict::Fails);
        assert_eq!(v(&t, Measure::Values(vec![])), Verdict::NotTestable);
        let lower = Test::Range {
            min: Some(0.627),
            max: None,
        };
        assert_eq!(v(&lower, Measure::value(0.75)), Verdict::Holds);
        assert_eq!(v(&lower, Measure::value(0.59)), Verdict::Fails);
        let j = judge(&lower, &Measure::Values(vec![0.9, 0.7])).unwrap();
        assert_eq!((j.value, j.threshold), (Some(0.7), Some(0.627)));
    }

    #[test]
    fn non_finite_values_make_any_test_not_testable_with_the_count() {
        let tests = [
            (
                Test::Range {
                    min: None,
                    max: Some(1.0),
                },
                Measure::Values(vec![0.5, f64::NAN, f64::INFINITY]),
            ),
            (
                Test::Bound {
                    slack: 2.0,
                    tol: 0.0,
                },
                Measure::Bound {
                    measured: f64::NAN,
                    bound: 1.0,
                },
            ),
            (
                Test::RateBound {
                    claimed: -1.0,
                    tol: 0.2,
                    plausible: None,
                },
                Measure::Rate(f64::NAN),
            ),
            (
                Test::Margin { alpha: 0.025 },
                Measure::Margin(Cmp::of_mean("", 1.0, f64::NAN, 5)),
            ),
        ];
        for (t, m) in tests {
            let j = judge(&t, &m).unwrap();
            assert_eq!(j.verdict, Verdict::NotTestable, "{t:?}");
            assert!(j.detail.contains("non-finite"), "{}", j.detail);
        }
        let j = judge(
            &tests_range(),
            &Measure::Values(vec![f64::NAN, f64::NAN, 0.1]),
        )
        .unwrap();
        assert!(j.detail.starts_with("2 non-finite values"), "{}", j.detail);
    }

    fn tests_range() -> Test {
        Test::Range {
            min: None,
            max: Some(1.0),
        }
    }

    #[test]
    fn bound_separates_violated_from_loose_and_fails_a_non_positive_measurement() {
        let t = Test::Bound {
            slack: 2.0,
            tol: 0.0,
        };
        let b = |measured, bound| v(&t, Measure::Bound { measured, bound });
        assert_eq!(b(0.9, 1.0), Verdict::Holds);
        assert_eq!(b(0.0156, 1.0), Verdict::Loose);
        assert_eq!(b(1.2, 1.0), Verdict::Fails);
        assert_eq!(b(0.0, 1.0), Verdict::Fails);
        assert_eq!(b(-0.3, 1.0), Verdict::Fails);
        let j = judge(
            &t,
            &Measure::Bound {
                measured: 0.25,
                bound: 1.0,
            },
        )
        .unwrap();
        assert!(j.detail.contains("×4"), "{}", j.detail);
    }

    #[test]
    fn rate_bound_is_one_sided_and_rate_two_sided() {
        let bound = Test::RateBound {
            claimed: -1.0,
            tol: 0.2,
            plausible: None,
        };
        assert_eq!(v(&bound, Measure::Rate(-1.05)), Verdict::Holds);
        assert_eq!(v(&bound, Measure::Rate(-2.0)), Verdict::Loose);
        assert_eq!(v(&bound, Measure::Rate(-0.08)), Verdict::Fails);
        let rate = Test::Rate {
            min: -1.15,
            max: -0.85,
            plausible: None,
        };
        assert_eq!(v(&rate, Measure::Rate(-1.0)), Verdict::Holds);
        // Faster decay is loose for a bound, but a failure for a rate.
        assert_eq!(v(&rate, Measure::Rate(-2.0)), Verdict::Fails);
        assert_eq!(v(&rate, Measure::Rate(-0.5)), Verdict::Fails);
        assert_eq!(v(&rate, Measure::Values(vec![-1.0, -0.9])), Verdict::Holds);
        assert_eq!(v(&rate, Measure::Values(vec![-1.0, -0.7])), Verdict::Fails);
        assert_eq!(v(&rate, Measure::Values(vec![])), Verdict::NotTestable);
    }

    #[test]
    fn a_fit_outside_its_plausible_window_is_noise_not_a_finding() {
        let t = Test::RateBound {
            claimed: 1.0,
            tol: 0.2,
            plausible: Some([0.5, 3.0]),
        };
        let j = judge(&t, &Measure::Rate(-0.06)).unwrap();
        assert_eq!(j.verdict, Verdict::NotTestable);
        assert!(j.detail.contains("noise"), "{}", j.detail);
        assert_eq!(v(&t, Measure::Rate(1.02)), Verdict::Holds);
        assert_eq!(v(&t, Measure::Rate(0.7)), Verdict::Loose);
        assert_eq!(v(&t, Measure::Rate(1.5)), Verdict::Fails);
    }

    #[test]
    fn share_can_hold_and_fail() {
        let t = Test::Share { min_share: 0.9 };
        let s = |hits, total| v(&t, Measure::Share { hits, total });
        assert_eq!(s(95, 100), Verdict::Holds);
        assert_eq!(s(50, 100), Verdict::Fails);
        assert_eq!(s(0, 0), Verdict::NotTestable);
        assert!(
            judge(
                &t,
                &Measure::Share {
                    hits: 91,
                    total: 100
                }
            )
            .unwrap()
            .borderline
        );
        assert!(
            !judge(
                &t,
                &Measure::Share {
                    hits: 99,
                    total: 100
                }
            )
            .unwrap()
            .borderline
        );
    }

    #[test]
    fn margin_uses_student_t_and_refuses_zero_se_or_few_samples() {
        let t = Test::Margin { alpha: 0.025 };
        let m = |diff, se, n| v(&t, Measure::Margin(Cmp::of_mean("", diff, se, n)));
        // t_{0.975, 2} = 4.30: 3 standard errors hold with 20 samples, fail with 3.
        assert_eq!(m(0.3, 0.1, 20), Verdict::Holds);
        assert_eq!(m(0.3, 0.1, 3), Verdict::Fails);
        assert_eq!(m(0.5, 0.1, 3), Verdict::Holds);
        assert_eq!(m(-0.5, 0.1, 20), Verdict::Fails);
        assert_eq!(m(1e-12, 0.0, 20), Verdict::NotTestable);
        assert_eq!(m(0.3, 0.1, 2), Verdict::NotTestable);
        assert!((t_critical(0.025, 2.0) - 4.3027).abs() < 1e-3);
        // The sign is said the right way round.
        let j = judge(&t, &Measure::Margin(Cmp::of_mean("", -0.048, 0.023, 3))).unwrap();
        assert!(
            j.detail.contains("against the claimed direction"),
            "{}",
            j.detail
        );
        let j = judge(&t, &Measure::Margin(Cmp::of_mean("", 0.3, 0.1, 20))).unwrap();
        assert!(
            j.detail.contains("+0.300 in the claimed direction"),
            "{}",
            j.detail
        );
        // Paired differences.
        let c = Cmp::paired("", &[1.0, 2.0, 3.0, 4.0], &[0.5, 1.4, 2.6, 3.5]);
        assert!((c.diff - 0.5).abs() < 1e-12 && c.df == 3.0);
    }

    #[test]
    fn holm_corrects_the_maximum_over_many_comparisons() {
        // 35 comparisons with no effect but one z ≈ 2.1 (p ≈ 0.02): holds without a
        // correction, fails with Holm at α = 0.05 (needs p ≤ 0.05/35).
        let mut cs: Vec<Cmp> = (0..34)
            .map(|i| Cmp::of_mean(format!("pair {i}"), 0.001 * i as f64 - 0.02, 0.01, 8))
            .collect();
        cs.push(Cmp::of_mean("(4,1) → (5,1)", 0.0109, 0.0052, 8));
        let t = Test::Margins { alpha: 0.05 };
        let j = judge(&t, &Measure::Margins(cs.clone())).unwrap();
        assert_eq!(j.verdict, Verdict::Fails, "{}", j.detail);
        assert!(j.correction.unwrap().contains("35"));
        assert_eq!(
            v(
                &Test::Margin { alpha: 0.05 },
                Measure::Margin(cs[34].clone())
            ),
            Verdict::Holds
        );
        // A strong effect survives the correction.
        cs.push(Cmp::of_mean("strong", 0.1, 0.01, 8));
        assert_eq!(v(&t, Measure::Margins(cs)), Verdict::Holds);
        assert_eq!(holm(&[0.01, 0.04, 0.03], 0.05), vec![true, false, false]);
        assert_eq!(holm(&[0.01, 0.02, 0.024], 0.05), vec![true, true, true]);
    }

    #[test]
    fn replicated_seeds_that_disagree_are_unstable() {
        let mk = |seed, diff| {
            Claim::judged(
                "combine-closer",
                String::new(),
                Measure::Margin(Cmp::of_mean("", diff, 0.1, 8)),
                "",
            )
            .unwrap()
            .at_seed(seed)
        };
        let same = replicate(&[mk(0, 0.5), mk(1, 0.6), mk(2, 0.7)]).unwrap();
        assert_eq!(same.verdict, Verdict::Holds);
        assert_eq!(same.seeds.len(), 3);
        let mixed = replicate(&[mk(0, 0.5), mk(1, -0.1), mk(2, 0.7)]).unwrap();
        assert_eq!(mixed.verdict, Verdict::Unstable { holds: 2, total: 3 });
        assert_eq!(mixed.verdict.text(), "unstable (2/3 holds)");
        assert!(mixed.detail.contains("seed 1: fails"), "{}", mixed.detail);
        assert_eq!(crate::experiments::report::seeds_agree(&mixed), 2);
        assert_eq!(crate::experiments::report::seeds_agree(&same), 3);
        // Values near the threshold are borderline.
        let near = replicate(&[mk(0, 0.2), mk(1, 0.25), mk(2, 0.3)]).unwrap();
        assert!(near.borderline, "{:?}", near.value);
    }

    #[test]
    fn not_testable_and_mismatched_shapes() {
        let t = Test::Share { min_share: 1.0 };
        assert_eq!(
            v(&t, Measure::NotTestable("no data".into())),
            Verdict::NotTestable
        );
        assert!(judge(&t, &Measure::Rate(1.0)).is_err());
    }

    #[test]
    fn every_stated_claim_parses_and_names_its_meanings() {
        let specs = specs().unwrap();
        assert!(specs.len() >= 30, "{} claims stated", specs.len());
        for (id, s) in specs {
            assert!(
                !s.quantity.is_empty() && !s.holds.is_empty() && !s.fails.is_empty(),
                "{id}"
            );
            let is_rev = |r: &str| r.len() >= 7 && r.chars().all(|c| c.is_ascii_hexdigit());
            assert!(
                is_rev(&s.since),
                "{id}: `since` is not a revision: {}",
                s.since
            );
            for c in &s.changed {
                assert!(is_rev(&c.rev) && !c.reason.is_empty(), "{id}: change {c:?}");
            }
            if matches!(s.test, Test::Bound { .. } | Test::RateBound { .. }) {
                assert!(
                    s.loose.is_some(),
                    "{id}: a bound test needs a `loose` meaning"
                );
            }
        }
        assert!(Claim::judged("no-such-claim", String::new(), Measure::value(0.0), "").is_err());
    }

    #[test]
    fn mean_se_of_known_data() {
        let (m, se) = mean_se(&[1.0, 2.0, 3.0, 4.0]);
        assert!((m - 2.5).abs() < 1e-15);
        // Sample variance 5/3, so se = sqrt(5/12).
        assert!((se - (5.0f64 / 12.0).sqrt()).abs() < 1e-15);
    }
}
