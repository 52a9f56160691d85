//! The one SIMD dispatch of the kernels, and the row primitives.
//!
//! **One proof, one dispatch.** A kernel is a value implementing [`Kernel`];
//! [`dispatch`]`(isa, kernel)` makes the pulp token of the best level up to `isa` that the CPU
//! has (a value only pulp's run-time detection creates) and runs the kernel's
//! `#[inline(always)]` `run(token)` inside a `#[target_feature]` frame for exactly that token's
//! features, so every method of the token inlines into single instructions there. The token is
//! the only proof any `unsafe` SIMD code rests on; an [`Isa`] only selects the level
//! (`RACELAB_ISA=scalar|avx2` lowers it, and the tests run every level the CPU has). A kernel
//! reads the token through the view its loops are written for ([`Token`]'s table): the row
//! primitives of [`Simd`], 16-lane rows ([`super::v16`]) or the native width
//! ([`super::native`]); the intrinsics only AVX-512 has are methods of the `V4` token
//! ([`Token::v4`]). [`in_frame`] is the same dispatch for a closure that only wants its loops
//! compiled in the frame.
//!
//! **The row primitives** on `d`-length f32 rows: `dot` and `axpy` (and their two-operand
//! forms for the two-level causal state, `x = base + local`), written once per [`Simd`]
//! implementation:
//!
//! - [`Scalar`]: plain sequential loops, the always-tested twin;
//! - [`Lanes`]: 16 independent accumulators with `mul_add`, which LLVM turns into two
//!   AVX2+FMA registers inside the AVX2 frame;
//! - [`Lanes512`]: AVX-512 intrinsics, methods of the `V4` token it holds.

use super::native::Native;
use super::v16::V16;
use std::sync::OnceLock;

/// An instruction-set level of the SIMD paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Scalar code (every CPU).
    Scalar,
    /// AVX2 and FMA (x86-64-v3).
    Avx2,
    /// AVX-512F (x86-64-v4).
    Avx512,
}

/// An instruction set this CPU has. Only detection creates one ([`Isa::best`],
/// [`Isa::at_most`], [`detected_isa`]; [`Isa::SCALAR`] runs everywhere), so an `Isa` never
/// asks for more than the CPU has, and safe code cannot forge one. It selects the level the
/// kernels run at; the proof that an instruction exists is the pulp token the dispatch makes
/// for it (see the module docs), never the level.
///
/// ```compile_fail
/// use racelab_core::cpu::{Isa, Level};
/// let forged = Isa(Level::Avx512); // the field is private
/// ```
///
/// ```
/// use racelab_core::cpu::{Isa, Level};
/// let isa = Isa::at_most(Level::Avx512); // detection: at most what this CPU has
/// assert!(isa.level() <= Level::Avx512);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Isa(Level);

impl Isa {
    /// The scalar paths, on every CPU.
    pub const SCALAR: Isa = Isa(Level::Scalar);

    /// The best instruction set this CPU has (CPUID, detected once).
    pub fn best() -> Isa {
        static BEST: OnceLock<Isa> = OnceLock::new();
        *BEST.get_or_init(|| Isa(cpu_level()))
    }

    /// `level` where the CPU has it, else the best level it has below it.
    pub fn at_most(level: Level) -> Isa {
        Isa(level.min(Isa::best().0))
    }

    /// The level the kernels run at.
    pub fn level(self) -> Level {
        self.0
    }

    /// The level's name (`scalar`, `avx2+fma`, `avx512f`).
    pub fn name(&self) -> &'static str {
        match self.0 {
            Level::Scalar => "scalar",
            Level::Avx2 => "avx2+fma",
            Level::Avx512 => "avx512f",
        }
    }
}

/// The best ISA this CPU supports (or the lower one `RACELAB_ISA=scalar|avx2` asks for),
/// detected once.
pub fn detected_isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| match std::env::var("RACELAB_ISA").as_deref() {
        Ok("scalar") => Isa::SCALAR,
        Ok("avx2") => Isa::at_most(Level::Avx2),
        _ => Isa::best(),
    })
}

/// The best ISA this CPU supports, ignoring the environment ([`Isa::best`]).
pub fn best_supported() -> Isa {
    Isa::best()
}

