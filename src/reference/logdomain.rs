//! Soft RACE exact at any beta (1e-6 … 1e6): log-domain features and scaled bucket sums.
//!
//! At large beta every feature of a query can be exponentially small (`e^{−2β·…}`), and a
//! bucket that no key falls in holds a mass of such terms: below f64's range from beta ≈ 350
//! (f32's from beta ≈ 44). [`crate::reference::race::soft_race`] then returns rows of
//! quantised subnormals, or zero. Here nothing is ever formed outside the exponent:
//!
//! - features in logs: `log φ_r(x) = Σ_p log σ(±2β·u_p)`, `u = tanh(Wx)`, with
//!   `log σ(t) = −softplus(−t)` evaluated without overflow;
//! - each bucket's mass and value sum carried with a scale, `A = e^m·a`, `B = e^m·b`, `m` the
//!   largest key log-feature added so far (so `a ≥ 1` once a key is in);
//! - each row read as `O_i = Σ_{l,r} e^{w−M} b / Σ_{l,r} e^{w−M} a`, `w = log φ_r(q_i) + m`,
//!   `M = max w`: the denominator is at least 1.
//!
//! The causal form (Algorithm 2) updates the scaled sums with key `i` before reading row
//! `i`. The authors' rule `Σ_{l,r} φ_r B/(A + 1e-6)` is summed term by term as
//! `e^{log φ_r + m − log(e^m a + 1e-6)}·b` (its output is not a ratio, so it can be tiny).
//! [`soft_race_pairs_log`] is the brute-force check: `log Ŝ_ij` by log-sum-exp over tables
//! and buckets, then a max-subtracted softmax over keys.

use super::race::AUTHORS_EPS;
use super::HeadOutput;
use crate::hashing::Planes;
use crate::params::Combine;
use crate::tensor::{Mat, MatRef};

/// `log σ(t)`, finite for every finite t.
#[inline]
pub fn log_sigmoid(t: f64) -> f64 {
    if t >= 0.0 {
        -(-t).exp().ln_1p()
    } else {
        t - t.exp().ln_1p()
    }
}

/// `log φ_l(x)` for one vector and table `l` (R = 2^P entries, first bit most significant).
pub fn log_features(planes: &Planes, l: usize, x: &[f64], beta: f64, out: &mut [f64]) {
    let mut z = vec![0.0; planes.p];
    planes.project(l, x, &mut z);
    out[0] = 0.0;
    let mut len = 1;
    for &zp in &z {
        let t = 2.0 * beta * zp.tanh();
        let (on, off) = (log_sigmoid(t), log_sigmoid(-t));
        for i in (0..len).rev() {
            let parent = out[i];
            out[2 * i] = parent + off;
            out[2 * i + 1] = parent + on;
        }
        len *= 2;
    }
}

/// `log φ` of every row for every table: `[L, n, R]` row-major.
pub fn log_feature_bank(planes: &Planes, x: &[f64], n: usize, beta: f64) -> Vec<f64> {
    let (r, d) = (planes.r(), planes.d);
    let mut out = vec![0.0; planes.l * n * r];
    for l in 0..planes.l {
        for i in 0..n {
            log_features(
                planes,
                l,
                &x[i * d..(i + 1) * d],
                beta,
                &mut out[(l * n + i) * r..(l * n + i + 1) * r],
            );
        }
    }
    out
}

/// `Σ_j e^{w_j}·(1, v_j)` carried as `e^m·(a, b)`.
#[derive(Debug, Clone)]
struct Scaled {
    m: f64,
    a: f64,
    b: Vec<f64>,
}

impl Scaled {
    fn new(dv: usize) -> Self {
        Scaled {
            m: f64::NEG_INFINITY,
            a: 0.0,
            b: vec![0.0; dv],
        }
    }
    fn add(&mut self, w: f64, v: &[f64]) {
        if w > self.m {
            let s = (self.m - w).exp();
            self.a *= s;
            self.b.iter_mut().for_each(|x| *x *= s);
            self.m = w;
        }
        let e = (w - self.m).exp();
        self.a += e;
        self.b.iter_mut().zip(v).for_each(|(x, &y)| *x += e * y);
    }
}

