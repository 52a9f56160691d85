//! One source for the 16-lane row passes, on every CPU.
//!
//! The soft-RACE paths keep their feature rows 16 floats wide (`mp = pad16(m)`), so a row is
//! one 16-lane vector. A pass over such rows is written once, generic over [`V16`]: a
//! [`pulp`] SIMD token whose f32 vector is `f32x16`, the view [`Token::w16`](crate::cpu::simd::Token::w16) of the one
//! dispatch's token ([`crate::cpu::simd::dispatch`]):
//!
//! | level | token | one row is |
//! |---|---|---|
//! | AVX-512 | `pulp::x86::V4` | one `zmm` register |
//! | AVX2 + FMA | `pulp::x86::V3_512b` | two `ymm` registers |
//! | scalar (x86-64 baseline), aarch64 | `pulp::Scalar512b` | 16 lanes in plain loops, which LLVM vectorises (SSE2; NEON, the aarch64 baseline) |
//!
//! A pulp token is a value that only pulp's CPU detection creates (`V4::try_new`,
//! `V3::try_new`), and every SIMD method takes it: a safe function cannot reach an
//! instruction the CPU lacks. The dispatch runs the kernel inside a `#[target_feature]` frame
//! for the token's features, so that the token's `#[inline(always)]` methods inline into
//! the pass and become single instructions.
//!
//! The operations used: `splat_f32s` (broadcast), `mul_add_e_f32s` (`a·b + c`, fused where
//! the CPU has FMA, unfused in the scalar form), `add_f32s`, `mul_f32s`, `reduce_sum_f32s`,
//! and [`V16::load_part`] / [`V16::store_part`] (the first `len` lanes of a slice, the rest
//! zero / untouched).

pub(crate) use pulp::f32x16;

/// A SIMD token whose f32 vector holds 16 lanes: the kernels' row. Its partial loads and
/// stores are its own: pulp 0.22's `V3_512b` masked accesses place the second half 16 lanes
/// on instead of 8 (an out-of-bounds store for a short slice), so that token splits them into
/// two 8-lane halves itself, each one masked access of `V3` ([`Native::load_tail`]).
///
/// [`Native::load_tail`]: crate::cpu::native::Native::load_tail
pub(crate) trait V16: pulp::Simd<f32s = f32x16> {
    /// The first `x.len() ≤ 16` lanes from `x`, the rest zero.
    fn load_part(self, x: &[f32]) -> f32x16;
    /// The first `out.len() ≤ 16` lanes of `v` into `out`.
    fn store_part(self, out: &mut [f32], v: f32x16);
    /// `v` with the lanes from `n` on set to zero: a product with 1s and 0s (`v` must be
    /// finite there, as feature products are), one masked move where the token has masks.
    #[inline(always)]
    fn keep_first(self, v: f32x16, n: usize) -> f32x16 {
        self.mul_f32s(v, pulp::cast(PREFIX[n.min(16)]))
    }
}

/// One masked load or store (pulp's partial accesses on `V4` call an assembly stub per length).
#[cfg(target_arch = "x86_64")]
impl V16 for pulp::x86::V4 {
    #[inline(always)]
    fn load_part(self, x: &[f32]) -> f32x16 {
        pulp::cast(crate::cpu::simd::avx512::load_part(self, x))
    }
    #[inline(always)]
    fn store_part(self, out: &mut [f32], v: f32x16) {
        crate::cpu::simd::avx512::store_part(self, out, pulp::cast(v))
    }
    #[inline(always)]
    fn keep_first(self, v: f32x16, n: usize) -> f32x16 {
        pulp::cast(crate::cpu::simd::avx512::keep_first(self, pulp::cast(v), n))
    }
}

#[cfg(target_arch = "x86_64")]
impl V16 for pulp::x86::V3_512b {
    #[inline(always)]
    fn load_part(self, x: &[f32]) -> f32x16 {
        use crate::cpu::native::Native;
        let v3 = self.0;
        let (lo, hi) = x.split_at(x.len().min(8));
        pulp::cast([v3.load_tail(lo), v3.load_tail(hi)])
    }
    #[inline(always)]
    fn store_part(self, out: &mut [f32], v: f32x16) {
        use crate::cpu::native::Native;
        let v3 = self.0;
        let [a, b]: [pulp::f32x8; 2] = pulp::cast(v);
        let n = out.len().min(8);
        let (lo, hi) = out.split_at_mut(n);
        v3.store_tail(lo, a);
        v3.store_tail(hi, b);
    }
}

