//! Small dense products for the blocked kernels: `D (=|+=) α · A · B` with `A` read through
//! arbitrary strides (so `Φᵀ` costs nothing) and `B` row-major ([`Gemm`], [`gemm`]), and
//! `D = A · Bᵀ` by dot products ([`Nt`]).
//!
//! The shapes here are skinny (one side is `m = L·2^P`, `L·P`, or a block of 32–64 tokens),
//! where general GEMM libraries spend their time packing and in edge kernels. This one does
//! not pack: a register tile of `MR` rows × `NV` vectors of `W` columns of `D` (`W` the CPU's
//! vector width) stays in registers while `k` runs; each step loads `NV` vectors of a `B` row
//! and broadcasts `MR` entries of `A`:
//!
//! ```text
//! D[i, Wj..Wj+W] = α Σ_k A[i·rs + k·cs] · B[k·ldb + Wj .. Wj + W]
//! ```
//!
//! Written once over [`Native`] tokens ([`super::native`]): `zmm` tiles on AVX-512, `ymm` on
//! AVX2 (fewer vectors per tile: it has sixteen registers, not 32), NEON's `q` registers on
//! aarch64, and plain unfused `a·b + c` on the scalar token. The last `cols mod W` columns are
//! one partial vector (masked loads and stores), so any `cols` is exact and no access leaves
//! its slice.

use super::native::Native;
use super::simd::{dispatch, Isa, Kernel, Token};

/// A row-major or transposed operand: element `(i, k)` is `data[i·rs + k·cs]`.
#[derive(Clone, Copy)]
pub struct Strided<'a> {
    pub data: &'a [f32],
    pub rs: usize,
    pub cs: usize,
}

impl<'a> Strided<'a> {
    /// Row-major `rows × cols` with row stride `ld`.
    pub fn rows(data: &'a [f32], ld: usize) -> Self {
        Strided {
            data,
            rs: ld,
            cs: 1,
        }
    }
    /// The transpose of a row-major matrix with row stride `ld`: `(i, k) = data[k·ld + i]`.
    pub fn transposed(data: &'a [f32], ld: usize) -> Self {
        Strided {
            data,
            rs: 1,
            cs: ld,
        }
    }
}

/// Which entries of `A` can be non-zero: all, or (for the causal sub-block products, where
/// `k = rows`) a triangle; a tile then runs only over the `k` its rows need.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Tri {
    Full,
    /// `A_ik = 0` for `k > i`.
    Lower,
    /// `A_ik = 0` for `k < i`.
    Upper,
}

/// One product `D (=|+=) α A B`: `D` is `rows × cols` with row stride `ldd`, `A` is
/// `rows × k`, `B` is `k × cols` with row stride `ldb`. With `b2`, `B` is read as the sum
/// `b + b2` of two matrices of that shape (a two-level state, without materialising the sum:
/// the adds ride along with the loads, which a separate pass would have to store and reload).
pub struct Gemm<'a> {
    pub d: &'a mut [f32],
    pub ldd: usize,
    pub rows: usize,
    pub cols: usize,
    pub k: usize,
    pub a: Strided<'a>,
    pub b: &'a [f32],
    pub b2: Option<&'a [f32]>,
    pub ldb: usize,
    pub alpha: f32,
    pub accumulate: bool,
    pub tri: Tri,
}

impl Gemm<'_> {
    /// Run with the primitives of `isa`. Panics (a programming error, not bad user input) if an
    /// operand is too short for the shape.
    pub fn run(self, isa: Isa) {
        if self.rows == 0 || self.cols == 0 {
            return;
        }
        use crate::cpu::extent::assert_holds;
        let (rows, cols, k) = (self.rows, self.cols, self.k);
        assert_holds(self.d.len(), rows, cols, self.ldd, 1, "gemm: D too short");
        if k > 0 {
            let a = self.a;
            assert_holds(a.data.len(), rows, k, a.rs, a.cs, "gemm: A too short");
            assert_holds(self.b.len(), k, cols, self.ldb, 1, "gemm: B too short");
            if let Some(b2) = self.b2 {
                assert_holds(b2.len(), k, cols, self.ldb, 1, "gemm: B2 too short");
            }
        }
        dispatch(isa, self)
    }
}

