//! Causal backward, the queries' half: per sub-block (in forward order, from the prefix
//! state), `∂ℓ/∂Φ_Q = Ĝ Sᵀ + tril(Ĝ X̂ᵀ) Φ_K` with `(Ĝ X̂ᵀ)_ij = c_i (g_i·v_j − s_i)`, and
//! `s_i = g_i·ô_i` rebuilt from products this pass forms (`Ô` is not read); the keys' half
//! ([`super::causal_backward`]) reads what it leaves in the scratch.

use super::causal::{
    feature_gram, gram, mask, sub, tri_gemm, FeatureRows, Scale, Scratch, TwoLevel, GRAM_T_MAX_M,
    TC,
};
use crate::backend::Heads;
use crate::cpu::features::{FeatureMap, SoftMap};
use crate::cpu::gemm::{Mat, MatMut};
use crate::cpu::mem::Ahead;
use crate::cpu::simd::{dispatch, in_frame, Isa, Kernel, Simd, Token};
use crate::cpu::soft::backward::GFactors;
use crate::cpu::soft::banks::{inv_den, rows_of, saved_rows};
use crate::cpu::soft::probs::lanes16;
use crate::cpu::v16::{self, V16 as _};
use pulp::Simd as _;

/// The inputs of the causal backward passes (`uq`, `uk`: the forward's saved `u`, or empty).
pub(crate) struct Io<'a> {
    pub(crate) map: &'a SoftMap<'a>,
    pub(crate) q: Heads<'a>,
    pub(crate) k: Heads<'a>,
    pub(crate) v: Heads<'a>,
    pub(crate) g: Heads<'a>,
    pub(crate) den: &'a [f32],
    pub(crate) uq: &'a [f32],
    pub(crate) uk: &'a [f32],
}

