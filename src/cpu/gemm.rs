//! Small dense products for the blocked kernels: `D (=|+=) α · A · B` with `A` read through
//! arbitrary strides (so `Φᵀ` costs nothing) and `B` row-major.
//!
//! The shapes here are skinny (one side is `m = L·2^P`, `L·P`, or a block of 32–64 tokens),
//! where general GEMM libraries spend their time packing and in edge kernels. This one does
//! not pack: a register tile of `MR` rows × `NV` vectors of 16 columns of `D` stays in registers
//! while `k` runs; each step loads `NV` vectors of a `B` row and broadcasts `MR` entries of `A`:
//!
//! ```text
//! D[i, 16j..16j+16] = α Σ_k A[i·rs + k·cs] · B[k·ldb + 16j .. 16j + 16]
//! ```
//!
//! Written once over [`Simd::fma`] with fixed-size lane arrays: inside [`dispatch`]'s AVX-512
//! frame every tile is a block of `zmm` FMAs (AVX2: pairs of `ymm`); the [`Scalar`] twin runs
//! the same loops with unfused `a·b + c`. Columns past the last whole vector go through a
//! copied, zero-padded vector, so any `cols` is exact and no read leaves its slice.
//!
//! [`Scalar`]: super::simd::Scalar

use super::simd::{dispatch, Isa, Simd, WithSimd};

const V: usize = 16;

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
        Strided { data, rs: ld, cs: 1 }
    }
    /// The transpose of a row-major matrix with row stride `ld`: `(i, k) = data[k·ld + i]`.
    pub fn transposed(data: &'a [f32], ld: usize) -> Self {
        Strided { data, rs: 1, cs: ld }
    }
}

/// One product `D (=|+=) α A B`: `D` is `rows × cols` with row stride `ldd`, `A` is
/// `rows × k`, `B` is `k × cols` with row stride `ldb`.
pub struct Gemm<'a> {
    pub d: &'a mut [f32],
    pub ldd: usize,
    pub rows: usize,
    pub cols: usize,
    pub k: usize,
    pub a: Strided<'a>,
    pub b: &'a [f32],
    pub ldb: usize,
    pub alpha: f32,
    pub accumulate: bool,
}

impl Gemm<'_> {
    /// Run with the primitives of `isa`. Panics (a programming error, not bad user input) if an
    /// operand is too short for the shape.
    pub fn run(self, isa: Isa) {
        if self.rows == 0 || self.cols == 0 {
            return;
        }
        let last = |rs: usize, cs: usize, r: usize, c: usize| (r - 1) * rs + (c - 1) * cs;
        assert!(self.d.len() > last(self.ldd, 1, self.rows, self.cols), "gemm: D too short");
        if self.k > 0 {
            assert!(
                self.a.data.len() > last(self.a.rs, self.a.cs, self.rows, self.k),
                "gemm: A too short"
            );
            assert!(self.b.len() > last(self.ldb, 1, self.k, self.cols), "gemm: B too short");
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
    ldb: usize,
    alpha: f32,
    accumulate: bool,
}

impl WithSimd for Gemm<'_> {
    type Output = ();
    #[inline(always)]
    fn run<S: Simd>(self) {
        let d = self.d;
        let g = Shape {
            ldd: self.ldd,
            rows: self.rows,
            cols: self.cols,
            k: self.k,
            a: self.a,
            b: self.b,
            ldb: self.ldb,
            alpha: self.alpha,
            accumulate: self.accumulate,
        };
        let full = g.cols / V;
        let mut j = 0;
        while j + 4 <= full {
            rows_for::<S, 4>(&g, d, j * V);
            j += 4;
        }
        if j + 2 <= full {
            rows_for::<S, 2>(&g, d, j * V);
            j += 2;
        }
        if j < full {
            rows_for::<S, 1>(&g, d, j * V);
        }
        if g.cols % V != 0 {
            for i in 0..g.rows {
                tail::<S>(&g, d, i, full * V);
            }
        }
    }
}

/// All rows for the `NV` vectors of columns starting at `c0`, in tiles of up to 4 (or 8 when
/// `NV = 1`, where one `B` load would otherwise serve too few FMAs).
#[inline(always)]
fn rows_for<S: Simd, const NV: usize>(g: &Shape, d: &mut [f32], c0: usize) {
    let mut i = 0;
    if NV == 1 {
        while i + 8 <= g.rows {
            tile::<S, 8, NV>(g, d, i, c0);
            i += 8;
        }
    }
    while i + 4 <= g.rows {
        tile::<S, 4, NV>(g, d, i, c0);
        i += 4;
    }
    match g.rows - i {
        3 => tile::<S, 3, NV>(g, d, i, c0),
        2 => tile::<S, 2, NV>(g, d, i, c0),
        1 => tile::<S, 1, NV>(g, d, i, c0),
        _ => {}
    }
}

