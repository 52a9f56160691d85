//! Causal soft RACE (Algorithm 2) as blocked matrix products: chunked linear attention.
//!
//! Tokens are processed in sub-blocks of [`TC`]. With `S` the bank entering a sub-block
//! (f64 base + f32 block-local sum, read as one f32 matrix), and lower-triangular masks
//! (`j ≤ i`, token i sees itself):
//!
//! - forward: `[Num | Den] = Φ_Q S + tril(Φ_Q Φ_Kᵀ) X̂`, then `S += Φ_Kᵀ X̂`;
//! - backward, queries (forward order, prefix recomputed from the stored segment bases):
//!   `∂ℓ/∂Φ_Q = (Ĝ Sᵀ + tril(Ĝ X̂ᵀ) Φ_K)/L`;
//! - backward, keys (reverse order; `dS` = suffix `Σ_{t>block} φ(q_t) ĝ_tᵀ/L`):
//!   `∂ℓ/∂Φ_K = X̂ dSᵀ + triu(X̂ Ĝᵀ) Φ_Q/L`, `∂ℓ/∂V = Φ_K dS_B + triu(Φ_K Φ_Qᵀ) Ĝ_v/L`.
//!
//! Segments (for parallelism at few heads) start from f64 exclusive scans of segment totals,
//! exactly as in [`super::forward`]; the f32 block-local sums are moved into f64 every
//! [`super::blocked::T`] tokens, so accuracy does not depend on N.

use super::blocked::{extend, g_ext, rows_of, Block, T};
use super::features::{FeatureMap, SoftMap};
use super::forward::{exclusive_scan, Ctx};
use super::state::{bank_width, plan_segments, split_out, Heads};
use faer::linalg::matmul::matmul;
use faer::{Accum, MatMut, MatRef, Par};
use rayon::prelude::*;

/// Tokens per causal sub-block (the intra-block products are `TC × TC`).
pub const TC: usize = 32;

fn mm(
    dst: &mut [f32],
    rows: usize,
    cols: usize,
    acc: Accum,
    a: MatRef<f32>,
    b: MatRef<f32>,
    alpha: f32,
) {
    matmul(
        MatMut::from_row_major_slice_mut(&mut dst[..rows * cols], rows, cols),
        acc,
        a,
        b,
        alpha,
        Par::Seq,
    );
}

fn view(x: &[f32], rows: usize, cols: usize) -> MatRef<'_, f32> {
    MatRef::from_row_major_slice(&x[..rows * cols], rows, cols)
}

/// Zero the entries above (`lower = true`: keep `j ≤ i`) or below (keep `j ≥ i`) the diagonal.
fn mask(a: &mut [f32], rows: usize, lower: bool) {
    for i in 0..rows {
        for j in 0..rows {
            if (lower && j > i) || (!lower && j < i) {
                a[i * rows + j] = 0.0;
            }
        }
    }
}

/// An f64 bank with an f32 block-local part, read as one f32 matrix.
struct TwoLevel {
    base: Vec<f64>,
    local: Vec<f32>,
    read: Vec<f32>,
    pending: usize,
}

impl TwoLevel {
    fn new(base: &[f64]) -> Self {
        TwoLevel {
            base: base.to_vec(),
            local: vec![0.0; base.len()],
            read: vec![0.0; base.len()],
            pending: 0,
        }
    }
    /// `read = f32(base) + local`.
    fn refresh(&mut self) {
        for ((r, &b), &l) in self.read.iter_mut().zip(&self.base).zip(&self.local) {
            *r = b as f32 + l;
        }
    }
    /// Count `rows` tokens; fold the f32 part into f64 every `T` tokens.
    fn tick(&mut self, rows: usize) {
        self.pending += rows;
        if self.pending >= T {
            for (b, l) in self.base.iter_mut().zip(self.local.iter_mut()) {
                *b += *l as f64;
                *l = 0.0;
            }
            self.pending = 0;
        }
    }
}

/// Scratch for one sub-block.
struct Scratch {
    kb: Block,
    qb: Block,
    x: Vec<f32>,    // TC × w
    g: Vec<f32>,    // TC × w
    a: Vec<f32>,    // TC × TC
    acc: Vec<f32>,  // TC × w
    gphi: Vec<f32>, // TC × m
    dz: Vec<f32>,   // TC × LP
}

impl Scratch {
    fn new(map: &SoftMap, w: usize) -> Self {
        let (lp, m) = (map.planes.l * map.planes.p, map.width());
        Scratch {
            kb: Block::new(lp, m),
            qb: Block::new(lp, m),
            x: vec![0.0; TC * w],
            g: vec![0.0; TC * w],
            a: vec![0.0; TC * TC],
            acc: vec![0.0; TC * w],
            gphi: vec![0.0; TC * m],
            dz: vec![0.0; TC * lp],
        }
    }
}

