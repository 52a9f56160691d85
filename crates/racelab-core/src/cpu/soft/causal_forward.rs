//! Causal forward (Algorithm 2 as chunked linear attention): per sub-block
//! `[Num | Den] = Φ_Q S + tril(Φ_Q Φ_Kᵀ) X̂`, then `S += Φ_Kᵀ X̂`; segments start from f64
//! exclusive scans of their totals, and with one segment per head the state entering every
//! block of [`super::causal::TB`] tokens is saved for the one-pass backward.

use crate::backend::{ForwardInputs, Heads};
use crate::cpu::bank16::{Mass, Read, Update};
use crate::cpu::features::{FeatureMap, SoftMap};
use crate::cpu::gemm::{Mat, MatMut};
use crate::cpu::mem::{ABuf, Ahead, Out};
use crate::cpu::saved::{exclusive_scan, Buffers, Ctx};
use crate::cpu::simd::{dispatch, Isa, Kernel, Token};
use crate::cpu::soft::banks::{rows_of, saved_pieces};
use crate::cpu::soft::causal::{
    blocks, feature_gram, mask, state_len, sub, sub_blocks, tri_gemm, FeatureRows, Scale, Scratch,
    TwoLevel, GRAM_T_MAX_M, TB, TC,
};
use crate::cpu::soft::forward::{key_bank, normalise, DenRule};
use crate::cpu::soft::probs::lanes16;
use crate::cpu::state::{bank_width, plan_segments, split_out};
use crate::cpu::v16::{self, V16 as _};
use pulp::Simd as _;
use rayon::prelude::*;

/// `att = tril(Φ_Q Φ_Kᵀ)` for a sub-block's feature rows (row stride [`TC`], 0 above the
/// diagonal), and the causal forward's `Den_i = φ_i·A + Σ_{j≤i} att_ij` into `den[i·ldd]`
/// (`A`: the mass column of the state entering the sub-block; the product with the state
/// covers the value columns only). With at most [`GRAM_T_MAX_M`] features (rows of 16
/// floats), one pass of 16-lane rows ([`LowerGram16`]); else
/// [`feature_gram`], [`mask`] and row sums.
fn lower_gram(
    isa: Isa,
    att: &mut [f32],
    (x, y, (yt, ldt), mp): FeatureRows,
    m: usize,
    rows: usize,
    (den, ldd, a): (&mut [f32], usize, &[f32]),
) {
    assert_eq!(a.len(), m, "lower_gram: one mass per feature");
    if mp == 16 && m <= GRAM_T_MAX_M {
        assert!(rows <= TC && x.len() >= rows * 16 && att.len() >= rows * TC);
        assert!(m == 0 || yt.len() >= (m - 1) * ldt + rows);
        assert!(rows == 0 || den.len() > (rows - 1) * ldd);
        let task = LowerGram16 {
            x,
            kt: (yt, ldt),
            m,
            rows,
            att,
            den: (den, ldd),
            a: lanes16(a),
        };
        dispatch(isa, task);
        return;
    }
    feature_gram(isa, att, (x, y, (yt, ldt), mp), m, rows, true);
    mask(isa, att, rows, true, Scale::None);
    for i in 0..rows {
        let bank: f32 = x[i * mp..i * mp + m]
            .iter()
            .zip(a)
            .map(|(p, q)| p * q)
            .sum();
        den[i * ldd] = bank + att[i * TC..i * TC + i + 1].iter().sum::<f32>();
    }
}