/// Everything of a [`Gemm`] but `D`.
#[derive(Clone, Copy)]
struct Shape<'a> {
    ldd: usize,
    rows: usize,
    cols: usize,
    k: usize,
    a: Strided<'a>,
    b: &'a [f32],
    b2: &'a [f32],
    ldb: usize,
    alpha: f32,
    accumulate: bool,
    tri: Tri,
}

impl Shape<'_> {
    /// The `k` range rows `i0..i1` need.
    #[inline(always)]
    fn k_range(&self, i0: usize, i1: usize) -> (usize, usize) {
        match self.tri {
            Tri::Full => (0, self.k),
            Tri::Lower => (0, i1.min(self.k)),
            Tri::Upper => (i0.min(self.k), self.k),
        }
    }
}

impl Kernel for Gemm<'_> {
    type Output = ();
    #[inline(always)]
    fn run<T: Token>(self, t: T) {
        let s = t.native();
        let d = self.d;
        let g = Shape {
            ldd: self.ldd,
            rows: self.rows,
            cols: self.cols,
            k: self.k,
            a: self.a,
            b: self.b,
            b2: self.b2.unwrap_or(&[]),
            ldb: self.ldb,
            alpha: self.alpha,
            accumulate: self.accumulate,
            tri: self.tri,
        };
        if g.b2.is_empty() {
            columns::<T::N, false>(s, &g, d)
        } else {
            columns::<T::N, true>(s, &g, d)
        }
    }
}

/// All column groups (`TWO`: `B` is `b + b2`), in vectors of the native width `VW`: groups
/// of 4 vectors (2 with AVX2's sixteen registers, and for a two-part `B`), then 2, then 1,
/// then the last `cols mod VW` columns as one partial vector.
#[inline(always)]
fn columns<S: Native, const TWO: bool>(s: S, g: &Shape, d: &mut [f32]) {
    let vw = S::LANES;
    let full = g.cols / vw;
    let mut j = 0;
    // Scalar lanes: 2 × 8 tiles, so that the only four-wide packing of the 16 accumulators
    // is along the columns (a row of `B` loaded whole, `A` broadcast), which is how LLVM's
    // SLP vectoriser then compiles them. At 4 × 4 it packed them by rows or by columns
    // depending on what else was compiled beside it, and by columns (`A` gathered, `B`
    // shuffled) the scalar (4,4) benchmark ran 15% slower.
    while vw == 1 && j + 8 <= full {
        rows_for::<S, 8, TWO>(s, g, d, j * vw, vw);
        j += 8;
    }
    // Two-part `B`: 8 × 2-vector tiles, so each `B` row (two loads and an add per vector) is
    // read for 8 rows of `A` (measured: 25% faster than 4 × 4 tiles on a causal state).
    while !TWO && vw != 8 && j + 4 <= full {
        rows_for::<S, 4, TWO>(s, g, d, j * vw, vw);
        j += 4;
    }
    while j + 2 <= full {
        rows_for::<S, 2, TWO>(s, g, d, j * vw, vw);
        j += 2;
    }
    if j < full {
        rows_for::<S, 1, TWO>(s, g, d, j * vw, vw);
    }
    if !g.cols.is_multiple_of(vw) {
        rows_for::<S, 1, TWO>(s, g, d, full * vw, g.cols % vw);
    }
}

/// All rows for the `NV` vectors of columns starting at `c0` (the last one `last` columns
/// wide), in tiles of up to 4 rows, or 8 where one `B` load would otherwise serve too few
/// FMAs (`NV = 1`, and a two-part `B` at `NV = 2` on 32-register ISAs).
#[inline(always)]
fn rows_for<S: Native, const NV: usize, const TWO: bool>(
    s: S,
    g: &Shape,
    d: &mut [f32],
    c0: usize,
    last: usize,
) {
    let mut i = 0;
    if NV == 8 {
        while i + 2 <= g.rows {
            tile::<S, 2, NV, TWO>(s, g, d, i, c0, last);
            i += 2;
        }
    }
    if NV == 1 || (TWO && NV == 2 && S::LANES != 8) {
        while i + 8 <= g.rows {
            tile::<S, 8, NV, TWO>(s, g, d, i, c0, last);
            i += 8;
        }
    }
    while i + 4 <= g.rows {
        tile::<S, 4, NV, TWO>(s, g, d, i, c0, last);
        i += 4;
    }
    match g.rows - i {
        3 => tile::<S, 3, NV, TWO>(s, g, d, i, c0, last),
        2 => tile::<S, 2, NV, TWO>(s, g, d, i, c0, last),
        1 => tile::<S, 1, NV, TWO>(s, g, d, i, c0, last),
        _ => {}
    }
}

