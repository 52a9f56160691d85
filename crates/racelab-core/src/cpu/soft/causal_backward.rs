//! Causal backward: queries in forward order `∂ℓ/∂Φ_Q = Ĝ Sᵀ + tril(Ĝ X̂ᵀ) Φ_K`, keys in
//! reverse order with the suffix `dS`: `∂ℓ/∂Φ_K = X̂ dSᵀ + triu(X̂ Ĝᵀ) Φ_Q`,
//! `∂ℓ/∂V = Φ_K dS_B + triu(Φ_K Φ_Qᵀ) (c ⊙ G)`; one reverse pass when each head is one segment
//! (from the saved block-start states), else the two-pass form.

use super::causal_query::{scale_gv, Io};
use crate::backend::{BackwardInputs, GradsMut, Heads};
use crate::cpu::bank16::{Mass, Read, Update};
use crate::cpu::features::{FeatureMap, SoftMap};
use crate::cpu::gemm::{Mat, MatMut, Strided};
use crate::cpu::mem::{ABuf, Out};
use crate::cpu::saved::{exclusive_scan, Ctx};
use crate::cpu::simd::{add_into_f64, dispatch, Isa, Kernel, Token};
use crate::cpu::soft::backward::GFactors;
use crate::cpu::soft::banks::{add_rows, inv_den, rows_of, saved_rows};
use crate::cpu::soft::block::{Block, T};
use crate::cpu::soft::causal::{
    blocks, feature_gram, gram, mask, state_len, sub, sub_blocks, sub_t, tri_gemm, Scale, Scratch,
    TwoLevel, TB, TC,
};
use crate::cpu::soft::causal_forward::add_per_head;
use crate::cpu::soft::probs::lanes16;
use crate::cpu::state::{bank_width, split_out};
use crate::cpu::v16;
use pulp::Simd as _;
use rayon::prelude::*;

/// The keys' `∂ℓ/∂φ_k` from `gphi_j = (x̂_j·dS_f)_f` without the mass column: adds `dA`
/// (`a`, the suffix state's mass column) and `tril(Ĝ X̂ᵀ)ᵀ Φ_Q` (`att`, the queries' scaled
/// sub-block matrix, row stride [`TC`]; `Σ_{i≥j} att_ij φ(q_i)` into row `j`). With AVX-512
/// and rows of 16 floats, one pass ([`key_intra16_avx512`]); else [`add_rows`] and
/// [`tri_gemm`].
fn key_intra(
    isa: Isa,
    gphi: &mut [f32],
    mp: usize,
    rows: usize,
    att: &[f32],
    pq: &[f32],
    a: &[f32],
) {
    if mp == 16 && a.len() <= 16 {
        assert!(rows <= TC && gphi.len() >= rows * 16 && pq.len() >= rows * 16);
        assert!(att.len() >= rows * TC);
        let task = KeyIntra16 {
            gphi,
            rows,
            att,
            pq,
            a: lanes16(a),
        };
        dispatch(isa, task);
        return;
    }
    add_rows(isa, gphi, mp, rows, a);
    tri_gemm(
        isa,
        MatMut::new(gphi, rows, mp, mp),
        sub_t(att),
        Mat::new(pq, rows, mp, mp),
        1.0,
        false,
    );
}

/// [`key_intra`] for rows of 16 floats, one source for every ISA ([`v16`]): row `j` is
/// `gphi_j + a + Σ_{i≥j} att_ij φ(q_i)`, the `att_ij` broadcast, two chains. `gphi` and `pq`
/// hold `rows ≤ 16` rows of 16 floats, `att` `rows` rows of [`TC`].
struct KeyIntra16<'a> {
    gphi: &'a mut [f32],
    rows: usize,
    att: &'a [f32],
    pq: &'a [f32],
    a: [f32; 16],
}

