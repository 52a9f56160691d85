//! The quantities the MQAR claims judge, each from the per-model [`Summary`]s. A difference
//! counts only where a one-sided Student-t test with the seeds' degrees of freedom passes
//! (`margin`; `margins` with Holm–Bonferroni over several): for a difference of means
//! `se = sqrt(se_a² + se_b²)`, and for an average of `K` such differences `se = sqrt(Σ se²)/K`.

use super::Summary;
use crate::experiments::{verdict::Cmp, Measure};
use std::collections::BTreeMap;

/// A learned β that moved less than this (in log2) was not learned in the training budget:
/// its claims are not testable.
pub const MIN_BETA_MOVE_LOG2: f64 = 0.25;

/// The β mode learned from the authors' start `1/√d_head`.
pub const AUTHORS: &str = "learned-authors";

pub(super) fn race<'a>(s: &'a [Summary], mode: &'a str) -> impl Iterator<Item = &'a Summary> + 'a {
    s.iter()
        .filter(move |x| x.model == "race" && x.beta_mode == mode)
}

/// Softmax's mean accuracy (the ceiling the comparison needs near 1).
pub fn softmax_measure(s: &[Summary]) -> (Measure, String) {
    match s.iter().find(|x| x.model == "softmax") {
        Some(x) => (
            Measure::value(x.accuracy),
            format!(
                "softmax accuracy {:.3} ± {:.3} over {} seeds",
                x.accuracy, x.se, x.seeds
            ),
        ),
        None => (
            Measure::NotTestable("no softmax rows in mqar.csv".into()),
            "no softmax rows".into(),
        ),
    }
}

/// Every drop in accuracy from P to a larger P' at the same L (fixed β), each with its
/// standard error over seeds: the existential claim "some setting trains worse with more
/// buckets" is tested over all these comparisons with Holm–Bonferroni.
pub fn more_buckets_measure(s: &[Summary]) -> (Measure, String) {
    let fixed: Vec<&Summary> = race(s, "fixed").collect();
    let mut cmps = Vec::new();
    let mut best: Option<(f64, &Summary, &Summary)> = None;
    for a in &fixed {
        for b in &fixed {
            if a.l == b.l && b.p > a.p {
                let (diff, se) = (a.accuracy - b.accuracy, a.se.hypot(b.se));
                cmps.push(Cmp {
                    label: format!("({},{}) → ({},{})", a.p, a.l, b.p, b.l),
                    diff,
                    se,
                    df: a.seeds.min(b.seeds) as f64 - 1.0,
                });
                let z = diff / se;
                if best.is_none_or(|(bz, _, _)| z.total_cmp(&bz).is_gt()) {
                    best = Some((z, a, b));
                }
            }
        }
    }
    match best {
        Some((_, a, b)) => (
            Measure::Margins(cmps.clone()),
            format!(
                "{} pairs; the largest drop over its se, ({},{}) → ({},{}): accuracy {:.3} → {:.3} ({})",
                cmps.len(),
                a.p,
                a.l,
                b.p,
                b.l,
                a.accuracy,
                b.accuracy,
                if a.accuracy > b.accuracy { format!("a drop of {:.3}", a.accuracy - b.accuracy) } else { format!("a gain of {:.3}: no pair drops", b.accuracy - a.accuracy) }
            ),
        ),
        None => (
            Measure::NotTestable("no two fixed-β (P, L) share an L".into()),
            "no pair of P at one L".into(),
        ),
    }
}

/// The mean of `K` independent differences `(d, se)` and its standard error `sqrt(Σ se²)/K`,
/// as a comparison with the seeds' degrees of freedom (`seeds − 1`, the fewest of any term),
/// and its text: `{prefix}{parts}; mean difference … (se …)`.
fn mean_difference(
    terms: &[(f64, f64)],
    seeds: usize,
    prefix: &str,
    parts: &[String],
) -> (Measure, String) {
    let k = terms.len() as f64;
    let c = Cmp {
        label: String::new(),
        diff: terms.iter().map(|t| t.0).sum::<f64>() / k,
        se: terms.iter().map(|t| t.1 * t.1).sum::<f64>().sqrt() / k,
        df: seeds as f64 - 1.0,
    };
    let text = format!(
        "{prefix}{}; mean difference {:+.3} (se {:.3})",
        parts.join(", "),
        c.diff,
        c.se
    );
    (Measure::Margin(c), text)
}

/// Mean over matched feature counts m of (soft RACE's mean accuracy over its fixed-β (P, L)
/// with L·2^P = m) − (Performer with m features).
pub fn race_vs_performer_measure(s: &[Summary]) -> (Measure, String) {
    let mut terms = Vec::new();
    let mut parts = Vec::new();
    let mut seeds = usize::MAX;
    for perf in s.iter().filter(|x| x.model == "performer") {
        let at: Vec<&Summary> = race(s, "fixed").filter(|x| x.m == perf.m).collect();
        if at.is_empty() {
            continue;
        }
        let k = at.len() as f64;
        let r = at.iter().map(|x| x.accuracy).sum::<f64>() / k;
        let r_se = at.iter().map(|x| x.se * x.se).sum::<f64>().sqrt() / k;
        terms.push((r - perf.accuracy, r_se.hypot(perf.se)));
        seeds = at
            .iter()
            .map(|x| x.seeds)
            .chain([perf.seeds, seeds])
            .min()
            .unwrap_or(0);
        parts.push(format!(
            "m={}: RACE {:.3} vs Performer {:.3}",
            perf.m, r, perf.accuracy
        ));
    }
    if terms.is_empty() {
        return (
            Measure::NotTestable("no Performer width matches a soft-RACE L·2^P".into()),
            "no matched state".into(),
        );
    }
    mean_difference(&terms, seeds, "", &parts)
}