impl Scratch {
    /// Start block `a..b` of head `h`: both feature blocks (from the saved `u` when there is
    /// one) and `c`; with `s_all` (`[heads, n]`, the query pass's `s_i = g_i·ô_i`) also `s`.
    /// Returns the [`Ahead`] drip armed with the rows of `next`.
    #[inline]
    pub(crate) fn load<'a>(
        &mut self,
        io: &Io<'a>,
        h: usize,
        (a, b): (usize, usize),
        next: (usize, usize),
        s_all: Option<&[f32]>,
        extra: &'a [f32],
    ) -> Ahead<'a> {
        let (n, lp) = (io.q.n, io.map.planes.l * io.map.planes.p);
        let (uq, uk) = (
            saved_rows(io.uq, n, lp, h, a, b),
            saved_rows(io.uk, n, lp, h, a, b),
        );
        let ahead_of = |x: &Heads<'a>| rows_of(x, h, next.0, next.1);
        let mut parts: [&[f32]; 5] = [ahead_of(&io.v), ahead_of(&io.g), &[], &[], extra];
        if uq.is_none() {
            parts[2] = ahead_of(&io.q);
        }
        if uk.is_none() {
            parts[3] = ahead_of(&io.k);
        }
        let mut ahead = Ahead::new(&parts);
        ahead.step();
        self.kb
            .features_of(io.map, rows_of(&io.k, h, a, b), uk, b - a);
        self.qb
            .features_of(io.map, rows_of(&io.q, h, a, b), uq, b - a);
        let m = io.map.width();
        if m <= GRAM_T_MAX_M {
            self.kb.features_t(m, b - a);
            self.qb.features_t(m, b - a);
        }
        let inv_l = 1.0 / io.map.planes.l as f32;
        inv_den(&io.den[h * n + a..h * n + b], inv_l, &mut self.c);
        if let Some(s) = s_all {
            self.s[..b - a].copy_from_slice(&s[h * n + a..h * n + b]);
        }
        ahead
    }

    /// The queries' half of the loaded block's sub-block `off..off + r2` (value and gradient
    /// rows `vb`, `gb`, `dv` wide) against the prefix state `st`: `∂ℓ/∂φ_q = Ĝ Sᵀ + tril(Ĝ X̂ᵀ) Φ_K`
    /// into `gphi` and `s_i` into `s`. From `g_i·S_f`, `g_i·v_j` and `φ(q_i)·φ(k_j)`,
    /// `ô_i = (Φ_Q S + tril(Φ_Q Φ_Kᵀ) X̂)_i / Den_i` gives
    /// `s_i = c_i (Σ_f φ_if (g_i·S_f) + Σ_{j≤i} (φ_i·φ_j)(g_i·v_j))`. The scaled `tril(Ĝ X̂ᵀ)`
    /// and `c ⊙ tril(Φ_Q Φ_Kᵀ)` (zeros above the diagonal) are left in `att` and `qk`, or
    /// with `keep = Some(j)` in slot `j` of `attb` and `qkb`, for the keys' half. With
    /// AVX-512 and at most 16 features the steps after `g·S` and `G Vᵀ` are one row pass
    /// ([`query_intra16`]).
    #[inline]
    pub(crate) fn query_sub_block(
        &mut self,
        isa: Isa,
        st: &TwoLevel,
        (off, r2): (usize, usize),
        (vb, gb, dv): (&[f32], &[f32], usize),
        keep: Option<usize>,
    ) {
        let (mp, m) = (self.kb.mp, st.bank.m);
        let (att, qk) = match keep {
            Some(j) => (
                &mut self.attb[j * TC * TC..(j + 1) * TC * TC],
                &mut self.qkb[j * TC * TC..(j + 1) * TC * TC],
            ),
            None => (&mut self.att[..], &mut self.qk[..]),
        };
        let (pq, pk) = (&self.qb.phi[off * mp..], &self.kb.phi[off * mp..]);
        let gphi = &mut self.gphi[off * mp..];
        st.dots(gphi, mp, r2, gb, dv);
        gram(
            isa,
            att,
            Mat::new(gb, r2, dv, dv),
            Mat::new(vb, r2, dv, dv),
            true,
        );
        st.masses(dv, &mut self.mass);
        let pkt = (&self.kb.phit()[off..], self.kb.tp());
        let (c, s) = (&self.c[off..off + r2], &mut self.s[off..off + r2]);
        let rows16 = (pq, pk, pkt, mp);
        if query_intra16(isa, rows16, m, r2, (gphi, att, qk), (c, s), &self.mass) {
            return;
        }
        feature_gram(isa, qk, (pq, pk, pkt, mp), m, r2, true);
        let (qk_r, gphi_r, att_r) = (&*qk, &*gphi, &*att);
        dispatch(
            isa,
            CausalS {
                pq,
                gphi: gphi_r,
                mp,
                m,
                qk: qk_r,
                att: att_r,
                c,
                s,
            },
        );
        let f = GFactors::of(c, s, gb, dv);
        f.scale_phi_grads(isa, gphi, mp, r2, &self.mass);
        scale_gv(isa, att, r2, f.c, f.s, true);
        tri_gemm(
            isa,
            MatMut::new(gphi, r2, mp, mp),
            sub(att),
            Mat::new(pk, r2, mp, mp),
            1.0,
            true,
        );
        mask(isa, qk, r2, true, Scale::Rows(f.c));
    }
}

/// `att_ij (=) c_i (g_i·v_j − s_i)` for `j ≤ i` (queries `i`, keys `j`, both in the
/// sub-block) from `att = G Vᵀ`, when `by_row`; else `att_ji = c_i (v_j·g_i − s_i)` for
/// `i ≥ j` from `att = V Gᵀ`; 0 off the triangle.
#[inline]
pub(crate) fn scale_gv(isa: Isa, att: &mut [f32], rows: usize, c: &[f32], s: &[f32], by_row: bool) {
    // Fused with the triangular mask (`by_row`: keep j ≤ i; else keep columns ≥ the row);
    // branch-free per row, so each row is a few vector selects (in the SIMD frame).
    in_frame(
        isa,
        #[inline(always)]
        || {
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
        },
    )
}

/// `s_i = c_i (Σ_f φ_if (g_i·S_f) + Σ_{j≤i} (φ_i·φ_j)(g_i·v_j))` for a sub-block's rows from
/// `gphi` (`g_i·S_f`), `qk` (`φ_i·φ_j`) and `att` (`g_i·v_j`), each sum a 16-lane
/// [`Simd::dot`] (a plain `f32` sum is one serial chain per row).
struct CausalS<'a> {
    pub(crate) pq: &'a [f32],
    pub(crate) gphi: &'a [f32],
    pub(crate) mp: usize,
    pub(crate) m: usize,
    pub(crate) qk: &'a [f32],
    pub(crate) att: &'a [f32],
    pub(crate) c: &'a [f32],
    pub(crate) s: &'a mut [f32],
}

