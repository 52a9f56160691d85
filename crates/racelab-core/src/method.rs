//! The operators racelab computes, each with its own options ([`Method`]), so that no option
//! reaches a method that would ignore it.
//!
//! - exact softmax `softmax(s·QKᵀ)V` (`s` defaults to `1/√d`) and exact angular attention
//!   `(1 − θ/π)^γ` weights: quadratic;
//! - hard LSH and soft RACE on `L` tables of `P` planes ([`PlaneSpec`]: drawn from a seed, or
//!   given, and then there is no seed);
//! - linear attention (`elu + 1` features) and Performer (`m` positive random features
//!   [`FeatureSpec`], logit scale `s`).
//!
//! [`MethodKind`] names a method without its options (the command line's `--method`, the
//! records' `method` field).

#![deny(missing_docs)]

use crate::error::{RaceError, Result};
use crate::hashing::Planes;
use crate::params::{validate_beta, validate_gamma, validate_pl, Combine, RaceParams};
use crate::params::{Beta, Bits, Seed, Tables};
use crate::rng::{stream, SeededRng};
use crate::tensor::Mat;
use serde::Serialize;

/// A method's name, without its options.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MethodKind {
    /// Exact softmax attention (quadratic).
    Softmax,
    /// Exact angular attention (quadratic).
    Angular,
    /// Hard LSH: keys in the query's bucket, averaged over tables.
    Hard,
    /// Soft RACE (Algorithm 1; causal: Algorithm 2).
    Soft,
    /// Linear attention with `elu(x) + 1` features.
    Linear,
    /// Performer with positive random features.
    Performer,
}

impl MethodKind {
    /// Every method, in the order the records list them.
    pub const ALL: [MethodKind; 6] = [
        MethodKind::Softmax,
        MethodKind::Angular,
        MethodKind::Hard,
        MethodKind::Soft,
        MethodKind::Linear,
        MethodKind::Performer,
    ];

    /// The lowercase name (`--method`, the records).
    pub fn name(&self) -> &'static str {
        match self {
            MethodKind::Softmax => "softmax",
            MethodKind::Angular => "angular",
            MethodKind::Hard => "hard",
            MethodKind::Soft => "soft",
            MethodKind::Linear => "linear",
            MethodKind::Performer => "performer",
        }
    }

    /// One line on what the method computes (`--help`).
    pub fn about(&self) -> &'static str {
        match self {
            MethodKind::Softmax => "Exact softmax attention (quadratic)",
            MethodKind::Angular => "Exact angular attention (quadratic)",
            MethodKind::Hard => "Hard LSH: keys in the query's bucket, averaged over tables",
            MethodKind::Soft => "Soft RACE (Algorithm 1; causal: Algorithm 2)",
            MethodKind::Linear => "Linear attention with `elu(x) + 1` features",
            MethodKind::Performer => "Performer with positive random features",
        }
    }

    /// Whether the method hashes with planes.
    pub fn uses_planes(&self) -> bool {
        matches!(self, MethodKind::Hard | MethodKind::Soft)
    }

    /// Whether the method forms an `N × M` score matrix per head.
    pub fn quadratic(&self) -> bool {
        matches!(self, MethodKind::Softmax | MethodKind::Angular)
    }
}

/// The flat options of a command line or a keyword call (every method's, as flags come),
/// which [`MethodKind::with`] maps onto one typed [`Method`].
#[derive(Debug, Clone, PartialEq)]
pub struct Flags {
    /// `--p`: bits per table.
    pub p: usize,
    /// `--l`: tables.
    pub l: usize,
    /// `--beta`: the soft-hash inverse temperature.
    pub beta: f64,
    /// `--combine`: how soft RACE combines its tables.
    pub combine: Combine,
    /// `--gamma`: the angular power.
    pub gamma: f64,
    /// `--scale`: the logit scale (softmax, Performer; `None`: `1/√d`).
    pub scale: Option<f64>,
    /// `--features`: Performer's `m`.
    pub features: usize,
    /// Planes to use instead of drawing them from `seed`.
    pub planes: Option<Planes>,
    /// Seed of drawn planes and Performer features.
    pub seed: u64,
}