/// Why the rows learned in `mode` cannot test a claim about learning β: none of them moved β
/// by [`MIN_BETA_MOVE_LOG2`] (or a move is not finite, which the verdict reports itself).
fn beta_not_learned(s: &[Summary], mode: &str) -> Option<String> {
    let moves: Vec<f64> = race(s, mode).map(Summary::most_moved).collect();
    if moves.is_empty() || moves.iter().any(|m| !m.is_finite()) {
        return None;
    }
    let most = moves
        .iter()
        .fold(0.0f64, |m, x| crate::stats::nan_max(m, x.abs()));
    (most < MIN_BETA_MOVE_LOG2).then(|| {
        format!(
            "training moved log2 β by at most {most:.2} (< {MIN_BETA_MOVE_LOG2}) in every (P, L) learned as `{mode}`: β was not learned in this budget"
        )
    })
}

/// Mean over the (P, L) trained both ways from the same β (`learned` from the validated β,
/// and `fixed` there), whose learned β moved by at least [`MIN_BETA_MOVE_LOG2`], of
/// (learned-β accuracy − fixed-β accuracy).
pub fn learned_vs_fixed_measure(s: &[Summary]) -> (Measure, String) {
    let mut terms = Vec::new();
    let mut parts = Vec::new();
    let mut seeds = usize::MAX;
    if let Some(why) = beta_not_learned(s, "learned") {
        return (Measure::NotTestable(why.clone()), why);
    }
    // A NaN move is kept: the verdict reports it as not finite.
    for a in race(s, "learned")
        .filter(|a| a.most_moved().is_nan() || a.most_moved() >= MIN_BETA_MOVE_LOG2)
    {
        if let Some(b) = race(s, "fixed").find(|b| (b.p, b.l) == (a.p, a.l)) {
            seeds = seeds.min(a.seeds).min(b.seeds);
            terms.push((a.accuracy - b.accuracy, a.se.hypot(b.se)));
            parts.push(format!(
                "({},{}): {:.3} vs {:.3} (Δlog2 β {:+.2})",
                a.p, a.l, a.accuracy, b.accuracy, a.dlog2_beta
            ));
        }
    }
    if terms.is_empty() {
        return (
            Measure::NotTestable("no (P, L) trained with both fixed and learned β".into()),
            "no pair".into(),
        );
    }
    mean_difference(&terms, seeds, "learned vs fixed ", &parts)
}

/// `log2(learned β_j / the β the fixed-input trade-off study validated)` for each layer j of
/// each (P, L) learned from the authors' start `1/√d_head` (`learned-authors`, far from every
/// validated β, so landing near it is something training did), β_j the geometric mean over
/// seeds; a layer whose β moved less than [`MIN_BETA_MOVE_LOG2`] is left out and named.
/// `tradeoff` maps (P, L) to that β (`beta_chosen` of `tradeoff.csv`). The text says which
/// layers of which (P, L) the values cover.
pub fn learned_beta_measure(
    s: &[Summary],
    tradeoff: &BTreeMap<(usize, usize), f64>,
) -> (Measure, String) {
    let mut logs = Vec::new();
    let mut parts = Vec::new();
    let mut covered = Vec::new();
    let mut still = Vec::new();
    let mut missing = Vec::new();
    if let Some(why) = beta_not_learned(s, AUTHORS) {
        return (Measure::NotTestable(why.clone()), why);
    }
    for a in race(s, AUTHORS) {
        let Some(&t) = tradeoff.get(&(a.p, a.l)) else {
            missing.push(format!("({},{})", a.p, a.l));
            continue;
        };
        // A β that is not finite is kept: the verdict says it is not finite.
        let layers = if a.beta_layers.is_empty() {
            vec![(0, f64::NAN, f64::NAN)]
        } else {
            (0..a.beta_layers.len())
                .map(|j| {
                    let mv = a.dlog2_layers.get(j).copied().unwrap_or(f64::NAN);
                    (j, a.beta_layers[j], mv)
                })
                .collect()
        };
        for (j, b, mv) in layers {
            if mv.abs() < MIN_BETA_MOVE_LOG2 {
                still.push(format!("({},{}) layer {j} (Δlog2 β {mv:+.2})", a.p, a.l));
                continue;
            }
            logs.push((b / t).log2());
            covered.push(format!("({},{}) layer {j}", a.p, a.l));
            parts.push(format!(
                "({},{}) layer {j}: learned {:.3} (Δlog2 β {:+.2}) vs validated {} (log2 ratio {:+.2})",
                a.p,
                a.l,
                b,
                mv,
                t,
                (b / t).log2()
            ));
        }
    }
    if logs.is_empty() {
        let why = if missing.is_empty() {
            format!(
                "no layer's β moved by {MIN_BETA_MOVE_LOG2} in log2: {}",
                still.join(", ")
            )
        } else {
            format!(
                "the trade-off study has no validated β for the learned (P, L) {}",
                missing.join(" ")
            )
        };
        return (
            Measure::NotTestable(why),
            "no learned layer to compare".into(),
        );
    }
    let mut text = format!("covers {}: {}", covered.join(", "), parts.join("; "));
    if !still.is_empty() {
        text += &format!("; left out (β did not move): {}", still.join(", "));
    }
    if !missing.is_empty() {
        text += &format!("; not in the trade-off grid: {}", missing.join(" "));
    }
    (Measure::Values(logs), text)
}