/// The level CPUID reports.
fn cpu_level() -> Level {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512dq")
            && is_x86_feature_detected!("fma")
        {
            return Level::Avx512;
        }
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            return Level::Avx2;
        }
    }
    Level::Scalar
}

/// Only this module implements [`Simd`] and [`Token`]: a type outside it could run any
/// instructions.
mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Scalar {}
    impl Sealed for super::Lanes {}
    #[cfg(target_arch = "x86_64")]
    impl Sealed for super::Lanes512 {}
    #[cfg(target_arch = "x86_64")]
    impl Sealed for pulp::x86::V4 {}
    #[cfg(target_arch = "x86_64")]
    impl Sealed for pulp::x86::V3 {}
    #[cfg(target_arch = "aarch64")]
    impl Sealed for pulp::aarch64::Neon {}
    impl Sealed for pulp::Scalar {}
}

/// The row primitives of the kernels. Sealed: its implementations are [`Scalar`] and
/// [`Lanes`] (portable code, safe on every CPU) and a crate-private AVX-512 form whose value
/// holds a detection-created `V4` token (only [`dispatch`] makes one). The module is the
/// crate's own, so code outside it reaches none of this:
///
/// ```compile_fail
/// // Neither the primitives nor the dispatch can be named outside the crate.
/// use racelab_core::cpu::simd::{dispatch, Kernel, Simd, Token};
/// ```
pub trait Simd: Copy + sealed::Sealed {
    /// `Σ a_i b_i`.
    fn dot(self, a: &[f32], b: &[f32]) -> f32;
    /// `Σ g_i (x_i + y_i)` (reading a two-level state).
    fn dot2(self, g: &[f32], x: &[f32], y: &[f32]) -> f32;
    /// `out += w · x`.
    fn axpy(self, out: &mut [f32], w: f32, x: &[f32]);
    /// `out += w · (x + y)`.
    fn axpy2(self, out: &mut [f32], w: f32, x: &[f32], y: &[f32]);
    /// `a·b + c`: fused in [`Lanes`] (one FMA instruction in the SIMD frames), unfused in
    /// [`Scalar`] (where a fused multiply-add would be a slow library call).
    fn fma(self, a: f32, b: f32, c: f32) -> f32;
    /// `out[c] = Σ_f φ_f (x[f·w + c] + y[f·w + c])` for `c < out.len()`, `f < φ.len()`
    /// (reading a two-level bank with weights φ).
    #[inline(always)]
    fn rows_combine(self, phi: &[f32], x: &[f32], y: &[f32], w: usize, out: &mut [f32]) {
        out.iter_mut().for_each(|o| *o = 0.0);
        let n = out.len();
        for (f, &p) in phi.iter().enumerate() {
            if p != 0.0 {
                self.axpy2(out, p, &x[f * w..f * w + n], &y[f * w..f * w + n]);
            }
        }
    }
}

/// Sequential loops: the reference twin of [`Lanes`].
#[derive(Clone, Copy)]
pub struct Scalar;

impl Simd for Scalar {
    #[inline(always)]
    fn fma(self, a: f32, b: f32, c: f32) -> f32 {
        a * b + c
    }
    #[inline(always)]
    fn dot(self, a: &[f32], b: &[f32]) -> f32 {
        let mut s = 0.0f32;
        for i in 0..a.len().min(b.len()) {
            s += a[i] * b[i];
        }
        s
    }
    #[inline(always)]
    fn dot2(self, g: &[f32], x: &[f32], y: &[f32]) -> f32 {
        let mut s = 0.0f32;
        for i in 0..g.len() {
            s += g[i] * (x[i] + y[i]);
        }
        s
    }
    #[inline(always)]
    fn axpy(self, out: &mut [f32], w: f32, x: &[f32]) {
        for (o, &xi) in out.iter_mut().zip(x) {
            *o += w * xi;
        }
    }
    #[inline(always)]
    fn axpy2(self, out: &mut [f32], w: f32, x: &[f32], y: &[f32]) {
        for i in 0..out.len() {
            out[i] += w * (x[i] + y[i]);
        }
    }
}

/// 16 independent lanes with fused multiply-add: vectorised inside [`dispatch`].
#[derive(Clone, Copy)]
pub struct Lanes;

const W: usize = 16;

