//! Causal soft RACE (Algorithm 2) as blocked matrix products: chunked linear attention.
//!
//! Tokens are processed in blocks of [`TB`] (features, their backward and the input
//! gradients, one product each) split into sub-blocks of [`TC`]. With
//! `S = [B | A]` the bank entering a sub-block (f64 base + f32 block-local sum, read as one f32
//! matrix), lower-triangular masks (`j ≤ i`, token i sees itself), and
//! `Ĝ = [G/Den, −s/Den]/L` with its row factors `c_i = 1/(L·Den_i)`, `s_i = g_i·ô_i`
//! (`GFactors`):
//!
//! - forward: `[Num | Den] = Φ_Q S + tril(Φ_Q Φ_Kᵀ) X̂`, then `S += Φ_Kᵀ X̂`; it saves
//!   `u = tanh(W·)` of queries and keys in the [`Ctx`];
//! - backward, queries (forward order, prefix recomputed from the stored segment bases):
//!   `∂ℓ/∂Φ_Q = Ĝ Sᵀ + tril(Ĝ X̂ᵀ) Φ_K`, where `(Ĝ X̂ᵀ)_ij = c_i (g_i·v_j − s_i)`. `Ô` is not
//!   read: `s_i = c_i (Σ_f φ_if (g_i·S_f) + Σ_{j≤i} (φ_i·φ_j)(g_i·v_j))` from products this
//!   pass forms anyway (plus `tril(Φ_Q Φ_Kᵀ)`), and is kept per token for the key pass;
//! - backward, keys (reverse order; `dS` = suffix `Σ_{t>block} φ(q_t) ĝ_tᵀ`):
//!   `∂ℓ/∂Φ_K = X̂ dSᵀ + triu(X̂ Ĝᵀ) Φ_Q`, `∂ℓ/∂V = Φ_K dS_B + triu(Φ_K Φ_Qᵀ) (c ⊙ G)`.
//!
//! With the saved `u` neither backward pass reads Q or K or projects them again: each reads
//! V and G. Every product is one [`gemm`] or [`gemm_nt`] call on the sub-block (triangular
//! ones skip the zero half). Segments (for parallelism at few heads) start from f64 exclusive
//! scans of segment totals, exactly as in [`super::forward`]; the f32 block-local sums are
//! moved into f64 every [`TB`] tokens, so accuracy does not depend on N.
//!
//! When each head is one segment (heads ≥ 2 × threads, the paper's shape), the forward also
//! keeps the state entering every block ([`Ctx::states`], `m·w/TB` floats per token), and
//! the backward runs as **one reverse pass** over the blocks (`one_pass`): per block the
//! queries' half (in order, from the saved block-start state) and then the keys' half (in
//! reverse, with the suffix `dS` carried from the end of the head). The keys' half reads the
//! queries' `tril(Ĝ X̂ᵀ)` and `c ⊙ tril(Φ_Q Φ_Kᵀ)` transposed instead of forming
//! `triu(X̂ Ĝᵀ)` and `triu(Φ_K Φ_Qᵀ)` again. Within a block the queries' prefix state is one
//! f32 matrix (the saved start plus the block's tokens so far), which differs from the
//! two-pass form's two-level sum only by the roundings of at most `TB/TC − 1` additions and
//! is read with half the bytes. Measured (one core, `examples/timing.rs`, N = 2^16), the
//! causal backward in cycles per token and head: `(2, 2)` 1107 → 825–870, `(3, 3)` 1814 →
//! 1390–1420, `(4, 4)` 3289 → 2730–2780; the forward pays 1–3% for the saved states at
//! `(4, 4)`. With several segments per head the keys' `dS` entering a segment needs the
//! later segments' queries first, so the two passes remain.
//!
//! For banks of at most 16 features with AVX-512 (`(2, 2)`: 8 features, rows of 16 floats),
//! the small per-sub-block steps are one row pass each instead of a chain of products and
//! masks: [`lower_gram`] (the forward's masked `Φ_Q Φ_Kᵀ` and its `Den` row sums),
//! [`query_intra16`] (the queries' `Φ_Q Φ_Kᵀ`, `s`, scalings and `tril(Ĝ X̂ᵀ) Φ_K`), and
//! [`key_intra`] (the keys' masses and `tril(Ĝ X̂ᵀ)ᵀ Φ_Q`). Row `i` of a sub-block's
//! `Φ_Q Φ_Kᵀ` is one 16-lane vector over its keys. The state's reads and updates of these
//! banks are [`bank16`] passes (the state's chunks in registers) rather than [`gemm`] calls.
//! Measured (one core, N = 2^16, alternated runs, medians): causal
//! `(2, 2)` forward+backward 1205 → 1092–1117 cycles per token and head with the row passes,
//! → 1043 with [`bank16`] as well; `racelab bench --causal --p 2 --l 2`, N = 2^20,
//! alternated: 0.656–0.699 s → 0.605–0.666 s → 0.553–0.630 s.

