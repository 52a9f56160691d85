//! Rows an f32 kernel cannot represent, found and recomputed exactly in the log domain.
//!
//! At large beta every kernel weight of a query row can be `e^{−2β·…}`: a bucket that no key
//! falls near holds a mass below f32's range, the row's numerator and denominator are then
//! quantised subnormals (or zero) and their ratio is noise. Every soft-RACE kernel (CPU
//! blocked and per-token, CUDA warp and tiled; causal or not) therefore *flags* a row whose
//! f32 denominator `Den_i = Σ_{l,r} φ_{l,r}(q_i) A_{l,r}` (before the `1/L`) is below
//! [`den_floor`]: it writes a zero row and saves `Den_i = 0`. The backward kernels already
//! give a saved `Den_i = 0` no share of any gradient (`ĝ_i = 0`), so a flagged row is simply
//! left out of every f32 sum. [`forward`] and [`backward`] then put it back exactly:
//!
//! - forward: `Ô_i` from [`crate::reference::logdomain::soft_race_rows_log`] on the f32
//!   inputs widened to f64;
//! - backward: the same routine with the rows' `G_i` gives their `∂ℓ/∂q_i` and their share
//!   of every key's `∂ℓ/∂k_j`, `∂ℓ/∂v_j` (through `G_i/Den_i`, which f32 cannot hold) and of
//!   `∂ℓ/∂β`; these are added to the kernel's gradients. Causal, a flagged row reaches keys
//!   `j ≤ i` only, so the suffix state of the causal backward needs nothing more.
//!
//! **Why the floor is safe.** Features are at most 1 and masses at most `n` (keys). In f32,
//! each feature, each mass and each product loses at most the smallest normal `2^-126`
//! (flushed to zero or rounded as a subnormal), so `|ΔDen| ≲ 2mn·2^-126` and
//! `|ΔNum| ≲ 2mn·2^-126·max|v|` (`m = L·R` features). For `Den ≥ mn·2^-100` the output error
//! is then at most `4·2^-26·max|v| = 2^-24·max|v|`, f32's own rounding. Rows below it are
//! recomputed; at ordinary beta there are none (`Den ≥ max_r φ_r(q)·φ_r(k_i) ≥ …` stays far
//! above the floor), so the kernels' speed is unchanged.
//!
//! **Cost.** `O(rows · keys · L·R)` per head (brute force over the keys of each flagged row,
//! which is cheaper than a scan when such rows are rare), plus the keys' log-features. The
//! seconds spent are reported with the row count.

use super::SoftMap;
use crate::backend::{ForwardInputs, GradsMut, Heads};

use crate::reference::logdomain::soft_race_rows_log;
use crate::tensor::Mat;
use rayon::prelude::*;
use std::time::Instant;

/// The smallest f32 denominator (`Σ_{l,r} φ A`, before the `1/L`) a kernel trusts:
/// `m·n·2^-100` for `m` features and `n` keys (see the module docs).
#[inline]
pub fn den_floor(m: usize, keys: usize) -> f32 {
    (m as f32) * (keys.max(1) as f32) * f32::powi(2.0, -100)
}

pub use crate::backend::Recomputed;

/// The rows a kernel flagged: saved denominator 0.
pub fn flagged(den: &[f32]) -> Vec<usize> {
    den.iter()
        .enumerate()
        .filter(|(_, &d)| d == 0.0)
        .map(|(i, _)| i)
        .collect()
}

/// One head's flagged rows, widened to f64, with the keys they see.
struct HeadRows {
    h: usize,
    /// Row indices within the head.
    pos: Vec<usize>,
}

fn by_head(rows: &[usize], n: usize) -> Vec<HeadRows> {
    let mut out: Vec<HeadRows> = Vec::new();
    for &r in rows {
        let (h, i) = (r / n, r % n);
        match out.last_mut() {
            Some(hr) if hr.h == h => hr.pos.push(i),
            _ => out.push(HeadRows { h, pos: vec![i] }),
        }
    }
    out
}

fn widen(x: &Heads, h: usize, rows: impl Iterator<Item = usize>) -> Mat<f64> {
    let data: Vec<f64> = rows
        .flat_map(|i| x.row(h, i).iter().map(|&a| a as f64))
        .collect();
    Mat::from_vec(data.len() / x.cols.max(1), x.cols, data)
}

/// What one head's exact pass gives.
struct HeadExact {
    h: usize,
    pos: Vec<usize>,
    out: crate::reference::logdomain::RowsLog,
}