#[inline(always)]
fn hsum(acc: [f32; W]) -> f32 {
    // Pairwise: the same tree whatever the register width.
    let mut a = acc;
    let mut w = W;
    while w > 1 {
        w /= 2;
        for i in 0..w {
            a[i] += a[i + w];
        }
    }
    a[0]
}

impl Simd for Lanes {
    #[inline(always)]
    fn fma(self, a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
    }
    #[inline(always)]
    fn dot(self, a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let (a, b) = (&a[..n], &b[..n]);
        // Four independent 16-lane accumulators: one would chain every FMA on the previous
        // one (latency-bound, about 4× slower for d = 128).
        let mut acc = [[0.0f32; W]; 4];
        let (ac, bc) = (a.chunks_exact(4 * W), b.chunks_exact(4 * W));
        let (ar, br) = (ac.remainder(), bc.remainder());
        for (x, y) in ac.zip(bc) {
            // Fixed-size views: each 16-lane group is one (or two) vector registers.
            let (x, y): (&[f32; 4 * W], &[f32; 4 * W]) =
                (x.try_into().unwrap(), y.try_into().unwrap());
            for (j, accj) in acc.iter_mut().enumerate() {
                for l in 0..W {
                    accj[l] = x[j * W + l].mul_add(y[j * W + l], accj[l]);
                }
            }
        }
        for (i, (&x, &y)) in ar.iter().zip(br).enumerate() {
            let (j, l) = (i / W, i % W);
            acc[j][l] = x.mul_add(y, acc[j][l]);
        }
        let mut sum = [0.0f32; W];
        for l in 0..W {
            sum[l] = (acc[0][l] + acc[1][l]) + (acc[2][l] + acc[3][l]);
        }
        hsum(sum)
    }
    #[inline(always)]
    fn dot2(self, g: &[f32], x: &[f32], y: &[f32]) -> f32 {
        let n = g.len();
        let (x, y) = (&x[..n], &y[..n]);
        let mut acc = [0.0f32; W];
        let full = n / W * W;
        for c in (0..full).step_by(W) {
            for l in 0..W {
                acc[l] = g[c + l].mul_add(x[c + l] + y[c + l], acc[l]);
            }
        }
        for i in full..n {
            acc[i - full] = g[i].mul_add(x[i] + y[i], acc[i - full]);
        }
        hsum(acc)
    }
    #[inline(always)]
    fn axpy(self, out: &mut [f32], w: f32, x: &[f32]) {
        let x = &x[..out.len()];
        for (o, &xi) in out.iter_mut().zip(x) {
            *o = w.mul_add(xi, *o);
        }
    }
    #[inline(always)]
    fn axpy2(self, out: &mut [f32], w: f32, x: &[f32], y: &[f32]) {
        let n = out.len();
        let (x, y) = (&x[..n], &y[..n]);
        for i in 0..n {
            out[i] = w.mul_add(x[i] + y[i], out[i]);
        }
    }
}

/// [`Lanes`] with its primitives written in AVX-512 intrinsics (four `zmm` accumulators for
/// `dot`: the auto-vectorised form was compiled to 128-bit vectors). It holds a
/// `pulp::x86::V4` token, which only pulp's run-time detection creates, and every intrinsic
/// is a method of that token: no value of it, and so no call of its methods, exists on a CPU
/// without AVX-512. Its methods are `#[inline(always)]` and run inside [`dispatch`]'s AVX-512
/// frame, where the token's methods become single instructions.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(crate) struct Lanes512(pulp::x86::V4);

