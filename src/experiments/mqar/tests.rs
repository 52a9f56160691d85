//! The MQAR summary's unit tests: the measures on made-up summaries, each able to hold and to fail.

use super::*;
use crate::experiments::verdict::{judge, specs, Verdict};

fn row(model: &str, p: usize, l: usize, mode: &str, acc: &[f64], beta: f64) -> Vec<Summary> {
    let (accuracy, se) = mean_se(acc);
    vec![Summary {
        model: model.into(),
        p,
        l,
        m: if model == "race" { l << p } else { p },
        beta_mode: mode.into(),
        setting: String::new(),
        state: 0.0,
        seeds: acc.len(),
        accuracy,
        se,
        beta_final: beta,
        // A learned β that moved by one octave (the gate needs 0.25).
        dlog2_beta: if mode.starts_with("learned") {
            1.0
        } else {
            f64::NAN
        },
    }]
}

fn verdict(id: &str, m: &Measure) -> Verdict {
    judge(&specs().unwrap()[id].test, m).unwrap().verdict
}

#[test]
fn more_buckets_holds_only_on_a_significant_drop() {
    // (2,1) → (4,1) drops well beyond 2 se: holds.
    let mut s = row("race", 2, 1, "fixed", &[0.80, 0.82, 0.81], f64::NAN);
    s.extend(row("race", 4, 1, "fixed", &[0.60, 0.62, 0.61], f64::NAN));
    let (m, _) = more_buckets_measure(&s);
    assert_eq!(verdict("mqar-more-buckets", &m), Verdict::Holds);
    // Accuracy rising with P: fails.
    let mut s = row("race", 2, 1, "fixed", &[0.60, 0.62, 0.61], f64::NAN);
    s.extend(row("race", 4, 1, "fixed", &[0.80, 0.82, 0.81], f64::NAN));
    let (m, _) = more_buckets_measure(&s);
    assert_eq!(verdict("mqar-more-buckets", &m), Verdict::Fails);
    // A drop within the seeds' noise: neither shown, underpowered, not "fails".
    let mut s = row("race", 2, 1, "fixed", &[0.5, 0.9, 0.7], f64::NAN);
    s.extend(row("race", 4, 1, "fixed", &[0.4, 0.9, 0.6], f64::NAN));
    let (m, _) = more_buckets_measure(&s);
    let j = judge(&specs().unwrap()["mqar-more-buckets"].test, &m).unwrap();
    assert_eq!(j.verdict, Verdict::NotTestable);
    assert!(j.detail.contains("underpowered"), "{}", j.detail);
}

#[test]
fn race_vs_performer_and_learned_beta_can_fail() {
    let mut s = row("performer", 8, 0, "", &[0.9, 0.91, 0.92], f64::NAN);
    s.extend(row("race", 2, 2, "fixed", &[0.5, 0.52, 0.51], f64::NAN));
    s.extend(row("race", 2, 2, "learned", &[0.4, 0.42, 0.41], 3.0));
    let (m, _) = race_vs_performer_measure(&s);
    assert_eq!(verdict("mqar-race-vs-performer", &m), Verdict::Fails);
    let (m, _) = learned_vs_fixed_measure(&s);
    assert_eq!(verdict("mqar-learned-beta", &m), Verdict::Fails);
    // And hold when the differences go the other way.
    let mut s = row("performer", 8, 0, "", &[0.5, 0.52, 0.51], f64::NAN);
    s.extend(row("race", 2, 2, "fixed", &[0.9, 0.91, 0.92], f64::NAN));
    s.extend(row("race", 2, 2, "learned", &[0.99, 0.98, 0.99], 3.0));
    let (m, _) = race_vs_performer_measure(&s);
    assert_eq!(verdict("mqar-race-vs-performer", &m), Verdict::Holds);
    let (m, _) = learned_vs_fixed_measure(&s);
    assert_eq!(verdict("mqar-learned-beta", &m), Verdict::Holds);
}

