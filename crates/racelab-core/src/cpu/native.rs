//! One source for the passes that run at the CPU's own vector width.
//!
//! Where a pass does not need a fixed 16-lane row ([`super::v16`]), it is written once over
//! [`Native`]: a [`pulp`] SIMD token with its own register width, the view
//! [`Token::native`](crate::cpu::simd::Token::native) of the one dispatch's token
//! ([`crate::cpu::simd::dispatch`]):
//!
//! | level | token | `f32s` |
//! |---|---|---|
//! | AVX-512 | `pulp::x86::V4` | `f32x16` (one `zmm`) |
//! | AVX2 + FMA | `pulp::x86::V3` | `f32x8` (one `ymm`) |
//! | aarch64 | `pulp::aarch64::Neon` | `f32x4` (one `q` register) |
//! | scalar | `pulp::Scalar` | `f32` |
//!
//! As in [`super::v16`], a token is a value only pulp's detection creates, and the dispatch
//! runs the kernel inside a `#[target_feature]` frame for the token's features, so the token's
//! `#[inline(always)]` methods become single instructions there. The operations pulp has no
//! portable form of are the token's own methods: the reduction of a register tile of dot
//! products ([`Native::reduce_tile`]: a transpose-and-add tree on AVX-512, lane sums
//! elsewhere) and an 8 × 8 transpose ([`Native::transpose8`]: shuffles on AVX2).

use pulp::Simd as _;

/// A SIMD token at its own width, with the kernels' one non-portable operation.
pub(crate) trait Native: pulp::Simd {
    /// Lanes of `f32s`.
    const LANES: usize = core::mem::size_of::<Self::f32s>() / 4;

    /// The first `x.len() ≤ LANES` lanes from `x`, the rest zero: pulp's partial load, one
    /// masked load on `V4` and `V3` (pulp's jumps to an out-of-line stub per length there).
    #[inline(always)]
    fn load_tail(self, x: &[f32]) -> Self::f32s {
        self.partial_load_f32s(x)
    }

    /// The first `out.len() ≤ LANES` lanes of `v` into `out` (the rest of `out` untouched).
    #[inline(always)]
    fn store_tail(self, out: &mut [f32], v: Self::f32s) {
        self.partial_store_f32s(out, v)
    }

    /// `out[r][q] = Σ lanes of acc[r][q]`.
    #[inline(always)]
    fn reduce_tile<const RT: usize, const QT: usize>(
        self,
        acc: &[[Self::f32s; QT]; RT],
    ) -> [[f32; QT]; RT] {
        lane_sums(self, acc)
    }

    /// `t[j][i] = r[i][j]`: the transpose of an 8 × 8 tile ([`crate::cpu::gemm::transpose_into`]).
    /// By element (which the frame vectorises as it can); AVX2 by shuffles.
    #[inline(always)]
    fn transpose8(self, r: &[[f32; 8]; 8]) -> [[f32; 8]; 8] {
        let mut t = [[0.0f32; 8]; 8];
        for (i, ri) in r.iter().enumerate() {
            for (j, &x) in ri.iter().enumerate() {
                t[j][i] = x;
            }
        }
        t
    }
}

#[cfg(target_arch = "x86_64")]
impl Native for pulp::x86::V4 {
    #[inline(always)]
    fn load_tail(self, x: &[f32]) -> Self::f32s {
        pulp::cast(crate::cpu::simd::avx512::load_part(self, x))
    }
    #[inline(always)]
    fn store_tail(self, out: &mut [f32], v: Self::f32s) {
        crate::cpu::simd::avx512::store_part(self, out, pulp::cast(v))
    }
    #[inline(always)]
    fn reduce_tile<const RT: usize, const QT: usize>(
        self,
        acc: &[[Self::f32s; QT]; RT],
    ) -> [[f32; QT]; RT] {
        if RT * QT != 16 {
            return lane_sums(self, acc);
        }
        // Accumulator of (row r, column q): lane ℓ = QT·r + q of the reduced vector comes from
        // input 4(ℓ mod 4) + ℓ/4 ([`hsum16x`]'s order), so each row's sums are contiguous.
        let mut v = [pulp::cast(self.splat_f32s(0.0)); 16];
        for (a, va) in v.iter_mut().enumerate() {
            let l = 4 * (a % 4) + a / 4;
            *va = pulp::cast(acc[l / QT][l % QT]);
        }
        let s: [f32; 16] = pulp::cast(hsum16x(self, &v));
        let mut out = [[0.0; QT]; RT];
        for (r, row) in out.iter_mut().enumerate() {
            row.copy_from_slice(&s[QT * r..QT * r + QT]);
        }
        out
    }
}

