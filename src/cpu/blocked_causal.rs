//! Causal soft RACE (Algorithm 2) as blocked matrix products: chunked linear attention.
//!
//! Tokens are processed in sub-blocks of [`TC`]. With `S = [B | A]` the bank entering a
//! sub-block (f64 base + f32 block-local sum, read as one f32 matrix), lower-triangular masks
//! (`j ≤ i`, token i sees itself), and `Ĝ = [G/Den, −s/Den]/L` with its row factors
//! `c_i = 1/(L·Den_i)`, `s_i = g_i·ô_i` (`GFactors`):
//!
//! - forward: `[Num | Den] = Φ_Q S + tril(Φ_Q Φ_Kᵀ) X̂`, then `S += Φ_Kᵀ X̂`;
//! - backward, queries (forward order, prefix recomputed from the stored segment bases):
//!   `∂ℓ/∂Φ_Q = Ĝ Sᵀ + tril(Ĝ X̂ᵀ) Φ_K`, where `(Ĝ X̂ᵀ)_ij = c_i (g_i·v_j − s_i)`;
//! - backward, keys (reverse order; `dS` = suffix `Σ_{t>block} φ(q_t) ĝ_tᵀ`):
//!   `∂ℓ/∂Φ_K = X̂ dSᵀ + triu(X̂ Ĝᵀ) Φ_Q`, `∂ℓ/∂V = Φ_K dS_B + triu(Φ_K Φ_Qᵀ) (c ⊙ G)`.
//!
//! Every product is one [`gemm`] on the sub-block; the `TC × TC` products need one operand
//! transposed, which is copied (`V` or `G`: `TC × dv`; the bank's values: `m × dv`).
//! Segments (for parallelism at few heads) start from f64 exclusive scans of segment totals,
//! exactly as in [`super::forward`]; the f32 block-local sums are moved into f64 every
//! [`T`] tokens, so accuracy does not depend on N.

use super::blocked::{
    bank_dots, gemm_ext, inv_den, key_bank, normalise, pad16, rows_of, saved_pieces, saved_rows,
    Block, GFactors, NT_MAX_M, T,
};
use super::features::{FeatureMap, SoftMap};
use super::forward::{exclusive_scan, Ctx};
use super::gemm::{gemm, gemm_nt, prefetch, transpose_into, Gemm, Strided, Tri};
use super::simd::{dispatch, Isa, Simd, WithSimd};
use super::state::{bank_width, plan_segments, split_out, Bank, Heads};
use rayon::prelude::*;

/// Largest causal sub-block (the intra-block products are at most `TC × TC`, stored with
/// row stride `TC`).
pub const TC: usize = 32;

/// Tokens per causal sub-block for a bank of `m` rows: the intra-block products cost about
/// `tc·dv` per token and the per-sub-block work (state refresh, transposes) `m·w/tc`, so
/// narrow banks take short sub-blocks (measured: 16 is faster for m ≤ 32, 32 for m = 64).
pub fn sub_block(m: usize) -> usize {
    if m <= 32 {
        16
    } else {
        TC
    }
}

/// Zero the entries above (`lower = true`: keep `j ≤ i`) or below (keep `j ≥ i`) the diagonal
/// of a `rows × rows` matrix with row stride [`TC`].
fn mask(a: &mut [f32], rows: usize, lower: bool) {
    for i in 0..rows {
        for j in 0..rows {
            if (lower && j > i) || (!lower && j < i) {
                a[i * TC + j] = 0.0;
            }
        }
    }
}

/// The two-level [`Bank`] (f64 base, f32 block-local part) and its f32 read image
/// `read = base32 + local`, refreshed once per sub-block.
struct TwoLevel {
    isa: Isa,
    bank: Bank,
    read: Vec<f32>,
}

/// `read = base32 + local` (elementwise, in the dispatched SIMD frame).
struct AddTask<'a> {
    out: &'a mut [f32],
    x: &'a [f32],
    y: &'a [f32],
}

impl WithSimd for AddTask<'_> {
    type Output = ();
    #[inline(always)]
    fn run<S: Simd>(self) {
        for ((o, &a), &b) in self.out.iter_mut().zip(self.x).zip(self.y) {
            *o = a + b;
        }
    }
}

