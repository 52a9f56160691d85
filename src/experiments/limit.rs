//! `racelab limit`: soft RACE as beta → ∞ (`proofs-notes/large-beta.md`, "The limit").
//!
//! With `u = tanh(Wx)`, one table's kernel factorises over its bits: a bit on which query
//! and key agree weighs `1 − e^{−2β|u_p(q)|} − e^{−2β|u_p(k)|} + …`, a bit on which they
//! differ `e^{−2β·min(|u_p(q)|, |u_p(k)|)}·(1 + …)`. So
//!
//! `Ŝ(q, k) ≈ (1/L) Σ_l e^{−2β·E_l(q,k)}`,  `E_l = Σ_{p differing} min(|u_p(q)|, |u_p(k)|)`,
//!
//! and every row tends to the `m_j`-weighted mean of the values of the keys minimising
//! `E(q, k_j) = min_l E_l`, `m_j` being the number of tables reaching that minimum. On rows
//! where the query shares a bucket with some key (`E = 0`) that is hard LSH; on the others
//! hard LSH returns 0 by convention, soft RACE the nearest key's value (or a mean where the
//! minimum ties, which happens when it is set by the query's own bits).
//!
//! The error decays as `e^{−2β·g}` with `g` ([`row_limit`]) the smallest exponent of a
//! first-order term the limit drops that does not cancel in the ratio: the gap to the next
//! key, and, when several keys win, the terms by which their weights differ. Each row is
//! evaluated exactly (`reference::logdomain`) at the betas where `2β·g = x`, and its measured
//! decay rate over the predicted one, `ρ = ln(err(x₁)/err(x₂))/(x₂ − x₁)`, must be 1.

use super::{f, fig, load_config, read_csv, write_csv, Claim, Ctx, ExpResult, Measure};
use crate::error::Result;
use crate::hashing::Planes;
use crate::params::Combine;
use crate::params::{Bits, Seed, Tables};
use crate::plot::{line_plot, LinePlot, Series};
use crate::reference::logdomain::soft_race_log;
use crate::reference::race::hard_lsh;
use crate::tensor::{Mat, MatRef};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct Config {
    pub instances: usize,
    pub n_queries: usize,
    pub n_keys: usize,
    pub d: usize,
    pub dv: usize,
    /// `(P, L)` configurations.
    pub pl: Vec<[usize; 2]>,
    /// The exponents `x = 2β·g` at which each row is evaluated.
    pub xs: Vec<f64>,
    /// The pair of `xs` the decay rate is measured between.
    pub fit: [f64; 2],
}

/// Exponents closer than this are one exponent (ties come from the same query bits, which
/// give bitwise-equal sums).
const TIE: f64 = 1e-12;
/// Below this an error is f64 rounding, not a decay (relative to `max|v|`).
const RESOLVED: f64 = 1e-13;
/// The window a row's measured over predicted decay rate `ρ` must lie in.
const RATE_WINDOW: [f64; 2] = [0.9, 1.1];

/// The β → ∞ limit of one row and the predicted decay exponent of its error.
#[derive(Debug, Clone, PartialEq)]
pub struct RowLimit {
    /// The query shares a bucket with some key in some table (`min E = 0`).
    pub shared: bool,
    /// The keys minimising `E`.
    pub winners: Vec<usize>,
    /// `Σ m_j v_j / Σ m_j` over the winners.
    pub limit: Vec<f64>,
    /// `g`: the error is `Θ(e^{−2β·g})`; infinite when no term survives (the limit is exact).
    pub rate: f64,
}

/// `E_l(q, k)` for every table: `Σ_{p differing} min(|u_p(q)|, |u_p(k)|)`.
fn table_exponents(uq: &[f64], uk: &[f64], p: usize) -> Vec<f64> {
    uq.chunks(p)
        .zip(uk.chunks(p))
        .map(|(a, b)| {
            a.iter()
                .zip(b)
                .filter(|(x, y)| (**x >= 0.0) != (**y >= 0.0))
                .map(|(x, y)| x.abs().min(y.abs()))
                .sum()
        })
        .collect()
}