impl V16 for pulp::Scalar512b {
    #[inline(always)]
    fn load_part(self, x: &[f32]) -> f32x16 {
        let mut a = [0.0f32; 16];
        a[..x.len()].copy_from_slice(x);
        pulp::cast(a)
    }
    #[inline(always)]
    fn store_part(self, out: &mut [f32], v: f32x16) {
        let a: [f32; 16] = pulp::cast(v);
        let n = out.len();
        out.copy_from_slice(&a[..n]);
    }
}

/// The first `len` lanes (≤ 16) of `x` from `at`, the rest zero: a whole row by one plain
/// load, a short one by the token's masked load.
#[inline(always)]
pub(crate) fn load_n<S: V16>(simd: S, x: &[f32], at: usize, len: usize) -> f32x16 {
    if len == 16 {
        load(simd, x, at)
    } else {
        simd.load_part(&x[at..at + len])
    }
}

/// Store the first `len` lanes (≤ 16) of `v` into `out` from `at` (a whole row by one plain
/// store).
#[inline(always)]
pub(crate) fn store_n<S: V16>(simd: S, out: &mut [f32], at: usize, len: usize, v: f32x16) {
    if len == 16 {
        store(simd, out, at, v)
    } else {
        simd.store_part(&mut out[at..at + len], v)
    }
}

/// A full row of 16 lanes of `x` from `at`.
#[inline(always)]
pub(crate) fn load<S: V16>(simd: S, x: &[f32], at: usize) -> f32x16 {
    let row: &[f32; 16] = x[at..at + 16].try_into().expect("16 lanes");
    let _ = simd;
    pulp::cast(*row)
}

/// Store a full row of 16 lanes into `out` from `at`.
#[inline(always)]
pub(crate) fn store<S: V16>(simd: S, out: &mut [f32], at: usize, v: f32x16) {
    let row: &mut [f32; 16] = (&mut out[at..at + 16]).try_into().expect("16 lanes");
    let _ = simd;
    *row = pulp::cast(v);
}

/// The first `n` rows of 16 floats of `x` (panics if `x` is shorter): a kernel indexes rows
/// of a known length, so that the only bounds checks left are on the row index.
#[inline(always)]
pub(crate) fn rows(x: &[f32], n: usize) -> &[[f32; 16]] {
    x[..n.checked_mul(16).expect("v16::rows: row count overflows")]
        .as_chunks::<16>()
        .0
}

/// [`rows`], mutable.
#[inline(always)]
pub(crate) fn rows_mut(x: &mut [f32], n: usize) -> &mut [[f32; 16]] {
    x[..n
        .checked_mul(16)
        .expect("v16::rows_mut: row count overflows")]
        .as_chunks_mut::<16>()
        .0
}

/// One row of 16 lanes.
#[inline(always)]
pub(crate) fn row<S: V16>(simd: S, x: &[f32; 16]) -> f32x16 {
    let _ = simd;
    pulp::cast(*x)
}

/// Store one row of 16 lanes.
#[inline(always)]
pub(crate) fn set_row<S: V16>(simd: S, out: &mut [f32; 16], v: f32x16) {
    let _ = simd;
    *out = pulp::cast(v);
}

/// `PREFIX[n]`: 1 in the first `n` lanes, 0 after.
const PREFIX: [[f32; 16]; 17] = {
    let mut t = [[0.0f32; 16]; 17];
    let mut n = 0;
    while n <= 16 {
        let mut j = 0;
        while j < n {
            t[n][j] = 1.0;
            j += 1;
        }
        n += 1;
    }
    t
};

/// `Σ_f x_f t_f` over the first `m ≤ 16` of the 16-lane vectors `t` (two chains, even and
/// odd `f`): one row of a product with a transposed 16-feature block.
#[inline(always)]
pub(crate) fn feature_row<S: V16>(simd: S, x: &[f32; 16], t: &[f32x16; 16], m: usize) -> f32x16 {
    let m = m.min(16);
    let zero = simd.splat_f32s(0.0);
    let (mut q0, mut q1) = (zero, zero);
    let mut f = 0;
    while f + 1 < m {
        q0 = simd.mul_add_e_f32s(simd.splat_f32s(x[f]), t[f], q0);
        q1 = simd.mul_add_e_f32s(simd.splat_f32s(x[f + 1]), t[f + 1], q1);
        f += 2;
    }
    if f < m {
        q0 = simd.mul_add_e_f32s(simd.splat_f32s(x[f]), t[f], q0);
    }
    simd.add_f32s(q0, q1)
}