use super::bank16::{self, Mass, Read, Update};
use super::blocked::{
    add_rows, gemm_ext, inv_den, key_bank, lanes16, normalise, pad16, rows_of, saved_pieces,
    saved_rows, Block, GFactors, T,
};
use super::features::{FeatureMap, SoftMap};
use super::forward::{exclusive_scan, Ctx};
use super::gemm::{gemm, gemm_nt, gemm_nt2, Gemm, Strided, Tri};
use super::mem::{ABuf, Ahead, Out};
use super::simd::{add_into_f64, dispatch, in_frame, Isa, Level, Simd, WithSimd};
use super::state::{bank_width, plan_segments, split_out, Bank, Heads};
use rayon::prelude::*;

/// Tokens per causal block: the features, their backward and the input gradients are computed
/// for a block at once (measured: 128 is 5–9% faster than 64, the non-causal block); the
/// state is read and updated per sub-block inside it, and its f32 part still moves into f64
/// every `TB` tokens (measured: a fold every 64 tokens cost about 100 cycles per token and
/// head at `(4, 4)`, about 70 every 128; the f32 part then sums at most 128 tokens).
pub const TB: usize = 128;

/// Tokens per causal sub-block (the intra-block products are `TC × TC`, stored with row
/// stride `TC`). They cost about `TC·dv` per token and the per-sub-block work (state read
/// and update) about `m·w/TC`; measured with blocks of [`TB`] (when the state
/// was still read through a refreshed copy), 16 is fastest for every `(P, L)` of the paper
/// (8 and 32 are 3–12% slower).
pub const TC: usize = 16;