impl TwoLevel {
    fn new(isa: Isa, m: usize, w: usize, base: &[f64]) -> Self {
        TwoLevel {
            isa,
            bank: Bank::new(m, w, Some(base)),
            read: vec![0.0; base.len()],
        }
    }
    /// `read = f32(base) + local`.
    fn refresh(&mut self) {
        let (x, y) = (&self.bank.base32, &self.bank.local);
        dispatch(
            self.isa,
            AddTask {
                out: &mut self.read,
                x,
                y,
            },
        );
    }
    /// Count `rows` tokens; fold the f32 part into f64 every `T` tokens.
    fn tick(&mut self, rows: usize) {
        self.bank.tick_rows(rows, T);
    }
}

/// Scratch for one sub-block.
struct Scratch {
    kb: Block,
    qb: Block,
    att: Vec<f32>,  // TC × TC
    qk: Vec<f32>,   // TC × TC: Φ_Q Φ_Kᵀ (backward, for s)
    acc: Vec<f32>,  // TC × w
    gphi: Vec<f32>, // TC × mp
    sphi: Vec<f32>, // TC × m
    c: Vec<f32>,    // TC
    s: Vec<f32>,    // TC
    st_t: Vec<f32>, // dv × mp: the state's values, transposed (padding columns stay 0)
}

impl Scratch {
    fn new(map: &SoftMap, isa: Isa, dv: usize, w: usize) -> Self {
        let (m, mp) = (map.width(), pad16(map.width()));
        Scratch {
            kb: Block::new(map, isa),
            qb: Block::new(map, isa),
            att: vec![0.0; TC * TC],
            qk: vec![0.0; TC * TC],
            acc: vec![0.0; TC * w],
            gphi: vec![0.0; TC * mp],
            sphi: vec![0.0; TC * m],
            c: vec![0.0; TC],
            s: vec![0.0; TC],
            st_t: vec![0.0; dv * mp],
        }
    }
}

/// The inputs of the causal backward passes (`uq`, `uk`: the forward's saved `u`, or empty).
struct Io<'a> {
    map: &'a SoftMap<'a>,
    q: Heads<'a>,
    k: Heads<'a>,
    v: Heads<'a>,
    g: Heads<'a>,
    den: &'a [f32],
    uq: &'a [f32],
    uk: &'a [f32],
}

impl Scratch {
    /// Start sub-block `a..b` of head `h`: prefetch the rows of `next`, refresh the state,
    /// compute both feature blocks (from the saved `u` when there is one) and `c` (into
    /// `c`); with `s_all` (`[heads, n]`, the query pass's `s_i = g_i·ô_i`) also `s`.
    fn load(
        &mut self,
        io: &Io,
        st: &mut TwoLevel,
        h: usize,
        (a, b): (usize, usize),
        next: (usize, usize),
        s_all: Option<&[f32]>,
    ) {
        let (n, lp) = (io.q.n, io.map.planes.l * io.map.planes.p);
        for x in [&io.v, &io.g] {
            prefetch(rows_of(x, h, next.0, next.1));
        }
        let (uq, uk) = (
            saved_rows(io.uq, n, lp, h, a, b),
            saved_rows(io.uk, n, lp, h, a, b),
        );
        if uq.is_none() {
            prefetch(rows_of(&io.q, h, next.0, next.1));
        }
        if uk.is_none() {
            prefetch(rows_of(&io.k, h, next.0, next.1));
        }
        st.refresh();
        self.kb
            .features_of(io.map, rows_of(&io.k, h, a, b), uk, b - a);
        self.qb
            .features_of(io.map, rows_of(&io.q, h, a, b), uq, b - a);
        let inv_l = 1.0 / io.map.planes.l as f32;
        inv_den(&io.den[h * n + a..h * n + b], inv_l, &mut self.c);
        if let Some(s) = s_all {
            self.s[..b - a].copy_from_slice(&s[h * n + a..h * n + b]);
        }
    }
}