impl Kernel for KeyIntra16<'_> {
    type Output = ();
    #[inline(always)]
    fn run<T: Token>(self, t: T) {
        let simd = t.w16();
        let KeyIntra16 {
            gphi,
            rows,
            att,
            pq,
            a,
        } = self;
        // Rows of 16 floats (TC = 16), cut to `rows ≤ 16`: every index is a lane under 16.
        const { assert!(TC == 16) };
        let rows = rows.min(16);
        let (att, pq, gphi) = (
            v16::rows(att, rows),
            v16::rows(pq, rows),
            v16::rows_mut(gphi, rows),
        );
        let av = v16::load(simd, &a, 0);
        for (j, grow) in gphi.iter_mut().enumerate() {
            let mut g0 = simd.add_f32s(v16::row(simd, grow), av);
            let mut g1 = simd.splat_f32s(0.0);
            // Σ_{i≥j} att_ij φ(q_i), two chains (rows i, i + 1 of `att` and `pq` in pairs).
            let (a2, a1) = att[j..].as_chunks::<2>();
            let (q2, q1) = pq[j..].as_chunks::<2>();
            for (w, q) in a2.iter().zip(q2) {
                g0 = simd.mul_add_e_f32s(simd.splat_f32s(w[0][j]), v16::row(simd, &q[0]), g0);
                g1 = simd.mul_add_e_f32s(simd.splat_f32s(w[1][j]), v16::row(simd, &q[1]), g1);
            }
            if let (Some(w), Some(q)) = (a1.first(), q1.first()) {
                g0 = simd.mul_add_e_f32s(simd.splat_f32s(w[j]), v16::row(simd, q), g0);
            }
            v16::set_row(simd, grow, simd.add_f32s(g0, g1));
        }
    }
}

/// Each `(head, segment)`'s own `[dB | dA] = Σ φ(q_i) ĝ_iᵀ` (for the suffix scan of the causal
/// backward; all zero with one segment per head, where no scan is needed), over the segments
/// `segs` of every head of `x`.
fn suffix_totals(map: &SoftMap, isa: Isa, x: QueryRows, segs: &[(usize, usize)]) -> Vec<Vec<f64>> {
    let (heads, ns, m, w) = (x.q.heads, segs.len(), map.width(), bank_width(x.g.cols));
    if ns <= 1 {
        return vec![vec![0.0; m * w]; heads * ns];
    }
    (0..heads * ns)
        .into_par_iter()
        .map(|i| query_total(map, isa, &x, i / ns, segs[i % ns]))
        .collect()
}

/// What [`query_total`] reads: the queries (and their saved `u`, or empty), `G`, the saved
/// denominators and `s_i = g_i·ô_i`, all `[heads, n, ·]`.
#[derive(Clone, Copy)]
struct QueryRows<'a> {
    pub q: Heads<'a>,
    pub uq: &'a [f32],
    pub g: Heads<'a>,
    pub den: &'a [f32],
    pub s_all: &'a [f32],
}

/// `[dB | dA] = Σ_i φ(q_i) ĝ_iᵀ` over the tokens `start..end` of head `h` (f64).
fn query_total(
    map: &SoftMap,
    isa: Isa,
    x: &QueryRows,
    h: usize,
    (start, end): (usize, usize),
) -> Vec<f64> {
    let QueryRows {
        q,
        uq,
        g,
        den,
        s_all,
    } = *x;
    let (n, dv, m, w) = (q.n, g.cols, map.width(), bank_width(g.cols));
    let lp = map.planes.l * map.planes.p;
    let inv_l = 1.0 / map.planes.l as f32;
    let mut qb = Block::new(map, isa);
    let mp = qb.mp;
    let (mut c, mut sphi) = (vec![0.0f32; T], vec![0.0f32; T * m]);
    let (mut d32, mut d64) = (ABuf::zeroed(m * w), vec![0.0f64; m * w]);
    let mut a = start;
    while a < end {
        let b = (a + T).min(end);
        let rows = b - a;
        let gb = rows_of(&g, h, a, b);
        let u = saved_rows(uq, n, lp, h, a, b);
        qb.features_of(map, rows_of(&q, h, a, b), u, rows);
        inv_den(&den[h * n + a..h * n + b], inv_l, &mut c);
        let f = GFactors::of(&c, &s_all[h * n + a..h * n + b], gb, dv);
        f.dbank(
            isa,
            Mat::new(&qb.phi, rows, m, mp),
            &mut sphi,
            (&mut d32, w),
            false,
        );
        add_into_f64(isa, &mut d64, &d32);
        a = b;
    }
    d64
}