/// The AVX mask of the first `min(n, 8)` lanes (all bits set in a lane that is on).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn first8(v3: pulp::x86::V3, n: usize) -> std::arch::x86_64::__m256i {
    let iota: std::arch::x86_64::__m256i = pulp::cast([0i32, 1, 2, 3, 4, 5, 6, 7]);
    let n: std::arch::x86_64::__m256i = pulp::cast([n.min(8) as i32; 8]);
    v3.avx2._mm256_cmpgt_epi32(n, iota)
}

/// [`Native::reduce_tile`] by one lane sum per accumulator. (Plain loops: a closure passed
/// to `std::array::from_fn` is compiled outside the SIMD frame, without its features.)
#[inline(always)]
fn lane_sums<S: pulp::Simd, const RT: usize, const QT: usize>(
    s: S,
    acc: &[[S::f32s; QT]; RT],
) -> [[f32; QT]; RT] {
    let mut out = [[0.0; QT]; RT];
    for (o, a) in out.iter_mut().zip(acc) {
        for (x, &v) in o.iter_mut().zip(a) {
            *x = s.reduce_sum_f32s(v);
        }
    }
    out
}

#[cfg(target_arch = "x86_64")]
impl Native for pulp::x86::V3 {
    #[inline(always)]
    fn load_tail(self, x: &[f32]) -> Self::f32s {
        let mask = first8(self, x.len());
        // SAFETY: the mask enables the first min(len, 8) lanes, all within `x`; AVX masked
        // loads do not access (or fault on) the lanes the mask disables.
        pulp::cast(unsafe { self.avx._mm256_maskload_ps(x.as_ptr(), mask) })
    }
    #[inline(always)]
    fn store_tail(self, out: &mut [f32], v: Self::f32s) {
        let mask = first8(self, out.len());
        // SAFETY: the mask enables the first min(len, 8) lanes, all within `out`; the disabled
        // lanes are not written.
        unsafe {
            self.avx
                ._mm256_maskstore_ps(out.as_mut_ptr(), mask, pulp::cast(v))
        }
    }
    /// Rows interleaved in pairs (`unpack`), then in fours (`shuffle`), then 128-bit halves
    /// exchanged (`permute2f128`): 24 shuffles for 64 elements.
    #[inline(always)]
    fn transpose8(self, r: &[[f32; 8]; 8]) -> [[f32; 8]; 8] {
        use std::arch::x86_64::__m256;
        let avx = self.avx;
        let mut v: [__m256; 8] = [pulp::cast([0.0f32; 8]); 8];
        for (vi, ri) in v.iter_mut().zip(r) {
            *vi = pulp::cast(*ri);
        }
        let mut t = v;
        for p in 0..4 {
            t[2 * p] = avx._mm256_unpacklo_ps(v[2 * p], v[2 * p + 1]);
            t[2 * p + 1] = avx._mm256_unpackhi_ps(v[2 * p], v[2 * p + 1]);
        }
        let mut s = t;
        for g in 0..2 {
            let (a, b, c, d) = (t[4 * g], t[4 * g + 1], t[4 * g + 2], t[4 * g + 3]);
            s[4 * g] = avx._mm256_shuffle_ps::<0x44>(a, c);
            s[4 * g + 1] = avx._mm256_shuffle_ps::<0xEE>(a, c);
            s[4 * g + 2] = avx._mm256_shuffle_ps::<0x44>(b, d);
            s[4 * g + 3] = avx._mm256_shuffle_ps::<0xEE>(b, d);
        }
        let mut out = [[0.0f32; 8]; 8];
        for e in 0..4 {
            out[e] = pulp::cast(avx._mm256_permute2f128_ps::<0x20>(s[e], s[4 + e]));
            out[4 + e] = pulp::cast(avx._mm256_permute2f128_ps::<0x31>(s[e], s[4 + e]));
        }
        out
    }
}