/// How [`mask`] scales the entries it keeps.
#[derive(Clone, Copy)]
enum Scale<'a> {
    None,
    /// Column `j` by `x[j]`.
    Cols(&'a [f32]),
    /// Row `i` by `x[i]`.
    Rows(&'a [f32]),
}

/// Zero the entries above (`lower = true`: keep `j ≤ i`) or below (keep `j ≥ i`) the diagonal
/// of a `rows × rows` matrix with row stride [`TC`], and scale the kept entries.
fn mask(isa: Isa, a: &mut [f32], rows: usize, lower: bool, scale: Scale) {
    let ones = [1.0f32; TC];
    let (c, r) = match scale {
        Scale::None => (&ones[..rows], &ones[..rows]),
        Scale::Cols(x) => (&x[..rows], &ones[..rows]),
        Scale::Rows(x) => (&ones[..rows], &x[..rows]),
    };
    in_frame(
        isa,
        #[inline(always)]
        || {
            for (i, &ri) in r.iter().enumerate() {
                let row = &mut a[i * TC..i * TC + rows];
                for (j, (x, &cj)) in row.iter_mut().zip(c).enumerate() {
                    let off = if lower { j > i } else { j < i };
                    *x = if off { 0.0 } else { *x * cj * ri };
                }
            }
        },
    )
}

/// The two-level [`Bank`] (f64 base, f32 block-local part). Products read the state as
/// `base32 + local` inside their tiles ([`Gemm::b2`], [`gemm_nt2`]): a refreshed copy of the sum
/// per sub-block cost about 170 cycles per token and head at `(4, 4)` in each pass, measured.
///
/// After [`TwoLevel::restart`] at a saved block-start state it is one f32 matrix (`local`,
/// the saved state plus the block's tokens so far): it is only needed within the block, so at
/// most `TB/TC − 1` f32 additions at the state's scale round it before the next restart, and
/// the products read half the bytes.
struct TwoLevel {
    isa: Isa,
    bank: Bank,
    /// Restarted: `local` is the whole state, and there is no f64 part.
    single: bool,
}

impl TwoLevel {
    fn new(isa: Isa, m: usize, w: usize, base: &[f64]) -> Self {
        TwoLevel {
            isa,
            bank: Bank::new(m, w, Some(base)),
            single: false,
        }
    }
    /// Restart at a block-start state saved by the forward ([`Ctx::states`]), copied into
    /// `local` as the whole state. Tokens are then added but never folded (no
    /// [`TwoLevel::tick`]).
    fn restart(&mut self, saved: &[f32]) {
        self.bank.local.copy_from_slice(saved);
        self.single = true;
    }
    /// The two parts `(f32(base), local)` whose sum is the state (after a restart: `local`
    /// alone, as the first part, and an empty second part).
    fn parts(&self) -> (&[f32], &[f32]) {
        if self.single {
            (&self.bank.local, &[])
        } else {
            (&self.bank.base32, &self.bank.local)
        }
    }
    /// Whether [`TwoLevel::read_update`] runs ([`bank16::applies`]: AVX-512, at most 16
    /// features, so feature rows are 16 floats).
    fn fused(&self) -> bool {
        bank16::applies(self.isa, self.bank.m)
    }
    /// [`bank16::read_update`] on this state (`f32(base) + local`, or `local` alone after a
    /// restart); only when [`TwoLevel::fused`].
    fn read_update(&mut self, dv: usize, read: Option<Read>, update: Option<Update>) {
        let (isa, m, w) = (self.isa, self.bank.m, self.bank.w);
        let bank = &mut self.bank;
        let base: &[f32] = if self.single { &[] } else { &bank.base32 };
        bank16::read_update(isa, m, dv, (base, &mut bank.local, w), read, update);
    }
    /// `local (+)= Φᵀ X̂` for a sub-block's feature rows `phi` (row stride `mp`) and value rows
    /// `x` (stride `dv`), the ones column included ([`gemm_ext`], or [`bank16`]).
    fn add_tokens(&mut self, phi: &[f32], mp: usize, rows: usize, x: &[f32], dv: usize) {
        let (m, w) = (self.bank.m, self.bank.w);
        if self.fused() {
            let (b, mass) = (phi, Mass::Ones);
            let update = Update {
                b,
                rows,
                x,
                ldx: dv,
                mass,
            };
            return self.read_update(dv, None, Some(update));
        }
        let pt = Strided::transposed(phi, mp);
        gemm_ext(
            self.isa,
            &mut self.bank.local,
            w,
            m,
            rows,
            pt,
            x,
            dv,
            1.0,
            true,
        );
    }
    /// `D = X S` for `rows` rows of `x` (`rows × m`, row stride `ldx`) and the state `S`
    /// (`m × w`), into `d` (row stride `w`, first `cols` columns).
    #[allow(clippy::too_many_arguments)]
    fn product(&self, d: &mut [f32], rows: usize, cols: usize, x: &[f32], ldx: usize, ldd: usize) {
        let (b, b2) = self.parts();
        Gemm {
            d,
            ldd,
            rows,
            cols,
            k: self.bank.m,
            a: Strided::rows(x, ldx),
            b,
            b2: Some(b2).filter(|x| !x.is_empty()),
            ldb: self.bank.w,
            alpha: 1.0,
            accumulate: false,
            tri: Tri::Full,
        }
        .run(self.isa)
    }
    /// `out[i·ldo + f] = x_i · B_f` for `rows` rows `x` (stride `dv`) and the state's value rows.
    fn dots(&self, out: &mut [f32], ldo: usize, rows: usize, x: &[f32], dv: usize) {
        let (isa, m, w) = (self.isa, self.bank.m, self.bank.w);
        gemm_nt2(
            isa,
            Tri::Full,
            out,
            ldo,
            rows,
            m,
            dv,
            x,
            dv,
            self.parts(),
            w,
        );
    }
    /// The state's mass column `A_f = S[f][dv]` (contiguous).
    fn masses(&self, dv: usize, out: &mut Vec<f32>) {
        let (b, b2) = self.parts();
        let w = self.bank.w;
        let local = |f: usize| b2.get(f * w + dv).copied().unwrap_or(0.0);
        out.clear();
        out.extend((0..self.bank.m).map(|f| b[f * w + dv] + local(f)));
    }
    /// Count `rows` tokens; fold the f32 part into f64 every [`TB`] tokens.
    fn tick(&mut self, rows: usize) {
        debug_assert!(!self.single, "a restarted state is never folded");
        let bank = &mut self.bank;
        in_frame(
            self.isa,
            #[inline(always)]
            || bank.tick_rows(rows, TB),
        );
    }
}

/// Scratch for one block of [`TB`] tokens (features, `∂ℓ/∂φ`, `c`, `s`) and its sub-blocks.
struct Scratch {
    kb: Block,
    qb: Block,
    att: ABuf,      // TC × TC
    qk: ABuf,       // TC × TC: Φ_Q Φ_Kᵀ (backward, for s)
    attb: ABuf,     // TB × TC: the block's scaled `tril(Ĝ X̂ᵀ)`, one TC × TC per sub-block
    qkb: ABuf,      // TB × TC: the block's `c ⊙ tril(Φ_Q Φ_Kᵀ)`, likewise
    acc: ABuf,      // TC × w
    gphi: ABuf,     // TB × mp
    sphi: Vec<f32>, // TC × m
    c: Vec<f32>,    // TB
    s: Vec<f32>,    // TB
    mass: Vec<f32>, // m: the state's mass column
}

impl Scratch {
    fn new(map: &SoftMap, isa: Isa, w: usize) -> Self {
        let (m, mp) = (map.width(), pad16(map.width()));
        Scratch {
            kb: Block::with_rows(map, isa, TB),
            qb: Block::with_rows(map, isa, TB),
            att: ABuf::zeroed(TC * TC),
            qk: ABuf::zeroed(TC * TC),
            attb: ABuf::zeroed(TB * TC),
            qkb: ABuf::zeroed(TB * TC),
            acc: ABuf::zeroed(TC * w),
            gphi: ABuf::zeroed(TB * mp),
            sphi: vec![0.0; TC * m],
            c: vec![0.0; TB],
            s: vec![0.0; TB],
            mass: Vec::with_capacity(m),
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
    /// Start block `a..b` of head `h`: both feature blocks (from the saved `u` when there is
    /// one) and `c`; with `s_all` (`[heads, n]`, the query pass's `s_i = g_i·ô_i`) also `s`.
    /// Returns the [`Ahead`] drip armed with the rows of `next`.
    fn load<'a>(
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
    fn query_sub_block(
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
        gram(isa, att, gb, dv, vb, dv, r2, dv, true);
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
        tri_gemm(isa, gphi, mp, r2, mp, sub(att), pk, mp, 1.0, true);
        mask(isa, qk, r2, true, Scale::Rows(f.c));
    }
}

/// A sub-block's feature rows `x`, `y` (row stride `mp`), `y` transposed with its row
/// stride, and `mp`: `(x, y, (yt, ldt), mp)`.
type FeatureRows<'a> = (&'a [f32], &'a [f32], (&'a [f32], usize), usize);

/// [`query_intra16_avx512`] when it applies (AVX-512, feature rows of 16 floats, at most
/// [`GRAM_T_MAX_M`] features, so the keys' transposed features are there); `false`
/// otherwise, for the general sequence in [`Scratch::query_sub_block`].
#[allow(clippy::too_many_arguments)]
fn query_intra16(
    isa: Isa,
    (pq, pk, (pkt, tp), mp): FeatureRows,
    m: usize,
    rows: usize,
    (gphi, att, qk): (&mut [f32], &mut [f32], &mut [f32]),
    (c, s): (&[f32], &mut [f32]),
    a: &[f32],
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if isa.level() == Level::Avx512 && mp == 16 && m <= GRAM_T_MAX_M {
        assert!(rows <= TC && pq.len() >= rows * 16 && pk.len() >= rows * 16);
        assert!(gphi.len() >= rows * 16 && att.len() >= rows * TC && qk.len() >= rows * TC);
        assert!(c.len() >= rows && s.len() >= rows && a.len() == m);
        assert!(m == 0 || pkt.len() >= (m - 1) * tp + rows);
        let a16 = lanes16(a);
        // SAFETY: an `Isa` at Avx512 exists only where the CPU has AVX-512F; every row read or
        // written is in bounds (asserted).
        unsafe {
            query_intra16_avx512((pq, pk, (pkt, tp)), m, rows, (gphi, att, qk), (c, s), &a16)
        };
        return true;
    }
    let _ = (isa, pq, pk, pkt, tp, mp, m, rows, gphi, att, qk, c, s, a);
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
/// # Safety
/// The CPU must support AVX-512F; `pq`, `pk`, `gphi` hold `rows ≤ 16` rows of 16 floats,
/// `att` and `qk` `rows` rows of [`TC`], `pkt` `m ≤ 16` rows of `rows` (stride `tp`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn query_intra16_avx512(
    (pq, pk, (pkt, tp)): (&[f32], &[f32], (&[f32], usize)),
    m: usize,
    rows: usize,
    (gphi, att, qk): (&mut [f32], &mut [f32], &mut [f32]),
    (c, s): (&[f32], &mut [f32]),
    a: &[f32; 16],
) {
    use std::arch::x86_64::*;
    let (kr, kf) = (((1u32 << rows) - 1) as u16, ((1u32 << m) - 1) as u16);
    let mut kt = [_mm512_setzero_ps(); 16];
    for (f, t) in kt.iter_mut().enumerate().take(m) {
        *t = _mm512_maskz_loadu_ps(kr, pkt.as_ptr().add(f * tp));
    }
    let av = _mm512_loadu_ps(a.as_ptr());
    // Σ_{j≤i} φ(k_j), so that Σ_{j≤i} c_i (att_ij − s_i) φ(k_j) = c_i (Σ_{j≤i} att_ij φ(k_j) −
    // s_i Σ_{j≤i} φ(k_j)): the product over the row does not wait for s_i (and does not
    // read back the scaled row just stored, which would stall on store forwarding).
    let mut pre = _mm512_setzero_ps();
    for i in 0..rows {
        // Row i keeps the keys j ≤ i.
        let ki = ((2u32 << i) - 1) as u16;
        let arow = att.as_mut_ptr().add(i * TC);
        let krow = |j: usize| _mm512_loadu_ps(pk.as_ptr().add(j * 16));
        // Σ_{j≤i} (g_i·v_j) φ(k_j), two chains (even and odd j).
        let (mut t0, mut t1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        let mut j = 0;
        while j < i {
            t0 = _mm512_fmadd_ps(_mm512_set1_ps(*arow.add(j)), krow(j), t0);
            t1 = _mm512_fmadd_ps(_mm512_set1_ps(*arow.add(j + 1)), krow(j + 1), t1);
            j += 2;
        }
        if j == i {
            t0 = _mm512_fmadd_ps(_mm512_set1_ps(*arow.add(j)), krow(j), t0);
        }
        pre = _mm512_add_ps(pre, krow(i));
        let prow = pq.as_ptr().add(i * 16);
        let q = _mm512_maskz_mov_ps(ki, feature_row16(prow, &kt, m));
        let ph = _mm512_maskz_loadu_ps(kf, prow);
        let g = _mm512_maskz_loadu_ps(kf, gphi.as_ptr().add(i * 16));
        let at = _mm512_maskz_loadu_ps(ki, arow);
        let ci = c[i];
        let si = ci * _mm512_reduce_add_ps(_mm512_fmadd_ps(q, at, _mm512_mul_ps(ph, g)));
        s[i] = si;
        let (cv, sv) = (_mm512_set1_ps(ci), _mm512_set1_ps(si));
        // Only the sub-block's columns (a row is `TC` floats).
        let at = _mm512_maskz_mul_ps(ki, cv, _mm512_sub_ps(at, sv));
        _mm512_mask_storeu_ps(arow, kr, at);
        _mm512_mask_storeu_ps(qk.as_mut_ptr().add(i * TC), kr, _mm512_mul_ps(q, cv));
        // c_i (g_i·S + Σ_j (g_i·v_j) φ(k_j) − s_i (A + Σ_{j≤i} φ(k_j))).
        let gsum = _mm512_add_ps(g, _mm512_add_ps(t0, t1));
        let gout = _mm512_mul_ps(cv, _mm512_fnmadd_ps(sv, _mm512_add_ps(av, pre), gsum));
        _mm512_storeu_ps(gphi.as_mut_ptr().add(i * 16), gout);
    }
}

/// The sub-blocks of `a..b` of at most `tc` tokens, in order or (`rev`) from the end.
fn sub_blocks(a: usize, b: usize, tc: usize, rev: bool) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = (a..b).step_by(tc).map(|x| (x, (x + tc).min(b))).collect();
    if rev {
        // From the end: the short sub-block (if any) comes last.
        out = (0..out.len())
            .map(|i| (b.saturating_sub((i + 1) * tc).max(a), b - i * tc))
            .collect();
    }
    out
}

/// The blocks of [`TB`] tokens of a segment, in order or (`rev`) from the end.
fn blocks(start: usize, end: usize, rev: bool) -> Vec<(usize, usize)> {
    sub_blocks(start, end, TB, rev)
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

/// Banks of at most this many features take their `Φ Φᵀ` grams from a transposed copy of
/// the block's features ([`feature_gram`]).
const GRAM_T_MAX_M: usize = 16;

/// `att[i][j] = φ_i · ψ_j` for a sub-block's feature rows `x`, `y` (row stride `mp`) on the
/// triangle kept (`lower` as in [`gram`]; entries off it may be written too). For at most
/// [`GRAM_T_MAX_M`] features, a register-tiled product with `yt`, `ψ` transposed (row stride
/// `ldt`, the sub-block's first token in column 0): there the dot products do one 16-lane
/// step per tile and then a 16-way reduction, which costs more than the arithmetic. Measured
/// (one core, medians of alternated runs): causal forward+backward at `(2, 2)` 1613 → 1576
/// cycles per token and head; at `(3, 3)` (`m = 24`) no change, at `(4, 4)` slower, hence
/// the limit. Else [`gram`].
fn feature_gram(
    isa: Isa,
    att: &mut [f32],
    (x, y, (yt, ldt), mp): FeatureRows,
    m: usize,
    rows: usize,
    lower: bool,
) {
    if m > GRAM_T_MAX_M {
        return gram(isa, att, x, mp, y, mp, rows, mp, lower);
    }
    gemm(
        isa,
        att,
        TC,
        rows,
        rows,
        m,
        Strided::rows(x, mp),
        yt,
        ldt,
        1.0,
        false,
    );
}

/// `att = tril(Φ_Q Φ_Kᵀ)` for a sub-block's feature rows (row stride [`TC`], 0 above the
/// diagonal), and the causal forward's `Den_i = φ_i·A + Σ_{j≤i} att_ij` into `den[i·ldd]`
/// (`A`: the mass column of the state entering the sub-block; the product with the state
/// covers the value columns only). With AVX-512 and at most [`GRAM_T_MAX_M`] features (rows
/// of 16 floats), one pass of 16-lane rows ([`lower_gram16_avx512`]); else
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
    #[cfg(target_arch = "x86_64")]
    if isa.level() == Level::Avx512 && mp == 16 && m <= GRAM_T_MAX_M {
        assert!(rows <= TC && x.len() >= rows * 16 && att.len() >= rows * TC);
        assert!(m == 0 || yt.len() >= (m - 1) * ldt + rows);
        assert!(rows == 0 || den.len() > (rows - 1) * ldd);
        let a16 = lanes16(a);
        // SAFETY: an `Isa` at Avx512 exists only where the CPU has AVX-512F; every row read or
        // written is in bounds (asserted).
        unsafe { lower_gram16_avx512(x, (yt, ldt), m, rows, att, (den, ldd), &a16) };
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

/// [`lower_gram`] for banks of at most 16 features with AVX-512: row `i` of `Φ_Q Φ_Kᵀ` is
/// `Σ_f φ_if (φ_f)ᵀ` over the transposed key features (one 16-lane vector per feature, loaded
/// once per sub-block), masked to `j ≤ i` and stored; `Den_i` is one 16-lane sum of that row
/// plus `φ_i ⊙ A`.
///
/// # Safety
/// The CPU must support AVX-512F; `x` holds `rows ≤ 16` rows of 16 floats, `att` `rows` rows
/// of [`TC`], `yt` `m ≤ 16` rows of `rows` (stride `ldt`), `den` `rows` entries of stride `ldd`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn lower_gram16_avx512(
    x: &[f32],
    (yt, ldt): (&[f32], usize),
    m: usize,
    rows: usize,
    att: &mut [f32],
    (den, ldd): (&mut [f32], usize),
    a: &[f32; 16],
) {
    use std::arch::x86_64::*;
    let kr = ((1u32 << rows) - 1) as u16;
    let av = _mm512_loadu_ps(a.as_ptr());
    let mut kt = [_mm512_setzero_ps(); 16];
    for (f, t) in kt.iter_mut().enumerate().take(m) {
        *t = _mm512_maskz_loadu_ps(kr, yt.as_ptr().add(f * ldt));
    }
    for i in 0..rows {
        let ki = ((2u32 << i) - 1) as u16;
        let row = x.as_ptr().add(i * 16);
        let q = _mm512_maskz_mov_ps(ki, feature_row16(row, &kt, m));
        _mm512_mask_storeu_ps(att.as_mut_ptr().add(i * TC), kr, q);
        den[i * ldd] = _mm512_reduce_add_ps(_mm512_fmadd_ps(_mm512_loadu_ps(row), av, q));
    }
}

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
    #[cfg(target_arch = "x86_64")]
    if isa.level() == Level::Avx512 && mp == 16 && a.len() <= 16 {
        assert!(rows <= TC && gphi.len() >= rows * 16 && pq.len() >= rows * 16);
        assert!(att.len() >= rows * TC);
        let a16 = lanes16(a);
        // SAFETY: an `Isa` at Avx512 exists only where the CPU has AVX-512F; every row read or
        // written is in bounds (asserted).
        unsafe { key_intra16_avx512(gphi, rows, att, pq, &a16) };
        return;
    }
    add_rows(isa, gphi, mp, rows, a);
    tri_gemm(isa, gphi, mp, rows, mp, sub_t(att), pq, mp, 1.0, false);
}

/// [`key_intra`] for rows of 16 floats: row `j` is `gphi_j + a + Σ_{i≥j} att_ij φ(q_i)`, the
/// `att_ij` broadcast from memory, two chains.
///
/// # Safety
/// The CPU must support AVX-512F; `gphi` and `pq` hold `rows ≤ 16` rows of 16 floats, `att`
/// `rows` rows of [`TC`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn key_intra16_avx512(
    gphi: &mut [f32],
    rows: usize,
    att: &[f32],
    pq: &[f32],
    a: &[f32; 16],
) {
    use std::arch::x86_64::*;
    let av = _mm512_loadu_ps(a.as_ptr());
    let (at, q) = (att.as_ptr(), pq.as_ptr());
    for j in 0..rows {
        let out = gphi.as_mut_ptr().add(j * 16);
        let mut g0 = _mm512_add_ps(_mm512_loadu_ps(out), av);
        let mut g1 = _mm512_setzero_ps();
        let mut i = j;
        while i + 1 < rows {
            let x0 = _mm512_set1_ps(*at.add(i * TC + j));
            g0 = _mm512_fmadd_ps(x0, _mm512_loadu_ps(q.add(i * 16)), g0);
            let x1 = _mm512_set1_ps(*at.add((i + 1) * TC + j));
            g1 = _mm512_fmadd_ps(x1, _mm512_loadu_ps(q.add((i + 1) * 16)), g1);
            i += 2;
        }
        if i < rows {
            let x0 = _mm512_set1_ps(*at.add(i * TC + j));
            g0 = _mm512_fmadd_ps(x0, _mm512_loadu_ps(q.add(i * 16)), g0);
        }
        _mm512_storeu_ps(out, _mm512_add_ps(g0, g1));
    }
}