/// The register tile: rows `i0..i0+MR`, columns `c0..c0+16·NV`.
#[inline(always)]
fn tile<S: Simd, const MR: usize, const NV: usize>(g: &Shape, d: &mut [f32], i0: usize, c0: usize) {
    let mut acc = [[[0.0f32; V]; NV]; MR];
    let (a, b) = (g.a, g.b);
    for k in 0..g.k {
        let brow = &b[k * g.ldb + c0..k * g.ldb + c0 + NV * V];
        let mut bv = [[0.0f32; V]; NV];
        for (j, x) in bv.iter_mut().enumerate() {
            x.copy_from_slice(&brow[j * V..(j + 1) * V]);
        }
        for (r, row) in acc.iter_mut().enumerate() {
            // SAFETY: `Gemm::run` asserted that the last element `(rows−1)·rs + (k−1)·cs` of A
            // is in bounds; here `i0 + r < rows` and `k < g.k`.
            let x = unsafe { *a.data.get_unchecked((i0 + r) * a.rs + k * a.cs) };
            for (c, bb) in row.iter_mut().zip(&bv) {
                for l in 0..V {
                    c[l] = S::fma(x, bb[l], c[l]);
                }
            }
        }
    }
    store(g, d, &acc, i0, c0);
}

#[inline(always)]
fn store<const MR: usize, const NV: usize>(
    g: &Shape,
    d: &mut [f32],
    acc: &[[[f32; V]; NV]; MR],
    i0: usize,
    c0: usize,
) {
    for (r, row) in acc.iter().enumerate() {
        let o = (i0 + r) * g.ldd + c0;
        let out = &mut d[o..o + NV * V];
        for (j, c) in row.iter().enumerate() {
            let out = &mut out[j * V..(j + 1) * V];
            if g.accumulate {
                for l in 0..V {
                    out[l] += g.alpha * c[l];
                }
            } else {
                for l in 0..V {
                    out[l] = g.alpha * c[l];
                }
            }
        }
    }
}

/// Row `i`, columns `c0..cols` (fewer than 16), through a zero-padded copy of each `B` row.
#[inline(always)]
fn tail<S: Simd>(g: &Shape, d: &mut [f32], i: usize, c0: usize) {
    let n = g.cols - c0;
    let mut acc = [0.0f32; V];
    for k in 0..g.k {
        let mut bv = [0.0f32; V];
        bv[..n].copy_from_slice(&g.b[k * g.ldb + c0..k * g.ldb + c0 + n]);
        let x = g.a.data[i * g.a.rs + k * g.a.cs];
        for l in 0..V {
            acc[l] = S::fma(x, bv[l], acc[l]);
        }
    }
    let o = i * g.ldd + c0;
    let out = &mut d[o..o + n];
    for l in 0..n {
        out[l] = if g.accumulate { out[l] } else { 0.0 } + g.alpha * acc[l];
    }
}

/// `D (=|+=) α A B`; see [`Gemm`].
#[allow(clippy::too_many_arguments)]
pub fn gemm(
    isa: Isa,
    d: &mut [f32],
    ldd: usize,
    rows: usize,
    cols: usize,
    k: usize,
    a: Strided,
    b: &[f32],
    ldb: usize,
    alpha: f32,
    accumulate: bool,
) {
    Gemm {
        d,
        ldd,
        rows,
        cols,
        k,
        a,
        b,
        ldb,
        alpha,
        accumulate,
    }
    .run(isa)
}

/// `out[c·ld_out + r] = x[r·ld + c]` for a `rows × cols` matrix; `ld_out ≥ rows` (padding
/// columns of `out` are left as they are).
pub fn transpose_into(x: &[f32], rows: usize, cols: usize, ld: usize, out: &mut [f32], ld_out: usize) {
    for r in 0..rows {
        for c in 0..cols {
            out[c * ld_out + r] = x[r * ld + c];
        }
    }
}

/// Ask for `x` to be brought into the L2 cache ahead of use (one hint per 64-byte line; a
/// no-op off x86-64). The blocked kernels call it on the next block's input rows, which are
/// read in an order (several rows at once) that the hardware prefetchers follow poorly.
#[inline]
pub fn prefetch(x: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
        for line in x.chunks(16) {
            // SAFETY: a prefetch hint never faults and has no architectural effect; `line` is a
            // valid, in-bounds pointer anyway. (SSE is part of the x86-64 baseline.)
            #[allow(unused_unsafe)]
            unsafe {
                _mm_prefetch::<_MM_HINT_T1>(line.as_ptr() as *const i8)
            };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = x;
}
