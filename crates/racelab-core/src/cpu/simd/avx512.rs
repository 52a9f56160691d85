//! The primitives of [`super::Lanes512`]: every intrinsic a method of the `V4` token (pulp's
//! safe wrappers; the loads and stores through pointers are `unsafe`, each with its bounds).

use pulp::x86::V4;
use std::arch::x86_64::{__m512, __mmask16};

/// The mask of the first `min(n, 16)` lanes.
#[inline(always)]
fn first(n: usize) -> __mmask16 {
    ((1u32 << n.min(16)) - 1) as u16
}

/// `out[c] = Σ_f φ_f (x[f·w + c] + y[f·w + c])`: one 16-column chunk of `out` at a time
/// stays in a register while all rows are added (a row-by-row `axpy` would chain every row
/// through memory).
#[inline(always)]
pub(super) fn rows_combine(
    v4: V4,
    phi: &[f32],
    x: &[f32],
    y: &[f32],
    w: usize,
    out: &mut [f32],
) {
    let f = v4.avx512f;
    let (m, n) = (phi.len(), out.len());
    if m == 0 {
        out.iter_mut().for_each(|o| *o = 0.0);
        return;
    }
    assert!(n <= w, "rows_combine: {n} columns past the row stride {w}");
    crate::cpu::extent::assert_holds(x.len(), m, n, w, 1, "rows_combine: x too short");
    crate::cpu::extent::assert_holds(y.len(), m, n, w, 1, "rows_combine: y too short");
    let (px, py, po) = (x.as_ptr(), y.as_ptr(), out.as_mut_ptr());
    let mut c = 0;
    while c < n {
        let mask = if n - c >= 16 { 0xFFFF } else { first(n - c) };
        let mut acc = f._mm512_setzero_ps();
        for (r, &p) in phi.iter().enumerate() {
            // SAFETY: lanes c..c+16 (masked to < n) of row r lie within `x`, `y`
            // (asserted: (m − 1)·w + n ≤ len).
            let xy = unsafe {
                f._mm512_add_ps(
                    f._mm512_maskz_loadu_ps(mask, px.add(r * w + c)),
                    f._mm512_maskz_loadu_ps(mask, py.add(r * w + c)),
                )
            };
            acc = f._mm512_fmadd_ps(f._mm512_set1_ps(p), xy, acc);
        }
        // SAFETY: lanes below n − c of `out` from c.
        unsafe { f._mm512_mask_storeu_ps(po.add(c), mask, acc) };
        c += 16;
    }
}

/// `Σ g_i (x_i + y_i)` over `g.len()` elements, two accumulators, masked tail.
#[inline(always)]
pub(super) fn dot2(v4: V4, g: &[f32], x: &[f32], y: &[f32]) -> f32 {
    let f = v4.avx512f;
    let n = g.len();
    assert!(x.len() >= n && y.len() >= n);
    let (pg, px, py) = (g.as_ptr(), x.as_ptr(), y.as_ptr());
    let mut acc = [f._mm512_setzero_ps(); 2];
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: [i, i + 16) with i + 16 ≤ n; all three slices hold n elements (asserted).
        let (s, gv) = unsafe {
            (
                f._mm512_add_ps(f._mm512_loadu_ps(px.add(i)), f._mm512_loadu_ps(py.add(i))),
                f._mm512_loadu_ps(pg.add(i)),
            )
        };
        let j = (i / 16) & 1;
        acc[j] = f._mm512_fmadd_ps(gv, s, acc[j]);
        i += 16;
    }
    if i < n {
        let m = first(n - i);
        // SAFETY: only the lanes below n − i from i, within n.
        let (s, gv) = unsafe {
            (
                f._mm512_add_ps(
                    f._mm512_maskz_loadu_ps(m, px.add(i)),
                    f._mm512_maskz_loadu_ps(m, py.add(i)),
                ),
                f._mm512_maskz_loadu_ps(m, pg.add(i)),
            )
        };
        acc[0] = f._mm512_fmadd_ps(gv, s, acc[0]);
    }
    f._mm512_reduce_add_ps(f._mm512_add_ps(acc[0], acc[1]))
}

/// `x[i..]` masked by `m` (plus `y[i..]` where there is one).
#[inline(always)]
fn load_sum(v4: V4, m: __mmask16, x: &[f32], y: Option<&[f32]>, i: usize) -> __m512 {
    let f = v4.avx512f;
    // SAFETY: the callers pass masks of lanes below `x.len() − i` (and `y.len() − i`).
    unsafe {
        let xv = f._mm512_maskz_loadu_ps(m, x.as_ptr().add(i));
        match y {
            Some(y) => f._mm512_add_ps(xv, f._mm512_maskz_loadu_ps(m, y.as_ptr().add(i))),
            None => xv,
        }
    }
}