impl MethodKind {
    /// This method with its own options taken from `f`.
    pub fn with(self, f: &Flags) -> Method {
        let planes = || match &f.planes {
            Some(w) => PlaneSpec::Given(w.clone()),
            None => PlaneSpec::Draw {
                p: f.p,
                l: f.l,
                seed: f.seed,
            },
        };
        match self {
            MethodKind::Softmax => Method::Softmax { scale: f.scale },
            MethodKind::Angular => Method::Angular { gamma: f.gamma },
            MethodKind::Hard => Method::Hard { planes: planes() },
            MethodKind::Soft => Method::Soft {
                planes: planes(),
                beta: f.beta,
                combine: f.combine,
            },
            MethodKind::Linear => Method::Linear,
            MethodKind::Performer => Method::Performer {
                features: FeatureSpec::Draw {
                    m: f.features,
                    seed: f.seed,
                },
                scale: f.scale,
            },
        }
    }
}

impl std::str::FromStr for MethodKind {
    type Err = RaceError;
    fn from_str(s: &str) -> Result<Self> {
        MethodKind::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| {
                RaceError::param(
                    "method",
                    format!(
                        "`{s}` is not a method; use softmax|angular|hard|soft|linear|performer"
                    ),
                )
            })
    }
}

/// Where the hash planes come from: drawn (`[L, P, d]` i.i.d. N(0, 1) from `seed`, `d` from
/// the inputs), or given, and then their own `L`, `P`, `d` hold and there is no seed.
#[derive(Debug, Clone, PartialEq)]
pub enum PlaneSpec {
    /// `[L, P, d]` i.i.d. N(0, 1) drawn from `seed` (stream `PLANES`).
    Draw {
        /// Bits per table.
        p: usize,
        /// Tables.
        l: usize,
        /// The draw's seed.
        seed: u64,
    },
    /// Given planes (their own `L`, `P`, `d`).
    Given(Planes),
}

impl PlaneSpec {
    /// `(P, L)`.
    pub fn pl(&self) -> (usize, usize) {
        match self {
            PlaneSpec::Draw { p, l, .. } => (*p, *l),
            PlaneSpec::Given(w) => (w.p, w.l),
        }
    }

    /// P and L in range; given planes' `d` equal to the inputs' `d`.
    pub fn check(&self, d: Option<usize>) -> Result<()> {
        let (p, l) = self.pl();
        validate_pl(p, l)?;
        match (self, d) {
            (PlaneSpec::Given(w), Some(d)) => w.check(d, w.p, w.l),
            _ => Ok(()),
        }
    }

    /// The planes for inputs of dimension `d`.
    pub fn resolve(&self, d: usize) -> Result<Planes> {
        self.check(Some(d))?;
        match self {
            PlaneSpec::Draw { p, l, seed } => {
                Planes::gaussian(Bits(*p), Tables(*l), d, Seed(*seed))
            }
            PlaneSpec::Given(w) => Ok(w.clone()),
        }
    }
}

/// Where the Performer's random features `ω` (`m × d`) come from.
#[derive(Debug, Clone, PartialEq)]
pub enum FeatureSpec {
    /// `m × d` i.i.d. N(0, 1) drawn from `seed` (stream `PERFORMER`).
    Draw {
        /// The feature count.
        m: usize,
        /// The draw's seed.
        seed: u64,
    },
    /// Given features `ω` (`m × d`).
    Given(Mat<f64>),
}

impl FeatureSpec {
    /// The feature count `m`.
    pub fn count(&self) -> usize {
        match self {
            FeatureSpec::Draw { m, .. } => *m,
            FeatureSpec::Given(w) => w.rows,
        }
    }

