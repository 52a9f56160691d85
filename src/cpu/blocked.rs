//! Non-causal soft RACE as blocked matrix products (the production path for `causal =
//! false`). Tokens are processed in blocks of [`T`]: with `Φ` the block's `T × m` features,
//! `X̂ = [V, 1, 0…]` its `T × w` extended values, `Ĝ = [G/Den, −GᵀÔ/Den, 0…]`, and the bank
//! `𝔅 = [B | A]` (`m × w`):
//!
//! - keys: `𝔅 += Φ_Kᵀ X̂` (f32 within a block, added into f64 after every block);
//! - queries: `[Num | Den] = Φ_Q 𝔅`;
//! - backward, queries: `∂ℓ/∂Φ_Q = Ĝ 𝔅ᵀ / L`, `d𝔅 += Φ_Qᵀ Ĝ / L`;
//! - backward, keys: `∂ℓ/∂Φ_K = X̂ d𝔅ᵀ`, `∂ℓ/∂V = Φ_K dB`;
//! - projections `Z = X Wᵀ` and `∂ℓ/∂X = dZ W`.
//!
//! Every product is a faer GEMM (`Par::Seq`; rayon runs (head, segment) items in parallel),
//! so the bank is read once per block instead of once per token. Same maths, same planes and
//! same [`Ctx`] as [`super::forward`]/[`super::backward`] (either backward accepts either
//! forward's context); tested against the f64 reference like every other path.

use super::features::SoftMap;
use super::forward::Ctx;
use super::simd::{detected_isa, dispatch, exp_f32, tanh_f32, Simd, WithSimd};
use super::state::{bank_width, plan_segments, split_out, Heads};
use faer::linalg::matmul::matmul;
use faer::{Accum, MatMut, MatRef, Par};
use rayon::prelude::*;

/// Tokens per block (also the f32 accumulation length before an f64 flush).
pub const T: usize = 256;

/// `u = tanh(z)` (in place), `on = σ(2·beta·u)`, `off = σ(−2·beta·u)` over a whole block,
/// in the dispatched SIMD frame (the loop is branch-free and vectorises).
struct BitProbs<'a> {
    z: &'a mut [f32],
    on: &'a mut [f32],
    off: &'a mut [f32],
    beta: f32,
}

impl WithSimd for BitProbs<'_> {
    type Output = ();
    #[inline(always)]
    fn run<S: Simd>(self) {
        for ((z, on), off) in self
            .z
            .iter_mut()
            .zip(self.on.iter_mut())
            .zip(self.off.iter_mut())
        {
            let u = tanh_f32(*z);
            let t = 2.0 * self.beta * u;
            *z = u;
            // σ(±t) = 1/(1 + e^{∓t}); exp_f32 clamps its argument, so both stay finite.
            *on = 1.0 / (1.0 + exp_f32(-t));
            *off = 1.0 / (1.0 + exp_f32(t));
        }
    }
}

/// Per-block feature state: projections' tanh, bit probabilities, features.
pub(crate) struct Block {
    z: Vec<f32>,              // T × LP
    on: Vec<f32>,             // T × LP
    off: Vec<f32>,            // T × LP
    pub(crate) phi: Vec<f32>, // T × m
}

impl Block {
    pub(crate) fn new(lp: usize, m: usize) -> Self {
        Block {
            z: vec![0.0; T * lp],
            on: vec![0.0; T * lp],
            off: vec![0.0; T * lp],
            phi: vec![0.0; T * m],
        }
    }

    /// Features of rows `x` (`rows × d`); `z` keeps `u = tanh(Wx)` for the backward.
    pub(crate) fn features(&mut self, map: &SoftMap, x: &[f32], rows: usize) {
        let (pl, d) = (map.planes, map.planes.d);
        let (p, l, r) = (pl.p, pl.l, pl.r());
        let (lp, m) = (l * p, l * r);
        let w = MatRef::from_row_major_slice(&pl.w, lp, d);
        matmul(
            MatMut::from_row_major_slice_mut(&mut self.z[..rows * lp], rows, lp),
            Accum::Replace,
            MatRef::from_row_major_slice(x, rows, d),
            w.transpose(),
            1.0f32,
            Par::Seq,
        );
        dispatch(
            detected_isa(),
            BitProbs {
                z: &mut self.z[..rows * lp],
                on: &mut self.on[..rows * lp],
                off: &mut self.off[..rows * lp],
                beta: map.beta,
            },
        );
        for i in 0..rows {
            for t in 0..l {
                let out = &mut self.phi[i * m + t * r..i * m + (t + 1) * r];
                out[0] = 1.0;
                let mut len = 1;
                for b in 0..p {
                    let (on, off) = (self.on[i * lp + t * p + b], self.off[i * lp + t * p + b]);
                    for j in (0..len).rev() {
                        let parent = out[j];
                        out[2 * j] = parent * off;
                        out[2 * j + 1] = parent * on;
                    }
                    len *= 2;
                }
            }
        }
    }

