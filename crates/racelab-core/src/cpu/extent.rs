//! Extents that guard unchecked access, computed so they cannot wrap.
//!
//! A kernel that reads with raw pointers or `get_unchecked` first asserts that each slice
//! holds the block it walks: `rows × cols` elements at row stride `rs` and column stride `cs`
//! reach index `(rows − 1)·rs + (cols − 1)·cs`, so the slice needs one more element than
//! that. In release builds plain `*` and `+` wrap, and a wrapped extent is a *smaller* one
//! that a short slice passes: every such guard goes through [`extent`], where an overflow is
//! `None` and the assertion fails. (No slice holds more than `isize::MAX` bytes, so a block
//! whose extent overflows `usize` is never held.)

/// Elements a `rows × cols` block with strides `(rs, cs)` spans from its first element:
/// `(rows − 1)·rs + (cols − 1)·cs + 1`, 0 for an empty block, `None` where it overflows.
#[inline]
pub(crate) fn extent(rows: usize, cols: usize, rs: usize, cs: usize) -> Option<usize> {
    if rows == 0 || cols == 0 {
        return Some(0);
    }
    (rows - 1)
        .checked_mul(rs)?
        .checked_add((cols - 1).checked_mul(cs)?)?
        .checked_add(1)
}

/// Panics with `what` unless a slice of `len` elements holds the block (see [`extent`]).
#[inline]
#[track_caller]
pub(crate) fn assert_holds(len: usize, rows: usize, cols: usize, rs: usize, cs: usize, what: &str) {
    match extent(rows, cols, rs, cs) {
        Some(e) if e <= len => {}
        _ => too_short(
            what,
            format_args!("{rows} × {cols} at strides ({rs}, {cs})"),
            len,
        ),
    }
}

/// The failure of a guard, out of line: the guards sit in front of hot loops.
#[cold]
#[inline(never)]
#[track_caller]
fn too_short(what: &str, block: std::fmt::Arguments, len: usize) -> ! {
    panic!("{what}: {block} does not fit in {len}")
}

/// Panics with `what` unless `offset..offset + len` lies within `0..total`.
#[inline]
#[track_caller]
pub(crate) fn assert_range(offset: usize, len: usize, total: usize, what: &str) {
    match offset.checked_add(len) {
        Some(end) if end <= total => {}
        _ => too_short(what, format_args!("{offset} + {len}"), total),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extents_that_would_wrap_are_refused() {
        assert_eq!(extent(3, 4, 10, 1), Some(24));
        assert_eq!(extent(0, 4, usize::MAX, 1), Some(0));
        assert_eq!(extent(1, 1, usize::MAX, usize::MAX), Some(1));
        // (9 − 1)·2^61 wraps to 0 in release arithmetic: a 9-element slice would pass.
        assert_eq!(extent(9, 1, 1 << 61, 1), None);
        assert_eq!(extent(2, 2, usize::MAX / 2, usize::MAX / 2 + 1), None);
        assert!(std::panic::catch_unwind(|| assert_holds(9, 9, 1, 1 << 61, 1, "x")).is_err());
        assert!(std::panic::catch_unwind(|| assert_range(usize::MAX - 3, 4, 8, "x")).is_err());
        assert_holds(24, 3, 4, 10, 1, "x");
        assert_range(4, 4, 8, "x");
    }

    /// The safe calls that once reached memory outside their buffers (with wrapped guards,
    /// in release builds) are refused: each panics before any access, at every level this
    /// CPU has.
    #[test]
    fn calls_whose_extents_wrap_are_refused_not_run() {
        use crate::cpu::gemm::{transpose_into, Gemm, Strided, Tri};
        use crate::cpu::mem::{ABuf, Out};
        use crate::cpu::simd::{dispatch, Isa, Kernel, Level, Simd, Token};
        let refused = |what: &str, f: &mut dyn FnMut()| {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
            assert!(r.is_err(), "{what} ran");
        };
        // 2^62 + 2 floats: `len·4` wrapped to 8 bytes, and a 64-byte allocation was handed out.
        refused("ABuf::zeroed(2^62 + 2)", &mut || {
            let _ = ABuf::zeroed((usize::MAX >> 2) + 2);
        });
        for level in [Level::Scalar, Level::Avx2, Level::Avx512] {
            let isa = Isa::at_most(level);
            refused("gemm with a row stride of 2^61", &mut || {
                let (a, b, mut d) = ([1.0f32; 9], [1.0f32; 1], [0.0f32; 9]);
                Gemm {
                    d: &mut d,
                    ldd: 1,
                    rows: 9,
                    cols: 1,
                    k: 1,
                    a: Strided {
                        data: &a,
                        rs: 1 << 61,
                        cs: 1,
                    },
                    b: &b,
                    b2: None,
                    ldb: 1,
                    alpha: 1.0,
                    accumulate: false,
                    tri: Tri::Full,
                }
                .run(isa)
            });
            refused("transpose with a row stride of 2^61", &mut || {
                transpose_into(isa, &[1.0], 9, 1, 1 << 61, &mut [0.0; 9], 1)
            });
            struct Combine;
            impl Kernel for Combine {
                type Output = ();
                fn run<T: Token>(self, t: T) {
                    let simd = t.rows();
                    let (x, mut out) = ([1.0f32; 4], [0.0f32; 4]);
                    simd.rows_combine(&[1.0; 9], &x, &x, 1 << 61, &mut out);
                }
            }
            refused("rows_combine with a row stride of 2^61", &mut || {
                dispatch(isa, Combine)
            });
        }
        for (stream, queue) in [(false, false), (true, false), (true, true)] {
            let out = Out { stream, queue };
            let mut seg = vec![0.0f32; 64];
            refused("Behind::produce at usize::MAX − 3", &mut || {
                out.behind(&mut seg, 16, |b| {
                    b.produce(usize::MAX - 3, 4, |x| x.fill(1.0))
                })
            });
            // A range that overlaps one handed out before (whose write may still be queued).
            refused("Behind::produce over an earlier range", &mut || {
                out.behind(&mut seg, 16, |b| {
                    b.produce(0, 16, |x| x.fill(1.0));
                    b.produce(1, 15, |x| x.fill(2.0));
                })
            });
            out.behind(&mut seg, 16, |b| {
                b.produce(0, 16, |x| x.fill(1.0));
                b.produce(16, 16, |x| x.fill(2.0));
            });
            assert_eq!(seg[15..17], [1.0, 2.0]);
        }
    }
}