/// The register tile: rows `i0..i0+MR`, `NV` vectors of columns from `c0`, the last one
/// `last` columns wide (partial loads and stores when `last < VW`).
#[inline(always)]
fn tile<S: Native, const MR: usize, const NV: usize, const TWO: bool>(
    s: S,
    g: &Shape,
    d: &mut [f32],
    i0: usize,
    c0: usize,
    last: usize,
) {
    let vw = S::LANES;
    let len = |j: usize| if j + 1 == NV { last } else { vw };
    let zero = s.splat_f32s(0.0);
    let mut acc = [[zero; NV]; MR];
    let (a, b) = (g.a, g.b);
    let (k0, k1) = g.k_range(i0, i0 + MR);
    let span = (NV - 1) * vw + last;
    // Offsets stepped rather than multiplied (`o`: row `k` of `B` from column `c0`; `ak`:
    // column `k` of A), so that the loop's integer work stays below its FMAs.
    let (mut o, mut ak, mut tick) = (k0 * g.ldb + c0, k0 * a.cs, 0);
    let rows: [usize; MR] = {
        let mut r0 = [0; MR];
        for (r, x) in r0.iter_mut().enumerate() {
            *x = (i0 + r) * a.rs;
        }
        r0
    };
    for _ in k0..k1 {
        // SAFETY: `Gemm::run` asserted that the last element `(k−1)·ldb + cols − 1` of `B`
        // (and of `b2`, when there is one) is in bounds; here `o = k·ldb + c0` with `k < g.k`
        // and `c0 + span ≤ cols`. The loads below are then within `row` (no check per `k`).
        let (row, row2) = unsafe {
            (
                b.get_unchecked(o..o + span),
                if TWO {
                    g.b2.get_unchecked(o..o + span)
                } else {
                    &[][..]
                },
            )
        };
        let mut bv = [zero; NV];
        for (j, x) in bv.iter_mut().enumerate() {
            *x = load(s, row, j * vw, len(j));
            if TWO {
                *x = s.add_f32s(*x, load(s, row2, j * vw, len(j)));
            }
        }
        for (row, &ar) in acc.iter_mut().zip(&rows) {
            // SAFETY: `Gemm::run` asserted that the last element `(rows−1)·rs + (k−1)·cs` of A
            // is in bounds; here `ar + ak = (i0 + r)·rs + k·cs` with `i0 + r < rows`, `k < g.k`.
            let x = s.splat_f32s(unsafe { *a.data.get_unchecked(ar + ak) });
            for (c, &bb) in row.iter_mut().zip(&bv) {
                *c = s.mul_add_e_f32s(x, bb, *c);
            }
        }
        (o, ak, tick) = (o + g.ldb, ak + a.cs, tick + 1);
        if tick == 16 {
            tick = 0;
            super::mem::drip();
        }
    }
    let alpha = s.splat_f32s(g.alpha);
    for (r, row) in acc.iter().enumerate() {
        let o = (i0 + r) * g.ldd + c0;
        for (j, &c) in row.iter().enumerate() {
            let at = o + j * vw;
            let v = if g.accumulate {
                s.mul_add_e_f32s(alpha, c, load(s, d, at, len(j)))
            } else {
                s.mul_f32s(alpha, c)
            };
            store(s, d, at, len(j), v);
        }
    }
    super::mem::drip();
}

/// `len ≤ LANES` floats of `x` from `at`, the rest zero (one plain load when whole).
#[inline(always)]
pub(crate) fn load<S: Native>(s: S, x: &[f32], at: usize, len: usize) -> S::f32s {
    if len == S::LANES {
        S::as_simd_f32s(&x[at..at + len]).0[0]
    } else if len == 0 {
        s.splat_f32s(0.0)
    } else {
        s.load_tail(&x[at..at + len])
    }
}

