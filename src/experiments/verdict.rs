//! Claims and their verdicts.
//!
//! Every claim the lab checks is stated in `experiments/claims.toml` before it is measured:
//! the sentence, its source, the quantity measured, the test with its threshold, and what
//! each verdict means. An experiment measures the quantity and hands the numbers to
//! [`judge`]; no verdict is written anywhere else. The verdicts:
//!
//! - **holds**: the measured quantity is within the threshold;
//! - **loose**: the bound holds, and its slack factor is reported;
//! - **fails**: the claim is violated or not supported, with the margin reported;
//! - **not testable here**: the data cannot decide it, with the reason.
//!
//! The test families (one verdict function each, all in [`judge`]):
//!
//! - `range`: every measured value `x` satisfies `min ≤ x ≤ max`; the margin is the
//!   distance of the worst value outside.
//! - `bound`: `measured ≤ bound`. Fails when `measured > (1 + tol)·bound`; loose when the
//!   slack `bound/measured` exceeds `slack`; holds otherwise.
//! - `rate`: a measured log-log exponent `e` against the claimed one `c` of an upper bound
//!   (`error ∝ x^c`). Fails when `e > c + tol` (the error falls slower or grows faster than
//!   the bound: violated as `x` grows); loose when `e < c − tol` (it falls faster: the slack
//!   grows like `x^(c−e)`); holds otherwise.
//! - `share`: at least `min_share` of `total` points satisfy the stated condition.
//! - `margin`: an existential or comparative claim: the difference `diff` must exceed `z`
//!   standard errors (`diff > z·se`); anything less fails.

use crate::error::{RaceError, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::OnceLock;

/// The verdict of one claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Holds,
    Loose,
    Fails,
    NotTestable,
}

/// The documented verdict texts, as REPORT.md prints them.
pub const VERDICTS: [&str; 4] = ["holds", "loose", "fails", "not testable here"];

