//! The verdict functions' unit tests: every family can hold and fail.

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
            margin(0.025),
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

fn margin(alpha: f64) -> Test {
    Test::Margin {
        alpha,
        min_effect: 0.01,
    }
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
    let t = margin(0.025);
    let m = |diff, se, n| v(&t, Measure::Margin(Cmp::of_mean("", diff, se, n)));
    // t_{0.975, 2} = 4.30: 3 standard errors hold with 20 samples, not with 3.
    assert_eq!(m(0.3, 0.1, 20), Verdict::Holds);
    assert_eq!(m(0.3, 0.1, 3), Verdict::NotTestable);
    assert_eq!(m(0.5, 0.1, 3), Verdict::Holds);
    // Shown below the minimum effect 0.01: the opposite is shown.
    assert_eq!(m(-0.5, 0.1, 20), Verdict::Fails);
    assert_eq!(m(0.002, 0.001, 20), Verdict::Fails);
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
    // Welch: equal standard errors over 8 samples each give 14 degrees of freedom.
    let w = Cmp::welch("", 0.1, (0.02, 8), (0.02, 8));
    assert!((w.df - 14.0).abs() < 1e-12 && (w.se - 0.02 * 2f64.sqrt()).abs() < 1e-15);
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
    let t = Test::Margins {
        alpha: 0.05,
        min_effect: 0.01,
    };
    // Nothing survives, and not every comparison is shown below the minimum effect: the
    // comparisons are too noisy to say "fails".
    let j = judge(&t, &Measure::Margins(cs.clone())).unwrap();
    assert_eq!(j.verdict, Verdict::NotTestable, "{}", j.detail);
    assert!(j.detail.contains("underpowered"), "{}", j.detail);
    assert!(j.correction.unwrap().contains("35"));
    assert_eq!(
        v(&margin(0.05), Measure::Margin(cs[34].clone())),
        Verdict::Holds
    );
    // Every comparison shown below the minimum effect: fails.
    let below: Vec<Cmp> = (0..10)
        .map(|i| Cmp::of_mean(format!("pair {i}"), -0.01 + 0.001 * i as f64, 0.001, 8))
        .collect();
    assert_eq!(v(&t, Measure::Margins(below.clone())), Verdict::Fails);
    // One comparison left undecided is enough to withhold "fails".
    let mut open = below;
    open.push(Cmp::of_mean("open", 0.005, 0.004, 8));
    assert_eq!(v(&t, Measure::Margins(open)), Verdict::NotTestable);
    // A strong effect survives the correction.
    cs.push(Cmp::of_mean("strong", 0.1, 0.01, 8));
    assert_eq!(v(&t, Measure::Margins(cs)), Verdict::Holds);
    assert_eq!(holm(&[0.01, 0.04, 0.03], 0.05), vec![true, false, false]);
    assert_eq!(holm(&[0.01, 0.02, 0.024], 0.05), vec![true, true, true]);
}

/// A difference that is not significant is never "fails" by itself: it is underpowered,
/// inconclusive, or shown below the minimum effect.
#[test]
fn a_not_significant_margin_is_not_fails() {
    let t = margin(0.025);
    let j = |diff, se, n| judge(&t, &Measure::Margin(Cmp::of_mean("", diff, se, n))).unwrap();
    // RACE ahead by 0.3 standard errors at 8 seeds, effect 0.01 = 2 standard errors: power
    // far below 0.8.
    let a = j(0.0015, 0.005, 8);
    assert_eq!(a.verdict, Verdict::NotTestable);
    assert!(a.detail.contains("underpowered (power"), "{}", a.detail);
    // Enough power (effect = 3 standard errors, 20 samples) but the difference sits between
    // 0 and the effect, neither shown: inconclusive.
    let t3 = Test::Margin {
        alpha: 0.025,
        min_effect: 0.3,
    };
    let b = judge(&t3, &Measure::Margin(Cmp::of_mean("", 0.15, 0.1, 20))).unwrap();
    assert_eq!(b.verdict, Verdict::NotTestable);
    assert!(b.detail.contains("inconclusive"), "{}", b.detail);
    // The power at the effect: 1 − F(t_crit − e/se); at e/se = t_crit it is one half.
    let c = Cmp::of_mean("", 0.0, 0.1, 20);
    assert!((power(&c, 0.1 * t_critical(0.025, 19.0), 0.025) - 0.5).abs() < 1e-12);
}