impl Kernel for CausalS<'_> {
    type Output = ();
    #[inline(always)]
    fn run<T: Token>(self, t: T) {
        let simd = t.rows();
        let (mp, m) = (self.mp, self.m);
        for (i, si) in self.s.iter_mut().enumerate() {
            let bank = simd.dot(&self.pq[i * mp..i * mp + m], &self.gphi[i * mp..i * mp + m]);
            let row = i * TC..i * TC + i + 1;
            let intra = simd.dot(&self.qk[row.clone()], &self.att[row]);
            *si = self.c[i] * (bank + intra);
        }
    }
}

/// [`QueryIntra16`] when it applies (feature rows of 16 floats, at most
/// [`GRAM_T_MAX_M`] features, so the keys' transposed features are there); `false`
/// otherwise, for the general sequence in [`Scratch::query_sub_block`].
#[inline]
pub(crate) fn query_intra16(
    isa: Isa,
    (pq, pk, (pkt, tp), mp): FeatureRows,
    m: usize,
    rows: usize,
    (gphi, att, qk): (&mut [f32], &mut [f32], &mut [f32]),
    (c, s): (&[f32], &mut [f32]),
    a: &[f32],
) -> bool {
    if mp == 16 && m <= GRAM_T_MAX_M {
        assert!(rows <= TC && pq.len() >= rows * 16 && pk.len() >= rows * 16);
        assert!(gphi.len() >= rows * 16 && att.len() >= rows * TC && qk.len() >= rows * TC);
        assert!(c.len() >= rows && s.len() >= rows && a.len() == m);
        assert!(m == 0 || pkt.len() >= (m - 1) * tp + rows);
        let task = QueryIntra16 {
            phi: (pq, pk, (pkt, tp)),
            m,
            rows,
            out: (gphi, att, qk),
            cs: (c, s),
            a: lanes16(a),
        };
        dispatch(isa, task);
        return true;
    }
    false
}