#[cfg(target_arch = "x86_64")]
impl Simd for Lanes512 {
    #[inline(always)]
    fn fma(self, a: f32, b: f32, c: f32) -> f32 {
        Lanes.fma(a, b, c)
    }
    #[inline(always)]
    fn dot(self, a: &[f32], b: &[f32]) -> f32 {
        avx512::dot(self.0, a, b)
    }
    #[inline(always)]
    fn rows_combine(self, phi: &[f32], x: &[f32], y: &[f32], w: usize, out: &mut [f32]) {
        avx512::rows_combine(self.0, phi, x, y, w, out)
    }
    #[inline(always)]
    fn dot2(self, g: &[f32], x: &[f32], y: &[f32]) -> f32 {
        avx512::dot2(self.0, g, x, y)
    }
    #[inline(always)]
    fn axpy(self, out: &mut [f32], w: f32, x: &[f32]) {
        avx512::axpy2(self.0, out, w, x, None)
    }
    #[inline(always)]
    fn axpy2(self, out: &mut [f32], w: f32, x: &[f32], y: &[f32]) {
        avx512::axpy2(self.0, out, w, x, Some(y))
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;

/// The proof that this CPU has a level's instructions: a pulp token, which only pulp's run-time
/// detection creates (`V4::try_new`, `V3::try_new`, `Neon::try_new`; `pulp::Scalar` runs
/// everywhere). It is the only proof the kernels use: [`dispatch`] makes the one token of a
/// level and runs the kernel inside a `#[target_feature]` frame for that token's features, and
/// every SIMD instruction is a method reached through a token. A kernel sees the token through
/// the view its loops are written for:
///
/// | token | [`Token::rows`] ([`Simd`]) | [`Token::w16`] ([`V16`], 16 lanes) | [`Token::native`] ([`Native`]) |
/// |---|---|---|---|
/// | `V4` (AVX-512) | [`Lanes512`] | `V4` (one `zmm`) | `V4` (`f32x16`) |
/// | `V3` (AVX2 + FMA) | [`Lanes`] | `V3_512b` (two `ymm`) | `V3` (`f32x8`) |
/// | `Neon` (aarch64) | [`Scalar`] | `Scalar512b` | `Neon` (`f32x4`) |
/// | `pulp::Scalar` | [`Scalar`] | `Scalar512b` | `pulp::Scalar` |
pub(crate) trait Token: Copy + sealed::Sealed {
    /// The row primitives.
    type Rows: Simd;
    /// Rows of 16 lanes.
    type W16: V16;
    /// The token at its own register width.
    type N: Native;
    /// Whether a 16-lane row is one register (the AVX-512 token).
    const ROW_IN_REGISTER: bool = false;
    fn rows(self) -> Self::Rows;
    fn w16(self) -> Self::W16;
    fn native(self) -> Self::N;
    /// The AVX-512 token, at that level: the way to the intrinsics only it has.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn v4(self) -> Option<pulp::x86::V4> {
        None
    }
    /// The AVX2 token, at that level or above.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn v3(self) -> Option<pulp::x86::V3> {
        None
    }
}

#[cfg(target_arch = "x86_64")]
impl Token for pulp::x86::V4 {
    type Rows = Lanes512;
    type W16 = pulp::x86::V4;
    type N = pulp::x86::V4;
    const ROW_IN_REGISTER: bool = true;
    #[inline(always)]
    fn rows(self) -> Lanes512 {
        Lanes512(self)
    }
    #[inline(always)]
    fn w16(self) -> Self {
        self
    }
    #[inline(always)]
    fn native(self) -> Self {
        self
    }
    #[inline(always)]
    fn v4(self) -> Option<pulp::x86::V4> {
        Some(self)
    }
    #[inline(always)]
    fn v3(self) -> Option<pulp::x86::V3> {
        Some(*self)
    }
}

#[cfg(target_arch = "x86_64")]
impl Token for pulp::x86::V3 {
    type Rows = Lanes;
    type W16 = pulp::x86::V3_512b;
    type N = pulp::x86::V3;
    #[inline(always)]
    fn rows(self) -> Lanes {
        Lanes
    }
    #[inline(always)]
    fn w16(self) -> pulp::x86::V3_512b {
        pulp::x86::V3_512b(self)
    }
    #[inline(always)]
    fn native(self) -> Self {
        self
    }
    #[inline(always)]
    fn v3(self) -> Option<pulp::x86::V3> {
        Some(self)
    }
}

/// The tokens whose row primitives and 16-lane rows are the portable forms ([`Scalar`],
/// `Scalar512b`, which LLVM vectorises for the baseline: SSE2, or NEON on aarch64); the native
/// width is their own.
macro_rules! portable_rows {
    ($($t:ty),*) => {$(
        impl Token for $t {
            type Rows = Scalar;
            type W16 = pulp::Scalar512b;
            type N = $t;
            #[inline(always)]
            fn rows(self) -> Scalar {
                Scalar
            }
            #[inline(always)]
            fn w16(self) -> pulp::Scalar512b {
                pulp::Scalar512b
            }
            #[inline(always)]
            fn native(self) -> Self {
                self
            }
        }
    )*};
}
#[cfg(target_arch = "aarch64")]
portable_rows!(pulp::aarch64::Neon);
portable_rows!(pulp::Scalar);