/// Causal forward; same contract as [`super::forward_into`] with `causal = true`.
pub fn forward_into(
    map: &SoftMap,
    q: Heads,
    k: Heads,
    v: Heads,
    o: &mut [f32],
    mut den: Vec<f32>,
) -> (usize, Ctx) {
    let (heads, n, dv, m, w) = (q.heads, q.n, v.cols, map.width(), bank_width(v.cols));
    den.resize(heads * n, 0.0);
    let segs = plan_segments(n, heads);
    let ns = segs.len();
    let totals: Vec<Vec<f64>> = if ns > 1 {
        (0..heads * ns)
            .into_par_iter()
            .map(|i| super::blocked::key_bank(map, k, v, i / ns, segs[i % ns]))
            .collect()
    } else {
        vec![vec![0.0; m * w]; heads]
    };
    let bases = exclusive_scan(&totals, heads, ns, false);
    let den_scale = map.den_scale();
    let empty: usize = split_out(o, n, dv, &segs)
        .into_par_iter()
        .zip(split_out(&mut den, n, 1, &segs).into_par_iter())
        .map(|((h, s, op), (_, _, dp))| {
            let mut st = TwoLevel::new(&bases[h * ns + s]);
            let mut sc = Scratch::new(map, w);
            let (start, end) = segs[s];
            let (mut a, mut empty) = (start, 0usize);
            while a < end {
                let b = (a + TC).min(end);
                let rows = b - a;
                st.refresh();
                sc.kb.features(map, rows_of(&k, h, a, b), rows);
                sc.qb.features(map, rows_of(&q, h, a, b), rows);
                extend(rows_of(&v, h, a, b), rows, dv, w, &mut sc.x);
                let (pq, pk, xm) = (
                    view(&sc.qb.phi, rows, m),
                    view(&sc.kb.phi, rows, m),
                    view(&sc.x, rows, w),
                );
                mm(
                    &mut sc.acc,
                    rows,
                    w,
                    Accum::Replace,
                    pq,
                    view(&st.read, m, w),
                    1.0,
                );
                mm(
                    &mut sc.a,
                    rows,
                    rows,
                    Accum::Replace,
                    pq,
                    pk.transpose(),
                    1.0,
                );
                mask(&mut sc.a, rows, true);
                mm(
                    &mut sc.acc,
                    rows,
                    w,
                    Accum::Add,
                    view(&sc.a, rows, rows),
                    xm,
                    1.0,
                );
                for i in 0..rows {
                    let t = a - start + i;
                    let row = &sc.acc[i * w..(i + 1) * w];
                    let d = row[dv];
                    let out = &mut op[t * dv..(t + 1) * dv];
                    if d == 0.0 || !d.is_finite() {
                        out.iter_mut().for_each(|x| *x = 0.0);
                        dp[t] = 0.0;
                        empty += 1;
                    } else {
                        out.iter_mut()
                            .zip(&row[..dv])
                            .for_each(|(x, &y)| *x = y / d);
                        dp[t] = d * den_scale;
                    }
                }
                mm(&mut st.local, m, w, Accum::Add, pk.transpose(), xm, 1.0);
                st.tick(rows);
                a = b;
            }
            empty
        })
        .sum();
    (
        empty,
        Ctx {
            causal: true,
            segs,
            banks: bases,
            den,
        },
    )
}