/// The exact pass over every head with flagged rows (`g`: the upstream gradient, for the
/// backward). Causal, only keys up to the last flagged row are read.
fn exact(
    map: &SoftMap,
    x: ForwardInputs,
    g: Option<Heads>,
    causal: bool,
    rows: &[usize],
) -> Vec<HeadExact> {
    let (ForwardInputs { q, k, v }, beta) = (x, map.beta);
    let p64 = map.planes.to_planes();
    by_head(rows, q.n)
        .into_par_iter()
        .map(|hr| {
            let keys = if causal {
                (hr.pos.iter().max().unwrap() + 1).min(k.n)
            } else {
                k.n
            };
            let qm = widen(&q, hr.h, hr.pos.iter().cloned());
            let (km, vm) = (widen(&k, hr.h, 0..keys), widen(&v, hr.h, 0..keys));
            let gm = g.map(|g| widen(&g, hr.h, hr.pos.iter().cloned()));
            let out = soft_race_rows_log(
                qm.view(),
                km.view(),
                vm.view(),
                gm.as_ref().map(|x| x.view()),
                &p64,
                beta as f64,
                causal,
                &hr.pos,
            );
            HeadExact {
                h: hr.h,
                pos: hr.pos,
                out,
            }
        })
        .collect()
}

/// Write the exact outputs of the flagged `rows` into `o` (`[heads, n, dv]`). Returns the
/// rows that have no key at all (left 0) and what was recomputed.
pub fn forward(
    map: &SoftMap,
    x: ForwardInputs,
    causal: bool,
    rows: Vec<usize>,
    o: &mut [f32],
) -> (usize, Recomputed) {
    let t = Instant::now();
    let (q, dv) = (x.q, x.v.cols);
    let mut empty = 0;
    for he in exact(map, x, None, causal, &rows) {
        empty += he.out.empty_rows;
        for (t, &i) in he.pos.iter().enumerate() {
            let at = (he.h * q.n + i) * dv;
            o[at..at + dv]
                .iter_mut()
                .zip(he.out.o.row(t))
                .for_each(|(y, &x)| *y = x as f32);
        }
    }
    (
        empty,
        Recomputed {
            rows,
            seconds: t.elapsed().as_secs_f64(),
        },
    )
}

/// Add the flagged `rows`' exact share of every gradient (`g`: `∂ℓ/∂Ô`, `[heads, n, dv]`) to
/// `dq`, `dk`, `dv`; returns their share of `∂ℓ/∂β`. The kernel gave these rows none.
pub fn backward(
    map: &SoftMap,
    x: ForwardInputs,
    g: Heads,
    causal: bool,
    rows: &[usize],
    out: GradsMut,
) -> f64 {
    let (ForwardInputs { q, k, v }, GradsMut { dq, dk, dv }) = (x, out);
    let (d, cv) = (q.cols, v.cols);
    let mut dbeta = 0.0;
    for he in exact(map, x, Some(g), causal, rows) {
        let gr = &he.out.grads;
        dbeta += gr.dbeta;
        for (t, &i) in he.pos.iter().enumerate() {
            let at = (he.h * q.n + i) * d;
            let row = gr.dq.row(t);
            dq[at..at + d]
                .iter_mut()
                .zip(row)
                .for_each(|(y, &x)| *y += x as f32);
        }
        for j in 0..gr.dk.rows {
            let (ak, av) = ((he.h * k.n + j) * d, (he.h * v.n + j) * cv);
            dk[ak..ak + d]
                .iter_mut()
                .zip(gr.dk.row(j))
                .for_each(|(y, &x)| *y += x as f32);
            dv[av..av + cv]
                .iter_mut()
                .zip(gr.dv.row(j))
                .for_each(|(y, &x)| *y += x as f32);
        }
    }
    dbeta
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_group_by_head_in_order() {
        let hs = by_head(&[0, 3, 5, 6, 11], 4);
        let got: Vec<(usize, Vec<usize>)> = hs.into_iter().map(|h| (h.h, h.pos)).collect();
        assert_eq!(got, vec![(0, vec![0, 3]), (1, vec![1, 2]), (2, vec![3])]);
    }

    #[test]
    fn the_floor_scales_with_features_and_keys() {
        assert_eq!(den_floor(1, 1), f32::powi(2.0, -100));
        assert_eq!(den_floor(32, 1 << 20), f32::powi(2.0, -75));
        assert_eq!(den_floor(8, 0), den_floor(8, 1));
        assert_eq!(flagged(&[1.0, 0.0, 2.0, 0.0]), vec![1, 3]);
    }
}