/// The queries' sub-block work after `g·S_f` and `G Vᵀ`, one row per step, for banks of at
/// most 16 features with AVX-512 (row `i`'s `φ(q_i)·φ(k_j)` is one 16-lane vector over the
/// sub-block's keys `j`): with `gphi_i = (g_i·S_f)_f` and `att_ij = g_i·v_j` in,
///
/// - `qk_ij = c_i φ(q_i)·φ(k_j)` for `j ≤ i` (0 above the diagonal);
/// - `s_i = c_i (Σ_f φ_if gphi_if + Σ_{j≤i} (φ_i·φ_j) att_ij)`;
/// - `att_ij = c_i (att_ij − s_i)` for `j ≤ i` (0 above), the scaled `tril(Ĝ X̂ᵀ)`;
/// - `∂ℓ/∂φ_i = c_i (gphi_i − s_i A) + Σ_{j≤i} att_ij φ(k_j)` over `gphi`.
///
/// The same sums as [`feature_gram`], [`CausalS`], [`GFactors::scale_phi_grads`],
/// [`scale_gv`], [`tri_gemm`] and [`mask`], which take six passes over the sub-block.
///
/// `pq`, `pk`, `gphi` hold `rows ≤ 16` rows of 16 floats, `att` and `qk` `rows` rows of
/// [`TC`], `pkt` `m ≤ 16` rows of `rows` (stride `tp`). One source for every ISA ([`v16`]).
struct QueryIntra16<'a> {
    phi: (&'a [f32], &'a [f32], (&'a [f32], usize)),
    m: usize,
    rows: usize,
    out: (&'a mut [f32], &'a mut [f32], &'a mut [f32]),
    cs: (&'a [f32], &'a mut [f32]),
    a: [f32; 16],
}

impl Kernel for QueryIntra16<'_> {
    type Output = ();
    #[inline(always)]
    fn run<T: Token>(self, t: T) {
        let simd = t.w16();
        let QueryIntra16 {
            phi: (pq, pk, (pkt, tp)),
            m,
            rows,
            out: (gphi, att, qk),
            cs: (c, s),
            a,
        } = self;
        // Rows of 16 floats (TC = 16), cut to `rows ≤ 16`: every index below is a row index
        // under `rows` or a lane under 16, so the loops carry no bounds checks.
        const { assert!(TC == 16) };
        let (rows, m) = (rows.min(16), m.min(16));
        let (pq, pk) = (v16::rows(pq, rows), v16::rows(pk, rows));
        let (gphi, att, qk) = (
            v16::rows_mut(gphi, rows),
            v16::rows_mut(att, rows),
            v16::rows_mut(qk, rows),
        );
        let zero = simd.splat_f32s(0.0);
        let mut kt = [zero; 16];
        for (f, t) in kt.iter_mut().enumerate().take(m) {
            *t = v16::load_n(simd, pkt, f * tp, rows);
        }
        let av = v16::load(simd, &a, 0);
        // Σ_{j≤i} φ(k_j), so that Σ_{j≤i} c_i (att_ij − s_i) φ(k_j) = c_i (Σ_{j≤i} att_ij φ(k_j)
        // − s_i Σ_{j≤i} φ(k_j)): the product over the row does not wait for s_i (and does not
        // read back the scaled row just stored, which would stall on store forwarding).
        let mut pre = zero;
        let lines = pq
            .iter()
            .zip(gphi.iter_mut())
            .zip(att.iter_mut().zip(qk.iter_mut()));
        for (i, (((prow, grow), (arow, qrow)), (&ci, si_out))) in
            lines.zip(c.iter().zip(s.iter_mut())).enumerate()
        {
            // Σ_{j<i} (g_i·v_j) φ(k_j), two chains (even and odd j).
            let (k2, k1) = pk[..i].as_chunks::<2>();
            let (a2, a1) = arow[..i].as_chunks::<2>();
            let (mut t0, mut t1) = (zero, zero);
            for (k, w) in k2.iter().zip(a2) {
                t0 = simd.mul_add_e_f32s(simd.splat_f32s(w[0]), v16::row(simd, &k[0]), t0);
                t1 = simd.mul_add_e_f32s(simd.splat_f32s(w[1]), v16::row(simd, &k[1]), t1);
            }
            if let (Some(k), Some(&w)) = (k1.first(), a1.first()) {
                t0 = simd.mul_add_e_f32s(simd.splat_f32s(w), v16::row(simd, k), t0);
            }
            // j = i: its φ(k_i) into the prefix sum and its product into t0.
            let ki = v16::row(simd, &pk[i]);
            pre = simd.add_f32s(pre, ki);
            t0 = simd.mul_add_e_f32s(simd.splat_f32s(arow[i]), ki, t0);
            // Row i keeps the keys j ≤ i.
            let q = simd.keep_first(v16::feature_row(simd, prow, &kt, m), i + 1);
            let ph = v16::load_n(simd, prow, 0, m);
            let g = v16::load_n(simd, grow, 0, m);
            let at = v16::load_n(simd, arow, 0, i + 1);
            let dot = simd.mul_add_e_f32s(q, at, simd.mul_f32s(ph, g));
            let si = ci * simd.reduce_sum_f32s(dot);
            *si_out = si;
            let (cv, sv) = (simd.splat_f32s(ci), simd.splat_f32s(si));
            // Only the sub-block's columns (a row is `TC` floats), and only j ≤ i.
            let scaled = simd.keep_first(simd.mul_f32s(cv, simd.sub_f32s(at, sv)), i + 1);
            v16::store_n(simd, arow, 0, rows, scaled);
            v16::store_n(simd, qrow, 0, rows, simd.mul_f32s(q, cv));
            // c_i (g_i·S + Σ_j (g_i·v_j) φ(k_j) − s_i (A + Σ_{j≤i} φ(k_j))).
            let gsum = simd.add_f32s(g, simd.add_f32s(t0, t1));
            let gout = simd.negate_mul_add_e_f32s(sv, simd.add_f32s(av, pre), gsum);
            v16::set_row(simd, grow, simd.mul_f32s(cv, gout));
        }
    }
}