/// [`lower_gram`] for banks of at most 16 features, one source for every ISA ([`v16`]): row
/// `i` of `Φ_Q Φ_Kᵀ` is `Σ_f φ_if (φ_f)ᵀ` over the transposed key features (one 16-lane
/// vector per feature, loaded once per sub-block), kept for `j ≤ i` and stored; `Den_i` is
/// one 16-lane sum of that row plus `φ_i ⊙ A`. `x` holds `rows ≤ 16` rows of 16 floats, `att`
/// `rows` rows of [`TC`], the keys' transposed features `m ≤ 16` rows of `rows` (stride
/// `ldt`), `den` `rows` entries of stride `ldd`.
struct LowerGram16<'a> {
    x: &'a [f32],
    kt: (&'a [f32], usize),
    m: usize,
    rows: usize,
    att: &'a mut [f32],
    den: (&'a mut [f32], usize),
    a: [f32; 16],
}

impl Kernel for LowerGram16<'_> {
    type Output = ();
    #[inline(always)]
    fn run<T: Token>(self, t: T) {
        let simd = t.w16();
        let LowerGram16 {
            x,
            kt: (yt, ldt),
            m,
            rows,
            att,
            den: (den, ldd),
            a,
        } = self;
        // Rows of 16 floats (TC = 16), cut to `rows ≤ 16`: no bounds checks in the row loop
        // but `den`'s.
        const { assert!(TC == 16) };
        let (rows, m) = (rows.min(16), m.min(16));
        let (x, att) = (v16::rows(x, rows), v16::rows_mut(att, rows));
        let av = v16::load(simd, &a, 0);
        let mut kt = [simd.splat_f32s(0.0); 16];
        for (f, t) in kt.iter_mut().enumerate().take(m) {
            *t = v16::load_n(simd, yt, f * ldt, rows);
        }
        for (i, (row, arow)) in x.iter().zip(att.iter_mut()).enumerate() {
            let q = simd.keep_first(v16::feature_row(simd, row, &kt, m), i + 1);
            v16::store_n(simd, arow, 0, rows, q);
            let phi = v16::row(simd, row);
            den[i * ldd] = simd.reduce_sum_f32s(simd.mul_add_e_f32s(phi, av, q));
        }
    }
}

/// The segments of a causal pass and the bank entering each `(head, segment)`: f64
/// exclusive scans of the segments' key banks (all zero with one segment per head), plus
/// the head's `init` state (the keys before this slice of the token axis) when there is one.
pub(crate) fn forward_bases(
    map: &SoftMap,
    isa: Isa,
    k: Heads,
    v: Heads,
    init: Option<&[Vec<f64>]>,
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
    let mut bases = exclusive_scan(&totals, heads, ns, false);
    if let Some(init) = init {
        add_per_head(&mut bases, init, ns);
    }
    (segs, bases)
}

/// Add head `h`'s `init[h]` to each of its `ns` segment banks (`banks`: `heads × ns`).
pub(crate) fn add_per_head(banks: &mut [Vec<f64>], init: &[Vec<f64>], ns: usize) {
    for (i, b) in banks.iter_mut().enumerate() {
        b.iter_mut().zip(&init[i / ns]).for_each(|(x, y)| *x += y);
    }
}

/// Where a causal pass over a slice of the token axis starts: the state of the tokens before
/// it and the total key count the denominator floor is taken for
/// ([`crate::shared::recompute::den_floor`]). [`Boundary::whole`] is a pass over every token.
#[derive(Debug, Clone, Copy)]
pub struct Boundary<'a> {
    /// Per head, `[B | A]` (`m × bank_width(dv)`, f64) of the keys before the slice (forward)
    /// or `[dB | dA]` of the queries after it (backward); `None`: zero.
    pub state: Option<&'a [Vec<f64>]>,
    /// Keys in the whole sequence (the slice's own count for a whole pass).
    pub keys: usize,
}

impl Boundary<'_> {
    /// A pass over the whole sequence of `keys` keys: nothing before or after it.
    pub fn whole(keys: usize) -> Self {
        Boundary { state: None, keys }
    }
}

/// Causal forward; same contract as [`crate::cpu::soft_forward_into`] with `causal = true`.
pub fn causal_forward_into(
    map: &SoftMap,
    isa: Isa,
    q: Heads,
    k: Heads,
    v: Heads,
    o: &mut [f32],
    reuse: Ctx,
) -> (usize, Ctx) {
    let x = ForwardInputs::new(q, k, v);
    causal_forward_from(map, isa, x, o, reuse, Boundary::whole(k.n))
}

