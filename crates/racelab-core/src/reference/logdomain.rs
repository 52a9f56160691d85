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

/// Analytic gradients of `ℓ` with `∂ℓ/∂Ô = g` (paper combine rule), exact at any beta:
/// [`soft_race_rows_log`] over every query row.
pub fn soft_race_backward_log(
    q: MatRef<f64>,
    k: MatRef<f64>,
    v: MatRef<f64>,
    g: MatRef<f64>,
    planes: &Planes,
    beta: f64,
    causal: bool,
) -> super::backward::SoftGrads64 {
    let pos: Vec<usize> = (0..q.rows).collect();
    soft_race_rows_log(q, k, v, Some(g), planes, beta, causal, &pos).grads
}

/// What [`soft_race_rows_log`] returns for its query rows.
#[derive(Debug, Clone)]
pub struct RowsLog {
    /// `Ô` of the given rows (`rows × dv`); a row with no key is 0.
    pub o: Mat<f64>,
    /// Rows with no key (only with no keys at all, or none at or before a causal position).
    pub empty_rows: usize,
    /// With `g`: `∂ℓ/∂q` of the given rows (`rows × d`), and the share of `∂ℓ/∂k`, `∂ℓ/∂v`
    /// (every key) and `∂ℓ/∂β` that flows through these rows; zeros without `g`.
    pub grads: super::backward::SoftGrads64,
}

/// Soft RACE for some query rows only, forward and (with `g`, the rows' `∂ℓ/∂Ô`) backward,
/// exact at any beta (paper combine rule). Row `t` of `q` is the query at position
/// `pos[t]`; causal, it sees keys `0..=pos[t]`. The cost is `O(rows · keys · L·R)`, so a
/// kernel can hand this the few rows it cannot represent ([`crate::shared::recompute`]).
///
/// Per row, by brute force over keys: `log Ŝ_ij = log Σ_{l,r} e^{log φ_{l,r}(q_i) + log φ_{l,r}(k_j)} − log L`
/// (max-subtracted), `log Den_i` by log-sum-exp over `j`, and every weight formed as the
/// exponential of a log difference that is at most `log(L·R)`:
///
/// - `Ô_i = Σ_j e^{log Ŝ_ij − log Den_i} v_j`;
/// - `∂ℓ/∂v_j = Σ_i e^{log Ŝ_ij − log Den_i} G_i`;
/// - `∂ℓ/∂log φ_{l,r}(q_i) = Σ_j e^{log φ_{l,r}(q_i) + log φ_{l,r}(k_j) − log L − log Den_i}·G_iᵀ(v_j − Ô_i)`,
///   and the same with `q_i` and `k_j` swapped for the keys;
/// - `log φ_r = Σ_p log σ(s_rp·2β·u_p)` (`s_rp = ±1` the bit of `r`), so
///   `∂ log φ_r/∂u_p = 2β·s_rp·σ(−s_rp·2β·u_p)`, `∂ log φ_r/∂β = Σ_p 2u_p·s_rp·σ(−s_rp·2β·u_p)`,
///   `∂ℓ/∂x = Wᵀ(∂ℓ/∂u ⊙ (1 − u²))`.
#[allow(clippy::too_many_arguments)]
pub fn soft_race_rows_log(
    q: MatRef<f64>,
    k: MatRef<f64>,
    v: MatRef<f64>,
    g: Option<MatRef<f64>>,
    planes: &Planes,
    beta: f64,
    causal: bool,
    pos: &[usize],
) -> RowsLog {
    let (n, m, dv, r, lt) = (q.rows, k.rows, v.cols, planes.r(), planes.l);
    let lq = log_feature_bank(planes, q.data, n, beta);
    let lk = log_feature_bank(planes, k.data, m, beta);
    let log_l = (lt as f64).ln();
    let mut terms = vec![0.0; lt * r];
    let mut log_s = |i: usize, j: usize| -> f64 {
        let mut big = f64::NEG_INFINITY;
        for t in 0..lt {
            for b in 0..r {
                let x = lq[(t * n + i) * r + b] + lk[(t * m + j) * r + b];
                terms[t * r + b] = x;
                big = big.max(x);
            }
        }
        if big == f64::NEG_INFINITY {
            return big;
        }
        big + terms.iter().map(|&x| (x - big).exp()).sum::<f64>().ln() - log_l
    };
    let mut o = Mat::zeros(n, dv);
    let mut empty_rows = 0;
    let mut gq = vec![0.0; lt * n * r];
    let mut gk = vec![0.0; lt * m * r];
    let mut dvm = Mat::zeros(m, dv);
    let mut ls = Vec::with_capacity(m);
    for i in 0..n {
        let lim = if causal { (pos[i] + 1).min(m) } else { m };
        ls.clear();
        ls.extend((0..lim).map(|j| log_s(i, j)));
        let big = ls.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        if big == f64::NEG_INFINITY {
            empty_rows += 1;
            continue;
        }
        let log_den = big + ls.iter().map(|&x| (x - big).exp()).sum::<f64>().ln();
        let row = o.row_mut(i);
        for (j, &sj) in ls.iter().enumerate() {
            let w = (sj - log_den).exp();
            row.iter_mut().zip(v.row(j)).for_each(|(x, &y)| *x += w * y);
        }
        let Some(g) = g else { continue };
        let (gi, oi) = (g.row(i), o.row(i));
        for (j, &sj) in ls.iter().enumerate() {
            let w = (sj - log_den).exp();
            let vj = v.row(j);
            let gdiff: f64 = (0..dv).map(|c| gi[c] * (vj[c] - oi[c])).sum();
            super::axpy(dvm.row_mut(j), w, gi);
            for t in 0..lt {
                for b in 0..r {
                    let (a, c) = ((t * n + i) * r + b, (t * m + j) * r + b);
                    let e = (lq[a] + lk[c] - log_l - log_den).exp() * gdiff;
                    gq[a] += e;
                    gk[c] += e;
                }
            }
        }
    }
    let mut dq = Mat::zeros(n, q.cols);
    let mut dk = Mat::zeros(m, k.cols);
    let dbeta = if g.is_some() {
        through_log_features(planes, q, &gq, beta, &mut dq)
            + through_log_features(planes, k, &gk, beta, &mut dk)
    } else {
        0.0
    };
    RowsLog {
        o,
        empty_rows,
        grads: super::backward::SoftGrads64 {
            dq,
            dk,
            dv: dvm,
            dbeta,
        },
    }
}

