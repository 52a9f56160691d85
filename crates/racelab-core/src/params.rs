//! Hyper-parameters of the RACE estimators, validated in one place.
//!
//! `P ≥ 1` bits per table (`R = 2^P` buckets, `P ≤ 20` so the bucket bank fits), `L ≥ 1`
//! tables, `beta > 0` finite. The counts and values of every operator's options are newtypes
//! ([`Bits`], [`Tables`], [`Beta`], [`Seed`], …), so that a swapped P and L does not compile.

#![deny(missing_docs)]

use crate::error::{RaceError, Result};
use serde::{Deserialize, Serialize};

/// Bits per table, `P` (`R = 2^P` buckets): `1 ≤ P ≤ 20`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bits(pub usize);

/// Tables, `L ≥ 1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tables(pub usize);

/// Soft-hash inverse temperature `β`: finite, `0 < β ≤ 1e307`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Beta(pub f64);

/// The seed of a random draw (hash planes, Performer features): the same seed draws the same
/// values on every machine and version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seed(pub u64);

/// A logit scale `s` (softmax, Performer): finite and > 0.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scale(pub f64);

/// The angular power `γ` (weights `(1 − θ/π)^γ`): finite and > 0.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gamma(pub f64);

/// Performer's random feature count `m ≥ 1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Features(pub usize);

/// Largest P accepted: 2^20 buckets per table already means megabytes of state per table.
pub const MAX_P: usize = 20;

/// How tables are combined (`proofs-notes/combine-rules.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Combine {
    /// Paper, Algorithm 1: ratio of table-averaged numerator and denominator.
    #[default]
    Paper,
    /// Authors' released code: per-bucket means `B/(A+1e-6)`, summed over tables.
    Authors,
}

impl Combine {
    /// Both rules, in the order the command line lists them.
    pub const ALL: [Combine; 2] = [Combine::Paper, Combine::Authors];

    /// The lowercase name (`--combine`).
    pub fn name(&self) -> &'static str {
        match self {
            Combine::Paper => "paper",
            Combine::Authors => "authors",
        }
    }

    /// One line on the rule (`--help`).
    pub fn about(&self) -> &'static str {
        match self {
            Combine::Paper => {
                "Paper, Algorithm 1: ratio of table-averaged numerator and denominator"
            }
            Combine::Authors => {
                "Authors' released code: per-bucket means `B/(A+1e-6)`, summed over tables"
            }
        }
    }
}

impl std::str::FromStr for Combine {
    type Err = RaceError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "paper" => Ok(Combine::Paper),
            "authors" => Ok(Combine::Authors),
            _ => Err(RaceError::param(
                "combine",
                format!("`{s}` is not a combine rule; use `paper` or `authors`"),
            )),
        }
    }
}

/// The soft-hash inverse temperature β used wherever none is given (`attend`, `bench`, the
/// kernel timings of `tradeoff`). Below `crate::shared::PROJ_F64_BETA` the kernels'
/// cost does not depend on β.
pub const DEFAULT_BETA: f64 = 10.0;

/// RACE hyper-parameters, carried as one value from the command line to every backend
/// ([`crate::backend::Backend`]). The planes travel beside them (given, or drawn from a seed
/// by the caller: [`crate::method::PlaneSpec`]), so there is no seed here.
///
/// Only [`RaceParams::new`] makes one (validated); causal and the combine rule are set by
/// [`RaceParams::with_causal`] and [`RaceParams::with_combine`], never by a field write:
///
/// ```compile_fail
/// use racelab_core::params::{Beta, Bits, RaceParams, Tables};
/// let mut p = RaceParams::new(Bits(2), Tables(4), Beta(10.0)).unwrap();
/// p.beta = -1.0; // the fields are private
/// ```
///
/// ```
/// use racelab_core::params::{Beta, Bits, RaceParams, Tables};
/// let p = RaceParams::new(Bits(2), Tables(4), Beta(10.0)).unwrap().with_causal(true);
/// assert!(p.causal() && p.l() == 4);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RaceParams {
    /// Bits per table (`R = 2^P` buckets).
    pub(crate) p: usize,
    /// Tables.
    pub(crate) l: usize,
    /// Soft-hash inverse temperature.
    pub(crate) beta: f64,
    /// How the tables are combined.
    pub(crate) combine: Combine,
    /// Algorithm 2 (each query sees the keys at or before it) instead of Algorithm 1.
    pub(crate) causal: bool,
}

