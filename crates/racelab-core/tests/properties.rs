//! Properties of the f64 reference estimators, with named proptest strategies.
mod common;
use common::{assert_close, randn};
use proptest::prelude::*;
use racelab_core::analysis::rank::{numerical_rank, sharp_rank_bound};
use racelab_core::attend::attend;
use racelab_core::hashing::{hard_code, soft_features, soft_features_direct, Planes};
use racelab_core::method::Flags;
use racelab_core::params::{Bits, Seed, Tables};
use racelab_core::reference::kernels::{hard_matrix, soft_matrix};
use racelab_core::{AttendOptions, Combine, Mat, MethodKind, Tensor};

/// The methods whose output is a convex combination of value rows: all of them.
const CONVEX: [MethodKind; 6] = MethodKind::ALL;

/// Strategy: a small attention problem `(n, d, dv, seed)`.
fn problem() -> impl Strategy<Value = (usize, usize, usize, u64)> {
    (1usize..12, 1usize..6, 1usize..4, any::<u64>())
}

/// Strategy: RACE hyper-parameters `(p, l, beta)` with beta on a log scale.
fn race_params() -> impl Strategy<Value = (usize, usize, f64)> {
    (1usize..5, 1usize..5, -1.0f64..3.0).prop_map(|(p, l, lb)| (p, l, 10f64.powf(lb)))
}

/// Strategy: one of the convex methods.
fn method() -> impl Strategy<Value = MethodKind> {
    prop::sample::select(CONVEX.to_vec())
}

fn tensor(m: &Mat<f64>) -> Tensor<f64> {
    Tensor {
        shape: vec![m.rows, m.cols],
        data: m.data.clone(),
    }
}

fn opts_with(
    method: MethodKind,
    (p, l, beta): (usize, usize, f64),
    seed: u64,
    causal: bool,
    combine: Combine,
) -> AttendOptions {
    let flags = Flags {
        p,
        l,
        beta,
        combine,
        gamma: 1.5,
        scale: None,
        features: 32,
        planes: None,
        seed,
    };
    AttendOptions::new(method.with(&flags)).causal(causal)
}

fn opts(method: MethodKind, rp: (usize, usize, f64), seed: u64, causal: bool) -> AttendOptions {
    opts_with(method, rp, seed, causal, Combine::Paper)
}

fn run(q: &Mat<f64>, k: &Mat<f64>, v: &Mat<f64>, o: &AttendOptions) -> racelab_core::AttendResult {
    attend(&tensor(q), &tensor(k), &tensor(v), o).expect("valid problem")
}