/// Row `i` from the scaled states and the query's log-features (`[L·R]`).
fn read_row(states: &[Scaled], lq: &[f64], combine: Combine, out: &mut [f64]) -> bool {
    out.iter_mut().for_each(|x| *x = 0.0);
    match combine {
        Combine::Paper => {
            let big = states
                .iter()
                .zip(lq)
                .filter(|(s, _)| s.a > 0.0)
                .map(|(s, &w)| w + s.m)
                .fold(f64::NEG_INFINITY, f64::max);
            if big == f64::NEG_INFINITY {
                return false;
            }
            let mut den = 0.0;
            for (s, &w) in states.iter().zip(lq).filter(|(s, _)| s.a > 0.0) {
                let e = (w + s.m - big).exp();
                den += e * s.a;
                out.iter_mut().zip(&s.b).for_each(|(o, &b)| *o += e * b);
            }
            out.iter_mut().for_each(|o| *o /= den);
            true
        }
        Combine::Authors => {
            for (s, &w) in states.iter().zip(lq).filter(|(s, _)| s.a > 0.0) {
                let log_mass = log_add_exp(s.m + s.a.ln(), AUTHORS_EPS.ln());
                let e = (w + s.m - log_mass).exp();
                out.iter_mut().zip(&s.b).for_each(|(o, &b)| *o += e * b);
            }
            true
        }
    }
}

/// `log(e^x + e^y)`.
#[inline]
pub fn log_add_exp(x: f64, y: f64) -> f64 {
    let (hi, lo) = if x > y { (x, y) } else { (y, x) };
    if lo == f64::NEG_INFINITY {
        hi
    } else {
        hi + (lo - hi).exp().ln_1p()
    }
}

/// Soft RACE (Algorithm 1, or Algorithm 2 when `causal`), exact at any beta. Rows with no key
/// (only possible with no keys at all) are 0 and counted in `empty_rows`.
pub fn soft_race_log(
    q: MatRef<f64>,
    k: MatRef<f64>,
    v: MatRef<f64>,
    planes: &Planes,
    beta: f64,
    causal: bool,
    combine: Combine,
) -> HeadOutput {
    let (l, r, dv) = (planes.l, planes.r(), v.cols);
    let lq = log_feature_bank(planes, q.data, q.rows, beta);
    let lk = log_feature_bank(planes, k.data, k.rows, beta);
    let feat = |bank: &[f64], n: usize, t: usize, i: usize| -> Vec<f64> {
        bank[(t * n + i) * r..(t * n + i + 1) * r].to_vec()
    };
    let mut states = vec![Scaled::new(dv); l * r];
    let add_key = |states: &mut [Scaled], j: usize| {
        for t in 0..l {
            for (b, &w) in feat(&lk, k.rows, t, j).iter().enumerate() {
                states[t * r + b].add(w, v.row(j));
            }
        }
    };
    if !causal {
        for j in 0..k.rows {
            add_key(&mut states, j);
        }
    }
    let mut o = Mat::zeros(q.rows, dv);
    let mut empty_rows = 0;
    let mut row_lq = vec![0.0; l * r];
    for i in 0..q.rows {
        if causal && i < k.rows {
            add_key(&mut states, i);
        }
        for t in 0..l {
            row_lq[t * r..(t + 1) * r].copy_from_slice(&feat(&lq, q.rows, t, i));
        }
        if !read_row(&states, &row_lq, combine, o.row_mut(i)) {
            empty_rows += 1;
        }
    }
    HeadOutput { o, empty_rows }
}