/// Per head, `[dB | dA] = Σ_i φ(q_i) ĝ_iᵀ` over all of `q`'s tokens, with `s_i = g_i·ô_i`
/// from the forward's output `o` and its saved denominators `den` (and `u` of the queries,
/// or empty): the state a causal pass over an earlier slice of the token axis needs from
/// this one ([`causal_backward_from`]).
pub fn query_totals(
    map: &SoftMap,
    isa: Isa,
    q: Heads,
    uq: &[f32],
    g: Heads,
    o: Heads,
    den: &[f32],
) -> Vec<Vec<f64>> {
    let s_all: Vec<f32> = g
        .data
        .par_chunks(g.cols.max(1))
        .zip(o.data.par_chunks(o.cols.max(1)))
        .map(|(a, b)| a.iter().zip(b).map(|(x, y)| x * y).sum())
        .collect();
    let rows = QueryRows {
        q,
        uq,
        g,
        den,
        s_all: &s_all,
    };
    (0..q.heads)
        .into_par_iter()
        .map(|h| query_total(map, isa, &rows, h, (0, q.n)))
        .collect()
}

/// A keys' sub-block: `∂ℓ/∂V = Φ_K dS_B + T G` into `x` (`T`: the sub-block's
/// upper-triangular matrix as a product operand), then `dS += Φ_Qᵀ Ĝ` (value columns and
/// masses; `sphi` is scratch for `c ⊙ Φ_Q`). With [`TwoLevel::fused`] the read of `dS` and
/// its update are one [`bank16`] pass.
#[allow(clippy::too_many_arguments)]
fn key_values(
    isa: Isa,
    sk: &mut TwoLevel,
    x: &mut [f32],
    (pk, pq, mp): (&[f32], &[f32], usize),
    rows: usize,
    tri: Strided,
    f: &GFactors,
    sphi: &mut [f32],
) {
    let (dv, m, w) = (f.dv, sk.bank.m, sk.bank.w);
    if !sk.fused() {
        sk.product(x, rows, dv, pk, mp, dv);
        tri_gemm(
            isa,
            MatMut::new(x, rows, dv, dv),
            tri,
            Mat::new(f.g, rows, dv, dv),
            1.0,
            false,
        );
        f.dbank(
            isa,
            Mat::new(pq, rows, m, mp),
            sphi,
            (&mut sk.bank.local, w),
            true,
        );
        return;
    }
    // c ⊙ Φ_Q in rows of 16 (the features' padding lanes are zero).
    let mut b = [0.0f32; TC * 16];
    for (j, row) in b.chunks_exact_mut(16).take(rows).enumerate() {
        let src = &pq[j * mp..j * mp + 16];
        row.iter_mut().zip(src).for_each(|(y, &p)| *y = f.c[j] * p);
    }
    let read = Read {
        a: pk,
        rows,
        d: &mut *x,
        ldd: dv,
    };
    let (mass, g) = (Mass::NegS(f.s), f.g);
    let update = Update {
        b: &b,
        rows,
        x: g,
        ldx: dv,
        mass,
    };
    sk.read_update(dv, Some(read), Some(update));
    tri_gemm(
        isa,
        MatMut::new(x, rows, dv, dv),
        tri,
        Mat::new(g, rows, dv, dv),
        1.0,
        false,
    );
}

/// Causal backward from a causal [`Ctx`] (either causal forward's); writes every entry of
/// `dq`, `dk`, `dv`; returns `∂ℓ/∂beta`.
pub fn causal_backward_into(
    map: &SoftMap,
    isa: Isa,
    ctx: &Ctx,
    x: BackwardInputs,
    out: GradsMut,
) -> f64 {
    causal_backward_from(map, isa, ctx, x, out, None)
}