/// The lanes of `v` as an array.
#[inline(always)]
pub(crate) fn lanes(v: f32x16) -> [f32; 16] {
    pulp::cast(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::simd::{dispatch, Isa, Kernel, Level, Token};
    use pulp::Simd as _;

    struct Dot<'a>(&'a [f32], &'a [f32]);
    impl Kernel for Dot<'_> {
        type Output = (f32, [f32; 16]);
        #[inline(always)]
        fn run<T: Token>(self, t: T) -> Self::Output {
            let s = t.w16();
            let (a, b) = (load(s, self.0, 0), load_n(s, self.1, 0, 5));
            let p = s.mul_add_e_f32s(a, b, s.splat_f32s(1.0));
            let mut out = [0.0f32; 16];
            store_n(s, &mut out, 0, 7, p);
            (s.reduce_sum_f32s(s.mul_f32s(a, b)), out)
        }
    }

    struct Keep(usize);
    impl Kernel for Keep {
        type Output = [f32; 16];
        #[inline(always)]
        fn run<T: Token>(self, t: T) -> [f32; 16] {
            let s = t.w16();
            lanes(s.keep_first(s.splat_f32s(2.0), self.0))
        }
    }

    #[test]
    fn keep_first_zeroes_the_lanes_after_n() {
        for level in [Level::Scalar, Level::Avx2, Level::Avx512] {
            for n in 0..=16 {
                let got = dispatch(Isa::at_most(level), Keep(n));
                for (j, &x) in got.iter().enumerate() {
                    assert_eq!(x, if j < n { 2.0 } else { 0.0 }, "{level:?} n={n}");
                }
            }
        }
    }

    struct Parts(usize);
    impl Kernel for Parts {
        type Output = (Vec<f32>, [f32; 16]);
        #[inline(always)]
        fn run<T: Token>(self, t: T) -> Self::Output {
            let s = t.w16();
            // A short store must stay inside its slice: the guard lanes after it keep −1.
            let mut buf = vec![-1.0f32; 32];
            let x: Vec<f32> = (0..16).map(|i| i as f32).collect();
            let v = load_n(s, &x, 0, self.0);
            store_n(s, &mut buf, 4, self.0, v);
            (buf, lanes(v))
        }
    }

    #[test]
    fn partial_loads_and_stores_touch_only_their_lanes() {
        for level in [Level::Scalar, Level::Avx2, Level::Avx512] {
            for n in 0..=16 {
                let (buf, v) = dispatch(Isa::at_most(level), Parts(n));
                for (j, &x) in v.iter().enumerate() {
                    assert_eq!(
                        x,
                        if j < n { j as f32 } else { 0.0 },
                        "{level:?} n={n} load"
                    );
                }
                for (j, &x) in buf.iter().enumerate() {
                    let want = if (4..4 + n).contains(&j) {
                        (j - 4) as f32
                    } else {
                        -1.0
                    };
                    assert_eq!(x, want, "{level:?} n={n} store lane {j}");
                }
            }
        }
    }

    /// Every level this CPU has gives the same partial loads, stores and sums.
    #[test]
    fn every_level_computes_the_same_rows() {
        let a: Vec<f32> = (0..16).map(|i| i as f32 * 0.5).collect();
        let b: Vec<f32> = (0..16).map(|i| 1.0 + i as f32).collect();
        for level in [Level::Scalar, Level::Avx2, Level::Avx512] {
            let (sum, out) = dispatch(Isa::at_most(level), Dot(&a, &b));
            // Only the first 5 lanes of b load: Σ_{i<5} 0.5 i (1 + i) = 20.
            assert_eq!(sum, 20.0, "{level:?}");
            for i in 0..16 {
                let want = if i >= 7 {
                    0.0
                } else if i < 5 {
                    a[i] * b[i] + 1.0
                } else {
                    1.0
                };
                assert_eq!(out[i], want, "{level:?} lane {i}");
            }
        }
    }
}