/// A winner's first-order relative weight corrections `Σ_x c_x e^{−2βx}`, merged by `x`.
fn corrections(uq: &[f64], uk: &[f64], p: usize, e: &[f64], emin: f64) -> Vec<(f64, f64)> {
    let m = e.iter().filter(|&&x| x <= emin + TIE).count() as f64;
    let mut terms = Vec::new();
    for (l, &el) in e.iter().enumerate() {
        if el > emin + TIE {
            // Another table of the same key: `e^{−2β(E_l − E)}/m`.
            terms.push((el - emin, 1.0 / m));
            continue;
        }
        for (&a, &b) in uq[l * p..(l + 1) * p].iter().zip(&uk[l * p..(l + 1) * p]) {
            let (a, b, differ) = (a.abs(), b.abs(), (a >= 0.0) != (b >= 0.0));
            // Agreeing: 1 − e^{−2βa} − e^{−2βb}; differing (over its leading e^{−2β·min}):
            // 1 − e^{−2βa} − e^{−2βb} + e^{−2β|a−b|}.
            terms.push((a, -1.0 / m));
            terms.push((b, -1.0 / m));
            if differ {
                terms.push(((a - b).abs(), 1.0 / m));
            }
        }
    }
    merge(terms)
}

/// Sum the coefficients of equal exponents (within [`TIE`]); drop `x ≤ TIE` (no decay).
fn merge(mut terms: Vec<(f64, f64)>) -> Vec<(f64, f64)> {
    terms.retain(|t| t.0 > TIE);
    crate::stats::sort_by_float(&mut terms, |t| t.0);
    let mut out: Vec<(f64, f64)> = Vec::new();
    for (x, c) in terms {
        match out.last_mut() {
            Some(last) if x - last.0 <= TIE => last.1 += c,
            _ => out.push((x, c)),
        }
    }
    out
}

/// The limit of row `q` and its error's decay exponent, from `uq = tanh(W q)` (`L·P`, table
/// by table), `uk` (`n × L·P`) and the values `v` (`n × dv`).
pub fn row_limit(uq: &[f64], uk: &[f64], v: MatRef<f64>, p: usize) -> RowLimit {
    let lp = uq.len();
    let n = v.rows;
    let e: Vec<Vec<f64>> = (0..n)
        .map(|j| table_exponents(uq, &uk[j * lp..(j + 1) * lp], p))
        .collect();
    let ej: Vec<f64> = e
        .iter()
        .map(|t| t.iter().cloned().fold(f64::INFINITY, crate::stats::nan_min))
        .collect();
    let emin = ej
        .iter()
        .cloned()
        .fold(f64::INFINITY, crate::stats::nan_min);
    let winners: Vec<usize> = (0..n).filter(|&j| ej[j] <= emin + TIE).collect();
    let mult = |j: usize| e[j].iter().filter(|&&x| x <= emin + TIE).count() as f64;
    let total: f64 = winners.iter().map(|&j| mult(j)).sum();
    let mut limit = vec![0.0; v.cols];
    for &j in &winners {
        crate::reference::axpy(&mut limit, mult(j) / total, v.row(j));
    }
    // Losing keys enter with e^{−2β(E_j − E)}.
    let mut rate = (0..n)
        .filter(|j| !winners.contains(j))
        .map(|j| ej[j] - emin)
        .fold(f64::INFINITY, crate::stats::nan_min);
    // Winners' corrections survive the ratio unless every winner has the same coefficient.
    if winners.len() > 1 {
        let corr: Vec<Vec<(f64, f64)>> = winners
            .iter()
            .map(|&j| corrections(uq, &uk[j * lp..(j + 1) * lp], p, &e[j], emin))
            .collect();
        let xs = merge(corr.iter().flatten().map(|&(x, _)| (x, 0.0)).collect());
        for (x, _) in xs {
            let coef = |c: &Vec<(f64, f64)>| {
                c.iter()
                    .filter(|t| (t.0 - x).abs() <= TIE)
                    .map(|t| t.1)
                    .sum::<f64>()
            };
            let cs: Vec<f64> = corr.iter().map(coef).collect();
            let (lo, hi) = crate::stats::min_max(cs.iter().cloned());
            if hi - lo > 1e-9 {
                rate = rate.min(x);
                break; // xs ascend
            }
        }
    }
    RowLimit {
        shared: emin == 0.0,
        winners,
        limit,
        rate,
    }
}