/// `Σ_f x_f t_f` for the `m ≤ 16` floats at `x` and 16-lane rows `t` (two chains).
///
/// # Safety
/// The CPU must support AVX-512F; `x` points at `m` readable floats.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn feature_row16(
    x: *const f32,
    t: &[std::arch::x86_64::__m512; 16],
    m: usize,
) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let (mut q0, mut q1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let mut f = 0;
    while f + 1 < m {
        q0 = _mm512_fmadd_ps(_mm512_set1_ps(*x.add(f)), t[f], q0);
        q1 = _mm512_fmadd_ps(_mm512_set1_ps(*x.add(f + 1)), t[f + 1], q1);
        f += 2;
    }
    if f < m {
        q0 = _mm512_fmadd_ps(_mm512_set1_ps(*x.add(f)), t[f], q0);
    }
    _mm512_add_ps(q0, q1)
}

/// `D += α A B` for a masked `rows × rows` block `A` (a sub-block matrix with row stride
/// [`TC`], or its transpose), lower- or upper-triangular (the [`Gemm`] tiles skip the zero
/// triangle).
#[allow(clippy::too_many_arguments)]
fn tri_gemm(
    isa: Isa,
    d: &mut [f32],
    ldd: usize,
    rows: usize,
    cols: usize,
    att: Strided,
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
        a: att,
        b,
        b2: None,
        ldb,
        alpha,
        accumulate: true,
        tri: if lower { Tri::Lower } else { Tri::Upper },
    }
    .run(isa)
}

