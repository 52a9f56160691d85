//! Machinery shared by the causal passes: block ([`TB`]) and sub-block ([`TC`]) sizes, the
//! two-level state (f64 base plus f32 block-local sum), masks, Gram products and the
//! per-thread scratch.

use crate::cpu::bank16::{self, Mass, Read, Update};
use crate::cpu::features::{FeatureMap, SoftMap};
use crate::cpu::gemm::{gemm, Gemm, Mat, MatMut, Nt, Strided, Tri};
use crate::cpu::mem::ABuf;
use crate::cpu::simd::{in_frame, Isa};
use crate::cpu::soft::banks::gemm_ext;
use crate::cpu::soft::block::Block;
use crate::cpu::soft::probs::pad16;
use crate::cpu::state::Bank;

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
pub(crate) enum Scale<'a> {
    None,
    /// Column `j` by `x[j]`.
    Cols(&'a [f32]),
    /// Row `i` by `x[i]`.
    Rows(&'a [f32]),
}

/// Zero the entries above (`lower = true`: keep `j ≤ i`) or below (keep `j ≥ i`) the diagonal
/// of a `rows × rows` matrix with row stride [`TC`], and scale the kept entries.
#[inline]
pub(crate) fn mask(isa: Isa, a: &mut [f32], rows: usize, lower: bool, scale: Scale) {
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
/// `base32 + local` inside their tiles ([`Gemm::b2`], [`Nt::b2`]): a refreshed copy of the sum
/// per sub-block cost about 170 cycles per token and head at `(4, 4)` in each pass, measured.
///
/// After [`TwoLevel::restart`] at a saved block-start state it is one f32 matrix (`local`,
/// the saved state plus the block's tokens so far): it is only needed within the block, so at
/// most `TB/TC − 1` f32 additions at the state's scale round it before the next restart, and
/// the products read half the bytes.
pub(crate) struct TwoLevel {
    pub(crate) isa: Isa,
    pub(crate) bank: Bank,
    /// Restarted: `local` is the whole state, and there is no f64 part.
    pub(crate) single: bool,
}

impl TwoLevel {
    pub(crate) fn new(isa: Isa, m: usize, w: usize, base: &[f64]) -> Self {
        TwoLevel {
            isa,
            bank: Bank::new(m, w, Some(base)),
            single: false,
        }
    }
    /// Restart at a block-start state saved by the forward ([`Ctx::states`]), copied into
    /// `local` as the whole state. Tokens are then added but never folded (no
    /// [`TwoLevel::tick`]).
    #[inline]
    pub(crate) fn restart(&mut self, saved: &[f32]) {
        self.bank.local.copy_from_slice(saved);
        self.single = true;
    }
    /// The two parts `(f32(base), local)` whose sum is the state (after a restart: `local`
    /// alone, as the first part, and an empty second part).
    #[inline]
    pub(crate) fn parts(&self) -> (&[f32], &[f32]) {
        if self.single {
            (&self.bank.local, &[])
        } else {
            (&self.bank.base32, &self.bank.local)
        }
    }
    /// Whether [`TwoLevel::read_update`] runs ([`bank16::applies`]: at most 16 features, so a
    /// feature row is one 16-lane vector, at every ISA).
    #[inline]
    pub(crate) fn fused(&self) -> bool {
        bank16::applies(self.isa, self.bank.m)
    }
    /// [`bank16::read_update`] on this state (`f32(base) + local`, or `local` alone after a
    /// restart); only when [`TwoLevel::fused`].
    #[inline]
    pub(crate) fn read_update(&mut self, dv: usize, read: Option<Read>, update: Option<Update>) {
        let (isa, m, w) = (self.isa, self.bank.m, self.bank.w);
        let bank = &mut self.bank;
        let base: &[f32] = if self.single { &[] } else { &bank.base32 };
        bank16::read_update(isa, m, dv, (base, &mut bank.local, w), read, update);
    }
    /// `local (+)= Φᵀ X̂` for a sub-block's feature rows `phi` (row stride `mp`) and value rows
    /// `x` (stride `dv`), the ones column included ([`gemm_ext`], or [`bank16`]).
    #[inline]
    pub(crate) fn add_tokens(&mut self, phi: &[f32], mp: usize, rows: usize, x: &[f32], dv: usize) {
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
            MatMut::new(&mut self.bank.local, m, dv, w),
            pt,
            Mat::new(x, rows, dv, dv),
            1.0,
            true,
        );
    }
    /// `D = X S` for `rows` rows of `x` (`rows × m`, row stride `ldx`) and the state `S`
    /// (`m × w`), into `d` (row stride `w`, first `cols` columns).
    #[inline]
    pub(crate) fn product(
        &self,
        d: &mut [f32],
        rows: usize,
        cols: usize,
        x: &[f32],
        ldx: usize,
        ldd: usize,
    ) {
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
    #[inline]
    pub(crate) fn dots(&self, out: &mut [f32], ldo: usize, rows: usize, x: &[f32], dv: usize) {
        let (isa, m, w) = (self.isa, self.bank.m, self.bank.w);
        let (b, b2) = self.parts();
        Nt {
            tri: Tri::Full,
            d: out,
            ldd: ldo,
            rows,
            cols: m,
            k: dv,
            a: x,
            lda: dv,
            b,
            b2: (!b2.is_empty()).then_some(b2),
            ldb: w,
        }
        .run(isa);
    }
    /// The state's mass column `A_f = S[f][dv]` (contiguous).
    pub(crate) fn masses(&self, dv: usize, out: &mut Vec<f32>) {
        let (b, b2) = self.parts();
        let w = self.bank.w;
        let local = |f: usize| b2.get(f * w + dv).copied().unwrap_or(0.0);
        out.clear();
        out.extend((0..self.bank.m).map(|f| b[f * w + dv] + local(f)));
    }
    /// Count `rows` tokens; fold the f32 part into f64 every [`TB`] tokens.
    #[inline]
    pub(crate) fn tick(&mut self, rows: usize) {
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
pub(crate) struct Scratch {
    pub(crate) kb: Block,
    pub(crate) qb: Block,
    pub(crate) att: ABuf,      // TC × TC
    pub(crate) qk: ABuf,       // TC × TC: Φ_Q Φ_Kᵀ (backward, for s)
    pub(crate) attb: ABuf, // TB × TC: the block's scaled `tril(Ĝ X̂ᵀ)`, one TC × TC per sub-block
    pub(crate) qkb: ABuf,  // TB × TC: the block's `c ⊙ tril(Φ_Q Φ_Kᵀ)`, likewise
    pub(crate) acc: ABuf,  // TC × w
    pub(crate) gphi: ABuf, // TB × mp
    pub(crate) sphi: Vec<f32>, // TC × m
    pub(crate) c: Vec<f32>, // TB
    pub(crate) s: Vec<f32>, // TB
    pub(crate) mass: Vec<f32>, // m: the state's mass column
}

impl Scratch {
    pub(crate) fn new(map: &SoftMap, isa: Isa, w: usize) -> Self {
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

/// A sub-block's feature rows `x`, `y` (row stride `mp`), `y` transposed with its row
/// stride, and `mp`: `(x, y, (yt, ldt), mp)`.
pub(crate) type FeatureRows<'a> = (&'a [f32], &'a [f32], (&'a [f32], usize), usize);

/// The sub-blocks of `a..b` of at most `tc` tokens, in order or (`rev`) from the end.
#[inline]
pub(crate) fn sub_blocks(a: usize, b: usize, tc: usize, rev: bool) -> Vec<(usize, usize)> {
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
#[inline]
pub(crate) fn blocks(start: usize, end: usize, rev: bool) -> Vec<(usize, usize)> {
    sub_blocks(start, end, TB, rev)
}

/// `att[i][j] = x_i · y_j` (row stride [`TC`]) for the rows of `x` and `y` (the same number
/// of rows and columns), on the triangle that is kept (`lower`: `j ≤ i`, else `j ≥ i`);
/// entries off it may be written too, and [`mask`] clears them.
#[inline]
pub(crate) fn gram(isa: Isa, att: &mut [f32], x: Mat, y: Mat, lower: bool) {
    debug_assert!(x.rows == y.rows && x.cols == y.cols);
    let tri = if lower { Tri::Lower } else { Tri::Upper };
    let (
        Mat {
            data: x,
            rows,
            cols: k,
            ld: ldx,
        },
        Mat {
            data: y, ld: ldy, ..
        },
    ) = (x, y);
    Nt {
        tri,
        d: att,
        ldd: TC,
        rows,
        cols: rows,
        k,
        a: x,
        lda: ldx,
        b: y,
        b2: None,
        ldb: ldy,
    }
    .run(isa);
}

/// Banks of at most this many features take their `Φ Φᵀ` grams from a transposed copy of
/// the block's features ([`feature_gram`]).
pub(crate) const GRAM_T_MAX_M: usize = 16;

/// `att[i][j] = φ_i · ψ_j` for a sub-block's feature rows `x`, `y` (row stride `mp`) on the
/// triangle kept (`lower` as in [`gram`]; entries off it may be written too). For at most
/// [`GRAM_T_MAX_M`] features, a register-tiled product with `yt`, `ψ` transposed (row stride
/// `ldt`, the sub-block's first token in column 0): there the dot products do one 16-lane
/// step per tile and then a 16-way reduction, which costs more than the arithmetic. Measured
/// (one core, medians of alternated runs): causal forward+backward at `(2, 2)` 1613 → 1576
/// cycles per token and head; at `(3, 3)` (`m = 24`) no change, at `(4, 4)` slower, hence
/// the limit. Else [`gram`].
#[inline]
pub(crate) fn feature_gram(
    isa: Isa,
    att: &mut [f32],
    (x, y, (yt, ldt), mp): FeatureRows,
    m: usize,
    rows: usize,
    lower: bool,
) {
    if m > GRAM_T_MAX_M {
        return gram(
            isa,
            att,
            Mat::new(x, rows, mp, mp),
            Mat::new(y, rows, mp, mp),
            lower,
        );
    }
    gemm(
        isa,
        MatMut::new(att, rows, rows, TC),
        Strided::rows(x, mp),
        Mat::new(yt, m, rows, ldt),
        1.0,
        false,
    );
}

/// `D += α A B` for a masked `rows × rows` block `A` (a sub-block matrix with row stride
/// [`TC`], or its transpose), lower- or upper-triangular (the [`Gemm`] tiles skip the zero
/// triangle).
#[inline]
pub(crate) fn tri_gemm(isa: Isa, d: MatMut, att: Strided, b: Mat, alpha: f32, lower: bool) {
    assert_eq!((b.rows, b.cols), (d.rows, d.cols), "tri_gemm: B's shape");
    Gemm {
        d: d.data,
        ldd: d.ld,
        rows: d.rows,
        cols: d.cols,
        k: d.rows,
        a: att,
        b: b.data,
        b2: None,
        ldb: b.ld,
        alpha,
        accumulate: true,
        tri: if lower { Tri::Lower } else { Tri::Upper },
    }
    .run(isa)
}

/// A sub-block matrix (row stride [`TC`]) as a product operand.
#[inline]
pub(crate) fn sub(att: &[f32]) -> Strided<'_> {
    Strided::rows(att, TC)
}

/// The transpose of a sub-block matrix (row stride [`TC`]) as a product operand.
#[inline]
pub(crate) fn sub_t(att: &[f32]) -> Strided<'_> {
    Strided::transposed(att, TC)
}

/// Floats of [`Ctx::states`] per head: one `m × w` state per block of [`TB`] tokens.
#[inline]
pub(crate) fn state_len(n: usize, m: usize, w: usize) -> usize {
    n.div_ceil(TB) * m * w
}