#[test]
fn a_beta_that_training_did_not_move_or_a_nan_beta_is_not_testable() {
    let mut s = row("race", 2, 2, "fixed", &[0.5, 0.52, 0.51], f64::NAN);
    s.extend(row("race", 2, 2, "learned", &[0.9, 0.91, 0.92], 4.0));
    s.extend(row("race", 2, 2, AUTHORS, &[0.9, 0.91, 0.92], 4.0));
    s[1].dlog2_beta = 0.1;
    let (m, why) = learned_vs_fixed_measure(&s);
    assert_eq!(verdict("mqar-learned-beta", &m), Verdict::NotTestable);
    assert!(why.contains("not learned"), "{why}");
    let validated = BTreeMap::from([((2, 2), 4.0)]);
    // The picture reads the rows learned from the authors' start, which moved.
    let (m, _) = learned_beta_measure(&s, &validated);
    assert_eq!(verdict("mqar-learned-beta-picture", &m), Verdict::Holds);
    s[2].dlog2_beta = -0.2;
    let (m, why) = learned_beta_measure(&s, &validated);
    assert_eq!(
        verdict("mqar-learned-beta-picture", &m),
        Verdict::NotTestable
    );
    assert!(why.contains("learned-authors"), "{why}");
    // A NaN learned β: not testable because of the NaN, said as such.
    s[2].dlog2_beta = f64::NAN;
    s[2].beta_final = f64::NAN;
    let (m, _) = learned_beta_measure(&s, &validated);
    let j = judge(&specs().unwrap()["mqar-learned-beta-picture"].test, &m).unwrap();
    assert_eq!(j.verdict, Verdict::NotTestable);
    assert!(j.detail.contains("non-finite"), "{}", j.detail);
}

#[test]
fn learned_beta_picture_and_softmax_ceiling_can_fail() {
    let s = row("race", 2, 2, AUTHORS, &[0.9, 0.9, 0.9], 40.0);
    let validated = BTreeMap::from([((2, 2), 2.0)]);
    let (m, _) = learned_beta_measure(&s, &validated);
    assert_eq!(verdict("mqar-learned-beta-picture", &m), Verdict::Fails);
    let s = row("race", 2, 2, AUTHORS, &[0.9, 0.9, 0.9], 3.0);
    let (m, _) = learned_beta_measure(&s, &validated);
    assert_eq!(verdict("mqar-learned-beta-picture", &m), Verdict::Holds);
    let (m, _) = learned_beta_measure(&s, &BTreeMap::new());
    assert_eq!(
        verdict("mqar-learned-beta-picture", &m),
        Verdict::NotTestable
    );
    let s = row("softmax", 0, 0, "", &[0.5, 0.6, 0.55], f64::NAN);
    assert_eq!(
        verdict("mqar-softmax-ceiling", &softmax_measure(&s).0),
        Verdict::Fails
    );
    let s = row("softmax", 0, 0, "", &[1.0, 0.99, 1.0], f64::NAN);
    assert_eq!(
        verdict("mqar-softmax-ceiling", &softmax_measure(&s).0),
        Verdict::Holds
    );
}

#[test]
fn summarise_groups_seeds_and_reads_learned_betas() {
    let header: Vec<String> = [
        "model",
        "p",
        "l",
        "m_features",
        "beta_mode",
        "state_floats",
        "seed",
        "accuracy",
        "beta_start",
        "beta_final",
        "lr",
    ]
    .map(String::from)
    .to_vec();
    let rows: Vec<Vec<String>> = [
        "race,2,2,8,learned,520,0,0.5,4,4;16,0.01",
        "race,2,2,8,learned,520,1,0.7,4,8;8,0.01",
        "softmax,,,,,,0,1.0,,,0.003",
    ]
    .iter()
    .map(|r| r.split(',').map(String::from).collect())
    .collect();
    let s = summarise(&header, &rows);
    assert_eq!(s.len(), 2);
    let r = s.iter().find(|x| x.model == "race").unwrap();
    assert_eq!((r.p, r.l, r.m, r.seeds), (2, 2, 8, 2));
    assert!((r.accuracy - 0.6).abs() < 1e-12 && (r.beta_final - 9.0).abs() < 1e-12);
    // log2 moves 0, 2, 1, 1: mean 1.
    assert!((r.dlog2_beta - 1.0).abs() < 1e-12);
    assert_eq!(r.state, 520.0);
    assert_eq!(r.setting, "lr=0.01");
    let sm = s.iter().find(|x| x.model == "softmax").unwrap();
    assert_eq!((sm.state, sm.seeds), (0.0, 1));
}
