//! Claims as stated in `experiments/claims.toml` ([`ClaimSpec`]), judged into [`Claim`]s, and
//! the replication of a claim over master seeds ([`replicate`]).

use super::judge::{judge, Measure, Test, Verdict};
use crate::error::{RaceError, Result};
use crate::stats::mean_se;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::OnceLock;

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
    /// The claim in plain words, as REPORT.md's findings state it when it holds.
    #[serde(default)]
    pub finding: Option<String>,
}

/// The text of `experiments/claims.toml` built into the binary.
pub const CLAIMS_TOML: &str = include_str!("../../../experiments/claims.toml");

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

/// Where a claim's numbers come from when not from this run: a committed results file (the
/// trained MQAR models). Its verdict pools the training seeds in one test.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Committed {
    /// How the rows were made: the script, grid, seeds, revision, machine, time.
    pub text: String,
    /// The training seeds in the rows, which the verdict pools (degrees of freedom
    /// `seeds − 1`).
    pub seeds: Vec<u64>,
    /// The revision the rows were made at (the training run's, not this report's).
    pub revision: String,
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
    /// The value the verdict turns on and its threshold (see `Judgement`).
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
    pub provenance: Option<Committed>,
    /// Every master seed measured the same value: the seed does not change the quantity's
    /// inputs, so the replication is one input, not several ([`replicate`]).
    pub seed_invariant: bool,
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
            seed_invariant: false,
        })
    }

    /// The same claim, marked as read from a committed results file rather than this run.
    pub fn from_committed(mut self, provenance: Committed) -> Self {
        self.provenance = Some(provenance);
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

/// Whether a seed's verdict says the claim held: **holds**, or **loose** (a bound that held
/// with slack).
fn held(v: Verdict) -> bool {
    matches!(v, Verdict::Holds | Verdict::Loose)
}

/// One claim measured at several master seeds, merged: the common verdict where every seed
/// agrees; **loose** where every seed held but some only loosely; else **unstable (k/K
/// hold)**, a loose seed counting as one that held. The value is the mean over seeds with its
/// standard error; the claim is borderline when that mean lies within one standard error of
/// the threshold, or when any seed's verdict was borderline. The first run's measured text is
/// kept (its figures are the report's); each seed's verdict, value and detail are listed.
///
/// Where every seed measured the same value with the same verdict, the seed does not reach
/// the quantity (fixed inputs, a quadrature): the claim is marked seed-invariant and reported
/// as one input, not as a replication.
pub fn replicate(runs: &[Claim]) -> Option<Claim> {
    let first = runs.first()?;
    let mut c = first.clone();
    c.seeds = runs.iter().flat_map(|r| r.seeds.clone()).collect();
    let k = c.seeds.len();
    if k <= 1 {
        return Some(c);
    }
    let s0 = &c.seeds[0];
    if s0.value.is_some()
        && c.seeds.iter().all(|s| {
            s.verdict == s0.verdict
                && s.value.map(f64::to_bits) == s0.value.map(f64::to_bits)
                && s.detail == s0.detail
        })
    {
        c.seed_invariant = true;
        c.detail = format!(
            "1 input: the {k} master seeds measured the same value (the seed does not change this quantity's inputs); {}",
            first.detail
        );
        return Some(c);
    }
    let all_same = c.seeds.iter().all(|s| s.verdict == first.verdict);
    let holds = c.seeds.iter().filter(|s| held(s.verdict)).count();
    c.verdict = if all_same {
        first.verdict
    } else if holds == k {
        Verdict::Loose
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
    c.detail = if all_same || holds == k {
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