#[test]
fn a_share_of_margins_fails_only_where_enough_comparisons_are_shown_short() {
    let t = Test::ShareMargins {
        alpha: 0.05,
        min_effect: 0.01,
        min_share: 0.75,
    };
    let cmp = |diff, se| Cmp::welch("", diff, (se, 32), (se, 32));
    // Twelve clear wins.
    let wins: Vec<Cmp> = (0..12).map(|_| cmp(0.1, 0.005)).collect();
    assert_eq!(v(&t, Measure::Margins(wins.clone())), Verdict::Holds);
    // Half the sizes tied, shown below the minimum effect with small standard errors.
    let mut tied = wins[..6].to_vec();
    tied.extend((0..6).map(|_| cmp(0.0005, 0.0005)));
    let j = judge(&t, &Measure::Margins(tied)).unwrap();
    assert_eq!(j.verdict, Verdict::Fails, "{}", j.detail);
    assert!(j.detail.contains("6/12 shown below"), "{}", j.detail);
    // Small but significant wins below the minimum effect count as wins, once: the counts
    // partition the comparisons.
    let small: Vec<Cmp> = (0..12).map(|_| cmp(0.005, 0.0005)).collect();
    let j = judge(&t, &Measure::Margins(small)).unwrap();
    assert_eq!(j.verdict, Verdict::Holds, "{}", j.detail);
    assert!(
        j.detail
            .starts_with("12/12 significant wins, 0/12 shown below"),
        "{}",
        j.detail
    );
    assert!(j.detail.contains(", 0 undecided"), "{}", j.detail);
    // Half the sizes tied but noisy: neither shown, underpowered, not fails.
    let mut noisy = wins[..6].to_vec();
    noisy.extend((0..6).map(|_| cmp(0.002, 0.004)));
    let j = judge(&t, &Measure::Margins(noisy)).unwrap();
    assert_eq!(j.verdict, Verdict::NotTestable, "{}", j.detail);
    assert!(j.detail.contains("underpowered"), "{}", j.detail);
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
    let mixed = replicate(&[mk(0, 0.5), mk(1, -0.5), mk(2, 0.7)]).unwrap();
    assert_eq!(mixed.verdict, Verdict::Unstable { holds: 2, total: 3 });
    assert_eq!(mixed.verdict.text(), "unstable (2/3 hold)");
    assert!(mixed.detail.contains("seed 1: fails"), "{}", mixed.detail);
    assert_eq!(crate::experiments::report::seeds_agree(&mixed), 2);
    assert_eq!(crate::experiments::report::seeds_agree(&same), 3);
    // Values near the threshold are borderline.
    let near = replicate(&[mk(0, 0.2), mk(1, 0.25), mk(2, 0.3)]).unwrap();
    assert!(near.borderline, "{:?}", near.value);
    assert!(!near.seed_invariant);
    // The same value at every seed is one input, not three.
    let fixed = replicate(&[mk(0, 0.5), mk(1, 0.5), mk(2, 0.5)]).unwrap();
    assert!(fixed.seed_invariant);
    assert!(fixed.detail.starts_with("1 input"), "{}", fixed.detail);
}

#[test]
fn a_loose_seed_counts_as_a_held_bound() {
    let mk = |seed, measured| {
        Claim::judged(
            "variance-n",
            String::new(),
            Measure::Bound {
                measured,
                bound: 1.0,
            },
            "",
        )
        .unwrap()
        .at_seed(seed)
    };
    // Two loose seeds and one violation: two of three held.
    let r = replicate(&[mk(0, 0.58), mk(1, 0.73), mk(2, 1.19)]).unwrap();
    assert_eq!(r.verdict, Verdict::Unstable { holds: 2, total: 3 });
    // Loose and holds mixed: every seed's bound held, loosely at some.
    let r = replicate(&[mk(0, 0.58), mk(1, 0.95), mk(2, 0.9)]).unwrap();
    assert_eq!(r.verdict, Verdict::Loose);
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