#[cfg(target_arch = "aarch64")]
impl Native for pulp::aarch64::Neon {}

impl Native for pulp::Scalar {}

/// The 16 horizontal sums of `v[0..16]` in one vector: lane `4k + j` holds the sum of
/// `v[4j + k]` (a transpose-and-add tree: 128-bit blocks, then lanes; 15 adds in all).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn hsum16x(v4: pulp::x86::V4, v: &[std::arch::x86_64::__m512; 16]) -> std::arch::x86_64::__m512 {
    let f = v4.avx512f;
    // Block k of g[j] holds four partial sums of v[4j + k].
    let mut g = [f._mm512_setzero_ps(); 4];
    for (j, gj) in g.iter_mut().enumerate() {
        let mut ab = [f._mm512_setzero_ps(); 2];
        for (h, x) in ab.iter_mut().enumerate() {
            let (a, b) = (v[4 * j + 2 * h], v[4 * j + 2 * h + 1]);
            *x = f._mm512_add_ps(
                f._mm512_shuffle_f32x4::<0b01_00_01_00>(a, b),
                f._mm512_shuffle_f32x4::<0b11_10_11_10>(a, b),
            );
        }
        *gj = f._mm512_add_ps(
            f._mm512_shuffle_f32x4::<0b10_00_10_00>(ab[0], ab[1]),
            f._mm512_shuffle_f32x4::<0b11_01_11_01>(ab[0], ab[1]),
        );
    }
    // 4 × 4 transpose-and-add inside each 128-bit block.
    let u0 = f._mm512_add_ps(
        f._mm512_unpacklo_ps(g[0], g[1]),
        f._mm512_unpackhi_ps(g[0], g[1]),
    );
    let u1 = f._mm512_add_ps(
        f._mm512_unpacklo_ps(g[2], g[3]),
        f._mm512_unpackhi_ps(g[2], g[3]),
    );
    f._mm512_add_ps(
        f._mm512_shuffle_ps::<0b01_00_01_00>(u0, u1),
        f._mm512_shuffle_ps::<0b11_10_11_10>(u0, u1),
    )
}

#[cfg(test)]
mod tests {
    use super::Native;
    use crate::cpu::simd::{dispatch, Isa, Kernel, Level, Token};

    /// A tail of `len` lanes loaded from the start of `x` and stored at `4` of a guarded buffer.
    struct Tail(usize);
    impl Kernel for Tail {
        type Output = (usize, Vec<f32>, Vec<f32>);
        #[inline(always)]
        fn run<T: Token>(self, t: T) -> Self::Output {
            fn go<S: Native>(s: S, len: usize) -> (usize, Vec<f32>, Vec<f32>) {
                let n = len.min(S::LANES);
                let x: Vec<f32> = (0..S::LANES).map(|i| i as f32).collect();
                let v = s.load_tail(&x[..n]);
                let mut lanes = vec![0.0f32; S::LANES];
                S::as_mut_simd_f32s(&mut lanes).0[0] = v;
                // The guard lanes around the stored tail keep −1.
                let mut buf = vec![-1.0f32; S::LANES + 8];
                s.store_tail(&mut buf[4..4 + n], v);
                (S::LANES, lanes, buf)
            }
            go(t.native(), self.0)
        }
    }

    #[test]
    fn tails_load_and_store_only_their_lanes() {
        for level in [Level::Scalar, Level::Avx2, Level::Avx512] {
            for len in 0..=16 {
                let (w, lanes, buf) = dispatch(Isa::at_most(level), Tail(len));
                let n = len.min(w);
                for (j, &x) in lanes.iter().enumerate() {
                    assert_eq!(x, if j < n { j as f32 } else { 0.0 }, "{level:?} len={len}");
                }
                for (j, &x) in buf.iter().enumerate() {
                    let want = if (4..4 + n).contains(&j) {
                        (j - 4) as f32
                    } else {
                        -1.0
                    };
                    assert_eq!(x, want, "{level:?} len={len} store lane {j}");
                }
            }
        }
    }
}