/// [`causal_backward_into`] for a slice of the token axis: `after` is, per head, the
/// `[dB | dA] = Σ φ(q_t) ĝ_tᵀ` of the queries after the slice (the suffix `dS` its keys
/// start from); `ctx` is the forward's from [`super::causal_forward_from`].
pub fn causal_backward_from(
    map: &SoftMap,
    isa: Isa,
    ctx: &Ctx,
    x: BackwardInputs,
    out: GradsMut,
    after: Option<&[Vec<f64>]>,
) -> f64 {
    let BackwardInputs { q, k, v, o, g } = x;
    let GradsMut { dq, dk, dv: dvv } = out;
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
    let (uq, uk) = ctx.saved_u(&q, &k, map.planes.l * map.planes.p);
    let io = Io {
        map,
        q,
        k,
        v,
        g,
        den,
        uq,
        uk,
    };
    if ns == 1 && ctx.states.len() == heads * state_len(n, m, w) {
        let outs = (dq, dk, dvv);
        return one_pass(&io, isa, &ctx.states, outs, after);
    }
    // Queries, in order, with the prefix state rebuilt from the segment bases; each row's
    // `s_i = g_i·ô_i` into `s_all` for the suffix totals and the key pass.
    let mut s_all = vec![0.0f32; heads * n];
    let (out_q, out_k, out_v) = (
        Out::for_len(isa, dq.len()),
        Out::for_len(isa, dk.len()),
        Out::for_len(isa, dvv.len()),
    );
    let dbeta_q: f64 = split_out(dq, n, d, segs)
        .into_par_iter()
        .zip(split_out(&mut s_all, n, 1, segs).into_par_iter())
        .map(|((h, s, dqp), (_, _, sp))| {
            let mut st = TwoLevel::new(isa, m, w, &ctx.banks[h * ns + s]);
            let mut sc = Scratch::new(map, isa, w);
            let mut scratch = ABuf::zeroed(TB * d.max(dv));
            let (mp, tc) = (sc.kb.mp, TC);
            let (start, end) = segs[s];
            let mut dbeta = 0.0f64;
            for (a, b) in blocks(start, end, false) {
                let next = (b, (b + TB).min(end));
                let mut ahead = sc.load(&io, h, (a, b), next, None, &[]);
                for (a2, b2) in sub_blocks(a, b, tc, false) {
                    let (r2, off) = (b2 - a2, a2 - a);
                    let (vb, gb) = (rows_of(&v, h, a2, b2), rows_of(&g, h, a2, b2));
                    sc.query_sub_block(isa, &st, (off, r2), (vb, gb, dv), None);
                    st.add_tokens(&sc.kb.phi[off * mp..], mp, r2, vb, dv);
                    st.tick(r2);
                    ahead.step();
                }
                let (rows, t0) = (b - a, a - start);
                sp[t0..t0 + rows].copy_from_slice(&sc.s[..rows]);
                dbeta += sc.qb.backward(map, &sc.gphi, rows);
                let (qb, dqb) = (&sc.qb, &mut dqp[t0 * d..(t0 + rows) * d]);
                out_q.produce(dqb, &mut scratch, |x| qb.input_grads(map, rows, x));
            }
            out_q.fence();
            dbeta
        })
        .sum();
    // Suffix [dB | dA] entering each segment from the right.
    let rows = QueryRows {
        q,
        uq,
        g,
        den,
        s_all: &s_all,
    };
    let totals = suffix_totals(map, isa, rows, segs);
    let mut dbases = exclusive_scan(&totals, heads, ns, true);
    if let Some(after) = after {
        add_per_head(&mut dbases, after, ns);
    }
    // Keys and values, in reverse.
    let dbeta_k: f64 = split_out(dk, k.n, d, segs)
        .into_par_iter()
        .zip(split_out(dvv, k.n, dv, segs).into_par_iter())
        .map(|((h, s, dkp), (_, _, dvp))| {
            let mut st = TwoLevel::new(isa, m, w, &dbases[h * ns + s]);
            let mut sc = Scratch::new(map, isa, w);
            let mut scratch = ABuf::zeroed(TB * d.max(dv));
            let (mp, tc) = (sc.kb.mp, TC);
            let (start, end) = segs[s];
            let mut dbeta = 0.0f64;
            for (a, b) in blocks(start, end, true) {
                let next = (a.saturating_sub(TB).max(start), a);
                let mut ahead = sc.load(&io, h, (a, b), next, Some(&s_all), &[]);
                for (a2, b2) in sub_blocks(a, b, tc, true) {
                    let (r2, off) = (b2 - a2, a2 - a);
                    let (vb, gb) = (rows_of(&v, h, a2, b2), rows_of(&g, h, a2, b2));
                    let (pq, pk) = (&sc.qb.phi[off * mp..], &sc.kb.phi[off * mp..]);
                    let (c, s) = (&sc.c[off..off + r2], &sc.s[off..off + r2]);
                    let f = GFactors::of(c, s, gb, dv);
                    // ∂ℓ/∂φ_k = X̂ dSᵀ + triu(X̂ Ĝᵀ) Φ_Q.
                    let gphi = &mut sc.gphi[off * mp..];
                    st.dots(gphi, mp, r2, vb, dv);
                    st.masses(dv, &mut sc.mass);
                    add_rows(isa, gphi, mp, r2, &sc.mass);
                    gram(
                        isa,
                        &mut sc.att,
                        Mat::new(vb, r2, dv, dv),
                        Mat::new(gb, r2, dv, dv),
                        false,
                    );
                    scale_gv(isa, &mut sc.att, r2, f.c, f.s, false);
                    tri_gemm(
                        isa,
                        MatMut::new(gphi, r2, mp, mp),
                        sub(&sc.att),
                        Mat::new(pq, r2, mp, mp),
                        1.0,
                        false,
                    );
                    // ∂ℓ/∂v = Φ_K dS_B + triu(Φ_K Φ_Qᵀ) (c ⊙ G).
                    let pqt = (&sc.qb.phit()[off..], sc.qb.tp());
                    feature_gram(isa, &mut sc.att, (pk, pq, pqt, mp), m, r2, false);
                    mask(isa, &mut sc.att, r2, false, Scale::Cols(c));
                    let t0 = a2 - start;
                    let (att, st_m, sphi) = (sub(&sc.att), &mut st, &mut sc.sphi);
                    let dv_out = &mut dvp[t0 * dv..(t0 + r2) * dv];
                    out_v.produce(dv_out, &mut scratch, |x| {
                        key_values(isa, st_m, x, (pk, pq, mp), r2, att, &f, sphi);
                    });
                    st.tick(r2);
                    ahead.step();
                }
                let (rows, t0) = (b - a, a - start);
                dbeta += sc.kb.backward(map, &sc.gphi, rows);
                let (kb, dkb) = (&sc.kb, &mut dkp[t0 * d..(t0 + rows) * d]);
                out_k.produce(dkb, &mut scratch, |x| kb.input_grads(map, rows, x));
            }
            out_k.fence();
            out_v.fence();
            dbeta
        })
        .sum();
    dbeta_q + dbeta_k
}