    /// From `∂ℓ/∂φ` (`rows × m`) to `∂ℓ/∂z` (written into `dz`, `rows × LP`); returns Σ ∂ℓ/∂beta.
    pub(crate) fn backward(&self, map: &SoftMap, gphi: &[f32], dz: &mut [f32], rows: usize) -> f64 {
        let (p, l, r) = (map.planes.p, map.planes.l, map.planes.r());
        let (lp, m) = (l * p, l * r);
        let mut dbeta = 0.0f64;
        for i in 0..rows {
            let mut db = 0.0f32;
            for t in 0..l {
                let ph = &self.phi[i * m + t * r..i * m + (t + 1) * r];
                let gp = &gphi[i * m + t * r..i * m + (t + 1) * r];
                let gbar: f32 = ph.iter().zip(gp).map(|(a, b)| a * b).sum();
                for b in 0..p {
                    let shift = p - 1 - b;
                    let mut c = 0.0f32;
                    for (rr, (&x, &g)) in ph.iter().zip(gp).enumerate() {
                        let v = x * (g - gbar);
                        c += if (rr >> shift) & 1 == 1 { v } else { -v };
                    }
                    let u = self.z[i * lp + t * p + b];
                    db += u * c;
                    dz[i * lp + t * p + b] = map.beta * c * (1.0 - u * u);
                }
            }
            dbeta += db as f64;
        }
        dbeta
    }
}

/// `ĝ_i = [G_i/Den_i, −G_iᵀÔ_i/Den_i, 0…]` for `rows` tokens from `a`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn g_ext(
    g: &Heads,
    o: &Heads,
    den: &[f32],
    h: usize,
    a: usize,
    rows: usize,
    dv: usize,
    w: usize,
    out: &mut [f32],
) {
    for i in 0..rows {
        let (gr, or) = (g.row(h, a + i), o.row(h, a + i));
        let dn = den[h * g.n + a + i];
        let e = &mut out[i * w..(i + 1) * w];
        e.iter_mut().for_each(|x| *x = 0.0);
        if dn != 0.0 {
            let inv = 1.0 / dn;
            e[..dv].iter_mut().zip(gr).for_each(|(x, &y)| *x = y * inv);
            e[dv] = -gr.iter().zip(or).map(|(x, y)| x * y).sum::<f32>() * inv;
        }
    }
}

/// `ext[i] = [y_i, 1, 0…]` for `rows` rows of width `dv` into a `rows × w` buffer.
pub(crate) fn extend(y: &[f32], rows: usize, dv: usize, w: usize, ext: &mut [f32]) {
    for i in 0..rows {
        let e = &mut ext[i * w..(i + 1) * w];
        e[..dv].copy_from_slice(&y[i * dv..(i + 1) * dv]);
        e[dv] = 1.0;
        e[dv + 1..].iter_mut().for_each(|x| *x = 0.0);
    }
}

fn add_f64(acc: &mut [f64], x: &mut [f32]) {
    for (a, b) in acc.iter_mut().zip(x.iter_mut()) {
        *a += *b as f64;
        *b = 0.0;
    }
}

pub(crate) fn rows_of<'a>(x: &Heads<'a>, h: usize, a: usize, b: usize) -> &'a [f32] {
    &x.data[(h * x.n + a) * x.cols..(h * x.n + b) * x.cols]
}

