//! One source for the passes that run at the CPU's own vector width.
//!
//! Where a pass does not need a fixed 16-lane row ([`super::v16`]), it is written once over
//! [`Native`]: a [`pulp`] SIMD token with its own register width, instantiated by
//! [`dispatch`] for
//!
//! | level | token | `f32s` |
//! |---|---|---|
//! | AVX-512 | `pulp::x86::V4` | `f32x16` (one `zmm`) |
//! | AVX2 + FMA | `pulp::x86::V3` | `f32x8` (one `ymm`) |
//! | aarch64 | `pulp::aarch64::Neon` | `f32x4` (one `q` register) |
//! | scalar | `pulp::Scalar` | `f32` |
//!
//! As in [`super::v16`], a token is a value only pulp's detection creates, and [`dispatch`]
//! runs the task inside a `#[target_feature]` frame for the token's features, so the token's
//! `#[inline(always)]` methods become single instructions there. The one operation pulp
//! has no portable form of, the reduction of a register tile of dot products, is
//! [`Native::reduce_tile`]: a transpose-and-add tree on AVX-512, lane sums elsewhere.

use super::simd::{Isa, Level};
use pulp::Simd as _;

/// A SIMD token at its own width, with the kernels' one non-portable operation.
pub(crate) trait Native: pulp::Simd {
    /// Lanes of `f32s`.
    const LANES: usize = core::mem::size_of::<Self::f32s>() / 4;

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
        // SAFETY: `self` is a V4 token, which only pulp's detection creates after finding
        // AVX-512F (with BW, CD, DQ, VL) on this CPU.
        let s: [f32; 16] = pulp::cast(unsafe { hsum16x(&v) });
        let mut out = [[0.0; QT]; RT];
        for (r, row) in out.iter_mut().enumerate() {
            row.copy_from_slice(&s[QT * r..QT * r + QT]);
        }
        out
    }
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
#[target_feature(enable = "avx512f")]
fn hsum16x(v: &[std::arch::x86_64::__m512; 16]) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    // Block k of g[j] holds four partial sums of v[4j + k].
    let g = [0, 1, 2, 3].map(|j| {
        let pair = |a: __m512, b: __m512| {
            _mm512_add_ps(
                _mm512_shuffle_f32x4::<0b01_00_01_00>(a, b),
                _mm512_shuffle_f32x4::<0b11_10_11_10>(a, b),
            )
        };
        let (ab, cd) = (
            pair(v[4 * j], v[4 * j + 1]),
            pair(v[4 * j + 2], v[4 * j + 3]),
        );
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(ab, cd),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(ab, cd),
        )
    });
    // 4 × 4 transpose-and-add inside each 128-bit block.
    let u0 = _mm512_add_ps(
        _mm512_unpacklo_ps(g[0], g[1]),
        _mm512_unpackhi_ps(g[0], g[1]),
    );
    let u1 = _mm512_add_ps(
        _mm512_unpacklo_ps(g[2], g[3]),
        _mm512_unpackhi_ps(g[2], g[3]),
    );
    _mm512_add_ps(
        _mm512_shuffle_ps::<0b01_00_01_00>(u0, u1),
        _mm512_shuffle_ps::<0b11_10_11_10>(u0, u1),
    )
}

/// A pass at the native width. Implementations mark `run` as `#[inline(always)]`, so that it
/// is compiled inside [`dispatch`]'s frame.
pub(crate) trait TaskN {
    type Output;
    fn run<S: Native>(self, simd: S) -> Self::Output;
}

/// Run `task` with the native token for `isa` (see the module table). As in
/// [`super::v16::dispatch`], a CPU that has the `Isa` level but not pulp's token (which asks
/// for a few more features) runs the scalar form.
pub(crate) fn dispatch<T: TaskN>(isa: Isa, task: T) -> T::Output {
    match isa.level() {
        #[cfg(target_arch = "x86_64")]
        Level::Avx512 => {
            if let Some(simd) = pulp::x86::V4::try_new() {
                #[target_feature(
                    enable = "sse,sse2,fxsr,sse3,ssse3,sse4.1,sse4.2,popcnt,avx,avx2,bmi1,bmi2,fma,lzcnt,avx512f,avx512bw,avx512cd,avx512dq,avx512vl"
                )]
                fn frame<T: TaskN>(t: T, simd: pulp::x86::V4) -> T::Output {
                    t.run(simd)
                }
                // SAFETY: `simd` exists, so pulp's detection found every feature of V4 (the
                // ones the frame enables) on this CPU.
                return unsafe { frame(task, simd) };
            }
        }
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 => {
            if let Some(simd) = pulp::x86::V3::try_new() {
                #[target_feature(
                    enable = "sse,sse2,fxsr,sse3,ssse3,sse4.1,sse4.2,popcnt,avx,avx2,bmi1,bmi2,fma,lzcnt"
                )]
                fn frame<T: TaskN>(t: T, simd: pulp::x86::V3) -> T::Output {
                    t.run(simd)
                }
                // SAFETY: `simd` exists, so pulp's detection found every feature of V3 (the
                // ones the frame enables) on this CPU.
                return unsafe { frame(task, simd) };
            }
        }
        #[cfg(target_arch = "aarch64")]
        Level::Scalar => {
            if let Some(simd) = pulp::aarch64::Neon::try_new() {
                #[target_feature(enable = "neon")]
                fn frame<T: TaskN>(t: T, simd: pulp::aarch64::Neon) -> T::Output {
                    t.run(simd)
                }
                // SAFETY: `simd` exists, so pulp's detection found NEON on this CPU.
                return unsafe { frame(task, simd) };
            }
        }
        _ => {}
    }
    task.run(pulp::Scalar)
}