/// The causal backward in one reverse pass over each head's blocks, when the forward saved
/// the state entering every block ([`Ctx::states`], one segment per head). Per block, the
/// features are formed once; then
///
/// - queries, sub-blocks in order, the prefix state rebuilt from the block's saved start:
///   `∂ℓ/∂Φ_Q = Ĝ Sᵀ + tril(Ĝ X̂ᵀ) Φ_K` and `s_i` exactly as in the two-pass form; each
///   sub-block keeps its scaled `tril(Ĝ X̂ᵀ)` and `c ⊙ tril(Φ_Q Φ_Kᵀ)`;
/// - keys, sub-blocks in reverse, `dS` the suffix from the end of the head:
///   `∂ℓ/∂Φ_K = X̂ dSᵀ + tril(Ĝ X̂ᵀ)ᵀ Φ_Q`, `∂ℓ/∂V = Φ_K dS_B + (c ⊙ tril(Φ_Q Φ_Kᵀ))ᵀ G`:
///   the two intra-sub-block matrices are the queries' own, transposed, not formed again.
///
/// Against the two passes this saves forming the features of every block a second time,
/// reading V and G from memory a second time (the key half reads them from cache), two
/// `TC × TC` grams per sub-block, the `s` round trip through memory, and the state update
/// after each block's last sub-block.
fn one_pass(
    io: &Io,
    isa: Isa,
    states: &[f32],
    outs: (&mut [f32], &mut [f32], &mut [f32]),
    after: Option<&[Vec<f64>]>,
) -> f64 {
    let (map, q, v, g) = (io.map, io.q, io.v, io.g);
    let (n, d, dv, m, w) = (q.n, q.cols, v.cols, map.width(), bank_width(v.cols));
    let (dq, dk, dvv) = outs;
    let segs = [(0, n)];
    let (out_q, out_k, out_v) = (
        Out::for_len(isa, dq.len()),
        Out::for_len(isa, dk.len()),
        Out::for_len(isa, dvv.len()),
    );
    let (mw, per_head) = (m * w, state_len(n, m, w));
    let zero = vec![0.0f64; mw];
    let dbeta: f64 = split_out(dq, n, d, &segs)
        .into_par_iter()
        .zip(split_out(dk, n, d, &segs).into_par_iter())
        .zip(split_out(dvv, n, dv, &segs).into_par_iter())
        .map(|(((h, _, dqp), (_, _, dkp)), (_, _, dvp))| {
            let snaps = &states[h * per_head..(h + 1) * per_head];
            // The queries' prefix state (restarted per block) and the keys' suffix `dS`.
            let end = after.map_or(&zero[..], |a| &a[h][..]);
            let (mut sq, mut sk) = (
                TwoLevel::new(isa, m, w, &zero),
                TwoLevel::new(isa, m, w, end),
            );
            let mut sc = Scratch::new(map, isa, w);
            let mut scratch = ABuf::zeroed(TB * d.max(dv));
            let mp = sc.kb.mp;
            let mut dbeta = 0.0f64;
            for (a, b) in blocks(0, n, false).into_iter().rev() {
                let (next, bi) = ((a.saturating_sub(TB), a), a / TB);
                // Prefetched with the next rows: the state entering the next block.
                let next_snap = &snaps[bi.saturating_sub(1) * mw..bi * mw];
                let mut ahead = sc.load(io, h, (a, b), next, None, next_snap);
                let subs = sub_blocks(a, b, TC, false);
                sq.restart(&snaps[bi * mw..(bi + 1) * mw]);
                for (j, &(a2, b2)) in subs.iter().enumerate() {
                    let (r2, off) = (b2 - a2, a2 - a);
                    let (vb, gb) = (rows_of(&v, h, a2, b2), rows_of(&g, h, a2, b2));
                    sc.query_sub_block(isa, &sq, (off, r2), (vb, gb, dv), Some(j));
                    if j + 1 < subs.len() {
                        sq.add_tokens(&sc.kb.phi[off * mp..], mp, r2, vb, dv);
                    }
                    ahead.step();
                }
                let rows = b - a;
                dbeta += sc.qb.backward(map, &sc.gphi, rows);
                let (qb, dqb) = (&sc.qb, &mut dqp[a * d..b * d]);
                out_q.produce(dqb, &mut scratch, |x| qb.input_grads(map, rows, x));
                for (j, &(a2, b2)) in subs.iter().enumerate().rev() {
                    let (r2, off) = (b2 - a2, a2 - a);
                    let (vb, gb) = (rows_of(&v, h, a2, b2), rows_of(&g, h, a2, b2));
                    let (pq, pk) = (&sc.qb.phi[off * mp..], &sc.kb.phi[off * mp..]);
                    let (c, s) = (&sc.c[off..off + r2], &sc.s[off..off + r2]);
                    let f = GFactors::of(c, s, gb, dv);
                    let att = &sc.attb[j * TC * TC..(j + 1) * TC * TC];
                    let qk = &sc.qkb[j * TC * TC..(j + 1) * TC * TC];
                    // ∂ℓ/∂φ_k = X̂ dSᵀ + tril(Ĝ X̂ᵀ)ᵀ Φ_Q.
                    let gphi = &mut sc.gphi[off * mp..];
                    sk.dots(gphi, mp, r2, vb, dv);
                    sk.masses(dv, &mut sc.mass);
                    key_intra(isa, gphi, mp, r2, att, pq, &sc.mass);
                    // ∂ℓ/∂v = Φ_K dS_B + (c ⊙ tril(Φ_Q Φ_Kᵀ))ᵀ G, then dS += Φ_Qᵀ Ĝ.
                    let (sk_m, sphi) = (&mut sk, &mut sc.sphi);
                    out_v.produce(&mut dvp[a2 * dv..b2 * dv], &mut scratch, |x| {
                        key_values(isa, sk_m, x, (pk, pq, mp), r2, sub_t(qk), &f, sphi);
                    });
                    sk.tick(r2);
                    ahead.step();
                }
                dbeta += sc.kb.backward(map, &sc.gphi, rows);
                let (kb, dkb) = (&sc.kb, &mut dkp[a * d..b * d]);
                out_k.produce(dkb, &mut scratch, |x| kb.input_grads(map, rows, x));
            }
            out_q.fence();
            out_k.fence();
            out_v.fence();
            dbeta
        })
        .sum();
    dbeta
}