/// The first `len ≤ LANES` lanes of `v` into `out` from `at` (one plain store when whole).
#[inline(always)]
pub(crate) fn store<S: Native>(s: S, out: &mut [f32], at: usize, len: usize, v: S::f32s) {
    if len == S::LANES {
        S::as_mut_simd_f32s(&mut out[at..at + len]).0[0] = v;
    } else if len > 0 {
        s.store_tail(&mut out[at..at + len], v)
    }
}

/// A row-major `rows × cols` operand: element `(i, j)` is `data[i·ld + j]`.
#[derive(Clone, Copy)]
pub struct Mat<'a> {
    pub data: &'a [f32],
    pub rows: usize,
    pub cols: usize,
    pub ld: usize,
}

impl<'a> Mat<'a> {
    pub fn new(data: &'a [f32], rows: usize, cols: usize, ld: usize) -> Self {
        Mat {
            data,
            rows,
            cols,
            ld,
        }
    }
}

/// A row-major `rows × cols` output: element `(i, j)` is `data[i·ld + j]`.
pub struct MatMut<'a> {
    pub data: &'a mut [f32],
    pub rows: usize,
    pub cols: usize,
    pub ld: usize,
}

impl<'a> MatMut<'a> {
    pub fn new(data: &'a mut [f32], rows: usize, cols: usize, ld: usize) -> Self {
        MatMut {
            data,
            rows,
            cols,
            ld,
        }
    }
}

/// `D (=|+=) α A B` for `D` (`rows × cols`), `A` (`rows × k`, read through its strides) and
/// `B` (`k × cols`); see [`Gemm`]. Panics (a programming error) when `B`'s columns are not
/// `D`'s.
pub fn gemm(isa: Isa, d: MatMut, a: Strided, b: Mat, alpha: f32, accumulate: bool) {
    assert_eq!(b.cols, d.cols, "gemm: B and D columns");
    Gemm {
        d: d.data,
        ldd: d.ld,
        rows: d.rows,
        cols: d.cols,
        k: b.rows,
        a,
        b: b.data,
        b2: None,
        ldb: b.ld,
        alpha,
        accumulate,
        tri: Tri::Full,
    }
    .run(isa)
}

/// `out[c·ld_out + r] = x[r·ld + c]` for a `rows × cols` matrix; `ld ≥ cols`, `ld_out ≥ rows`
/// (entries of `out` outside the transpose are left as they are). With AVX-512: 16 × 16
/// tiles through registers (masked loads and stores at the edges, four shuffle stages);
/// otherwise 8 × 8 tiles at the native width ([`Native::transpose8`]: shuffles on AVX2).
pub fn transpose_into(
    isa: Isa,
    x: &[f32],
    rows: usize,
    cols: usize,
    ld: usize,
    out: &mut [f32],
    ld_out: usize,
) {
    if rows == 0 || cols == 0 {
        return;
    }
    crate::cpu::extent::assert_holds(x.len(), rows, cols, ld, 1, "transpose: input too short");
    crate::cpu::extent::assert_holds(
        out.len(),
        cols,
        rows,
        ld_out,
        1,
        "transpose: output too short",
    );
    let task = Transpose {
        x: Mat::new(x, rows, cols, ld),
        out,
        ld_out,
    };
    dispatch(isa, task)
}

/// [`transpose_into`] at the native width: 8 × 8 tiles by [`Native::transpose8`], the edges
/// element by element.
struct Transpose<'a> {
    x: Mat<'a>,
    out: &'a mut [f32],
    ld_out: usize,
}

impl Kernel for Transpose<'_> {
    type Output = ();
    #[inline(always)]
    fn run<T: Token>(self, t: T) {
        #[cfg(target_arch = "x86_64")]
        if let Some(v4) = t.v4() {
            return transpose16_tiles(v4, self.x, self.out, self.ld_out);
        }
        let s = t.native();
        let (
            Mat {
                data: x,
                rows,
                cols,
                ld,
            },
            out,
            ldo,
        ) = (self.x, self.out, self.ld_out);
        let (r8, c8) = (rows - rows % 8, cols - cols % 8);
        let mut r0 = 0;
        while r0 < r8 {
            let mut c0 = 0;
            while c0 < c8 {
                let mut t = [[0.0f32; 8]; 8];
                for (i, ti) in t.iter_mut().enumerate() {
                    let o = (r0 + i) * ld + c0;
                    *ti = x[o..o + 8].try_into().unwrap();
                }
                let t = s.transpose8(&t);
                for (j, tj) in t.iter().enumerate() {
                    let o = (c0 + j) * ldo + r0;
                    out[o..o + 8].copy_from_slice(tj);
                }
                super::mem::drip();
                c0 += 8;
            }
            for r in r0..r0 + 8 {
                for c in c8..cols {
                    out[c * ldo + r] = x[r * ld + c];
                }
            }
            r0 += 8;
        }
        for r in r8..rows {
            for c in 0..cols {
                out[c * ldo + r] = x[r * ld + c];
            }
        }
    }
}