/// `att[i][j] = x_i · y_j` (row stride [`TC`]) on the triangle that is kept (`lower`:
/// `j ≤ i`, else `j ≥ i`); entries off it may be written too, and [`mask`] clears them.
#[allow(clippy::too_many_arguments)]
fn gram(
    isa: Isa,
    att: &mut [f32],
    x: &[f32],
    ldx: usize,
    y: &[f32],
    ldy: usize,
    rows: usize,
    k: usize,
    lower: bool,
) {
    let tri = if lower { Tri::Lower } else { Tri::Upper };
    gemm_nt(isa, tri, att, TC, rows, rows, k, x, ldx, y, ldy);
}

/// `D += α A B` for a masked `rows × rows` block `A` (row stride [`TC`]), lower- or
/// upper-triangular (the [`Gemm`] tiles skip the zero triangle).
#[allow(clippy::too_many_arguments)]
fn tri_gemm(
    isa: Isa,
    d: &mut [f32],
    ldd: usize,
    rows: usize,
    cols: usize,
    att: &[f32],
    b: &[f32],
    ldb: usize,
    alpha: f32,
    lower: bool,
) {
    Gemm {
        d,
        ldd,
        rows,
        cols,
        k: rows,
        a: Strided::rows(att, TC),
        b,
        ldb,
        alpha,
        accumulate: true,
        tri: if lower { Tri::Lower } else { Tri::Upper },
    }
    .run(isa)
}

/// The segments of a causal pass and the bank entering each `(head, segment)`: f64
/// exclusive scans of the segments' key banks (all zero with one segment per head).
pub(crate) fn forward_bases(
    map: &SoftMap,
    isa: Isa,
    k: Heads,
    v: Heads,
) -> (Vec<(usize, usize)>, Vec<Vec<f64>>) {
    let (heads, m, w) = (k.heads, map.width(), bank_width(v.cols));
    let segs = plan_segments(k.n, heads);
    let ns = segs.len();
    let totals: Vec<Vec<f64>> = if ns > 1 {
        (0..heads * ns)
            .into_par_iter()
            .map(|i| key_bank(map, isa, k, v, i / ns, segs[i % ns], None))
            .collect()
    } else {
        vec![vec![0.0; m * w]; heads * ns]
    };
    let bases = exclusive_scan(&totals, heads, ns, false);
    (segs, bases)
}

/// Each `(head, segment)`'s own `[dB | dA] = Σ φ(q_i) ĝ_iᵀ` (for the suffix scan of the causal
/// backward; all zero with one segment per head, where no scan is needed). `s_all` holds
/// `s_i = g_i·ô_i` (`[heads, n]`), `uq` the saved `u` of the queries (or is empty).
#[allow(clippy::too_many_arguments)]
pub(crate) fn suffix_totals(
    map: &SoftMap,
    isa: Isa,
    q: Heads,
    uq: &[f32],
    g: Heads,
    den: &[f32],
    s_all: &[f32],
    segs: &[(usize, usize)],
    heads: usize,
) -> Vec<Vec<f64>> {
    let (n, dv, m, w) = (q.n, g.cols, map.width(), bank_width(g.cols));
    let (ns, lp) = (segs.len(), map.planes.l * map.planes.p);
    let inv_l = 1.0 / map.planes.l as f32;
    if ns <= 1 {
        return vec![vec![0.0; m * w]; heads * ns];
    }
    (0..heads * ns)
        .into_par_iter()
        .map(|i| {
            let (h, (start, end)) = (i / ns, segs[i % ns]);
            let mut qb = Block::new(map, isa);
            let mp = qb.mp;
            let (mut c, mut sphi) = (vec![0.0f32; T], vec![0.0f32; T * m]);
            let (mut d32, mut d64) = (vec![0.0f32; m * w], vec![0.0f64; m * w]);
            let mut a = start;
            while a < end {
                let b = (a + T).min(end);
                let rows = b - a;
                let gb = rows_of(&g, h, a, b);
                let u = saved_rows(uq, n, lp, h, a, b);
                qb.features_of(map, rows_of(&q, h, a, b), u, rows);
                inv_den(&den[h * n + a..h * n + b], inv_l, &mut c);
                let f = GFactors::of(&c, &s_all[h * n + a..h * n + b], gb, dv);
                f.dbank(isa, &qb.phi, mp, m, rows, &mut sphi, &mut d32, w, false);
                d64.iter_mut().zip(&d32).for_each(|(x, &y)| *x += y as f64);
                a = b;
            }
            d64
        })
        .collect()
}