/// `tanh(W x)` for every table of every row of `x` (`n × L·P`).
fn tanh_bank(planes: &Planes, x: &Mat<f64>) -> Vec<f64> {
    let (l, p) = (planes.l(), planes.p());
    let mut out = vec![0.0; x.rows * l * p];
    for i in 0..x.rows {
        for t in 0..l {
            let z = &mut out[(i * l + t) * p..(i * l + t + 1) * p];
            planes.project(t, x.row(i), z);
            z.iter_mut().for_each(|u| *u = u.tanh());
        }
    }
    out
}

/// `max_c |O_c − lim_c| / max|v|` for one query row at one beta, `O` exact (log domain).
pub fn row_error(
    q: &[f64],
    k: MatRef<f64>,
    v: MatRef<f64>,
    planes: &Planes,
    beta: f64,
    limit: &[f64],
) -> f64 {
    let qm = MatRef::single_row(q);
    let o = soft_race_log(qm, k, v, planes, beta, false, Combine::Paper).o;
    let vmax = v
        .data
        .iter()
        .fold(0.0f64, |m, x| crate::stats::nan_max(m, x.abs()))
        .max(1e-300);
    o.row(0)
        .iter()
        .zip(limit)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, crate::stats::nan_max)
        / vmax
}

/// The decay rate over the predicted one between two exponents: 1 when the prediction is
/// right, `None` when the later error is below f64's resolution.
pub fn rate_ratio((x1, e1): (f64, f64), (x2, e2): (f64, f64)) -> Option<f64> {
    (e2 >= RESOLVED && e1 > 0.0).then(|| (e1 / e2).ln() / (x2 - x1))
}

/// Inputs of one instance: `N(0, 1/d)` rows (so `Wx ~ N(0, 1)`: `u` spread over (−1, 1)).
fn instance(cfg: &Config, seed: u64) -> (Mat<f64>, Mat<f64>, Mat<f64>) {
    let scale = 1.0 / (cfg.d as f64).sqrt();
    let s = |m: Mat<f64>| Mat::from_vec(m.rows, m.cols, m.data.iter().map(|x| x * scale).collect());
    (
        s(super::data::gaussian(cfg.n_queries, cfg.d, seed * 3 + 1)),
        s(super::data::gaussian(cfg.n_keys, cfg.d, seed * 3 + 2)),
        super::data::gaussian(cfg.n_keys, cfg.dv, seed * 3 + 3),
    )
}