impl Default for RaceParams {
    fn default() -> Self {
        RaceParams {
            p: 2,
            l: 2,
            beta: DEFAULT_BETA,
            combine: Combine::Paper,
            causal: false,
        }
    }
}

impl RaceParams {
    /// Validated parameters (Algorithm 1, the paper's combine rule).
    pub fn new(bits: Bits, tables: Tables, beta: Beta) -> Result<Self> {
        let (p, l, beta) = (bits.0, tables.0, beta.0);
        let s = RaceParams {
            p,
            l,
            beta,
            ..Default::default()
        };
        s.validate()?;
        Ok(s)
    }
    /// The same parameters, causal (Algorithm 2) or not (Algorithm 1).
    pub fn with_causal(self, causal: bool) -> Self {
        RaceParams { causal, ..self }
    }
    /// The same parameters with tables combined by `combine`.
    pub fn with_combine(self, combine: Combine) -> Self {
        RaceParams { combine, ..self }
    }
    /// `P`, bits per table.
    pub fn p(&self) -> usize {
        self.p
    }
    /// `L`, tables.
    pub fn l(&self) -> usize {
        self.l
    }
    /// `β`, the soft-hash inverse temperature.
    pub fn beta(&self) -> f64 {
        self.beta
    }
    /// How the tables are combined.
    pub fn combine(&self) -> Combine {
        self.combine
    }
    /// Algorithm 2 (causal) or Algorithm 1.
    pub fn causal(&self) -> bool {
        self.causal
    }
    /// `R = 2^P`.
    pub fn r(&self) -> usize {
        1 << self.p
    }
    /// `Ok` when P, L and β are in range (see [`validate_pl`], [`validate_beta`]).
    pub fn validate(&self) -> Result<()> {
        validate_pl(self.p, self.l)?;
        validate_beta(self.beta)
    }
}

/// Check P and L (shared by hard and soft estimators).
pub fn validate_pl(p: usize, l: usize) -> Result<()> {
    if p == 0 {
        return Err(RaceError::param(
            "p",
            "P = 0 bits gives one bucket; use P ≥ 1",
        ));
    }
    if p > MAX_P {
        return Err(RaceError::param(
            "p",
            format!(
                "P = {p} needs 2^{p} buckets per table, more than can be held; use P ≤ {MAX_P}"
            ),
        ));
    }
    if l == 0 {
        return Err(RaceError::param(
            "l",
            "L = 0 tables estimates nothing; use L ≥ 1",
        ));
    }
    Ok(())
}

/// `Ok` when `x` is finite and > 0, else the error naming `arg` (`arg = x; {what}`).
fn finite_positive(arg: &str, x: f64, what: &str) -> Result<()> {
    if x.is_finite() && x > 0.0 {
        Ok(())
    } else {
        Err(RaceError::param(arg, format!("{arg} = {x}; {what}")))
    }
}

/// The largest beta taken: the hash's argument `2·beta·tanh(wᵀx)` must stay finite in f64
/// (it overflows from beta = f64::MAX/2 ≈ 9e307).
pub const MAX_BETA: f64 = 1e307;

/// Check beta: finite, > 0 and at most [`MAX_BETA`].
pub fn validate_beta(beta: f64) -> Result<()> {
    finite_positive(
        "beta",
        beta,
        "the soft-hash temperature must be finite and > 0",
    )?;
    if beta > MAX_BETA {
        return Err(RaceError::param(
            "beta",
            format!("beta = {beta:e} is above {MAX_BETA:e}, where 2·beta·tanh(·) overflows f64; use beta ≤ {MAX_BETA:e}"),
        ));
    }
    Ok(())
}

/// Check a logit scale (softmax, Performer): finite and > 0.
pub fn validate_scale(scale: f64) -> Result<()> {
    finite_positive("scale", scale, "use a finite value > 0 (default 1/sqrt(d))")
}

/// Check gamma (angular power): finite and > 0.
pub fn validate_gamma(gamma: f64) -> Result<()> {
    finite_positive("gamma", gamma, "the angular power must be finite and > 0")
}