/// A unit of kernel work, generic over the token. Implementations mark `run` as
/// `#[inline(always)]` so it is compiled inside the frame of [`dispatch`], and take the view
/// of the token their loops use (`let simd = t.rows();`, `t.w16()`, `t.native()`).
pub(crate) trait Kernel {
    type Output;
    fn run<T: Token>(self, t: T) -> Self::Output;
}

/// Run `kernel` with the token of the best level up to `isa` that pulp's detection finds (it
/// asks a little more than [`Isa`]'s: V4 also needs AVX-512BW/CD/VL, V3 BMI1/2 and LZCNT), in
/// a `#[target_feature]` frame for exactly that token's features; `pulp::Scalar` where there is
/// none. The level only selects: the token is the proof the frame's `unsafe` call rests on.
pub(crate) fn dispatch<K: Kernel>(isa: Isa, kernel: K) -> K::Output {
    #[cfg(target_arch = "x86_64")]
    {
        if isa.level() == Level::Avx512 {
            if let Some(v4) = pulp::x86::V4::try_new() {
                #[target_feature(
                    enable = "sse,sse2,fxsr,sse3,ssse3,sse4.1,sse4.2,popcnt,avx,avx2,bmi1,bmi2,fma,lzcnt,avx512f,avx512bw,avx512cd,avx512dq,avx512vl"
                )]
                fn frame<K: Kernel>(k: K, t: pulp::x86::V4) -> K::Output {
                    k.run(t)
                }
                // SAFETY: `v4` exists, so pulp's detection found every feature of V4 (the ones
                // the frame enables) on this CPU.
                return unsafe { frame(kernel, v4) };
            }
        }
        if isa.level() >= Level::Avx2 {
            if let Some(v3) = pulp::x86::V3::try_new() {
                #[target_feature(
                    enable = "sse,sse2,fxsr,sse3,ssse3,sse4.1,sse4.2,popcnt,avx,avx2,bmi1,bmi2,fma,lzcnt"
                )]
                fn frame<K: Kernel>(k: K, t: pulp::x86::V3) -> K::Output {
                    k.run(t)
                }
                // SAFETY: `v3` exists, so pulp's detection found every feature of V3 (the ones
                // the frame enables) on this CPU.
                return unsafe { frame(kernel, v3) };
            }
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        let _ = isa;
        if let Some(neon) = pulp::aarch64::Neon::try_new() {
            #[target_feature(enable = "neon")]
            fn frame<K: Kernel>(k: K, t: pulp::aarch64::Neon) -> K::Output {
                k.run(t)
            }
            // SAFETY: `neon` exists, so pulp's detection found NEON on this CPU.
            return unsafe { frame(kernel, neon) };
        }
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = isa;
    kernel.run(pulp::Scalar)
}

/// Run the closure `f` inside [`dispatch`]'s frame for `isa` (a [`Kernel`] that ignores its
/// token), so that its loops (inlined into the frame) are compiled for that instruction set:
/// code outside a frame is compiled for the x86-64 baseline (SSE2), where an elementwise loop
/// over f32 runs 4 lanes at a time and one over f64 only 2. The closure must be marked
/// `#[inline(always)]` at the call site (`in_frame(isa, #[inline(always)] || …)`): a closure
/// is its own function, and LLVM declines to inline a large one into the frame, which leaves
/// its body compiled for the baseline (seen in the assembly: the frame was a bare jump to the
/// closure).
#[inline(always)]
pub(crate) fn in_frame<R, F: FnOnce() -> R>(isa: Isa, f: F) -> R {
    struct Closure<F>(F);
    impl<R, F: FnOnce() -> R> Kernel for Closure<F> {
        type Output = R;
        #[inline(always)]
        fn run<T: Token>(self, _t: T) -> R {
            (self.0)()
        }
    }
    dispatch(isa, Closure(f))
}

/// `acc += x` elementwise, f32 into f64 (the two-level flush), in the dispatched frame.
pub fn add_into_f64(isa: Isa, acc: &mut [f64], x: &[f32]) {
    in_frame(
        isa,
        #[inline(always)]
        || {
            acc.iter_mut().zip(x).for_each(|(a, &b)| *a += b as f64);
        },
    )
}