    /// `m ≥ 1`; given features finite (as given planes must be), of the inputs' `d`.
    pub fn check(&self, d: Option<usize>) -> Result<()> {
        if self.count() == 0 {
            return Err(RaceError::param(
                "features",
                format!(
                    "Performer needs m ≥ 1 random features; use {}, say",
                    crate::error::setting("features", 256)
                ),
            ));
        }
        if let FeatureSpec::Given(w) = self {
            crate::tensor::check_finite("omega", &w.data)?;
        }
        if let (FeatureSpec::Given(w), Some(d)) = (self, d) {
            if w.cols != d {
                return Err(RaceError::shape(
                    "omega",
                    format!(
                        "Performer features have d = {} but q/k have d = {d}",
                        w.cols
                    ),
                ));
            }
        }
        Ok(())
    }

    /// `ω` for inputs of dimension `d`.
    pub fn resolve(&self, d: usize) -> Result<Mat<f64>> {
        self.check(Some(d))?;
        Ok(match self {
            FeatureSpec::Draw { m, seed } => performer_omega(*m, d, *seed),
            FeatureSpec::Given(w) => w.clone(),
        })
    }
}

/// The Performer's `ω`: `m × d` i.i.d. N(0, 1) from the seeded generator (stream
/// `PERFORMER`).
pub fn performer_omega(m: usize, d: usize, seed: u64) -> Mat<f64> {
    let mut rng = SeededRng::new(seed, stream::PERFORMER);
    Mat::from_vec(m, d, rng.normals(m * d))
}

/// One operator and its own options.
#[derive(Debug, Clone, PartialEq)]
pub enum Method {
    /// Exact softmax; `scale` multiplies the logits (`None`: `1/√d`).
    Softmax {
        /// Multiplies the logits (`None`: `1/√d`).
        scale: Option<f64>,
    },
    /// Exact angular attention with weights `(1 − θ/π)^γ`.
    Angular {
        /// The power `γ`.
        gamma: f64,
    },
    /// Hard LSH on `planes`.
    Hard {
        /// The planes.
        planes: PlaneSpec,
    },
    /// Soft RACE on `planes` at inverse temperature `beta`, tables combined by `combine`.
    Soft {
        /// The planes.
        planes: PlaneSpec,
        /// The inverse temperature `β`.
        beta: f64,
        /// How the tables are combined.
        combine: Combine,
    },
    /// Linear attention.
    Linear,
    /// Performer with `features`; `scale` multiplies the logits (`None`: `1/√d`).
    Performer {
        /// The random features `ω`.
        features: FeatureSpec,
        /// Multiplies the logits (`None`: `1/√d`).
        scale: Option<f64>,
    },
}

impl Method {
    /// Soft RACE at `(P, L, β)` on planes drawn from `seed`, the paper's combine rule.
    pub fn soft(bits: Bits, tables: Tables, beta: Beta, seed: Seed) -> Self {
        Method::Soft {
            planes: PlaneSpec::Draw {
                p: bits.0,
                l: tables.0,
                seed: seed.0,
            },
            beta: beta.0,
            combine: Combine::Paper,
        }
    }

    /// The method without its options.
    pub fn kind(&self) -> MethodKind {
        match self {
            Method::Softmax { .. } => MethodKind::Softmax,
            Method::Angular { .. } => MethodKind::Angular,
            Method::Hard { .. } => MethodKind::Hard,
            Method::Soft { .. } => MethodKind::Soft,
            Method::Linear => MethodKind::Linear,
            Method::Performer { .. } => MethodKind::Performer,
        }
    }

