//! The bucket bank and its two-level accumulation, plus the work split.
//!
//! A bank holds, for each of the `m` features, one row of width `w = bank_width(dv)` (≥ `dv + 1`): the value sums
//! `B_f` and, in the last column, the mass `A_f` (keys enter as `[v_j, 1]`), so mass and
//! values are one `axpy`. Backward banks hold `[dB_f, dA_f]` the same way.
//!
//! Long sums (`proofs-notes/long-sums.md`): a plain f32 running sum over 10^8 tokens drifts by 1e-3..1e-1. The
//! bank adds tokens into an f32 `local` block started from zero, and every [`FLUSH`] tokens
//! moves it into an f64 `base` (and refreshes the f32 copy `base32` used for reads). A read
//! sees `base32 + local`: rounding error `O(eps)` relative to the state from `base32`, plus
//! at most [`FLUSH`] f32 additions of small terms — independent of N.

use super::simd::Simd;

/// The key side of a non-causal read: the per-head totals `[B | A]` (f64, `m × w` with
/// `w = bank_width(dv)`), the value width `dv`, and the floor below which a query row is
/// flagged ([`crate::shared::recompute::den_floor`] for the number of keys summed).
pub struct KeyTotals<'a> {
    pub banks: &'a [Vec<f64>],
    pub dv: usize,
    pub floor: f32,
}

pub use crate::shared::layout::{bank_width, plan_segments, FLUSH};

/// A fresh `[·, 1, 0…]` buffer for values of width `dv`.
pub fn ext_buffer(dv: usize) -> Vec<f32> {
    let mut e = vec![0.0f32; bank_width(dv)];
    e[dv] = 1.0;
    e
}

/// `m` rows of width `w`: f64 base, its f32 image, and the f32 block being accumulated.
pub struct Bank {
    pub m: usize,
    pub w: usize,
    pub base64: Vec<f64>,
    /// f32 image and block, 64-byte aligned (full-vector loads and stores).
    pub base32: super::mem::ABuf,
    pub local: super::mem::ABuf,
    pending: usize,
}

impl Bank {
    /// A bank starting at `base` (or zero).
    pub fn new(m: usize, w: usize, base: Option<&[f64]>) -> Self {
        let base64 = base.map(|b| b.to_vec()).unwrap_or_else(|| vec![0.0; m * w]);
        let mut base32 = super::mem::ABuf::zeroed(m * w);
        base32
            .iter_mut()
            .zip(&base64)
            .for_each(|(y, &x)| *y = x as f32);
        Bank {
            m,
            w,
            base64,
            base32,
            local: super::mem::ABuf::zeroed(m * w),
            pending: 0,
        }
    }

    /// `local_f += φ_f · x` for every non-zero `φ_f`.
    #[inline(always)]
    pub fn add<S: Simd>(&mut self, simd: S, phi: &[f32], scale: f32, x: &[f32]) {
        let w = self.w;
        for (f, &p) in phi.iter().enumerate() {
            if p != 0.0 {
                simd.axpy(&mut self.local[f * w..(f + 1) * w], p * scale, x);
            }
        }
    }

    /// Count one token; flush the f32 block into the f64 base every [`FLUSH`] tokens.
    #[inline(always)]
    pub fn tick(&mut self) {
        self.pending += 1;
        if self.pending == FLUSH {
            self.flush();
        }
    }

    /// Count `rows` tokens at once; flush once at least `every` have accumulated (the
    /// blocked causal path adds a sub-block at a time, inside its SIMD frame).
    #[inline(always)]
    pub fn tick_rows(&mut self, rows: usize, every: usize) {
        self.pending += rows;
        if self.pending >= every {
            self.flush();
        }
    }

    /// Move the f32 block into the f64 base.
    #[inline(always)]
    pub fn flush(&mut self) {
        for ((b, b32), l) in self
            .base64
            .iter_mut()
            .zip(self.base32.iter_mut())
            .zip(self.local.iter_mut())
        {
            *b += *l as f64;
            *b32 = *b as f32;
            *l = 0.0;
        }
        self.pending = 0;
    }

    /// `out = Σ_f φ_f (base_f + local_f)[..out.len()]` (overwritten).
    #[inline(always)]
    pub fn read<S: Simd>(&self, simd: S, phi: &[f32], out: &mut [f32]) {
        simd.rows_combine(phi, &self.base32, &self.local, self.w, out);
    }

    /// `(base_f + local_f) · g`.
    #[cfg(any(test, feature = "bench-internals"))]
    #[inline(always)]
    pub fn dot_row<S: Simd>(&self, simd: S, f: usize, g: &[f32]) -> f32 {
        let w = self.w;
        simd.dot2(
            g,
            &self.base32[f * w..f * w + g.len()],
            &self.local[f * w..f * w + g.len()],
        )
    }

    /// `out += p · (base_f + local_f)[..out.len()]`.
    #[cfg(any(test, feature = "bench-internals"))]
    #[inline(always)]
    pub fn axpy_row<S: Simd>(&self, simd: S, out: &mut [f32], p: f32, f: usize) {
        let (w, n) = (self.w, out.len());
        simd.axpy2(
            out,
            p,
            &self.base32[f * w..f * w + n],
            &self.local[f * w..f * w + n],
        );
    }

    /// The exact (f64) total.
    pub fn total(mut self) -> Vec<f64> {
        self.flush();
        self.base64
    }
}

/// Split a `[heads, n, cols]` output buffer into disjoint `(head, segment)` pieces.
pub fn split_out<'a, T>(
    buf: &'a mut [T],
    n: usize,
    cols: usize,
    segs: &[(usize, usize)],
) -> Vec<(usize, usize, &'a mut [T])> {
    let mut out = Vec::new();
    for (h, head) in buf.chunks_mut((n * cols).max(1)).enumerate() {
        let mut rest = head;
        for (s, &(a, b)) in segs.iter().enumerate() {
            let (piece, tail) = rest.split_at_mut((b - a) * cols);
            out.push((h, s, piece));
            rest = tail;
        }
    }
    out
}
