//! Hyper-parameters of the RACE estimators, validated in one place.
//!
//! `P ≥ 1` bits per table (`R = 2^P` buckets, `P ≤ 20` so the bucket bank fits), `L ≥ 1`
//! tables, `beta > 0` finite.

use crate::error::{RaceError, Result};
use serde::{Deserialize, Serialize};

/// Largest P accepted: 2^20 buckets per table already means megabytes of state per table.
pub const MAX_P: usize = 20;

/// How tables are combined (`proofs-notes/combine-rules.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Combine {
    /// Paper, Algorithm 1: ratio of table-averaged numerator and denominator.
    #[default]
    Paper,
    /// Authors' released code: per-bucket means `B/(A+1e-6)`, summed over tables.
    Authors,
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
/// kernel timings of `tradeoff`). Below [`crate::cpu::features::PROJ_F64_BETA`] the kernels'
/// cost does not depend on β.
pub const DEFAULT_BETA: f64 = 10.0;

/// RACE hyper-parameters, carried as one value from the command line to every backend
/// ([`crate::backend::Backend`]). The planes travel beside them (given, or drawn from a seed
/// by the caller: [`crate::method::PlaneSpec`]), so there is no seed here.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RaceParams {
    /// Bits per table (`R = 2^P` buckets).
    pub p: usize,
    /// Tables.
    pub l: usize,
    /// Soft-hash inverse temperature.
    pub beta: f64,
    /// How the tables are combined.
    pub combine: Combine,
    /// Algorithm 2 (each query sees the keys at or before it) instead of Algorithm 1.
    pub causal: bool,
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
    pub fn new(p: usize, l: usize, beta: f64) -> Result<Self> {
        let s = RaceParams {
            p,
            l,
            beta,
            ..Default::default()
        };
        s.validate()?;
        Ok(s)
    }
    /// `R = 2^P`.
    pub fn r(&self) -> usize {
        1 << self.p
    }
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