/// `Σ_j φ(k_j)[v_j, 1]` over `range` of head `h` (f64).
pub(crate) fn key_bank(
    map: &SoftMap,
    k: Heads,
    v: Heads,
    h: usize,
    range: (usize, usize),
) -> Vec<f64> {
    let (m, dv, w) = (map.width(), v.cols, bank_width(v.cols));
    let mut blk = Block::new(map.planes.l * map.planes.p, m);
    let (mut ext, mut b32, mut b64) = (
        vec![0.0f32; T * w],
        vec![0.0f32; m * w],
        vec![0.0f64; m * w],
    );
    let mut a = range.0;
    while a < range.1 {
        let b = (a + T).min(range.1);
        let rows = b - a;
        blk.features(map, rows_of(&k, h, a, b), rows);
        extend(rows_of(&v, h, a, b), rows, dv, w, &mut ext);
        let phi = MatRef::from_row_major_slice(&blk.phi[..rows * m], rows, m);
        matmul(
            MatMut::from_row_major_slice_mut(&mut b32, m, w),
            Accum::Add,
            phi.transpose(),
            MatRef::from_row_major_slice(&ext[..rows * w], rows, w),
            1.0f32,
            Par::Seq,
        );
        add_f64(&mut b64, &mut b32);
        a = b;
    }
    b64
}

use super::features::FeatureMap;

/// Non-causal pass 1, blocked: `[B | A] = Σ_j φ(k_j)[v_j, 1]` per head (f64).
pub fn key_banks(map: &SoftMap, k: Heads, v: Heads) -> Vec<Vec<f64>> {
    let (heads, m, w) = (k.heads, map.width(), bank_width(v.cols));
    let kseg = plan_segments(k.n, heads);
    let parts: Vec<Vec<f64>> = (0..heads * kseg.len())
        .into_par_iter()
        .map(|i| key_bank(map, k, v, i / kseg.len(), kseg[i % kseg.len()]))
        .collect();
    let banks: Vec<Vec<f64>> = parts
        .chunks(kseg.len())
        .map(|c| {
            c.iter().fold(vec![0.0f64; m * w], |mut acc, p| {
                acc.iter_mut().zip(p).for_each(|(a, b)| *a += b);
                acc
            })
        })
        .collect();
    banks
}

/// Non-causal pass 2, blocked: `o = Num/Den` from the per-head banks into `o` and `den`
/// (`[heads, n]`, the Algorithm-1 denominator); returns (empty rows, segments used).
pub fn read_into(
    map: &SoftMap,
    q: Heads,
    banks: &[Vec<f64>],
    dv: usize,
    o: &mut [f32],
    den: &mut [f32],
) -> (usize, Vec<(usize, usize)>) {
    let (heads, n, m, w) = (q.heads, q.n, map.width(), bank_width(dv));
    let banks32: Vec<Vec<f32>> = banks
        .iter()
        .map(|b| b.iter().map(|&x| x as f32).collect())
        .collect();
    let segs = plan_segments(n, heads);
    let inv_l = map.den_scale();
    let empty: usize = split_out(o, n, dv, &segs)
        .into_par_iter()
        .zip(split_out(den, n, 1, &segs).into_par_iter())
        .map(|((h, s, op), (_, _, dp))| {
            let mut blk = Block::new(map.planes.l * map.planes.p, m);
            let mut acc = vec![0.0f32; T * w];
            let (mut a, end, mut empty) = (segs[s].0, segs[s].1, 0usize);
            let bank = MatRef::from_row_major_slice(&banks32[h], m, w);
            while a < end {
                let b = (a + T).min(end);
                let rows = b - a;
                blk.features(map, rows_of(&q, h, a, b), rows);
                matmul(
                    MatMut::from_row_major_slice_mut(&mut acc[..rows * w], rows, w),
                    Accum::Replace,
                    MatRef::from_row_major_slice(&blk.phi[..rows * m], rows, m),
                    bank,
                    1.0f32,
                    Par::Seq,
                );
                for i in 0..rows {
                    let t = a - segs[s].0 + i;
                    let row = &acc[i * w..(i + 1) * w];
                    let d = row[dv];
                    let out = &mut op[t * dv..(t + 1) * dv];
                    if d == 0.0 || !d.is_finite() {
                        out.iter_mut().for_each(|x| *x = 0.0);
                        dp[t] = 0.0;
                        empty += 1;
                    } else {
                        let inv = 1.0 / d;
                        out.iter_mut()
                            .zip(&row[..dv])
                            .for_each(|(x, &y)| *x = y * inv);
                        dp[t] = d * inv_l;
                    }
                }
                a = b;
            }
            empty
        })
        .sum();
    (empty, segs)
}