impl Verdict {
    pub fn text(&self) -> &'static str {
        match self {
            Verdict::Holds => VERDICTS[0],
            Verdict::Loose => VERDICTS[1],
            Verdict::Fails => VERDICTS[2],
            Verdict::NotTestable => VERDICTS[3],
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
    Rate {
        claimed: f64,
        tol: f64,
    },
    Share {
        min_share: f64,
    },
    Margin {
        z: f64,
    },
}

impl Test {
    /// The threshold in words, for the report.
    pub fn describe(&self) -> String {
        match self {
            Test::Range { min, max } => match (min, max) {
                (Some(a), Some(b)) => format!("within [{a}, {b}]"),
                (Some(a), None) => format!("≥ {a}"),
                (None, Some(b)) => format!("≤ {b}"),
                (None, None) => "any value".into(),
            },
            Test::Bound { slack, tol } => {
                format!("measured ≤ (1 + {tol})·bound; loose if bound/measured > {slack}")
            }
            Test::Rate { claimed, tol } => format!(
                "exponent vs the bound's {claimed}: > {:.2} fails, < {:.2} loose",
                claimed + tol,
                claimed - tol
            ),
            Test::Share { min_share } => format!("share ≥ {min_share}"),
            Test::Margin { z } => format!("difference > {z} standard errors"),
        }
    }
}

/// What was measured, in the shape the claim's test takes.
#[derive(Debug, Clone, PartialEq)]
pub enum Measure {
    /// For `range`: every value must be in range.
    Values(Vec<f64>),
    /// For `bound`.
    Bound { measured: f64, bound: f64 },
    /// For `rate`: the measured exponent.
    Rate(f64),
    /// For `share`.
    Share { hits: usize, total: usize },
    /// For `margin`.
    Margin { diff: f64, se: f64 },
    /// The data cannot decide the claim (any test).
    NotTestable(String),
}

impl Measure {
    pub fn value(x: f64) -> Self {
        Measure::Values(vec![x])
    }
}

/// `x` with three significant digits, in plain notation where that stays short.
fn num(x: f64) -> String {
    let a = x.abs();
    if a == 0.0 || (1e-2..1e4).contains(&a) {
        format!("{x:.3}")
    } else {
        format!("{x:.2e}")
    }
}

/// The verdict and a short account of it (the slack, the margin, or the reason).
pub fn judge(test: &Test, m: &Measure) -> Result<(Verdict, String)> {
    use Verdict::*;
    let nonfinite = |xs: &[f64]| xs.iter().any(|x| !x.is_finite());
    Ok(match (test, m) {
        (_, Measure::NotTestable(why)) => (NotTestable, why.clone()),
        (Test::Range { min, max }, Measure::Values(xs)) => {
            if xs.is_empty() || nonfinite(xs) {
                (Fails, "a measured value is missing or not finite".into())
            } else {
                let lo = min.unwrap_or(f64::NEG_INFINITY);
                let hi = max.unwrap_or(f64::INFINITY);
                let out = xs
                    .iter()
                    .map(|&x| (lo - x).max(x - hi))
                    .fold(f64::NEG_INFINITY, f64::max);
                if out <= 0.0 {
                    (Holds, format!("inside by {}", num(-out)))
                } else {
                    (Fails, format!("outside by {}", num(out)))
                }
            }
        }
        (Test::Bound { slack, tol }, Measure::Bound { measured, bound }) => {
            if nonfinite(&[*measured, *bound]) || *bound < 0.0 {
                (Fails, "measured value or bound not finite".into())
            } else if *measured > (1.0 + tol) * bound {
                (
                    Fails,
                    format!("violated: measured/bound = {:.3}", measured / bound),
                )
            } else if *measured <= 0.0 || bound / measured > *slack {
                (Loose, format!("slack ×{:.3}", bound / measured))
            } else {
                (Holds, format!("slack ×{:.3}", bound / measured))
            }
        }
        (Test::Rate { claimed, tol }, Measure::Rate(e)) => {
            if !e.is_finite() {
                (Fails, "exponent not finite".into())
            } else if *e > claimed + tol {
                (
                    Fails,
                    format!(
                        "exponent {e:.3} exceeds the bound's {claimed} by {:.3}",
                        e - claimed
                    ),
                )
            } else if *e < claimed - tol {
                (
                    Loose,
                    format!("slack grows like x^{:.2} (exponent {e:.3})", claimed - e),
                )
            } else {
                (Holds, format!("exponent {e:.3}"))
            }
        }
        (Test::Share { min_share }, Measure::Share { hits, total }) => {
            if *total == 0 {
                (NotTestable, "no points to test".into())
            } else {
                let s = *hits as f64 / *total as f64;
                if s >= *min_share {
                    (Holds, format!("{hits}/{total}"))
                } else {
                    (
                        Fails,
                        format!(
                            "{hits}/{total}: short of {min_share} by {:.3}",
                            min_share - s
                        ),
                    )
                }
            }
        }
        (Test::Margin { z }, Measure::Margin { diff, se }) => {
            if nonfinite(&[*diff, *se]) {
                (Fails, "difference or standard error not finite".into())
            } else if *diff > z * se {
                (
                    Holds,
                    format!("{diff:.3e} = {:.1} standard errors", diff / se.max(1e-300)),
                )
            } else {
                (
                    Fails,
                    format!(
                        "{diff:.3e} is {:.1} standard errors, not > {z}",
                        diff / se.max(1e-300)
                    ),
                )
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

/// One claim as stated in `experiments/claims.toml`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimSpec {
    pub claim: String,
    pub source: String,
    pub quantity: String,
    pub test: Test,
    pub holds: String,
    #[serde(default)]
    pub loose: Option<String>,
    pub fails: String,
    #[serde(default)]
    pub not_testable: Option<String>,
}

/// Every stated claim, by id.
pub fn specs() -> Result<&'static BTreeMap<String, ClaimSpec>> {
    static SPECS: OnceLock<std::result::Result<BTreeMap<String, ClaimSpec>, String>> =
        OnceLock::new();
    SPECS
        .get_or_init(|| {
            toml::from_str(include_str!("../../experiments/claims.toml")).map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| RaceError::Config {
            path: "experiments/claims.toml (built in)".into(),
            msg: e.clone(),
        })
}

/// One row of REPORT.md.
#[derive(Debug, Clone, Serialize)]
pub struct Claim {
    pub id: String,
    pub claim: String,
    pub source: String,
    pub quantity: String,
    pub threshold: String,
    pub measured: String,
    pub verdict: Verdict,
    /// The slack, margin or reason behind the verdict.
    pub detail: String,
    /// What this verdict means for this claim (from the TOML).
    pub meaning: String,
    pub note: String,
}

impl Claim {
    /// Judge claim `id` (a `-real` suffix shares the base claim's statement) on `m`.
    pub fn judged(id: &str, measured: String, m: Measure, note: impl Into<String>) -> Result<Self> {
        let specs = specs()?;
        let base = id.strip_suffix("-real").unwrap_or(id);
        let spec = specs
            .get(id)
            .or_else(|| specs.get(base))
            .ok_or_else(|| RaceError::Config {
                path: "experiments/claims.toml (built in)".into(),
                msg: format!("claim `{id}` is measured but not stated"),
            })?;
        let (verdict, detail) = judge(&spec.test, &m)?;
        let meaning = match verdict {
            Verdict::Holds => spec.holds.clone(),
            Verdict::Loose => spec.loose.clone().unwrap_or_else(|| spec.holds.clone()),
            Verdict::Fails => spec.fails.clone(),
            Verdict::NotTestable => spec.not_testable.clone().unwrap_or_default(),
        };
        Ok(Claim {
            id: id.into(),
            claim: spec.claim.clone(),
            source: spec.source.clone(),
            quantity: spec.quantity.clone(),
            threshold: spec.test.describe(),
            measured,
            verdict,
            detail,
            meaning,
            note: note.into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(t: &Test, m: Measure) -> Verdict {
        judge(t, &m).unwrap().0
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
        assert_eq!(v(&t, Measure::Values(vec![f64::NAN])), Verdict::Fails);
        assert_eq!(v(&t, Measure::Values(vec![])), Verdict::Fails);
        let lower = Test::Range {
            min: Some(0.627),
            max: None,
        };
        assert_eq!(v(&lower, Measure::value(0.75)), Verdict::Holds);
        assert_eq!(v(&lower, Measure::value(0.59)), Verdict::Fails);
    }

    #[test]
    fn bound_separates_violated_from_loose() {
        let t = Test::Bound {
            slack: 2.0,
            tol: 0.0,
        };
        let b = |measured, bound| v(&t, Measure::Bound { measured, bound });
        assert_eq!(b(0.9, 1.0), Verdict::Holds);
        assert_eq!(b(0.0156, 1.0), Verdict::Loose);
        assert_eq!(b(1.2, 1.0), Verdict::Fails);
        assert_eq!(b(f64::INFINITY, 1.0), Verdict::Fails);
        let (_, detail) = judge(
            &t,
            &Measure::Bound {
                measured: 0.25,
                bound: 1.0,
            },
        )
        .unwrap();
        assert!(detail.contains("×4"), "{detail}");
    }

    #[test]
    fn rate_separates_violated_from_loose() {
        let t = Test::Rate {
            claimed: -1.0,
            tol: 0.2,
        };
        assert_eq!(v(&t, Measure::Rate(-1.05)), Verdict::Holds);
        assert_eq!(v(&t, Measure::Rate(-2.0)), Verdict::Loose);
        assert_eq!(v(&t, Measure::Rate(-0.08)), Verdict::Fails);
        assert_eq!(v(&t, Measure::Rate(f64::NAN)), Verdict::Fails);
    }

    #[test]
    fn share_can_hold_and_fail() {
        let t = Test::Share { min_share: 0.9 };
        let s = |hits, total| v(&t, Measure::Share { hits, total });
        assert_eq!(s(95, 100), Verdict::Holds);
        assert_eq!(s(50, 100), Verdict::Fails);
        assert_eq!(s(0, 0), Verdict::NotTestable);
    }

    #[test]
    fn margin_needs_more_than_z_standard_errors() {
        let t = Test::Margin { z: 2.0 };
        let m = |diff, se| v(&t, Measure::Margin { diff, se });
        assert_eq!(m(0.3, 0.1), Verdict::Holds);
        assert_eq!(m(0.15, 0.1), Verdict::Fails);
        assert_eq!(m(-0.5, 0.1), Verdict::Fails);
        assert_eq!(m(0.3, f64::NAN), Verdict::Fails);
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
            if matches!(s.test, Test::Bound { .. } | Test::Rate { .. }) {
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