proptest! {
    #![proptest_config(common::fixed_cases(48))]

    #[test]
    fn outputs_lie_in_the_column_range_of_v((n, d, dv, seed) in problem(), m in method(), rp in race_params(), causal in any::<bool>()) {
        let (q, k, v) = (randn(n, d, seed), randn(n, d, seed ^ 1), randn(n, dv, seed ^ 2));
        let out = run(&q, &k, &v, &opts(m, rp, seed, causal));
        for i in 0..n {
            let row = out.o.row_slice(i, dv);
            // An empty row is 0 by definition (hard: no collision; angular with d = 1: all keys
            // antipodal; soft at large beta: the kernel underflows below 1e-308).
            if out.empty_rows > 0 && row.iter().all(|&x| x == 0.0) { continue; }
            for (c, &rc) in row.iter().enumerate() {
                let lim = if causal { i + 1 } else { n };
                let col: Vec<f64> = (0..lim).map(|j| v.at(j, c)).collect();
                let (lo, hi) = col.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| (a.min(x), b.max(x)));
                let tol = 1e-12 * (1.0 + lo.abs().max(hi.abs()));
                prop_assert!(rc >= lo - tol && rc <= hi + tol, "{:?} row {} col {}: {} not in [{}, {}]", m, i, c, rc, lo, hi);
            }
        }
    }

    #[test]
    fn one_token_returns_its_value((_, d, dv, seed) in problem(), m in method(), rp in race_params(), causal in any::<bool>()) {
        let q = randn(1, d, seed);
        // Hard LSH needs q and k in one bucket to have any mass; use k = q for it.
        // Angular with d = 1 can be antipodal (κ = 0, an empty row); use k = q for it too.
        let k = if m == MethodKind::Hard || (m == MethodKind::Angular && d == 1) { q.clone() } else { randn(1, d, seed ^ 1) };
        let v = randn(1, dv, seed ^ 2);
        let out = run(&q, &k, &v, &opts(m, rp, seed, causal));
        // Soft RACE at large beta may underflow to an (explicitly counted) empty row.
        if !(m == MethodKind::Soft && out.empty_rows == 1) {
            assert_close(&format!("{m:?} N=1"), &out.o.data, &v.data, 1e-12);
        }
    }

    #[test]
    fn permutation_equivariance((n, d, dv, seed) in problem(), m in method(), rp in race_params()) {
        let (q, k, v) = (randn(n, d, seed), randn(n, d, seed ^ 1), randn(n, dv, seed ^ 2));
        let perm: Vec<usize> = (0..n).map(|i| (i * 7 + 3) % n).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
        let perm: Vec<usize> = if perm.len() == n { (0..n).map(|i| (i * 7 + 3) % n).collect() } else { (0..n).rev().collect() };
        let permute = |a: &Mat<f64>| Mat::from_vec(a.rows, a.cols, perm.iter().flat_map(|&i| a.row(i).to_vec()).collect());
        let o = opts(m, rp, seed, false);
        let base = run(&q, &k, &v, &o);
        // Permuting queries permutes output rows.
        let pq = run(&permute(&q), &k, &v, &o);
        let want: Vec<f64> = perm.iter().flat_map(|&i| base.o.row_slice(i, dv).to_vec()).collect();
        assert_close(&format!("{m:?} query equivariance"), &pq.o.data, &want, 1e-12);
        // Permuting keys and values together changes nothing.
        let pkv = run(&q, &permute(&k), &permute(&v), &o);
        assert_close(&format!("{m:?} key/value invariance"), &pkv.o.data, &base.o.data, 1e-12);
    }

    #[test]
    fn last_causal_row_equals_full_row((n, d, dv, seed) in problem(), m in method(), rp in race_params()) {
        let (q, k, v) = (randn(n, d, seed), randn(n, d, seed ^ 1), randn(n, dv, seed ^ 2));
        let full = run(&q, &k, &v, &opts(m, rp, seed, false));
        let causal = run(&q, &k, &v, &opts(m, rp, seed, true));
        assert_close(&format!("{m:?} last row"), causal.o.row_slice(n - 1, dv), full.o.row_slice(n - 1, dv), 1e-12);
    }

    #[test]
    fn output_scales_with_v((n, d, dv, seed) in problem(), m in method(), rp in race_params(), c in -5.0f64..5.0, causal in any::<bool>()) {
        let (q, k, v) = (randn(n, d, seed), randn(n, d, seed ^ 1), randn(n, dv, seed ^ 2));
        let vc = Mat::from_vec(n, dv, v.data.iter().map(|x| c * x).collect());
        let o = opts(m, rp, seed, causal);
        let (a, b) = (run(&q, &k, &v, &o), run(&q, &k, &vc, &o));
        let want: Vec<f64> = a.o.data.iter().map(|x| c * x).collect();
        assert_close(&format!("{m:?} scaling"), &b.o.data, &want, 1e-12 * (1.0 + c.abs()) * 10.0);
    }

    #[test]
    fn factorised_features_equal_direct_softmax(d in 1usize..8, p in 1usize..7, seed in any::<u64>(), lb in -6.0f64..6.0) {
        let beta = 10f64.powf(lb);
        let planes = Planes::gaussian(Bits(p), Tables(1), d, Seed(seed)).unwrap();
        let x = randn(1, d, seed ^ 5);
        let r = 1 << p;
        let (mut f, mut g) = (vec![0.0; r], vec![0.0; r]);
        soft_features(&planes, 0, &x.data, beta, &mut f);
        soft_features_direct(&planes, 0, &x.data, beta, &mut g);
        // The direct form rounds logits of size up to beta·P, so each φ_r carries a relative
        // error up to ~eps·(P + beta·P); the bound below is 4× that, and 1e-14 for beta ≤ 1.
        for r in 0..(1 << p) {
            let tol = (4.0 * f64::EPSILON * (p as f64) * (1.0 + beta) * f[r].max(g[r])).max(1e-14 * f[r].max(g[r]));
            prop_assert!((f[r] - g[r]).abs() <= tol.max(1e-300), "beta={:e} P={} r={}: {} vs {} (tol {:.1e})", beta, p, r, f[r], g[r], tol);
        }
        prop_assert!((f.iter().sum::<f64>() - 1.0).abs() < 1e-14);
    }
}