/// Brute force over pairs (Algorithm 1's kernel, the paper's combine rule):
/// `log Ŝ_ij = log Σ_{l,r} φ_{l,r}(q_i) φ_{l,r}(k_j)` by log-sum-exp, then
/// `O_i = Σ_j e^{log Ŝ_ij − max} v_j / Σ_j e^{log Ŝ_ij − max}` over `j` (`j ≤ i` if causal).
pub fn soft_race_pairs_log(
    q: MatRef<f64>,
    k: MatRef<f64>,
    v: MatRef<f64>,
    planes: &Planes,
    beta: f64,
    causal: bool,
) -> HeadOutput {
    let (l, r) = (planes.l, planes.r());
    let lq = log_feature_bank(planes, q.data, q.rows, beta);
    let lk = log_feature_bank(planes, k.data, k.rows, beta);
    let mut o = Mat::zeros(q.rows, v.cols);
    let mut empty_rows = 0;
    for i in 0..q.rows {
        let keys = if causal { (i + 1).min(k.rows) } else { k.rows };
        let s: Vec<f64> = (0..keys)
            .map(|j| {
                let mut acc = f64::NEG_INFINITY;
                for t in 0..l {
                    for b in 0..r {
                        acc = log_add_exp(
                            acc,
                            lq[(t * q.rows + i) * r + b] + lk[(t * k.rows + j) * r + b],
                        );
                    }
                }
                acc
            })
            .collect();
        let big = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        if big == f64::NEG_INFINITY {
            empty_rows += 1;
            continue;
        }
        let mut den = 0.0;
        let row = o.row_mut(i);
        for (j, &sj) in s.iter().enumerate() {
            let e = (sj - big).exp();
            den += e;
            row.iter_mut().zip(v.row(j)).for_each(|(x, &y)| *x += e * y);
        }
        row.iter_mut().for_each(|x| *x /= den);
    }
    HeadOutput { o, empty_rows }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::metrics::max_abs_diff;
    use crate::reference::race::soft_race;
    use crate::rng::SeededRng;

    fn inputs(n: usize, d: usize, dv: usize, seed: u64) -> (Mat<f64>, Mat<f64>, Mat<f64>) {
        let mut rng = SeededRng::new(seed, crate::rng::stream::EXPERIMENT);
        (
            Mat::from_vec(n, d, rng.normals(n * d)),
            Mat::from_vec(n, d, rng.normals(n * d)),
            Mat::from_vec(n, dv, rng.normals(n * dv)),
        )
    }

    #[test]
    fn log_sigmoid_is_finite_and_matches_the_plain_form() {
        for &t in &[-800.0, -30.0, -1.0, 0.0, 0.5, 30.0, 800.0] {
            let plain = crate::hashing::sigmoid(t).ln();
            let l = log_sigmoid(t);
            assert!(l.is_finite() && l <= 0.0, "{t}: {l}");
            if plain.is_finite() && plain != 0.0 {
                assert!(
                    (l - plain).abs() <= 1e-12 * plain.abs().max(1.0),
                    "{t}: {l} vs {plain}"
                );
            }
        }
        assert!((log_sigmoid(-800.0) + 800.0).abs() < 1e-12);
    }

    /// Where the plain reference is in range it and the log-domain one agree.
    #[test]
    fn agrees_with_the_plain_reference_in_range() {
        let (q, k, v) = inputs(40, 6, 3, 1);
        for &(p, l) in &[(1usize, 1usize), (2, 3), (3, 2)] {
            let planes = Planes::gaussian(l, p, 6, 7).unwrap();
            for &beta in &[1e-3, 0.1, 1.0, 8.0, 20.0] {
                for causal in [false, true] {
                    for combine in [Combine::Paper, Combine::Authors] {
                        let a =
                            soft_race(q.view(), k.view(), v.view(), &planes, beta, causal, combine);
                        let b = soft_race_log(
                            q.view(),
                            k.view(),
                            v.view(),
                            &planes,
                            beta,
                            causal,
                            combine,
                        );
                        let e = max_abs_diff(&a.o.data, &b.o.data);
                        assert!(
                            e < 1e-12,
                            "P={p} L={l} beta={beta} causal={causal} {combine:?}: {e:.2e}"
                        );
                        assert_eq!(b.empty_rows, 0);
                    }
                }
            }
        }
    }

    /// At every beta the scaled sums agree with the brute-force log-domain sum over pairs.
    #[test]
    fn agrees_with_brute_force_pairs_at_any_beta() {
        let (q, k, v) = inputs(24, 5, 2, 3);
        let planes = Planes::gaussian(3, 2, 5, 11).unwrap();
        for &beta in &[1e-6, 1e-3, 1.0, 60.0, 400.0, 1e3, 1e4, 1e6] {
            for causal in [false, true] {
                let a = soft_race_log(
                    q.view(),
                    k.view(),
                    v.view(),
                    &planes,
                    beta,
                    causal,
                    Combine::Paper,
                );
                let b = soft_race_pairs_log(q.view(), k.view(), v.view(), &planes, beta, causal);
                assert!(a.o.data.iter().all(|x| x.is_finite()));
                let e = max_abs_diff(&a.o.data, &b.o.data);
                assert!(e < 1e-9, "beta={beta} causal={causal}: {e:.2e}");
            }
        }
    }

    /// A case the plain reference cannot do: at beta = 1000 its rows are subnormal or zero
    /// (set to 0, counted), while the exact output is a weighted average of values.
    #[test]
    fn rows_the_plain_reference_loses_are_exact_here() {
        let (q, k, v) = inputs(32, 8, 2, 5);
        let planes = Planes::gaussian(1, 4, 8, 2).unwrap();
        let beta = 1e3;
        let plain = soft_race(
            q.view(),
            k.view(),
            v.view(),
            &planes,
            beta,
            true,
            Combine::Paper,
        );
        let exact = soft_race_log(
            q.view(),
            k.view(),
            v.view(),
            &planes,
            beta,
            true,
            Combine::Paper,
        );
        let brute = soft_race_pairs_log(q.view(), k.view(), v.view(), &planes, beta, true);
        assert!(
            plain.empty_rows > 0,
            "the plain reference should lose rows here"
        );
        assert_eq!(exact.empty_rows, 0);
        assert!(max_abs_diff(&exact.o.data, &brute.o.data) < 1e-9);
        // Every exact row is a convex combination of the prefix's values.
        for i in 0..q.rows {
            for c in 0..v.cols {
                let (lo, hi) = (0..=i).fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), j| {
                    (a.min(v.at(j, c)), b.max(v.at(j, c)))
                });
                let x = exact.o.at(i, c);
                assert!(
                    x >= lo - 1e-12 && x <= hi + 1e-12,
                    "row {i}: {x} outside [{lo}, {hi}]"
                );
            }
        }
    }
}