/// A sub-block matrix (row stride [`TC`]) as a product operand.
fn sub(att: &[f32]) -> Strided<'_> {
    Strided::rows(att, TC)
}

/// The transpose of a sub-block matrix (row stride [`TC`]) as a product operand.
fn sub_t(att: &[f32]) -> Strided<'_> {
    Strided::transposed(att, TC)
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
                f.dbank(isa, &qb.phi, mp, m, rows, &mut sphi, &mut d32, w, false);
                add_into_f64(isa, &mut d64, &d32);
                a = b;
            }
            d64
        })
        .collect()
}

/// Floats of [`Ctx::states`] per head: one `m × w` state per block of [`TB`] tokens.
fn state_len(n: usize, m: usize, w: usize) -> usize {
    n.div_ceil(TB) * m * w
}

/// Causal forward; same contract as [`super::soft_forward_into`] with `causal = true`.
pub fn forward_into(
    map: &SoftMap,
    isa: Isa,
    q: Heads,
    k: Heads,
    v: Heads,
    o: &mut [f32],
    mut reuse: Ctx,
) -> (usize, Ctx) {
    let (heads, n, dv, m, w) = (q.heads, q.n, v.cols, map.width(), bank_width(v.cols));
    let lp = map.planes.l * map.planes.p;
    let mut states = std::mem::take(&mut reuse.states);
    let (mut den, mut uq, mut uk) = reuse.recycle(map, &q, &k);
    let (segs, bases) = forward_bases(map, isa, k, v);
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
    let (den_scale, floor) = (map.den_scale(), super::recompute::den_floor(m, k.n));
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
                        tri_gemm(isa, &mut sc.acc, w, r2, dv, sub(&sc.att), vb, dv, 1.0, true);
                        let t2 = a2 - start;
                        let (ot, dt) = (&mut op[t2 * dv..(t2 + r2) * dv], &mut dp[t2..t2 + r2]);
                        out.produce(ot, &mut ob, |x| {
                            empty += normalise(isa, &sc.acc, w, r2, dv, den_scale, x, dt, floor);
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
        tri_gemm(isa, x, dv, rows, dv, tri, f.g, dv, 1.0, false);
        f.dbank(isa, pq, mp, m, rows, sphi, &mut sk.bank.local, w, true);
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
    tri_gemm(isa, x, dv, rows, dv, tri, g, dv, 1.0, false);
}

/// `att_ij (=) c_i (g_i·v_j − s_i)` for `j ≤ i` (queries `i`, keys `j`, both in the
/// sub-block) from `att = G Vᵀ`, when `by_row`; else `att_ji = c_i (v_j·g_i − s_i)` for
/// `i ≥ j` from `att = V Gᵀ`; 0 off the triangle.
fn scale_gv(isa: Isa, att: &mut [f32], rows: usize, c: &[f32], s: &[f32], by_row: bool) {
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
    pq: &'a [f32],
    gphi: &'a [f32],
    mp: usize,
    m: usize,
    qk: &'a [f32],
    att: &'a [f32],
    c: &'a [f32],
    s: &'a mut [f32],
}

impl WithSimd for CausalS<'_> {
    type Output = ();
    #[inline(always)]
    fn run<S: Simd>(self) {
        let (mp, m) = (self.mp, self.m);
        for (i, si) in self.s.iter_mut().enumerate() {
            let bank = S::dot(&self.pq[i * mp..i * mp + m], &self.gphi[i * mp..i * mp + m]);
            let row = i * TC..i * TC + i + 1;
            let intra = S::dot(&self.qk[row.clone()], &self.att[row]);
            *si = self.c[i] * (bank + intra);
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
        return one_pass(&io, isa, &ctx.states, outs);
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
    let totals = suffix_totals(map, isa, q, uq, g, den, &s_all, segs, heads);
    let dbases = exclusive_scan(&totals, heads, ns, true);
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
                    gram(isa, &mut sc.att, vb, dv, gb, dv, r2, dv, false);
                    scale_gv(isa, &mut sc.att, r2, f.c, f.s, false);
                    tri_gemm(isa, gphi, mp, r2, mp, sub(&sc.att), pq, mp, 1.0, false);
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
fn one_pass(io: &Io, isa: Isa, states: &[f32], outs: (&mut [f32], &mut [f32], &mut [f32])) -> f64 {
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
            let (mut sq, mut sk) = (
                TwoLevel::new(isa, m, w, &zero),
                TwoLevel::new(isa, m, w, &zero),
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