/// Extension used above: a row of a tensor viewed as `[rows, dv]`.
trait RowSlice {
    fn row_slice(&self, i: usize, dv: usize) -> &[f64];
}
impl RowSlice for Tensor<f64> {
    fn row_slice(&self, i: usize, dv: usize) -> &[f64] {
        &self.data[i * dv..(i + 1) * dv]
    }
}

#[test]
fn features_are_finite_from_beta_1e_minus6_to_1e6() {
    let planes = Planes::gaussian(Bits(6), Tables(3), 16, Seed(7)).unwrap();
    let x = randn(1, 16, 8);
    let huge = Mat::from_vec(1, 16, x.data.iter().map(|t| t * 1e150).collect());
    for e in -6..=6 {
        let beta = 10f64.powi(e);
        for input in [&x, &huge] {
            let mut f = vec![0.0; 64];
            soft_features(&planes, 1, &input.data, beta, &mut f);
            assert!(
                f.iter().all(|v| v.is_finite() && *v >= 0.0),
                "beta={beta:e}: {f:?}"
            );
            assert!((f.iter().sum::<f64>() - 1.0).abs() < 1e-13, "beta={beta:e}");
        }
    }
}

#[test]
fn soft_features_tend_to_hard_buckets() {
    let planes = Planes::gaussian(Bits(4), Tables(4), 8, Seed(11)).unwrap();
    let x = randn(1, 8, 12);
    let mut prev = f64::INFINITY;
    for beta in [1.0, 10.0, 100.0, 1e3, 1e4, 1e5] {
        let mut worst = 0.0f64;
        for l in 0..4 {
            let mut f = vec![0.0; 16];
            soft_features(&planes, l, &x.data, beta, &mut f);
            let h = hard_code(&planes, l, &x.data);
            let dist: f64 = f
                .iter()
                .enumerate()
                .map(|(r, &v)| (v - (r == h) as u8 as f64).abs())
                .sum();
            worst = worst.max(dist);
        }
        assert!(
            worst <= prev + 1e-15,
            "L1 distance to hard bucket grew at beta={beta}: {worst} > {prev}"
        );
        prev = worst;
    }
    assert!(
        prev < 1e-10,
        "at beta=1e5 soft features are {prev} from the hard bucket"
    );
}

/// Exact two-sided binomial test (statrs) that hard collisions have frequency κ^P.
#[test]
fn hard_collision_frequency_matches_kappa_pow_p() {
    use statrs::distribution::{Binomial, DiscreteCDF};
    let d = 6;
    for (p, seed, theta) in [(1usize, 21u64, 1.0f64), (2, 22, 0.7), (3, 23, 0.5)] {
        let l = 20_000;
        let planes = Planes::gaussian(Bits(p), Tables(l), d, Seed(seed)).unwrap();
        // q = e_0, k at angle theta from it in the (e_0, e_1) plane, rotated by a random map.
        let rot = randn(d, d, seed + 100);
        let apply = |x: &[f64]| -> Vec<f64> {
            (0..d)
                .map(|i| (0..d).map(|j| rot.at(i, j) * x[j]).sum())
                .collect()
        };
        let mut e0 = vec![0.0; d];
        e0[0] = 1.0;
        let mut kt = vec![0.0; d];
        kt[0] = theta.cos();
        kt[1] = theta.sin();
        let q = Mat::from_vec(1, d, apply(&e0));
        let k = Mat::from_vec(1, d, apply(&kt));
        let hits = (0..l)
            .filter(|&t| hard_code(&planes, t, &q.data) == hard_code(&planes, t, &k.data))
            .count() as u64;
        let prob = racelab_core::reference::angular::kappa(&q.data, &k.data).powi(p as i32);
        let bin = Binomial::new(prob, l as u64).unwrap();
        let lower = bin.cdf(hits);
        let upper = 1.0 - if hits == 0 { 0.0 } else { bin.cdf(hits - 1) };
        let pval = (2.0 * lower.min(upper)).min(1.0);
        assert!(
            pval > 1e-3,
            "P={p}: {hits}/{l} collisions vs κ^P = {prob:.4}: two-sided p = {pval:.2e}"
        );
        // And the test has power: a 2% shift in the probability is rejected.
        let off = Binomial::new((prob * 1.1).min(1.0), l as u64).unwrap();
        let p_off = 2.0 * off.cdf(hits).min(1.0 - off.cdf(hits.saturating_sub(1)));
        assert!(
            p_off < 1e-3,
            "P={p}: the test cannot tell κ^P from 1.1·κ^P (p = {p_off:.2e})"
        );
    }
}