/// Compute → CSVs `limit` (per row: its kind, winners, predicted rate `g`, the errors at the
/// two fit points and their rate ratio `ρ`) and `limit_curves` (each row's error against
/// `x = 2βg`); also the largest gap between a shared row's limit and hard LSH.
fn compute_csvs(ctx: &Ctx, cfg: &Config) -> Result<(Vec<String>, f64)> {
    let mut rows = Vec::new();
    let mut curves = Vec::new();
    let mut hard_gap = 0.0f64;
    for &[p, l] in &cfg.pl {
        for inst in 0..cfg.instances {
            let seed = ctx.seed.wrapping_mul(1000) + (p * 100 + l * 10) as u64 * 1000 + inst as u64;
            let planes = Planes::gaussian(Bits(p), Tables(l), cfg.d, Seed(seed))?;
            let (q, k, v) = instance(cfg, seed);
            let (uq, uk) = (tanh_bank(&planes, &q), tanh_bank(&planes, &k));
            for i in 0..q.rows {
                let mut lim = row_limit(&uq[i * l * p..(i + 1) * l * p], &uk, v.view(), p);
                let kind = if lim.shared { "shared" } else { "unshared" };
                let head = [p, l, inst, i].map(|x| x.to_string());
                let winners = lim.winners.len().to_string();
                // One limit.csv row: (P, L, instance, row, kind, winners) and its measures.
                let row = |tail: [String; 4]| -> Vec<String> {
                    head.iter()
                        .cloned()
                        .chain([kind.to_string(), winners.clone()])
                        .chain(tail)
                        .collect()
                };
                if lim.shared {
                    // The limit is the library's hard-LSH output itself (and must agree with
                    // the winners' weighted mean).
                    let qi = MatRef::single_row(q.row(i));
                    let hard = hard_lsh(qi, k.view(), v.view(), &planes, false).o;
                    for (a, b) in lim.limit.iter().zip(hard.row(0)) {
                        hard_gap = hard_gap.max((a - b).abs());
                    }
                    lim.limit = hard.row(0).to_vec();
                }
                if !lim.rate.is_finite() {
                    // Nothing decays: the row must equal its limit at any beta.
                    let err = row_error(q.row(i), k.view(), v.view(), &planes, 1.0, &lim.limit);
                    let verdict = if err < RESOLVED { "exact" } else { "wrong" };
                    rows.push(row(["inf".into(), f(err), f(err), verdict.into()]));
                    continue;
                }
                let errs: Vec<(f64, f64)> = cfg
                    .xs
                    .iter()
                    .chain(&cfg.fit)
                    .map(|&x| {
                        let beta = x / (2.0 * lim.rate);
                        (
                            x,
                            row_error(q.row(i), k.view(), v.view(), &planes, beta, &lim.limit),
                        )
                    })
                    .collect();
                let nx = cfg.xs.len();
                for &(x, e) in &errs[..nx] {
                    curves.push(vec![
                        p.to_string(),
                        l.to_string(),
                        inst.to_string(),
                        i.to_string(),
                        kind.into(),
                        f(x),
                        f(e),
                    ]);
                }
                let (a, b) = (errs[nx], errs[nx + 1]);
                let rho = rate_ratio(a, b);
                let rho = rho.map(f).unwrap_or_else(|| "unresolved".into());
                rows.push(row([f(lim.rate), f(a.1), f(b.1), rho]));
            }
        }
    }
    let header = [
        "p", "l", "instance", "row", "kind", "winners", "g", "err_x1", "err_x2", "rho",
    ];
    let csv1 = write_csv(ctx, "limit", &header, &rows, &cfg)?;
    let csv2 = write_csv(
        ctx,
        "limit_curves",
        &["p", "l", "instance", "row", "kind", "x", "err"],
        &curves,
        &cfg,
    )?;
    Ok((vec![csv1, csv2], hard_gap))
}