    /// The lowercase name (`--method`, the records).
    pub fn name(&self) -> &'static str {
        self.kind().name()
    }

    /// The planes, for the hashing methods.
    pub fn planes(&self) -> Option<&PlaneSpec> {
        match self {
            Method::Hard { planes } | Method::Soft { planes, .. } => Some(planes),
            _ => None,
        }
    }

    /// The soft-RACE parameters (soft RACE only).
    pub fn race_params(&self, causal: bool) -> Option<RaceParams> {
        match self {
            Method::Soft {
                planes,
                beta,
                combine,
            } => {
                let (p, l) = planes.pl();
                Some(RaceParams {
                    p,
                    l,
                    beta: *beta,
                    combine: *combine,
                    causal,
                })
            }
            _ => None,
        }
    }

    /// Features per token (`L·2^P` for the hashing methods, in [`crate::memory::Work`]'s
    /// terms: `(p, l, map_features)`).
    pub fn work_terms(&self, d: usize) -> (usize, usize, usize) {
        match self {
            Method::Hard { planes } | Method::Soft { planes, .. } => {
                let (p, l) = planes.pl();
                (p, l, 0)
            }
            Method::Linear => (0, 1, d),
            Method::Performer { features, .. } => (0, 1, features.count()),
            _ => (0, 1, 0),
        }
    }

    /// Every option in its range, and, when the inputs' `d` is known, given planes and
    /// features of that `d`.
    pub fn check(&self, d: Option<usize>) -> Result<()> {
        match self {
            Method::Softmax { scale } => check_scale(*scale),
            Method::Angular { gamma } => validate_gamma(*gamma),
            Method::Hard { planes } => planes.check(d),
            Method::Soft { planes, beta, .. } => {
                planes.check(d)?;
                validate_beta(*beta)
            }
            Method::Linear => Ok(()),
            Method::Performer { features, scale } => {
                features.check(d)?;
                check_scale(*scale)
            }
        }
    }
}

/// A logit scale: `None` or finite and `> 0`.
fn check_scale(scale: Option<f64>) -> Result<()> {
    scale.map_or(Ok(()), crate::params::validate_scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_method_refuses_its_own_bad_options() {
        let bad = [
            (Method::Softmax { scale: Some(-1.0) }, "scale"),
            (Method::Angular { gamma: 0.0 }, "gamma"),
            (Method::soft(Bits(0), Tables(2), Beta(1.0), Seed(0)), "p"),
            (Method::soft(Bits(2), Tables(0), Beta(1.0), Seed(0)), "l"),
            (
                Method::soft(Bits(2), Tables(2), Beta(f64::NAN), Seed(0)),
                "beta",
            ),
            (
                Method::Performer {
                    features: FeatureSpec::Draw { m: 0, seed: 0 },
                    scale: None,
                },
                "features",
            ),
            (
                Method::Performer {
                    features: FeatureSpec::Draw { m: 4, seed: 0 },
                    scale: Some(f64::INFINITY),
                },
                "scale",
            ),
        ];
        for (m, arg) in bad {
            let e = m.check(None).unwrap_err().to_string();
            assert!(e.contains(arg), "{m:?}: {e}");
        }
        assert!(Method::soft(Bits(2), Tables(2), Beta(1.0), Seed(0))
            .check(Some(8))
            .is_ok());
        assert!(Method::Linear.check(None).is_ok());
    }

    #[test]
    fn given_planes_carry_no_seed_and_must_match_d() {
        let w = Planes::gaussian(Bits(2), Tables(3), 4, Seed(9)).unwrap();
        let m = Method::Hard {
            planes: PlaneSpec::Given(w.clone()),
        };
        assert_eq!(m.planes().unwrap().pl(), (2, 3));
        assert_eq!(m.planes().unwrap().resolve(4).unwrap(), w);
        assert!(m.check(Some(5)).unwrap_err().to_string().contains("planes"));
    }

    #[test]
    fn kinds_round_trip_through_their_names() {
        for k in MethodKind::ALL {
            assert_eq!(k.name().parse::<MethodKind>().unwrap(), k);
        }
        assert!("nope".parse::<MethodKind>().is_err());
    }
}