/// [`transpose_into`] by 16 × 16 register tiles, intrinsics of the `V4` token.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn transpose16_tiles(v4: pulp::x86::V4, x: Mat, out: &mut [f32], ld_out: usize) {
    use std::arch::x86_64::__mmask16;
    let f = v4.avx512f;
    let Mat {
        data: x,
        rows,
        cols,
        ld,
    } = x;
    crate::cpu::extent::assert_holds(x.len(), rows, cols, ld, 1, "transpose: input too short");
    crate::cpu::extent::assert_holds(out.len(), cols, rows, ld_out, 1, "transpose: output");
    let (xp, op) = (x.as_ptr(), out.as_mut_ptr());
    let mut r0 = 0;
    while r0 < rows {
        let nr = (rows - r0).min(16);
        let mut c0 = 0;
        while c0 < cols {
            let nc = (cols - c0).min(16);
            let cmask: __mmask16 = if nc == 16 { 0xFFFF } else { (1u16 << nc) - 1 };
            let mut v = [f._mm512_setzero_ps(); 16];
            for (i, vi) in v.iter_mut().enumerate().take(nr) {
                // SAFETY: lanes `c0..c0 + nc` of row `r0 + i < rows` lie within `x` (asserted:
                // (rows − 1)·ld + cols ≤ len); the masked lanes are not accessed.
                *vi = unsafe { f._mm512_maskz_loadu_ps(cmask, xp.add((r0 + i) * ld + c0)) };
            }
            let t = transpose16(v4, &v);
            let rmask: __mmask16 = if nr == 16 { 0xFFFF } else { (1u16 << nr) - 1 };
            for (j, tj) in t.iter().enumerate().take(nc) {
                // SAFETY: lanes `r0..r0 + nr` of output row `c0 + j < cols` lie within `out`
                // (asserted: (cols − 1)·ld_out + rows ≤ len).
                unsafe { f._mm512_mask_storeu_ps(op.add((c0 + j) * ld_out + r0), rmask, *tj) };
            }
            super::mem::drip();
            c0 += 16;
        }
        r0 += 16;
    }
}