/// Non-causal soft-RACE forward, blocked. Same contract as [`super::forward_into`].
pub fn forward_into(
    map: &SoftMap,
    q: Heads,
    k: Heads,
    v: Heads,
    o: &mut [f32],
    mut den: Vec<f32>,
) -> (usize, Ctx) {
    den.resize(q.heads * q.n, 0.0);
    let banks = key_banks(map, k, v);
    let (empty, segs) = read_into(map, q, &banks, v.cols, o, &mut den);
    (
        empty,
        Ctx {
            causal: false,
            segs,
            banks,
            den,
        },
    )
}

/// Backward, queries' side (blocked): `∂ℓ/∂q` into `dq` and the per-head `d𝔅 = Σ_i φ(q_i) ĝ_iᵀ/L`
/// (f64); returns `(d𝔅 per head, the queries' share of ∂ℓ/∂beta)`.
#[allow(clippy::too_many_arguments)]
pub fn query_grads(
    map: &SoftMap,
    banks: &[Vec<f64>],
    segs: &[(usize, usize)],
    den: &[f32],
    q: Heads,
    o: Heads,
    g: Heads,
    dq: &mut [f32],
) -> (Vec<Vec<f64>>, f64) {
    let (heads, n, d, dv, m, w) = (
        q.heads,
        q.n,
        q.cols,
        o.cols,
        map.width(),
        bank_width(o.cols),
    );
    let lp = map.planes.l * map.planes.p;
    let inv_l = 1.0 / map.planes.l as f32;
    let wm = MatRef::from_row_major_slice(&map.planes.w, lp, d);
    let banks32: Vec<Vec<f32>> = banks
        .iter()
        .map(|b| b.iter().map(|&x| x as f32).collect())
        .collect();
    // Queries: ∂ℓ/∂q and the per-segment d𝔅.
    let qres: Vec<(usize, Vec<f64>, f64)> = split_out(dq, n, d, segs)
        .into_par_iter()
        .map(|(h, s, dqp)| {
            let mut blk = Block::new(lp, m);
            let (mut gx, mut gphi, mut dz) = (
                vec![0.0f32; T * w],
                vec![0.0f32; T * m],
                vec![0.0f32; T * lp],
            );
            let (mut d32, mut d64) = (vec![0.0f32; m * w], vec![0.0f64; m * w]);
            let bank = MatRef::from_row_major_slice(&banks32[h], m, w);
            let (mut a, end, mut dbeta) = (segs[s].0, segs[s].1, 0.0f64);
            while a < end {
                let b = (a + T).min(end);
                let rows = b - a;
                blk.features(map, rows_of(&q, h, a, b), rows);
                g_ext(&g, &o, den, h, a, rows, dv, w, &mut gx);
                let gxm = MatRef::from_row_major_slice(&gx[..rows * w], rows, w);
                matmul(
                    MatMut::from_row_major_slice_mut(&mut gphi[..rows * m], rows, m),
                    Accum::Replace,
                    gxm,
                    bank.transpose(),
                    inv_l,
                    Par::Seq,
                );
                matmul(
                    MatMut::from_row_major_slice_mut(&mut d32, m, w),
                    Accum::Add,
                    MatRef::from_row_major_slice(&blk.phi[..rows * m], rows, m).transpose(),
                    gxm,
                    inv_l,
                    Par::Seq,
                );
                add_f64(&mut d64, &mut d32);
                dbeta += blk.backward(map, &gphi, &mut dz, rows);
                let t0 = a - segs[s].0;
                matmul(
                    MatMut::from_row_major_slice_mut(&mut dqp[t0 * d..(t0 + rows) * d], rows, d),
                    Accum::Replace,
                    MatRef::from_row_major_slice(&dz[..rows * lp], rows, lp),
                    wm,
                    1.0f32,
                    Par::Seq,
                );
                a = b;
            }
            (h, d64, dbeta)
        })
        .collect();
    let mut dbanks = vec![vec![0.0f64; m * w]; heads];
    for (h, bank, _) in &qres {
        dbanks[*h].iter_mut().zip(bank).for_each(|(a, b)| *a += b);
    }
    (dbanks, qres.iter().map(|x| x.2).sum())
}