/// [`causal_forward_into`] for a slice of the token axis that starts from `from.state`
/// (per head, the keys' `[B | A]` before the slice): every token also sees those keys.
pub fn causal_forward_from(
    map: &SoftMap,
    isa: Isa,
    x: ForwardInputs,
    o: &mut [f32],
    mut reuse: Ctx,
    from: Boundary,
) -> (usize, Ctx) {
    let ForwardInputs { q, k, v } = x;
    let (heads, n, dv, m, w) = (q.heads, q.n, v.cols, map.width(), bank_width(v.cols));
    let lp = map.planes.l * map.planes.p;
    let mut states = std::mem::take(&mut reuse.states);
    let Buffers {
        mut den,
        mut uq,
        mut uk,
    } = reuse.recycle(map, &q, &k);
    let (segs, bases) = forward_bases(map, isa, k, v, from.state);
    let ns = segs.len();
    // One segment per head: the state entering each block, for the one-pass backward.
    let per_head = state_len(n, m, w);
    let snaps: Vec<Option<&mut [f32]>> = if ns == 1 {
        states.resize(heads * per_head, 0.0);
        states.chunks_mut(per_head.max(1)).map(Some).collect()
    } else {
        states.clear();
        (0..heads * ns).map(|_| None).collect()
    };
    let rule = DenRule {
        scale: map.den_scale(),
        floor: crate::shared::recompute::den_floor(m, from.keys),
    };
    let out = Out::for_len(isa, o.len());
    let empty: usize = split_out(o, n, dv, &segs)
        .into_par_iter()
        .zip(split_out(&mut den, n, 1, &segs).into_par_iter())
        .zip(saved_pieces(&mut uq, n, lp, &segs, heads).into_par_iter())
        .zip(saved_pieces(&mut uk, n, lp, &segs, heads).into_par_iter())
        .zip(snaps.into_par_iter())
        .map(
            |(((((h, s, op), (_, _, dp)), mut suq), mut suk), mut snap)| {
                let mut st = TwoLevel::new(isa, m, w, &bases[h * ns + s]);
                let mut sc = Scratch::new(map, isa, w);
                let (mp, tc) = (sc.kb.mp, TC);
                let (start, end) = segs[s];
                let (mut empty, mut ob) = (0usize, ABuf::zeroed(TC * dv));
                // Features per block of TB tokens; the state is read and updated per sub-block.
                for (a, b) in blocks(start, end, false) {
                    let (rows, next) = (b - a, (b + TB).min(end));
                    let parts = [&q, &k, &v].map(|x| rows_of(x, h, b, next));
                    let mut ahead = Ahead::new(&parts);
                    ahead.step();
                    sc.kb.features(map, rows_of(&k, h, a, b), rows);
                    sc.qb.features(map, rows_of(&q, h, a, b), rows);
                    if m <= GRAM_T_MAX_M {
                        sc.kb.features_t(m, rows);
                    }
                    let t0 = a - start;
                    if let Some(sn) = snap.as_deref_mut() {
                        // Blocks start at multiples of TB, where the f32 part has just folded.
                        let mw = m * w;
                        sn[t0 / TB * mw..(t0 / TB + 1) * mw].copy_from_slice(st.parts().0);
                    }
                    for (blk, save) in [(&sc.qb, &mut suq), (&sc.kb, &mut suk)] {
                        if let Some(u) = save.as_deref_mut() {
                            u[t0 * lp..(t0 + rows) * lp].copy_from_slice(blk.u(rows));
                        }
                    }
                    for (a2, b2) in sub_blocks(a, b, tc, false) {
                        let (r2, off) = (b2 - a2, a2 - a);
                        let vb = rows_of(&v, h, a2, b2);
                        let (pq, pk) = (&sc.qb.phi[off * mp..], &sc.kb.phi[off * mp..]);
                        // Num = Φ_Q S (+ the intra-sub-block terms below), then S += Φ_Kᵀ X̂:
                        // one pass over the state where it fits in registers.
                        st.masses(dv, &mut sc.mass);
                        let fused = st.fused();
                        if fused {
                            let read = Read {
                                a: pq,
                                rows: r2,
                                d: &mut sc.acc,
                                ldd: w,
                            };
                            let (b, x, mass) = (pk, vb, Mass::Ones);
                            let update = Update {
                                b,
                                rows: r2,
                                x,
                                ldx: dv,
                                mass,
                            };
                            st.read_update(dv, Some(read), Some(update));
                        } else {
                            st.product(&mut sc.acc, r2, dv, pq, mp, w);
                        }
                        let pkt = (&sc.kb.phit()[off..], sc.kb.tp());
                        let den = (&mut sc.acc[dv..], w, &sc.mass[..]);
                        lower_gram(isa, &mut sc.att, (pq, pk, pkt, mp), m, r2, den);
                        tri_gemm(
                            isa,
                            MatMut::new(&mut sc.acc, r2, dv, w),
                            sub(&sc.att),
                            Mat::new(vb, r2, dv, dv),
                            1.0,
                            true,
                        );
                        let t2 = a2 - start;
                        let (ot, dt) = (&mut op[t2 * dv..(t2 + r2) * dv], &mut dp[t2..t2 + r2]);
                        out.produce(ot, &mut ob, |x| {
                            empty += normalise(isa, Mat::new(&sc.acc, r2, dv + 1, w), rule, x, dt);
                        });
                        if !fused {
                            st.add_tokens(pk, mp, r2, vb, dv);
                        }
                        st.tick(r2);
                        ahead.step();
                    }
                }
                out.fence();
                empty
            },
        )
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
            states,
            recomputed: Default::default(),
        },
    )
}