/// The transpose of a 16 × 16 tile held as 16 row vectors (element pairs, then pairs of
/// pairs, then 128-bit blocks twice).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn transpose16(
    v4: pulp::x86::V4,
    r: &[std::arch::x86_64::__m512; 16],
) -> [std::arch::x86_64::__m512; 16] {
    let f = v4.avx512f;
    // t[2i] / t[2i+1]: rows 2i, 2i+1 interleaved (elements 0,1 | 2,3 of each 128-bit block).
    let mut t = [f._mm512_setzero_ps(); 16];
    for i in 0..8 {
        t[2 * i] = f._mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = f._mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    // u[4g + e]: rows 4g..4g+4 at element e of each 128-bit block.
    let mut u = [f._mm512_setzero_ps(); 16];
    for g in 0..4 {
        let (a, b, c, d) = (
            f._mm512_castps_pd(t[4 * g]),
            f._mm512_castps_pd(t[4 * g + 1]),
            f._mm512_castps_pd(t[4 * g + 2]),
            f._mm512_castps_pd(t[4 * g + 3]),
        );
        u[4 * g] = f._mm512_castpd_ps(f._mm512_unpacklo_pd(a, c));
        u[4 * g + 1] = f._mm512_castpd_ps(f._mm512_unpackhi_pd(a, c));
        u[4 * g + 2] = f._mm512_castpd_ps(f._mm512_unpacklo_pd(b, d));
        u[4 * g + 3] = f._mm512_castpd_ps(f._mm512_unpackhi_pd(b, d));
    }
    // Blocks 0, 2 / 1, 3 of row groups (0, 1) and (2, 3).
    let mut w = [f._mm512_setzero_ps(); 16];
    for e in 0..4 {
        w[e] = f._mm512_shuffle_f32x4::<0x88>(u[e], u[4 + e]);
        w[4 + e] = f._mm512_shuffle_f32x4::<0xdd>(u[e], u[4 + e]);
        w[8 + e] = f._mm512_shuffle_f32x4::<0x88>(u[8 + e], u[12 + e]);
        w[12 + e] = f._mm512_shuffle_f32x4::<0xdd>(u[8 + e], u[12 + e]);
    }
    let mut o = [f._mm512_setzero_ps(); 16];
    for e in 0..8 {
        o[e] = f._mm512_shuffle_f32x4::<0x88>(w[e], w[8 + e]);
        o[8 + e] = f._mm512_shuffle_f32x4::<0xdd>(w[e], w[8 + e]);
    }
    o
}

/// `D = A Bᵀ` by dot products: `D[i·ldd + j] = A_i · B_j` for `rows` rows of `A` and `cols`
/// rows of `B`, each of length `k` (row strides `lda`, `ldb`). The projections `Z = X Wᵀ`
/// and `∂ℓ/∂φ = G Bᵀ` have few, long output columns, where [`gemm`] would need a transposed
/// copy and waste vector lanes. With `b2`, `B` is read as the sum `b + b2` of two matrices of
/// the same shape: `D[i·ldd + j] = A_i · (B_j + B2_j)`, a two-level state without
/// materialising the sum. With `tri` other than [`Tri::Full`] only the outputs on that
/// triangle (`j ≤ i` or `j ≥ i`) are guaranteed; tiles wholly off it are skipped.
///
/// Written once over [`Native`] tokens: a register tile of `RT` rows × `QT` columns of
/// accumulators at the CPU's width, one load of each row chunk and column chunk per step, and
/// one [`Native::reduce_tile`] for the tile's dot products (see [`Nt::tiles`] for the tile
/// shapes).
pub struct Nt<'a> {
    pub tri: Tri,
    pub d: &'a mut [f32],
    pub ldd: usize,
    pub rows: usize,
    pub cols: usize,
    pub k: usize,
    pub a: &'a [f32],
    pub lda: usize,
    pub b: &'a [f32],
    pub b2: Option<&'a [f32]>,
    pub ldb: usize,
}

