//! The MQAR summary's unit tests: the measures on made-up summaries, each able to hold and to fail.

use super::*;
use crate::experiments::verdict::{judge, specs, Verdict};
use crate::stats::mean_se;

fn row(model: &str, p: usize, l: usize, mode: &str, acc: &[f64], beta: f64) -> Vec<Summary> {
    let (accuracy, se) = mean_se(acc);
    vec![Summary {
        model: model.into(),
        p,
        l,
        m: if model == "race" { l << p } else { p },
        beta_mode: mode.into(),
        setting: String::new(),
        edge: String::new(),
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
        beta_layers: if model == "race" {
            vec![beta; 2]
        } else {
            vec![]
        },
        dlog2_layers: if mode.starts_with("learned") {
            vec![1.0; 2]
        } else {
            vec![]
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
    s[1].dlog2_layers = vec![0.1, -0.2];
    let (m, why) = learned_vs_fixed_measure(&s);
    assert_eq!(verdict("mqar-learned-beta", &m), Verdict::NotTestable);
    assert!(why.contains("not learned"), "{why}");
    let validated = BTreeMap::from([((2, 2), 4.0)]);
    // The picture reads the rows learned from the authors' start, which moved.
    let (m, _) = learned_beta_measure(&s, &validated);
    assert_eq!(verdict("mqar-learned-beta-picture", &m), Verdict::Holds);
    s[2].dlog2_layers = vec![-0.2, 0.1];
    let (m, why) = learned_beta_measure(&s, &validated);
    assert_eq!(
        verdict("mqar-learned-beta-picture", &m),
        Verdict::NotTestable
    );
    assert!(why.contains("learned-authors"), "{why}");
    // A NaN learned β: not testable because of the NaN, said as such.
    s[2].dlog2_layers = vec![f64::NAN, 1.0];
    s[2].beta_layers = vec![f64::NAN, 4.0];
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

#[test]
fn the_learned_beta_picture_is_per_layer_and_says_which_layers_it_covers() {
    // The first layer lands on the validated β, the second 8 times below it: the layer mean
    // (log2 ratio −1) would hold, the per-layer picture fails on layer 1.
    let mut s = row("race", 3, 4, AUTHORS, &[0.8, 0.8, 0.8], 2.0);
    s[0].beta_layers = vec![2.0, 0.25];
    let validated = BTreeMap::from([((3, 4), 2.0)]);
    let (m, text) = learned_beta_measure(&s, &validated);
    assert_eq!(m, Measure::Values(vec![0.0, -3.0]));
    assert_eq!(verdict("mqar-learned-beta-picture", &m), Verdict::Fails);
    assert!(
        text.starts_with("covers (3,4) layer 0, (3,4) layer 1:"),
        "{text}"
    );
    // A layer whose β did not move is left out and named; the other decides.
    s[0].dlog2_layers = vec![3.0, 0.1];
    let (m, text) = learned_beta_measure(&s, &validated);
    assert_eq!(m, Measure::Values(vec![0.0]));
    assert_eq!(verdict("mqar-learned-beta-picture", &m), Verdict::Holds);
    assert!(
        text.contains("left out (β did not move): (3,4) layer 1"),
        "{text}"
    );
}

const FIXTURE: &str = include_str!("../../../tests/data/mqar_small.csv");

/// The committed fixture `tests/data/mqar_small.csv`: two seeds of a two-layer soft RACE
/// learned from 1/√d_head whose layers end far apart, a Performer tuned on its grid's edge.
fn fixture() -> Vec<Summary> {
    let (header, rows) = split_csv(FIXTURE);
    summarise(&header, &rows)
}

#[test]
fn the_per_layer_picture_of_a_small_committed_csv() {
    let s = fixture();
    let r = s.iter().find(|x| x.beta_mode == AUTHORS).unwrap();
    // Layer 0 ends at 4 and 16 (geometric mean 8), layer 1 at 0.5 and 0.5; from 0.125.
    assert_eq!(r.beta_layers.len(), 2);
    assert!((r.beta_layers[0] - 8.0).abs() < 1e-12 && (r.beta_layers[1] - 0.5).abs() < 1e-12);
    assert!((r.dlog2_layers[0] - 6.0).abs() < 1e-12 && (r.dlog2_layers[1] - 2.0).abs() < 1e-12);
    let validated = BTreeMap::from([((3, 4), 2.0)]);
    let (m, text) = learned_beta_measure(&s, &validated);
    // log2(8/2) = 2 (inside ±2), log2(0.5/2) = −2 (inside): holds, both layers covered.
    assert_eq!(m, Measure::Values(vec![2.0, -2.0]));
    assert!(
        text.contains("(3,4) layer 0") && text.contains("(3,4) layer 1"),
        "{text}"
    );
    assert_eq!(verdict("mqar-learned-beta-picture", &m), Verdict::Holds);
    // Validated at 0.5 instead, layer 0 lands 16 times above it: fails.
    let (m, _) = learned_beta_measure(&s, &BTreeMap::from([((3, 4), 0.5)]));
    assert_eq!(verdict("mqar-learned-beta-picture", &m), Verdict::Fails);
}

#[test]
fn a_setting_on_its_grids_edge_is_reported() {
    let s = fixture();
    assert_eq!(
        tuning_edges(&s),
        vec!["performer m=8 (scale low)".to_string()]
    );
    let p = s.iter().find(|x| x.model == "performer").unwrap();
    assert_eq!(p.setting, "lr=0.01 scale=0.125");
    // Interior everywhere: nothing reported.
    let mut t = s.clone();
    t.iter_mut().for_each(|x| x.edge.clear());
    assert!(tuning_edges(&t).is_empty());
}

#[test]
fn committed_rows_record_their_training_seeds_and_revision() {
    let (header, rows) = split_csv(FIXTURE);
    let meta = serde_json::json!({"grid": "full", "seeds": [3, 7], "revision": "abc123"});
    let c = committed(&header, &rows, &meta);
    assert_eq!(c.seeds, vec![3, 7]);
    assert_eq!(c.revision, "abc123");
}
