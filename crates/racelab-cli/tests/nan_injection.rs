//! Nothing swallowed, experiment by experiment: each experiment runs `--quick` with
//! `RACELAB_TEST_NAN` making the measured columns of its CSVs read back as NaN, and every
//! claim judged from those columns must come out **not testable: k non-finite values**, never
//! holds, fails or another reason (a NaN folded away, filtered out of the points, or counted as
//! a miss). The claims outside this table are judged from numbers that never pass through a
//! CSV (`lemma10-beta-range`, `authors-bias-vacuous`: quadratures in memory; the timing claims
//! and `phi-factorisation`, which only `reproduce` runs; `mqar-learned-beta-picture`, whose
//! NaN path is the unit test `a_beta_that_training_did_not_move_or_a_nan_beta_is_not_testable`).
use std::process::Command;

/// (experiment, the columns made NaN as `STEM:COLUMN,…`, the claims that read them).
const CASES: &[(&str, &str, &[&str])] = &[
    ("rank", "rank:rank", &["rank-sharp", "rank-lr-loose"]),
    (
        "lemma10",
        "lemma10_counterexample:e_norm_over_n,lemma10_repair:e_norm_over_n,lemma10_repair:sufficient_holds",
        &["lemma10-counterexample", "lemma10-repair", "lemma10-sufficient"],
    ),
    (
        "limit",
        "limit:rho",
        &["limit-shared-hard", "limit-unshared-nearest"],
    ),
    (
        "bias",
        "bias:sup_bias,bias:bias_beta_over_p,bias_pair_bound:max_ratio,bias_quadrature_check:z,bias_quadrature_check:refinement_diff,bias_angles:bias",
        &[
            "bias-pair-bound",
            "bias-slope",
            "bias-interior",
            "bias-constant",
            "bias-quadrature",
            "bias-refinement",
        ],
    ),
    (
        "combine",
        "combine:err_paper,combine:paper_vs_authors_over_l",
        &["combine-different", "combine-closer"],
    ),
    (
        "fig3",
        "fig3_convergence:rel_frob_vs_limit",
        &["fig3-race-target"],
    ),
    ("variance", "variance:q50", &["variance-l", "variance-n"]),
    (
        "theorem",
        "theorem:err_cal,theorem:err_test,theorem:sampling_err,theorem_limit:limit_err,theorem_explicit:max_ratio",
        &[
            "theorem2-fit",
            "theorem2-vf",
            "theorem2-sampling",
            "theorem2-bias-rate-clustered",
            "theorem2-bias-rate-minilm",
            "theorem2-bias-rate-tied",
            "theorem2-bias-explicit",
            "theorem2-bias-form",
        ],
    ),
    (
        "causal",
        "causal_summary:sampling_err,causal_summary:causal_err,causal_summary:short_over_long_relative",
        &["causal-sampling", "causal-vs-full", "causal-short-prefix"],
    ),
    (
        "authors",
        "authors:err_vs_angular",
        &["authors-near-uniform"],
    ),
    (
        "real",
        "real_errors:err_vs_angular_p,real_errors:tanh_saturated_share",
        &["real-race-error", "real-tanh-saturation"],
    ),
    (
        "tradeoff",
        "tradeoff_tuning:validation_err_vs_softmax,tradeoff:err_vs_softmax,tradeoff_matched:race_err_vs_softmax",
        &["tradeoff-matched", "tradeoff-more-buckets"],
    ),
    (
        "mqar",
        "mqar/mqar_summary:accuracy",
        &[
            "mqar-softmax-ceiling",
            "mqar-more-buckets",
            "mqar-race-vs-performer",
            "mqar-learned-beta",
        ],
    ),
];

#[test]
fn a_nan_in_any_experiments_measured_columns_reaches_its_claims_as_not_testable() {
    let root = std::env::temp_dir().join(format!("racelab-nan-{}", std::process::id()));
    let mut wrong = Vec::new();
    for (exp, columns, ids) in CASES {
        let out = root.join(exp);
        let o = Command::new(env!("CARGO_BIN_EXE_racelab"))
            .args([exp, "--quick", "--json", "--out"])
            .arg(&out)
            .env("RACELAB_TEST_NAN", columns)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{exp}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let js: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let claims = js["claims"].as_array().expect("claims");
        for id in *ids {
            let c = claims.iter().find(|c| c["id"] == *id);
            let Some(c) = c else {
                wrong.push(format!("{exp}: no claim {id}"));
                continue;
            };
            let (v, d) = (
                c["verdict"].as_str().unwrap_or(""),
                c["detail"].as_str().unwrap_or(""),
            );
            if v != "not_testable" || !d.contains("non-finite") {
                wrong.push(format!("{exp}: {id} is {v} ({d})"));
            }
        }
    }
    std::fs::remove_dir_all(&root).ok();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The hook itself: with no NaN injected the same claims are judged on their numbers.
#[test]
fn without_the_hook_the_claims_are_judged() {
    let out = std::env::temp_dir().join(format!("racelab-nan-none-{}", std::process::id()));
    let o = Command::new(env!("CARGO_BIN_EXE_racelab"))
        .args(["rank", "--quick", "--json", "--out"])
        .arg(&out)
        .env_remove("RACELAB_TEST_NAN")
        .output()
        .unwrap();
    assert!(o.status.success());
    let js: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    for c in js["claims"].as_array().unwrap() {
        assert_ne!(c["verdict"], "not_testable", "{c}");
    }
    std::fs::remove_dir_all(&out).ok();
}