/// Backward, keys' side (blocked): `∂ℓ/∂k`, `∂ℓ/∂v` into `dk`, `dvv` from the per-head `d𝔅`;
/// returns the keys' share of `∂ℓ/∂beta`.
#[allow(clippy::too_many_arguments)]
pub fn key_grads(
    map: &SoftMap,
    dbanks: &[Vec<f64>],
    segs: &[(usize, usize)],
    k: Heads,
    v: Heads,
    dk: &mut [f32],
    dvv: &mut [f32],
) -> f64 {
    let (d, dv, m, w) = (k.cols, v.cols, map.width(), bank_width(v.cols));
    let lp = map.planes.l * map.planes.p;
    let wm = MatRef::from_row_major_slice(&map.planes.w, lp, d);
    let dbanks32: Vec<Vec<f32>> = dbanks
        .iter()
        .map(|b| b.iter().map(|&x| x as f32).collect())
        .collect();
    let dbeta_k: f64 = split_out(dk, k.n, d, segs)
        .into_par_iter()
        .zip(split_out(dvv, k.n, dv, segs).into_par_iter())
        .map(|((h, s, dkp), (_, _, dvp))| {
            let mut blk = Block::new(lp, m);
            let (mut ext, mut gphi, mut dz) = (
                vec![0.0f32; T * w],
                vec![0.0f32; T * m],
                vec![0.0f32; T * lp],
            );
            let db = MatRef::from_row_major_slice(&dbanks32[h], m, w);
            let db_values = MatRef::from_row_major_slice_with_stride(&dbanks32[h], m, dv, w);
            let (mut a, end, mut dbeta) = (segs[s].0, segs[s].1, 0.0f64);
            while a < end {
                let b = (a + T).min(end);
                let rows = b - a;
                blk.features(map, rows_of(&k, h, a, b), rows);
                extend(rows_of(&v, h, a, b), rows, dv, w, &mut ext);
                let phi = MatRef::from_row_major_slice(&blk.phi[..rows * m], rows, m);
                matmul(
                    MatMut::from_row_major_slice_mut(&mut gphi[..rows * m], rows, m),
                    Accum::Replace,
                    MatRef::from_row_major_slice(&ext[..rows * w], rows, w),
                    db.transpose(),
                    1.0f32,
                    Par::Seq,
                );
                let t0 = a - segs[s].0;
                matmul(
                    MatMut::from_row_major_slice_mut(&mut dvp[t0 * dv..(t0 + rows) * dv], rows, dv),
                    Accum::Replace,
                    phi,
                    db_values,
                    1.0f32,
                    Par::Seq,
                );
                dbeta += blk.backward(map, &gphi, &mut dz, rows);
                matmul(
                    MatMut::from_row_major_slice_mut(&mut dkp[t0 * d..(t0 + rows) * d], rows, d),
                    Accum::Replace,
                    MatRef::from_row_major_slice(&dz[..rows * lp], rows, lp),
                    wm,
                    1.0f32,
                    Par::Seq,
                );
                a = b;
            }
            dbeta
        })
        .sum();
    dbeta_k
}

/// Non-causal soft-RACE backward, blocked; writes every entry of `dq`, `dk`, `dv`; returns
/// `∂ℓ/∂beta`. Same contract as [`super::soft_backward_into`] for a non-causal context.
#[allow(clippy::too_many_arguments)]
pub fn backward_into(
    map: &SoftMap,
    ctx: &Ctx,
    q: Heads,
    k: Heads,
    v: Heads,
    o: Heads,
    g: Heads,
    dq: &mut [f32],
    dk: &mut [f32],
    dvv: &mut [f32],
) -> f64 {
    assert!(!ctx.causal, "blocked backward is the non-causal path");
    let (dbanks, dbeta_q) = query_grads(map, &ctx.banks, &ctx.segs, &ctx.den, q, o, g, dq);
    dbeta_q + key_grads(map, &dbanks, &ctx.segs, k, v, dk, dvv)
}