/// `out += w · (x + y)` (or `out += w · x` without `y`) over `out.len()` elements.
#[inline(always)]
pub(super) fn axpy2(v4: V4, out: &mut [f32], w: f32, x: &[f32], y: Option<&[f32]>) {
    let f = v4.avx512f;
    let n = out.len();
    assert!(x.len() >= n && y.is_none_or(|y| y.len() >= n));
    let po = out.as_mut_ptr();
    let wv = f._mm512_set1_ps(w);
    let mut i = 0;
    while i + 16 <= n {
        let xy = load_sum(v4, 0xFFFF, x, y, i);
        // SAFETY: [i, i + 16) with i + 16 ≤ n = out.len().
        unsafe {
            let o = f._mm512_loadu_ps(po.add(i));
            f._mm512_storeu_ps(po.add(i), f._mm512_fmadd_ps(wv, xy, o));
        }
        i += 16;
    }
    if i < n {
        let m = first(n - i);
        let xy = load_sum(v4, m, x, y, i);
        // SAFETY: only the lanes below n − i from i.
        unsafe {
            let o = f._mm512_maskz_loadu_ps(m, po.add(i));
            f._mm512_mask_storeu_ps(po.add(i), m, f._mm512_fmadd_ps(wv, xy, o));
        }
    }
}

/// `Σ a_i b_i` with four 16-lane accumulators; the tail (< 16) through a masked load.
#[inline(always)]
pub(super) fn dot(v4: V4, a: &[f32], b: &[f32]) -> f32 {
    let f = v4.avx512f;
    let n = a.len().min(b.len());
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc = [f._mm512_setzero_ps(); 4];
    let mut i = 0;
    while i + 64 <= n {
        for (j, acc_j) in acc.iter_mut().enumerate() {
            // SAFETY: [i + 16j, i + 16j + 16) lies below i + 64 ≤ n, within both slices.
            let (x, y) = unsafe {
                (
                    f._mm512_loadu_ps(pa.add(i + 16 * j)),
                    f._mm512_loadu_ps(pb.add(i + 16 * j)),
                )
            };
            *acc_j = f._mm512_fmadd_ps(x, y, *acc_j);
        }
        i += 64;
    }
    while i + 16 <= n {
        // SAFETY: [i, i + 16) with i + 16 ≤ n.
        let (x, y) = unsafe { (f._mm512_loadu_ps(pa.add(i)), f._mm512_loadu_ps(pb.add(i))) };
        acc[0] = f._mm512_fmadd_ps(x, y, acc[0]);
        i += 16;
    }
    if i < n {
        let m = first(n - i);
        // SAFETY: only the lanes below n − i from i.
        let (x, y) = unsafe {
            (
                f._mm512_maskz_loadu_ps(m, pa.add(i)),
                f._mm512_maskz_loadu_ps(m, pb.add(i)),
            )
        };
        acc[1] = f._mm512_fmadd_ps(x, y, acc[1]);
    }
    let s = f._mm512_add_ps(
        f._mm512_add_ps(acc[0], acc[1]),
        f._mm512_add_ps(acc[2], acc[3]),
    );
    f._mm512_reduce_add_ps(s)
}

/// The first `x.len()` lanes (at most 16) of `x`, the rest zero: one masked load. (pulp's
/// `partial_load_f32s` on `V4` calls an out-of-line assembly stub per length, a call in the
/// kernels' loops around which their accumulators were kept in memory.)
#[inline(always)]
pub(crate) fn load_part(v4: V4, x: &[f32]) -> __m512 {
    let mask = first(x.len());
    // SAFETY: the mask enables the first min(len, 16) lanes, all within `x`; AVX-512 masked
    // loads do not access (or fault on) the lanes the mask disables.
    unsafe { v4.avx512f._mm512_maskz_loadu_ps(mask, x.as_ptr()) }
}

/// `v` with the lanes from `n` on set to zero: one masked move.
#[inline(always)]
pub(crate) fn keep_first(v4: V4, v: __m512, n: usize) -> __m512 {
    v4.avx512f._mm512_maskz_mov_ps(first(n), v)
}

/// The first `out.len()` lanes (at most 16) of `v` into `out`: one masked store.
#[inline(always)]
pub(crate) fn store_part(v4: V4, out: &mut [f32], v: __m512) {
    let mask = first(out.len());
    // SAFETY: the mask enables the first min(len, 16) lanes, all within `out`; the disabled
    // lanes are not written.
    unsafe { v4.avx512f._mm512_mask_storeu_ps(out.as_mut_ptr(), mask, v) }
}