/// `e^x` for f32, vectorisable: `x = n ln2 + r`, `e^r` by a degree-6 polynomial, `2^n` by
/// exponent bits. Inputs below −87.3 return 0; relative error < 2e-7 elsewhere.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    let x = x.clamp(-87.3, 88.0);
    // Round to nearest with the 1.5·2^23 trick (no libm call, so loops over exp vectorise):
    // k = 1.5·2^23 + n exactly, so n is also k's low mantissa bits, read by a bit cast (a
    // float-to-int `as` would be a saturating conversion, which does not vectorise).
    let k = x * std::f32::consts::LOG2_E + 12_582_912.0;
    let n = k - 12_582_912.0;
    let ni = (k.to_bits() as i32).wrapping_sub(0x4B40_0000);
    let r = x - n * 0.693_145_75 - n * 1.428_606_8e-6;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (0.166_666_67 + r * (0.041_666_44 + r * (0.008_333_73 + r * 0.001_394_4)))));
    let bits = (ni.wrapping_add(127) as u32) << 23;
    p * f32::from_bits(bits)
}

/// `tanh(z)` for f32 from [`exp_f32`]: an odd Taylor polynomial for |z| < 1/16 (relative error
/// < 1e-9 there), else `sign(z)(1 − 2/(e^{2|z|} + 1))`; saturates to ±1 without overflow.
#[inline(always)]
pub fn tanh_f32(z: f32) -> f32 {
    // Both branches are computed and one selected, so loops over tanh vectorise.
    let a = z.abs();
    let z2 = z * z;
    let small = z * (1.0 + z2 * (-1.0 / 3.0 + z2 * (2.0 / 15.0 - z2 * (17.0 / 315.0))));
    let big = (1.0 - 2.0 / (exp_f32(2.0 * a.min(20.0)) + 1.0)).copysign(z);
    if a < 0.0625 {
        small
    } else {
        big
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every primitive, at every level this CPU has (each value made by [`dispatch`]), agrees
    /// with the scalar twin, over lengths with and without a partial last vector.
    #[test]
    fn the_primitives_agree_at_every_level() {
        struct All<'a>(&'a [f32], &'a [f32], &'a [f32], usize);
        impl Kernel for All<'_> {
            type Output = Vec<f32>;
            #[inline(always)]
            fn run<T: Token>(self, t: T) -> Vec<f32> {
                let simd = t.rows();
                let (x, y, g, n) = (self.0, self.1, self.2, self.3);
                let mut out = vec![simd.dot(&x[..n], &y[..n]), simd.dot2(&g[..n], x, y)];
                let mut a = g[..n].to_vec();
                simd.axpy(&mut a, 0.5, x);
                simd.axpy2(&mut a, -0.25, x, y);
                out.extend(a);
                let mut rc = vec![0.0; n.min(5)];
                simd.rows_combine(&g[..3], x, y, 7, &mut rc);
                out.extend(rc);
                out.push(simd.fma(1.5, -2.0, 0.25));
                out
            }
        }
        let v = |k: f32| (0..100).map(|i| (i as f32 * k).sin()).collect::<Vec<f32>>();
        let (x, y, g) = (v(0.7), v(1.3), v(2.1));
        for n in [1, 15, 16, 17, 37, 64, 100] {
            let want = All(&x, &y, &g, n).run(pulp::Scalar);
            for level in [Level::Scalar, Level::Avx2, Level::Avx512] {
                let got = dispatch(Isa::at_most(level), All(&x, &y, &g, n));
                for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                        "{level:?} n={n} #{i}: {a} vs {b}"
                    );
                }
            }
        }
    }

    /// Asking for a level the CPU lacks gives the best one it has, never more; the scalar
    /// level is always there.
    #[test]
    fn an_isa_never_exceeds_the_cpu() {
        let best = Isa::best().level();
        for level in [Level::Scalar, Level::Avx2, Level::Avx512] {
            let isa = Isa::at_most(level);
            assert_eq!(isa.level(), level.min(best), "{level:?}");
            assert!(isa.level() <= cpu_level());
        }
        assert_eq!(Isa::at_most(Level::Scalar), Isa::SCALAR);
        assert!(detected_isa().level() <= best);
    }
}