/// Causal backward from a causal [`Ctx`] (either causal forward's); writes every entry of
/// `dq`, `dk`, `dv`; returns `∂ℓ/∂beta`.
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
    assert!(ctx.causal, "blocked causal backward needs a causal context");
    let (heads, n, d, dv, m, w) = (
        q.heads,
        q.n,
        q.cols,
        v.cols,
        map.width(),
        bank_width(v.cols),
    );
    let lp = map.planes.l * map.planes.p;
    let inv_l = 1.0 / map.planes.l as f32;
    let wm = MatRef::from_row_major_slice(&map.planes.w, lp, d);
    let (segs, ns, den) = (&ctx.segs, ctx.segs.len(), &ctx.den);
    // Queries, in order, with the prefix state rebuilt from the segment bases.
    let dbeta_q: f64 = split_out(dq, n, d, segs)
        .into_par_iter()
        .map(|(h, s, dqp)| {
            let mut st = TwoLevel::new(&ctx.banks[h * ns + s]);
            let mut sc = Scratch::new(map, w);
            let (start, end) = segs[s];
            let (mut a, mut dbeta) = (start, 0.0f64);
            while a < end {
                let b = (a + TC).min(end);
                let rows = b - a;
                st.refresh();
                sc.kb.features(map, rows_of(&k, h, a, b), rows);
                sc.qb.features(map, rows_of(&q, h, a, b), rows);
                extend(rows_of(&v, h, a, b), rows, dv, w, &mut sc.x);
                g_ext(&g, &o, den, h, a, rows, dv, w, &mut sc.g);
                let (pk, xm, gm) = (
                    view(&sc.kb.phi, rows, m),
                    view(&sc.x, rows, w),
                    view(&sc.g, rows, w),
                );
                mm(
                    &mut sc.gphi,
                    rows,
                    m,
                    Accum::Replace,
                    gm,
                    view(&st.read, m, w).transpose(),
                    inv_l,
                );
                mm(
                    &mut sc.a,
                    rows,
                    rows,
                    Accum::Replace,
                    gm,
                    xm.transpose(),
                    1.0,
                );
                mask(&mut sc.a, rows, true);
                mm(
                    &mut sc.gphi,
                    rows,
                    m,
                    Accum::Add,
                    view(&sc.a, rows, rows),
                    pk,
                    inv_l,
                );
                dbeta += sc.qb.backward(map, &sc.gphi, &mut sc.dz, rows);
                let t0 = a - start;
                mm(
                    &mut dqp[t0 * d..],
                    rows,
                    d,
                    Accum::Replace,
                    view(&sc.dz, rows, lp),
                    wm,
                    1.0,
                );
                mm(&mut st.local, m, w, Accum::Add, pk.transpose(), xm, 1.0);
                st.tick(rows);
                a = b;
            }
            dbeta
        })
        .sum();
    // Suffix [dB | dA] entering each segment from the right.
    let totals: Vec<Vec<f64>> = if ns > 1 {
        (0..heads * ns)
            .into_par_iter()
            .map(|i| {
                let (h, (start, end)) = (i / ns, segs[i % ns]);
                let mut qb = Block::new(lp, m);
                let mut gx = vec![0.0f32; T * w];
                let (mut d32, mut d64) = (vec![0.0f32; m * w], vec![0.0f64; m * w]);
                let mut a = start;
                while a < end {
                    let b = (a + T).min(end);
                    let rows = b - a;
                    qb.features(map, rows_of(&q, h, a, b), rows);
                    g_ext(&g, &o, den, h, a, rows, dv, w, &mut gx);
                    mm(
                        &mut d32,
                        m,
                        w,
                        Accum::Add,
                        view(&qb.phi, rows, m).transpose(),
                        view(&gx, rows, w),
                        inv_l,
                    );
                    d64.iter_mut().zip(d32.iter_mut()).for_each(|(x, y)| {
                        *x += *y as f64;
                        *y = 0.0;
                    });
                    a = b;
                }
                d64
            })
            .collect()
    } else {
        vec![vec![0.0; m * w]; heads]
    };
    let dbases = exclusive_scan(&totals, heads, ns, true);
    // Keys and values, in reverse.
    let dbeta_k: f64 = split_out(dk, k.n, d, segs)
        .into_par_iter()
        .zip(split_out(dvv, k.n, dv, segs).into_par_iter())
        .map(|((h, s, dkp), (_, _, dvp))| {
            let mut st = TwoLevel::new(&dbases[h * ns + s]);
            let mut sc = Scratch::new(map, w);
            let (start, end) = segs[s];
            let mut dbeta = 0.0f64;
            let mut b = end;
            while b > start {
                let a = b.saturating_sub(TC).max(start);
                let rows = b - a;
                st.refresh();
                sc.kb.features(map, rows_of(&k, h, a, b), rows);
                sc.qb.features(map, rows_of(&q, h, a, b), rows);
                extend(rows_of(&v, h, a, b), rows, dv, w, &mut sc.x);
                g_ext(&g, &o, den, h, a, rows, dv, w, &mut sc.g);
                let (pq, pk, xm, gm) = (
                    view(&sc.qb.phi, rows, m),
                    view(&sc.kb.phi, rows, m),
                    view(&sc.x, rows, w),
                    view(&sc.g, rows, w),
                );
                let dread = view(&st.read, m, w);
                mm(
                    &mut sc.gphi,
                    rows,
                    m,
                    Accum::Replace,
                    xm,
                    dread.transpose(),
                    1.0,
                );
                mm(
                    &mut sc.a,
                    rows,
                    rows,
                    Accum::Replace,
                    xm,
                    gm.transpose(),
                    1.0,
                );
                mask(&mut sc.a, rows, false);
                mm(
                    &mut sc.gphi,
                    rows,
                    m,
                    Accum::Add,
                    view(&sc.a, rows, rows),
                    pq,
                    inv_l,
                );
                let t0 = a - start;
                let dv_out = &mut dvp[t0 * dv..];
                mm(
                    dv_out,
                    rows,
                    dv,
                    Accum::Replace,
                    pk,
                    MatRef::from_row_major_slice_with_stride(&st.read, m, dv, w),
                    1.0,
                );
                mm(
                    &mut sc.a,
                    rows,
                    rows,
                    Accum::Replace,
                    pk,
                    pq.transpose(),
                    1.0,
                );
                mask(&mut sc.a, rows, false);
                mm(
                    dv_out,
                    rows,
                    dv,
                    Accum::Add,
                    view(&sc.a, rows, rows),
                    MatRef::from_row_major_slice_with_stride(&sc.g, rows, dv, w),
                    inv_l,
                );
                dbeta += sc.kb.backward(map, &sc.gphi, &mut sc.dz, rows);
                mm(
                    &mut dkp[t0 * d..],
                    rows,
                    d,
                    Accum::Replace,
                    view(&sc.dz, rows, lp),
                    wm,
                    1.0,
                );
                mm(&mut st.local, m, w, Accum::Add, pq.transpose(), gm, inv_l);
                st.tick(rows);
                b = a;
            }
            dbeta
        })
        .sum();
    dbeta_q + dbeta_k
}