/// Back-propagate log-feature gradients `gl` (`[L, n, R]`) of the rows of `x` into `dx`;
/// returns their contribution to `∂ℓ/∂β`.
fn through_log_features(
    planes: &Planes,
    x: MatRef<f64>,
    gl: &[f64],
    beta: f64,
    dx: &mut Mat<f64>,
) -> f64 {
    let (p, r, d) = (planes.p, planes.r(), planes.d);
    let mut dbeta = 0.0;
    let mut z = vec![0.0; p];
    for l in 0..planes.l {
        for i in 0..x.rows {
            let gr = &gl[(l * x.rows + i) * r..(l * x.rows + i + 1) * r];
            planes.project(l, x.row(i), &mut z);
            for b in 0..p {
                let u = z[b].tanh();
                // Σ_r gl_r·s_rp·σ(−s_rp·2βu): the bit is on (s = +1) or off (s = −1).
                let (on, off) = (
                    crate::hashing::sigmoid(-2.0 * beta * u),
                    crate::hashing::sigmoid(2.0 * beta * u),
                );
                let sum: f64 = gr
                    .iter()
                    .enumerate()
                    .map(|(rr, &gv)| {
                        if (rr >> (p - 1 - b)) & 1 == 1 {
                            gv * on
                        } else {
                            -gv * off
                        }
                    })
                    .sum();
                dbeta += 2.0 * u * sum;
                let dz = 2.0 * beta * sum * (1.0 - u * u);
                let w = &planes.table(l)[b * d..(b + 1) * d];
                super::axpy(dx.row_mut(i), dz, w);
            }
        }
    }
    dbeta
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::metrics::max_abs_diff;
    use crate::params::{Bits, Seed, Tables};
    use crate::reference::race::soft_race;
    use crate::rng::SeededRng;

    /// The exact forward, paper rule.
    fn exact(
        q: &Mat<f64>,
        k: &Mat<f64>,
        v: &Mat<f64>,
        planes: &Planes,
        beta: f64,
        causal: bool,
    ) -> HeadOutput {
        soft_race_log(
            q.view(),
            k.view(),
            v.view(),
            planes,
            beta,
            causal,
            Combine::Paper,
        )
    }

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
            let planes = Planes::gaussian(Bits(p), Tables(l), 6, Seed(7)).unwrap();
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
        let planes = Planes::gaussian(Bits(2), Tables(3), 5, Seed(11)).unwrap();
        for &beta in &[1e-6, 1e-3, 1.0, 60.0, 400.0, 1e3, 1e4, 1e6] {
            for causal in [false, true] {
                let a = exact(&q, &k, &v, &planes, beta, causal);
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
        let planes = Planes::gaussian(Bits(4), Tables(1), 8, Seed(2)).unwrap();
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
        let exact = exact(&q, &k, &v, &planes, beta, true);
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

    fn loss(o: &Mat<f64>, g: &Mat<f64>) -> f64 {
        o.data.iter().zip(&g.data).map(|(a, b)| a * b).sum()
    }

    /// In range the log-domain gradients equal the plain reference's.
    #[test]
    fn gradients_agree_with_the_plain_reference_in_range() {
        let (q, k, v) = inputs(16, 5, 3, 8);
        let g = inputs(16, 3, 3, 9).2;
        let planes = Planes::gaussian(Bits(2), Tables(2), 5, Seed(4)).unwrap();
        for &beta in &[0.05, 1.0, 12.0] {
            for causal in [false, true] {
                let a = crate::reference::backward::soft_race_backward(
                    q.view(),
                    k.view(),
                    v.view(),
                    g.view(),
                    &planes,
                    beta,
                    causal,
                );
                let b = soft_race_backward_log(
                    q.view(),
                    k.view(),
                    v.view(),
                    g.view(),
                    &planes,
                    beta,
                    causal,
                );
                for (x, y, name) in [
                    (&a.dq, &b.dq, "dq"),
                    (&a.dk, &b.dk, "dk"),
                    (&a.dv, &b.dv, "dv"),
                ] {
                    let e = max_abs_diff(&x.data, &y.data);
                    let s = x.data.iter().map(|t| t.abs()).fold(0.0, f64::max);
                    assert!(
                        e <= 1e-10 * s.max(1.0),
                        "{name} beta={beta} causal={causal}: {e:.2e}"
                    );
                }
                assert!(
                    (a.dbeta - b.dbeta).abs() <= 1e-10 * a.dbeta.abs().max(1.0),
                    "dbeta {beta}"
                );
            }
        }
    }

    /// At large beta (where the plain reference loses rows) the gradients match central
    /// differences of the exact forward.
    #[test]
    fn gradients_match_central_differences_at_large_beta() {
        let (q, k, v) = inputs(10, 4, 2, 12);
        let g = inputs(10, 2, 2, 13).2;
        let planes = Planes::gaussian(Bits(3), Tables(2), 4, Seed(6)).unwrap();
        for &beta in &[3.0, 200.0, 1e3] {
            for causal in [false, true] {
                let f = |q: &Mat<f64>, k: &Mat<f64>, v: &Mat<f64>, beta: f64| {
                    loss(&exact(q, k, v, &planes, beta, causal).o, &g)
                };
                let an = soft_race_backward_log(
                    q.view(),
                    k.view(),
                    v.view(),
                    g.view(),
                    &planes,
                    beta,
                    causal,
                );
                let h = 1e-6 / beta.max(1.0);
                let scale = an
                    .dq
                    .data
                    .iter()
                    .chain(&an.dk.data)
                    .chain(&an.dv.data)
                    .map(|t| t.abs())
                    .fold(1.0, f64::max);
                for (which, grad) in [(0usize, &an.dq), (1, &an.dk), (2, &an.dv)] {
                    for idx in [0usize, 5, grad.data.len() - 1] {
                        let bump = |delta: f64| {
                            let (mut qq, mut kk, mut vv) = (q.clone(), k.clone(), v.clone());
                            [&mut qq, &mut kk, &mut vv][which].data[idx] += delta;
                            f(&qq, &kk, &vv, beta)
                        };
                        let fd = (bump(h) - bump(-h)) / (2.0 * h);
                        let e = (fd - grad.data[idx]).abs();
                        assert!(
                            e <= 1e-5 * scale,
                            "beta={beta} causal={causal} arg {which}[{idx}]: fd {fd:.6e} vs {:.6e}",
                            grad.data[idx]
                        );
                    }
                }
                let hb = 1e-6 * beta;
                let fd = (f(&q, &k, &v, beta + hb) - f(&q, &k, &v, beta - hb)) / (2.0 * hb);
                assert!(
                    (fd - an.dbeta).abs() <= 1e-5 * an.dbeta.abs().max(1e-3 / beta),
                    "dbeta beta={beta}: {fd:.6e} vs {:.6e}",
                    an.dbeta
                );
            }
        }
    }

    /// Denominators spanning 1 … 1e-300 and far below: every key sits in bucket 1 (k = +1),
    /// the queries' bucket-1 feature is `σ(2β·tanh x_i) ≈ e^{−2β|tanh x_i|}` for x_i ≤ 0, so
    /// `Den_i/N` runs from about 1/2 down to e^{−2β·tanh 3}. All keys have the same features, so
    /// every exact row is the mean of V.
    #[test]
    fn denominators_down_to_1e_minus_300_and_beyond() {
        let (n, beta) = (64usize, 1e3);
        let planes = Planes::from_data(Bits(1), Tables(1), 1, vec![1.0]).unwrap();
        let q = Mat::from_vec(
            n,
            1,
            (0..n).map(|i| -3.0 * i as f64 / (n - 1) as f64).collect(),
        );
        let k = Mat::from_vec(n, 1, vec![1.0; n]);
        let v = inputs(n, 1, 2, 21).2;
        let log_den: Vec<f64> = (0..n)
            .map(|i| {
                let mut lq = [0.0; 2];
                log_features(&planes, 0, q.row(i), beta, &mut lq);
                let mut lk = [0.0; 2];
                log_features(&planes, 0, k.row(0), beta, &mut lk);
                log_add_exp(lq[0] + lk[0], lq[1] + lk[1]) + (n as f64).ln()
            })
            .collect();
        assert!(
            log_den[0] > -1.0 && log_den[n - 1] < -300.0 * 10f64.ln(),
            "span {} .. {}",
            log_den[0],
            log_den[n - 1]
        );
        let mean: Vec<f64> = (0..2)
            .map(|c| (0..n).map(|j| v.at(j, c)).sum::<f64>() / n as f64)
            .collect();
        let exact = exact(&q, &k, &v, &planes, beta, false);
        for i in 0..n {
            for c in 0..2 {
                assert!(
                    (exact.o.at(i, c) - mean[c]).abs() < 1e-12,
                    "row {i} (log Den {:.1})",
                    log_den[i]
                );
            }
        }
        // The plain reference loses the rows whose Den is below f64's normal range.
        let plain = soft_race(
            q.view(),
            k.view(),
            v.view(),
            &planes,
            beta,
            false,
            Combine::Paper,
        );
        let below = log_den
            .iter()
            .filter(|&&x| x < f64::MIN_POSITIVE.ln())
            .count();
        assert!(
            below > 0 && plain.empty_rows >= below,
            "{below} rows below range, {} empty",
            plain.empty_rows
        );
    }
}