impl Nt<'_> {
    /// Run at `isa`. Panics (a programming error, not bad user input) if an operand is too
    /// short for the shape.
    pub fn run(self, isa: Isa) {
        let (rows, cols, k) = (self.rows, self.cols, self.k);
        if rows == 0 || cols == 0 {
            return;
        }
        assert!(
            self.d.len() >= (rows - 1) * self.ldd + cols,
            "Nt: D too short"
        );
        assert!(self.a.len() >= (rows - 1) * self.lda + k, "Nt: A too short");
        assert!(self.b.len() >= (cols - 1) * self.ldb + k, "Nt: B too short");
        assert!(
            self.b2
                .is_none_or(|b2| b2.len() >= (cols - 1) * self.ldb + k),
            "Nt: B2 too short"
        );
        dispatch(isa, self)
    }

    /// All tiles of `RT` rows × `QT` columns (`TWO`: `B` is `b + b2`). Rows and columns past
    /// the end of a partial tile repeat the last one (their sums are not stored).
    #[inline(always)]
    fn tiles<S: Native, const TWO: bool, const RT: usize, const QT: usize>(self, s: S) {
        let Nt {
            tri,
            d,
            ldd,
            rows,
            cols,
            k,
            a,
            lda,
            b,
            b2,
            ldb,
        } = self;
        let b2 = b2.unwrap_or(b);
        let mut i = 0;
        while i < rows {
            let nr = (rows - i).min(RT);
            // Each operand row as whole vectors, all cut to one length `nv`, and its tail: by
            // plain loops (the closures of `array::map` and `from_fn` are compiled outside the
            // frame, which hid the common length and left a bounds check per row and step).
            let nv = k / S::LANES;
            let mut xv: [(&[S::f32s], &[f32]); RT] = [(&[], &[]); RT];
            for (r, x) in xv.iter_mut().enumerate() {
                let o = (i + r.min(nr - 1)) * lda;
                let (h, t) = S::as_simd_f32s(&a[o..o + k]);
                *x = (&h[..nv], t);
            }
            let mut p = 0;
            while p < cols {
                let np = (cols - p).min(QT);
                let off = match tri {
                    Tri::Full => false,
                    Tri::Lower => p > i + nr - 1,
                    Tri::Upper => p + np - 1 < i,
                };
                if off {
                    p += QT;
                    continue;
                }
                let mut wv: [(&[S::f32s], &[f32]); QT] = [(&[], &[]); QT];
                let mut wv2: [(&[S::f32s], &[f32]); QT] = [(&[], &[]); QT];
                for (q, (w, w2)) in wv.iter_mut().zip(wv2.iter_mut()).enumerate() {
                    let o = (p + q.min(np - 1)) * ldb;
                    let (h, t) = S::as_simd_f32s(&b[o..o + k]);
                    *w = (&h[..nv], t);
                    if TWO {
                        let (h, t) = S::as_simd_f32s(&b2[o..o + k]);
                        *w2 = (&h[..nv], t);
                    }
                }
                let zero = s.splat_f32s(0.0);
                let mut acc = [[zero; QT]; RT];
                let (mut xs, mut w) = ([zero; RT], [zero; QT]);
                for c in 0..nv {
                    for (x, v) in xs.iter_mut().zip(&xv) {
                        *x = v.0[c];
                    }
                    for (q, wq) in w.iter_mut().enumerate() {
                        *wq = if TWO {
                            s.add_f32s(wv[q].0[c], wv2[q].0[c])
                        } else {
                            wv[q].0[c]
                        };
                    }
                    outer(s, &mut acc, xs, w);
                }
                if !xv[0].1.is_empty() {
                    for (x, v) in xs.iter_mut().zip(&xv) {
                        *x = s.load_tail(v.1);
                    }
                    for (q, wq) in w.iter_mut().enumerate() {
                        *wq = s.load_tail(wv[q].1);
                        if TWO {
                            *wq = s.add_f32s(*wq, s.load_tail(wv2[q].1));
                        }
                    }
                    outer(s, &mut acc, xs, w);
                }
                let out = s.reduce_tile(&acc);
                // Whole `QT`-wide pieces by fixed-size copies (a variable-length copy is a
                // `memcpy` call, as long as the tile's arithmetic at these sizes).
                for (r, row) in out.iter().enumerate().take(nr) {
                    let o = (i + r) * ldd + p;
                    if np == QT {
                        d[o..o + QT].copy_from_slice(row);
                    } else {
                        d[o..o + np].copy_from_slice(&row[..np]);
                    }
                }
                super::mem::drip();
                p += QT;
            }
            i += RT;
        }
    }
}

/// `acc[r][q] += xs[r] · w[q]`, lane by lane.
#[inline(always)]
fn outer<S: Native, const RT: usize, const QT: usize>(
    s: S,
    acc: &mut [[S::f32s; QT]; RT],
    xs: [S::f32s; RT],
    w: [S::f32s; QT],
) {
    for (q, &wq) in w.iter().enumerate() {
        for (r, &x) in xs.iter().enumerate() {
            acc[r][q] = s.mul_add_e_f32s(x, wq, acc[r][q]);
        }
    }
}

impl Kernel for Nt<'_> {
    type Output = ();
    /// Tile shapes: 4 × 4 (16 accumulators), or 8 rows × 2 columns for a two-part `B` (each
    /// `B` chunk, two loads and an add, then serves 8 rows: measured 40% faster than 4 × 4 on
    /// a 2 × 36 KiB causal state with AVX-512); with AVX2's sixteen `ymm` registers 3 × 4 and
    /// 4 × 2, so that accumulators and operands fit.
    #[inline(always)]
    fn run<T: Token>(self, t: T) {
        let s = t.native();
        match (T::N::LANES, self.b2.is_some()) {
            (8, false) => self.tiles::<T::N, false, 3, 4>(s),
            (8, true) => self.tiles::<T::N, true, 4, 2>(s),
            (_, false) => self.tiles::<T::N, false, 4, 4>(s),
            (_, true) => self.tiles::<T::N, true, 8, 2>(s),
        }
    }
}

#[cfg(test)]
mod tests;
