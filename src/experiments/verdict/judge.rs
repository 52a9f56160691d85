//! The test families and their verdicts: a pre-stated [`Test`] applied to a [`Measure`] by
//! [`judge`] (the families are described in [`super`]).

use crate::error::{RaceError, Result};
use serde::{Deserialize, Serialize};
use statrs::distribution::{ContinuousCDF, StudentsT};

/// The verdict of one claim. In JSON a subcommand's per-claim `verdict` is `holds`, `loose`,
/// `fails`, `not_testable` or `unstable` (`claims.json` has the report's text as well).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Holds,
    Loose,
    Fails,
    NotTestable,
    /// The replicated seeds disagree: `holds` of `total` seeds hold (or are loose: the bound
    /// held).
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
/// count: "unstable (2/3 hold)").
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
            Verdict::Unstable { holds, total } => format!("unstable ({holds}/{total} hold)"),
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
        min_effect: f64,
    },
    Margins {
        alpha: f64,
        min_effect: f64,
    },
    ShareMargins {
        alpha: f64,
        min_effect: f64,
        min_share: f64,
    },
}

/// The power a margin test must have at its minimum effect before a failure to show the
/// difference counts for anything: below it the verdict is **not testable here:
/// underpowered**.
pub const MIN_POWER: f64 = 0.8;

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
            Test::Margin { alpha, min_effect } => format!(
                "one-sided Student-t, difference > 0 at α = {alpha}; fails if shown < {min_effect} (the minimum effect)"
            ),
            Test::Margins { alpha, min_effect } => format!(
                "some comparison > 0, one-sided Student-t, Holm–Bonferroni at family-wise α = {alpha}; fails if every comparison is shown < {min_effect} (the minimum effect)"
            ),
            Test::ShareMargins {
                alpha,
                min_effect,
                min_share,
            } => format!(
                "share ≥ {min_share} of comparisons > 0 (one-sided Student-t, Holm–Bonferroni at family-wise α = {alpha}); fails if more than {} are shown < {min_effect} (the minimum effect)",
                num(1.0 - min_share)
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
    /// The unpaired comparison of two independent means (`diff = mean_a − mean_b` or its
    /// negation), with Welch's standard error and degrees of freedom.
    pub fn welch(
        label: impl Into<String>,
        diff: f64,
        (se_a, n_a): (f64, usize),
        (se_b, n_b): (f64, usize),
    ) -> Self {
        let (va, vb) = (se_a * se_a, se_b * se_b);
        let den = va * va / (n_a as f64 - 1.0) + vb * vb / (n_b as f64 - 1.0);
        let df = if den > 0.0 {
            (va + vb).powi(2) / den
        } else {
            (n_a + n_b) as f64 - 2.0
        };
        Cmp {
            label: label.into(),
            diff,
            se: (va + vb).sqrt(),
            df,
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
    /// A share whose points were counted from `inputs`: not testable when any input is not
    /// finite (a NaN fails every comparison, so it would be counted as a miss, or filtered out
    /// of the points, instead of reported).
    pub fn share_of(hits: usize, total: usize, inputs: impl IntoIterator<Item = f64>) -> Self {
        let bad = inputs.into_iter().filter(|x| !x.is_finite()).count();
        if bad > 0 {
            Measure::NotTestable(format!(
                "{bad} non-finite value{} in the measured quantity",
                if bad == 1 { "" } else { "s" }
            ))
        } else {
            Measure::Share { hits, total }
        }
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

/// The one-sided p-value of `diff < e`: the difference shown below the minimum effect `e`.
pub fn p_below(c: &Cmp, e: f64) -> f64 {
    let t = StudentsT::new(0.0, 1.0, c.df).expect("df ≥ 2 is checked before");
    1.0 - t.cdf((e - c.diff) / c.se)
}

/// The approximate power of the one-sided test of `diff > 0` at level `alpha` when the true
/// difference is `e`: `P(T > t_{1−α} − e/se)` with `T` Student-t (the shifted central t, an
/// approximation of the noncentral t that is close for `df ≥ 5`).
pub fn power(c: &Cmp, e: f64, alpha: f64) -> f64 {
    let t = StudentsT::new(0.0, 1.0, c.df).expect("df ≥ 2 is checked before");
    1.0 - t.cdf(t_critical(alpha, c.df) - e / c.se)
}

/// Not shown either way: underpowered when the power at the minimum effect is below
/// [`MIN_POWER`], else inconclusive.
fn not_shown(pw: f64, e: f64, what: String) -> Judgement {
    if pw < MIN_POWER {
        Judgement::new(
            Verdict::NotTestable,
            format!(
                "underpowered (power {pw:.2} at effect {}, below {MIN_POWER}): {what}",
                num(e)
            ),
        )
    } else {
        Judgement::new(
            Verdict::NotTestable,
            format!("inconclusive (power {pw:.2} at effect {}): {what}", num(e)),
        )
    }
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
    crate::stats::sort_by_float(&mut order, |&i| p[i]);
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
                // The values are finite (checked above): the one furthest outside, or nearest
                // an edge.
                let outside: Vec<f64> = xs.iter().map(|&x| (lo - x).max(x - hi)).collect();
                let i = crate::stats::argmax(outside.iter().cloned()).unwrap_or(0);
                let (worst, out) = (xs[i], outside[i]);
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
            let top = js.iter().map(|j| rank(j.verdict)).max().unwrap_or(1);
            let worst: Vec<&Judgement> = js.iter().filter(|j| rank(j.verdict) == top).collect();
            let i = crate::stats::argmax(worst.iter().map(|j| key(j))).unwrap_or(0);
            let mut j = worst[i].clone();
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
        (Test::Margin { alpha, min_effect }, Measure::Margin(c)) => {
            if let Some(why) = untestable(c) {
                Judgement::new(NotTestable, why)
            } else {
                let crit = t_critical(*alpha, c.df);
                let (z, e) = (c.diff / c.se, *min_effect);
                let below = (e - c.diff) / c.se;
                let text = format!(
                    "{} = {z:.1} standard errors (t critical {crit:.2} at {} df)",
                    signed(c),
                    num(c.df)
                );
                let mut j = if z > crit {
                    Judgement::new(Holds, text)
                } else if below > crit {
                    Judgement::new(
                        Fails,
                        format!(
                            "{text}; shown below the minimum effect {}: upper {}-level bound {}",
                            num(e),
                            1.0 - alpha,
                            num(c.diff + crit * c.se)
                        ),
                    )
                } else {
                    not_shown(
                        power(c, e, *alpha),
                        e,
                        format!("{text}, and not shown below {}", num(e)),
                    )
                };
                j = j.at(z, crit);
                j.se = Some(1.0);
                j.borderline =
                    j.verdict != NotTestable && (z - crit).abs().min((below - crit).abs()) < 1.0;
                j
            }
        }
        (Test::Margins { alpha, min_effect }, Measure::Margins(cs)) => {
            if cs.is_empty() {
                Judgement::new(NotTestable, "no comparisons")
            } else if let Some(why) = cs.iter().find_map(untestable) {
                Judgement::new(NotTestable, why)
            } else {
                let p: Vec<f64> = cs.iter().map(p_one_sided).collect();
                let rej = holm(&p, *alpha);
                let m = cs.len();
                let best = crate::stats::argmin(p.iter().cloned()).unwrap_or(0);
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
                let e = *min_effect;
                // The opposite, shown: every comparison below the minimum effect (an
                // intersection–union test: each at level α, no correction needed).
                let shown_below = cs
                    .iter()
                    .all(|c| (e - c.diff) / c.se > t_critical(*alpha, c.df));
                let mut j = if n_rej > 0 {
                    Judgement::new(Holds, text)
                } else if shown_below {
                    Judgement::new(
                        Fails,
                        format!(
                            "{text}; every comparison is shown below the minimum effect {}",
                            num(e)
                        ),
                    )
                } else {
                    let pw =
                        crate::stats::max_all(cs.iter().map(|c| power(c, e, alpha / m as f64)));
                    not_shown(
                        pw,
                        e,
                        format!("{text}; not every comparison is shown below {}", num(e)),
                    )
                }
                .at(z, crit);
                j.se = Some(1.0);
                j.borderline = j.verdict == Holds && (z - crit).abs() < 1.0;
                j.correction = Some(format!("Holm–Bonferroni over {m} comparisons"));
                j
            }
        }
        (
            Test::ShareMargins {
                alpha,
                min_effect,
                min_share,
            },
            Measure::Margins(cs),
        ) => {
            if cs.is_empty() {
                Judgement::new(NotTestable, "no comparisons")
            } else if let Some(why) = cs.iter().find_map(untestable) {
                Judgement::new(NotTestable, why)
            } else {
                let (m, e) = (cs.len(), *min_effect);
                let wins = holm(&cs.iter().map(p_one_sided).collect::<Vec<_>>(), *alpha);
                let short = holm(
                    &cs.iter().map(|c| p_below(c, e)).collect::<Vec<_>>(),
                    *alpha,
                );
                // A significant win is a win even where it is also shown below the minimum
                // effect; "shown short" counts the other comparisons, so the three counts
                // partition them.
                let n_win = wins.iter().filter(|&&w| w).count();
                let n_short = (0..m).filter(|&i| short[i] && !wins[i]).count();
                let share = n_win as f64 / m as f64;
                let pw = cs
                    .iter()
                    .map(|c| power(c, e, alpha / m as f64))
                    .sum::<f64>()
                    / m as f64;
                let text = format!(
                    "{n_win}/{m} significant wins, {n_short}/{m} shown below the minimum effect {}, {} undecided (Holm–Bonferroni at family-wise α = {alpha} each way; mean power {pw:.2} at {})",
                    num(e),
                    m - n_win - n_short,
                    num(e)
                );
                let mut j = if share >= *min_share {
                    Judgement::new(Holds, text)
                } else if n_short as f64 / m as f64 > 1.0 - min_share {
                    Judgement::new(Fails, text)
                } else {
                    not_shown(pw, e, text)
                }
                .at(share, *min_share);
                j.correction = Some(format!("Holm–Bonferroni over {m} comparisons, each way"));
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