/// Figure, from `limit_curves.csv`: the first rows of each kind against `e^{-x}`.
fn figures(ctx: &Ctx, cfg: &Config) -> Result<Vec<String>> {
    // Figure: the first rows of each kind, err(x)/err(x₀)·e^{−x₀} against x, beside e^{−x}.
    let (_, cr) = read_csv(ctx, "limit_curves")?;
    let mut series = Vec::new();
    for kind in ["shared", "unshared"] {
        let mut keys: Vec<String> = Vec::new();
        for r in cr.iter().filter(|r| r[4] == kind) {
            let key = r[..4].join("/");
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
        for key in keys.iter().take(4) {
            let pts: Vec<(f64, f64)> = cr
                .iter()
                .filter(|r| r[..4].join("/") == *key)
                .map(|r| {
                    (
                        r[5].parse().unwrap_or(f64::NAN),
                        r[6].parse().unwrap_or(f64::NAN),
                    )
                })
                .collect();
            let (x0, e0) = pts[0];
            let norm: Vec<(f64, f64)> = pts
                .iter()
                .map(|&(x, e)| (x, e / e0 * (-x0).exp()))
                .collect();
            series.push(Series::new(
                format!("{kind} row (P,L,inst,row) {key}"),
                norm,
            ));
        }
    }
    let xs: Vec<(f64, f64)> = cfg.xs.iter().map(|&x| (x, (-x).exp())).collect();
    series.push(Series::dashed("predicted e^(-2 beta g)", xs));
    line_plot(
        &fig(ctx, "limit_decay"),
        &LinePlot {
            title: "Soft RACE -> its beta -> infinity limit, per row",
            xlabel: "x = 2 beta g (g predicted per row)",
            ylabel: "error, scaled to e^(-x) at the first x",
            logx: false,
            logy: true,
        },
        &series,
    )?;
    Ok(vec!["limit_decay".into()])
}

/// The claims, from `limit.csv`: one per kind of row ([`judge_kind`]).
fn claims(ctx: &Ctx, cfg: &Config, hard_gap: f64) -> Result<(Vec<Claim>, serde_json::Value)> {
    let (_, rows) = read_csv(ctx, "limit")?;
    let claims = ["shared", "unshared"]
        .into_iter()
        .map(|kind| judge_kind(&rows, kind, cfg, hard_gap))
        .collect::<Result<Vec<_>>>()?;
    let count = |kind: &str| rows.iter().filter(|r| r[4] == kind).count();
    let headline = serde_json::json!({
        "shared_rows": count("shared"),
        "unshared_rows": count("unshared"),
        "tied_unshared_rows": rows.iter().filter(|r| r[4] == "unshared" && r[5] != "1").count(),
    });
    Ok((claims, headline))
}

pub fn run(ctx: &Ctx) -> Result<ExpResult> {
    let t0 = std::time::Instant::now();
    let cfg: Config = load_config(ctx, include_str!("../../experiments/limit.toml"), "limit")?;
    let (csv, hard_gap) = compute_csvs(ctx, &cfg)?;
    let figures = figures(ctx, &cfg)?;
    Ok(ExpResult::assemble(
        "limit",
        ctx,
        t0,
        (csv, figures),
        claims(ctx, &cfg, hard_gap)?,
    ))
}

/// The claim of one kind of row from the `limit.csv` rows: the share of resolved rows whose
/// `ρ` lies in [`RATE_WINDOW`] (an "exact" row counts as 1, a "wrong" one as 0).
fn judge_kind(rows: &[Vec<String>], kind: &str, cfg: &Config, hard_gap: f64) -> Result<Claim> {
    let id = if kind == "shared" {
        "limit-shared-hard"
    } else {
        "limit-unshared-nearest"
    };
    let mine: Vec<&Vec<String>> = rows.iter().filter(|r| r[4] == kind).collect();
    let values: Vec<f64> = mine
        .iter()
        .filter_map(|r| match r[9].as_str() {
            "unresolved" => None,
            "exact" => Some(1.0),
            "wrong" => Some(0.0),
            x => x.parse().ok(),
        })
        .collect();
    let unresolved = mine.len() - values.len();
    let tied = mine.iter().filter(|r| r[5] != "1").count();
    let [w0, w1] = RATE_WINDOW;
    let inside = values.iter().filter(|&&x| (w0..=w1).contains(&x)).count();
    let measure = if values.is_empty() {
        Measure::NotTestable(format!("no {kind} row resolved ({} rows)", mine.len()))
    } else {
        Measure::share_of(inside, values.len(), values.iter().cloned())
    };
    let outside: Vec<String> = mine
        .iter()
        .filter(|r| r[9].parse::<f64>().is_ok_and(|x| !(w0..=w1).contains(&x)) || r[9] == "wrong")
        .take(5)
        .map(|r| {
            format!(
                "(P {}, L {}, instance {}, row {}, {} winners): ρ {}",
                r[0], r[1], r[2], r[3], r[5], r[9]
            )
        })
        .collect();
    let (lo, hi) = crate::stats::min_max(values.iter().cloned());
    let against = if kind == "shared" {
        format!("; the hard-LSH output differs from the predicted limit by {hard_gap:.1e}")
    } else {
        String::new()
    };
    Claim::judged(
        id,
        format!(
            "ρ over {} {kind} rows: {inside} within [{w0}, {w1}]; min {lo:.4}, median {:.4}, max {hi:.4}; {unresolved} rows below f64 resolution at x = {}; {tied} rows with tied winners{against}{}",
            values.len(),
            super::quantile(&values, 0.5),
            cfg.fit[1],
            if outside.is_empty() {
                String::new()
            } else {
                format!("; outside the window: {}", outside.join(", "))
            }
        ),
        measure,
        format!("(P, L) in {:?}, {} instances × {} queries, {} keys", cfg.pl, cfg.instances, cfg.n_queries, cfg.n_keys),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One plane (`P = L = 1`), `u = tanh(x)`: the exponents are known by hand.
    fn one_bit(uq: f64, uk: &[f64], v: &[f64]) -> RowLimit {
        let vm = MatRef::new(uk.len(), 1, v).unwrap();
        row_limit(&[uq], uk, vm, 1)
    }

    #[test]
    fn exponents_by_hand() {
        // Shared (same sign): both keys collide; they differ by e^{−2β·0.3} and e^{−2β·0.6}
        // (their own bits; the query's 0.5 is common): g = 0.3.
        let r = one_bit(0.5, &[0.3, 0.6], &[1.0, 2.0]);
        assert!(r.shared);
        assert_eq!(r.winners, vec![0, 1]);
        assert_eq!(r.limit, vec![1.5]);
        assert!((r.rate - 0.3).abs() < 1e-15, "{r:?}");
        // Unshared: keys on the other side; E = min(0.5, |u_k|) = 0.2 for key 0, 0.5 for
        // key 1: key 0 wins by a gap of 0.3.
        let r = one_bit(0.5, &[-0.2, -0.7], &[1.0, 2.0]);
        assert!(!r.shared);
        assert_eq!((r.winners.clone(), r.limit.clone()), (vec![0], vec![1.0]));
        assert!((r.rate - 0.3).abs() < 1e-15, "{r:?}");
        // Tied: both keys' |u| exceed the query's 0.1, so E = 0.1 for both; their weights
        // differ at e^{−2β(0.6−0.1)} vs e^{−2β(0.8−0.1)}: g = 0.5.
        let r = one_bit(0.1, &[-0.6, -0.8], &[1.0, 3.0]);
        assert_eq!(
            (r.winners.clone(), r.limit.clone()),
            (vec![0, 1], vec![2.0])
        );
        assert!((r.rate - 0.5).abs() < 1e-12, "{r:?}");
    }

    /// The prediction is measured, and a wrong limit cannot pass: hard LSH's convention
    /// (0 on unshared rows) decays at rate 0, so its ρ is far from 1.
    #[test]
    fn measured_rate_matches_and_a_wrong_limit_fails() {
        let planes = Planes::from_data(Bits(1), Tables(1), 1, vec![1.0]).unwrap();
        let (q, k, v) = (
            [0.5f64.atanh()],
            [(-0.2f64).atanh(), (-0.7f64).atanh()],
            [1.0, 2.0],
        );
        let (km, vm) = (
            MatRef::new(2, 1, &k).unwrap(),
            MatRef::new(2, 1, &v).unwrap(),
        );
        let r = one_bit(0.5, &[-0.2, -0.7], &v);
        let at = |x: f64, lim: &[f64]| (x, row_error(&q, km, vm, &planes, x / (2.0 * r.rate), lim));
        let rho = rate_ratio(at(16.0, &r.limit), at(24.0, &r.limit)).unwrap();
        assert!((rho - 1.0).abs() < 0.02, "rho {rho}");
        let wrong = rate_ratio(at(16.0, &[0.0]), at(24.0, &[0.0])).unwrap();
        assert!(wrong.abs() < 0.1, "the hard-LSH limit decays at {wrong}");
        // The claim's own test: a share of rows inside the window.
        let spec = &specs().unwrap()["limit-shared-hard"].test;
        let share = |xs: &[f64]| {
            let inside = xs.iter().filter(|&&x| (0.9..=1.1).contains(&x)).count();
            judge(
                spec,
                &Measure::share_of(inside, xs.len(), xs.iter().cloned()),
            )
            .unwrap()
            .verdict
        };
        assert_eq!(share(&[rho; 100]), Verdict::Holds);
        // One row in a hundred off the rate is tolerated, two are not; a wrong limit fails.
        let mut some = vec![rho; 99];
        some.push(wrong);
        assert_eq!(share(&some), Verdict::Holds);
        some[0] = wrong;
        assert_eq!(share(&some), Verdict::Fails);
        assert_eq!(share(&[rho, wrong]), Verdict::Fails);
        assert_eq!(share(&[rho, f64::NAN]), Verdict::NotTestable);
    }

    #[test]
    fn unresolved_errors_are_not_rates() {
        assert_eq!(rate_ratio((16.0, 1e-7), (24.0, 1e-15)), None);
        let r = rate_ratio((16.0, 1.0), (24.0, (-8.0f64).exp())).unwrap();
        assert!((r - 1.0).abs() < 1e-12);
    }

    use super::super::verdict::{judge, specs, Verdict};
}