/// Causal forward; same contract as [`super::soft_forward_into`] with `causal = true`.
pub fn forward_into(
    map: &SoftMap,
    isa: Isa,
    q: Heads,
    k: Heads,
    v: Heads,
    o: &mut [f32],
    reuse: Ctx,
) -> (usize, Ctx) {
    let (heads, n, dv, m, w) = (q.heads, q.n, v.cols, map.width(), bank_width(v.cols));
    let lp = map.planes.l * map.planes.p;
    let (mut den, mut uq, mut uk) = (reuse.den, reuse.uq, reuse.uk);
    den.resize(heads * n, 0.0);
    uq.resize(heads * n * lp, 0.0);
    uk.resize(heads * n * lp, 0.0);
    let (segs, bases) = forward_bases(map, isa, k, v);
    let ns = segs.len();
    let den_scale = map.den_scale();
    let empty: usize = split_out(o, n, dv, &segs)
        .into_par_iter()
        .zip(split_out(&mut den, n, 1, &segs).into_par_iter())
        .zip(saved_pieces(&mut uq, n, lp, &segs, heads).into_par_iter())
        .zip(saved_pieces(&mut uk, n, lp, &segs, heads).into_par_iter())
        .map(|((((h, s, op), (_, _, dp)), mut suq), mut suk)| {
            let mut st = TwoLevel::new(isa, m, w, &bases[h * ns + s]);
            let mut sc = Scratch::new(map, isa, dv, w);
            let (mp, tc) = (sc.kb.mp, sub_block(m));
            let (start, end) = segs[s];
            let (mut a, mut empty) = (start, 0usize);
            while a < end {
                let b = (a + tc).min(end);
                let rows = b - a;
                for x in [&q, &k, &v] {
                    prefetch(rows_of(x, h, (b + tc).min(end), (b + 2 * tc).min(end)));
                }
                st.refresh();
                let vb = rows_of(&v, h, a, b);
                sc.kb.features(map, rows_of(&k, h, a, b), rows);
                sc.qb.features(map, rows_of(&q, h, a, b), rows);
                let t0 = a - start;
                for (blk, save) in [(&sc.qb, &mut suq), (&sc.kb, &mut suk)] {
                    if let Some(u) = save.as_deref_mut() {
                        u[t0 * lp..(t0 + rows) * lp].copy_from_slice(blk.u(rows));
                    }
                }
                let (pq, pk) = (&sc.qb.phi, &sc.kb.phi);
                gemm(
                    isa,
                    &mut sc.acc,
                    w,
                    rows,
                    w,
                    m,
                    Strided::rows(pq, mp),
                    &st.read,
                    w,
                    1.0,
                    false,
                );
                gram(isa, &mut sc.att, pq, mp, pk, mp, rows, mp, true);
                mask(&mut sc.att, rows, true);
                tri_gemm(isa, &mut sc.acc, w, rows, dv, &sc.att, vb, dv, 1.0, true);
                for i in 0..rows {
                    sc.acc[i * w + dv] += sc.att[i * TC..i * TC + i + 1].iter().sum::<f32>();
                }
                empty += normalise(
                    &sc.acc,
                    w,
                    rows,
                    dv,
                    den_scale,
                    &mut op[t0 * dv..(t0 + rows) * dv],
                    &mut dp[t0..t0 + rows],
                );
                gemm_ext(
                    isa,
                    &mut st.bank.local,
                    w,
                    m,
                    rows,
                    Strided::transposed(pk, mp),
                    vb,
                    dv,
                    1.0,
                    true,
                );
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
            uq,
            uk,
        },
    )
}

/// `att_ij (=) c_i (g_i·v_j − s_i)` for `j ≤ i` (queries `i`, keys `j`, both in the
/// sub-block) from `att = G Vᵀ`, when `by_row`; else `att_ji = c_i (v_j·g_i − s_i)` for
/// `i ≥ j` from `att = V Gᵀ`; 0 off the triangle.
fn scale_gv(att: &mut [f32], rows: usize, c: &[f32], s: &[f32], by_row: bool) {
    // Fused with the triangular mask (`by_row`: keep j ≤ i; else keep columns ≥ the row);
    // branch-free per row, so each row is a few vector selects.
    for r in 0..rows {
        let row = &mut att[r * TC..r * TC + rows];
        if by_row {
            let (cr, sr) = (c[r], s[r]);
            for (col, x) in row.iter_mut().enumerate() {
                *x = if col <= r { cr * (*x - sr) } else { 0.0 };
            }
        } else {
            for (col, x) in row.iter_mut().enumerate() {
                *x = if col >= r {
                    c[col] * (*x - s[col])
                } else {
                    0.0
                };
            }
        }
    }
}

/// Causal backward from a causal [`Ctx`] (either causal forward's); writes every entry of
/// `dq`, `dk`, `dv`; returns `∂ℓ/∂beta`.
#[allow(clippy::too_many_arguments)]
pub fn backward_into(
    map: &SoftMap,
    isa: Isa,
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
    let (segs, ns, den) = (&ctx.segs, ctx.segs.len(), &ctx.den);
    let _ = o; // not read: `s_i = g_i·ô_i` is recomputed by the query pass
    let io = Io {
        map,
        q,
        k,
        v,
        g,
        den,
        uq: &ctx.uq,
        uk: &ctx.uk,
    };
    // Queries, in order, with the prefix state rebuilt from the segment bases; each row's
    // `s_i = g_i·ô_i` into `s_all` for the suffix totals and the key pass.
    let mut s_all = vec![0.0f32; heads * n];
    let dbeta_q: f64 = split_out(dq, n, d, segs)
        .into_par_iter()
        .zip(split_out(&mut s_all, n, 1, segs).into_par_iter())
        .map(|((h, s, dqp), (_, _, sp))| {
            let mut st = TwoLevel::new(isa, m, w, &ctx.banks[h * ns + s]);
            let mut sc = Scratch::new(map, isa, dv, w);
            let (mp, tc) = (sc.kb.mp, sub_block(m));
            let (start, end) = segs[s];
            let (mut a, mut dbeta) = (start, 0.0f64);
            while a < end {
                let b = (a + tc).min(end);
                let rows = b - a;
                let next = ((b + tc).min(end), (b + 2 * tc).min(end));
                let (vb, gb) = (rows_of(&v, h, a, b), rows_of(&g, h, a, b));
                sc.load(&io, &mut st, h, (a, b), next, None);
                if m > NT_MAX_M {
                    transpose_into(&st.read, m, dv, w, &mut sc.st_t, mp);
                }
                // g_i·S_f, g_i·v_j and φ(q_i)·φ(k_j); then `ô_i = (Φ_Q S + tril(Φ_Q Φ_Kᵀ) X̂)_i / Den_i`
                // gives s_i = c_i (Σ_f φ_if (g_i·S_f) + Σ_{j≤i} (φ_i·φ_j)(g_i·v_j)).
                let (st_t, qb, kb) = (&sc.st_t, &sc.qb.phi, &sc.kb.phi);
                bank_dots(isa, &mut sc.gphi, mp, rows, m, gb, dv, &st.read, w, st_t);
                gram(isa, &mut sc.att, gb, dv, vb, dv, rows, dv, true);
                gram(isa, &mut sc.qk, qb, mp, kb, mp, rows, mp, true);
                for i in 0..rows {
                    let (ph, gp) = (&qb[i * mp..i * mp + m], &sc.gphi[i * mp..i * mp + m]);
                    let bank: f32 = ph.iter().zip(gp).map(|(&x, &y)| x * y).sum();
                    let (qk, gv) = (
                        &sc.qk[i * TC..i * TC + i + 1],
                        &sc.att[i * TC..i * TC + i + 1],
                    );
                    let intra: f32 = qk.iter().zip(gv).map(|(&x, &y)| x * y).sum();
                    sc.s[i] = sc.c[i] * (bank + intra);
                }
                sp[a - start..b - start].copy_from_slice(&sc.s[..rows]);
                let f = GFactors::of(&sc.c, &sc.s, gb, dv);
                f.scale_phi_grads(&mut sc.gphi, mp, m, rows, &st.read, w);
                scale_gv(&mut sc.att, rows, f.c, f.s, true);
                tri_gemm(
                    isa,
                    &mut sc.gphi,
                    mp,
                    rows,
                    mp,
                    &sc.att,
                    &sc.kb.phi,
                    mp,
                    1.0,
                    true,
                );
                dbeta += sc.qb.backward(map, &sc.gphi, mp, rows);
                let t0 = a - start;
                sc.qb
                    .input_grads(map, rows, &mut dqp[t0 * d..(t0 + rows) * d]);
                let pkt = Strided::transposed(&sc.kb.phi, mp);
                gemm_ext(isa, &mut st.bank.local, w, m, rows, pkt, vb, dv, 1.0, true);
                st.tick(rows);
                a = b;
            }
            dbeta
        })
        .sum();
    // Suffix [dB | dA] entering each segment from the right.
    let totals = suffix_totals(map, isa, q, &ctx.uq, g, den, &s_all, segs, heads);
    let dbases = exclusive_scan(&totals, heads, ns, true);
    // Keys and values, in reverse.
    let dbeta_k: f64 = split_out(dk, k.n, d, segs)
        .into_par_iter()
        .zip(split_out(dvv, k.n, dv, segs).into_par_iter())
        .map(|((h, s, dkp), (_, _, dvp))| {
            let mut st = TwoLevel::new(isa, m, w, &dbases[h * ns + s]);
            let mut sc = Scratch::new(map, isa, dv, w);
            let (mp, tc) = (sc.kb.mp, sub_block(m));
            let (start, end) = segs[s];
            let mut dbeta = 0.0f64;
            let mut b = end;
            while b > start {
                let a = b.saturating_sub(tc).max(start);
                let rows = b - a;
                let next = (
                    a.saturating_sub(2 * tc).max(start),
                    a.saturating_sub(tc).max(start),
                );
                let (vb, gb) = (rows_of(&v, h, a, b), rows_of(&g, h, a, b));
                sc.load(&io, &mut st, h, (a, b), next, Some(&s_all));
                let f = GFactors::of(&sc.c, &sc.s, gb, dv);
                // ∂ℓ/∂φ_k = X̂ dSᵀ + triu(X̂ Ĝᵀ) Φ_Q.
                if m > NT_MAX_M {
                    transpose_into(&st.read, m, dv, w, &mut sc.st_t, mp);
                }
                bank_dots(
                    isa,
                    &mut sc.gphi,
                    mp,
                    rows,
                    m,
                    vb,
                    dv,
                    &st.read,
                    w,
                    &sc.st_t,
                );
                for i in 0..rows {
                    for ff in 0..m {
                        sc.gphi[i * mp + ff] += st.read[ff * w + dv];
                    }
                }
                gram(isa, &mut sc.att, vb, dv, gb, dv, rows, dv, false);
                scale_gv(&mut sc.att, rows, f.c, f.s, false);
                tri_gemm(
                    isa,
                    &mut sc.gphi,
                    mp,
                    rows,
                    mp,
                    &sc.att,
                    &sc.qb.phi,
                    mp,
                    1.0,
                    false,
                );
                // ∂ℓ/∂v = Φ_K dS_B + triu(Φ_K Φ_Qᵀ) (c ⊙ G).
                let t0 = a - start;
                let dv_out = &mut dvp[t0 * dv..(t0 + rows) * dv];
                let pk = Strided::rows(&sc.kb.phi, mp);
                gemm(isa, dv_out, dv, rows, dv, m, pk, &st.read, w, 1.0, false);
                gram(
                    isa,
                    &mut sc.att,
                    &sc.kb.phi,
                    mp,
                    &sc.qb.phi,
                    mp,
                    rows,
                    mp,
                    false,
                );
                for j in 0..rows {
                    for i in 0..rows {
                        sc.att[j * TC + i] *= if i >= j { f.c[i] } else { 0.0 };
                    }
                }
                tri_gemm(isa, dv_out, dv, rows, dv, &sc.att, gb, dv, 1.0, false);
                dbeta += sc.kb.backward(map, &sc.gphi, mp, rows);
                sc.kb
                    .input_grads(map, rows, &mut dkp[t0 * d..(t0 + rows) * d]);
                f.dbank(
                    isa,
                    &sc.qb.phi,
                    mp,
                    m,
                    rows,
                    &mut sc.sphi,
                    &mut st.bank.local,
                    w,
                    true,
                );
                st.tick(rows);
                b = a;
            }
            dbeta
        })
        .sum();
    dbeta_q + dbeta_k
}