/// rank(Ŝ) ≤ L(R−1)+1, with equality on generic inputs, for soft and hard kernels.
#[test]
fn rank_meets_the_sharp_bound() {
    let (n, d) = (96, 8);
    let q = randn(n, d, 31);
    let k = randn(n, d, 32);
    for (p, l) in [(1, 1), (2, 2), (3, 3), (2, 4), (1, 5)] {
        let planes = Planes::gaussian(Bits(p), Tables(l), d, Seed(33 + p as u64)).unwrap();
        let bound = sharp_rank_bound(p, l);
        let soft = numerical_rank(&soft_matrix(q.view(), k.view(), &planes, 2.0));
        assert_eq!(
            soft,
            bound,
            "soft (P,L)=({p},{l}): rank {soft}, sharp bound {bound}, LR = {}",
            l << p
        );
        let hard = numerical_rank(&hard_matrix(q.view(), k.view(), &planes));
        assert!(hard <= bound, "hard (P,L)=({p},{l}): rank {hard} > {bound}");
        if l * (1 << p) <= 16 {
            assert_eq!(hard, bound, "hard (P,L)=({p},{l}) generic rank");
        }
    }
}

#[test]
fn authors_rule_differs_from_paper_rule() {
    let (q, k, v) = (randn(16, 4, 1), randn(16, 4, 2), randn(16, 2, 3));
    let a = run(&q, &k, &v, &opts(MethodKind::Soft, (2, 3, 5.0), 4, false));
    let authors = opts_with(MethodKind::Soft, (2, 3, 5.0), 4, false, Combine::Authors);
    let b = run(&q, &k, &v, &authors);
    let diff = racelab_core::analysis::metrics::max_abs_diff(&a.o.data, &b.o.data);
    assert!(diff > 1e-3, "combine rules agree to {diff}");
}

proptest! {
    #![proptest_config(common::fixed_cases(64))]

    /// The log-domain soft RACE reference equals the brute-force log-sum-exp over pairs for
    /// beta drawn log-uniformly in [1e-3, 1e5], causal or not, and never leaves a row empty.
    #[test]
    fn log_domain_soft_race_is_exact_at_any_beta(
        (n, d, dv, seed) in problem(),
        p in 1usize..5,
        l in 1usize..4,
        lb in -3.0f64..5.0,
        causal in any::<bool>(),
    ) {
        use racelab_core::reference::logdomain::{soft_race_log, soft_race_pairs_log};
        let beta = 10f64.powf(lb);
        let (q, k, v) = (randn(n, d, seed), randn(n, d, seed ^ 1), randn(n, dv, seed ^ 2));
        let planes = Planes::gaussian(Bits(p), Tables(l), d, Seed(seed)).unwrap();
        let a = soft_race_log(q.view(), k.view(), v.view(), &planes, beta, causal, Combine::Paper);
        let b = soft_race_pairs_log(q.view(), k.view(), v.view(), &planes, beta, causal);
        prop_assert_eq!(a.empty_rows, 0);
        let scale = v.data.iter().fold(1.0f64, |m, x| m.max(x.abs()));
        for (x, y) in a.o.data.iter().zip(&b.o.data) {
            prop_assert!(x.is_finite() && (x - y).abs() <= 1e-9 * scale, "beta {}: {} vs {}", beta, x, y);
        }
    }
}
