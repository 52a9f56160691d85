//! Runtime SIMD dispatch with a scalar twin.
//!
//! The hot loops are two primitives on `d`-length f32 rows: `dot` and `axpy` (and their
//! two-operand forms for the two-level causal state, `x = base + local`). They are written
//! once per [`Simd`] implementation:
//!
//! - [`Scalar`]: plain sequential loops, the always-tested twin;
//! - [`Lanes`]: 16 independent accumulators with `mul_add`, which LLVM turns into two
//!   AVX2+FMA registers when compiled inside [`dispatch`]'s `#[target_feature]` frame;
//! - a crate-private AVX-512 form in intrinsics, a value holding pulp's `V4` token.
//!
//! The primitives are methods of a value (`simd.dot(a, b)`). A kernel is a value implementing
//! [`WithSimd`]; [`dispatch`] runs its `#[inline(always)]` `run(simd)` body inside a function
//! compiled for the detected ISA, so every primitive is inlined and vectorised there. An
//! [`Isa`] is created only by runtime detection, and the AVX-512 value only from a token that
//! pulp's detection creates, so no safe call, inside the crate or out, reaches an instruction
//! the CPU lacks. `RACELAB_ISA=scalar|avx2` lowers the detected
//! level (tests use it to run both twins on the same inputs).

use std::sync::OnceLock;

/// An instruction-set level of the SIMD paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Scalar,
    Avx2,
    Avx512,
}

/// An instruction set this CPU has. Only detection creates one ([`Isa::best`],
/// [`Isa::at_most`], [`detected_isa`]; [`Isa::SCALAR`] runs everywhere), so holding an `Isa`
/// at [`Level::Avx512`] proves the CPU has AVX-512F/DQ and FMA, and one at [`Level::Avx2`]
/// that it has AVX2 and FMA: the `unsafe` SIMD blocks rely on this, and safe code cannot
/// forge it.
///
/// ```compile_fail
/// use racelab::cpu::{Isa, Level};
/// let forged = Isa(Level::Avx512); // the field is private
/// ```
///
/// ```
/// use racelab::cpu::{Isa, Level};
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

    pub fn level(self) -> Level {
        self.0
    }

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

/// Only this module implements [`Simd`]: a type outside it could run any instructions.
mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Scalar {}
    impl Sealed for super::Lanes {}
    #[cfg(target_arch = "x86_64")]
    impl Sealed for super::Lanes512 {}
}

/// The row primitives of the kernels. Sealed: its implementations are [`Scalar`] and
/// [`Lanes`] (portable code, safe on every CPU) and a crate-private AVX-512 form whose value
/// holds a detection-created `V4` token (only [`dispatch`] makes one). The module is the
/// crate's own, so code outside it reaches none of this:
///
/// ```compile_fail
/// // Neither the primitives nor the dispatch can be named outside the crate.
/// use racelab::cpu::simd::{dispatch, Simd, WithSimd};
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

/// [`Lanes`] with `dot` written in AVX-512 intrinsics (four `zmm` accumulators): the
/// auto-vectorised form was compiled to 128-bit vectors. It holds a `pulp::x86::V4` token,
/// which only pulp's run-time detection creates, so even inside the crate no value of it (and
/// so no call of its methods) exists on a CPU without AVX-512; [`dispatch`] makes the one.
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
        // SAFETY: `self` holds a V4 token, which exists only where pulp's detection found
        // AVX-512F (with BW, CD, DQ, VL) on this CPU; `dot512` keeps its accesses in bounds.
        unsafe { dot512(a, b) }
    }
    #[inline(always)]
    fn rows_combine(self, phi: &[f32], x: &[f32], y: &[f32], w: usize, out: &mut [f32]) {
        // SAFETY: as in `dot` (the token proves AVX-512F).
        unsafe { rows_combine512(phi, x, y, w, out) }
    }
    #[inline(always)]
    fn dot2(self, g: &[f32], x: &[f32], y: &[f32]) -> f32 {
        // SAFETY: as in `dot` (the token proves AVX-512F).
        unsafe { dot2_512(g, x, y) }
    }
    #[inline(always)]
    fn axpy(self, out: &mut [f32], w: f32, x: &[f32]) {
        // SAFETY: as in `dot` (the token proves AVX-512F).
        unsafe { axpy2_512(out, w, x, None) }
    }
    #[inline(always)]
    fn axpy2(self, out: &mut [f32], w: f32, x: &[f32], y: &[f32]) {
        // SAFETY: as in `dot` (the token proves AVX-512F).
        unsafe { axpy2_512(out, w, x, Some(y)) }
    }
}

/// [`Simd::rows_combine`]: one 16-column chunk of `out` at a time stays in a register while
/// all rows are added (a row-by-row `axpy` would chain every row through memory).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
fn rows_combine512(phi: &[f32], x: &[f32], y: &[f32], w: usize, out: &mut [f32]) {
    use std::arch::x86_64::*;
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
        let mask: __mmask16 = if n - c >= 16 {
            0xFFFF
        } else {
            ((1u32 << (n - c)) - 1) as u16
        };
        let mut acc = _mm512_setzero_ps();
        for (f, &p) in phi.iter().enumerate() {
            // SAFETY: lanes c..c+16 (masked to < n) of row f lie within `x`, `y` (asserted).
            unsafe {
                let xy = _mm512_add_ps(
                    _mm512_maskz_loadu_ps(mask, px.add(f * w + c)),
                    _mm512_maskz_loadu_ps(mask, py.add(f * w + c)),
                );
                acc = _mm512_fmadd_ps(_mm512_set1_ps(p), xy, acc);
            }
        }
        // SAFETY: lanes below n − c of `out` from c.
        unsafe { _mm512_mask_storeu_ps(po.add(c), mask, acc) };
        c += 16;
    }
}

/// `Σ g_i (x_i + y_i)` over `g.len()` elements, two accumulators, masked tail.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
fn dot2_512(g: &[f32], x: &[f32], y: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let n = g.len();
    assert!(x.len() >= n && y.len() >= n);
    let (pg, px, py) = (g.as_ptr(), x.as_ptr(), y.as_ptr());
    let mut acc = [_mm512_setzero_ps(); 2];
    let mut i = 0;
    // SAFETY: (all loads) full loads read [i, i + 16) with i + 16 ≤ n; the masked load reads
    // only lanes below n − i; all three slices hold at least n elements (asserted).
    unsafe {
        while i + 16 <= n {
            let s = _mm512_add_ps(_mm512_loadu_ps(px.add(i)), _mm512_loadu_ps(py.add(i)));
            let j = (i / 16) & 1;
            acc[j] = _mm512_fmadd_ps(_mm512_loadu_ps(pg.add(i)), s, acc[j]);
            i += 16;
        }
        if i < n {
            let m: __mmask16 = ((1u32 << (n - i)) - 1) as u16;
            let s = _mm512_add_ps(
                _mm512_maskz_loadu_ps(m, px.add(i)),
                _mm512_maskz_loadu_ps(m, py.add(i)),
            );
            acc[0] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, pg.add(i)), s, acc[0]);
        }
    }
    _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1]))
}

/// `out += w · (x + y)` (or `out += w · x` without `y`) over `out.len()` elements.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
fn axpy2_512(out: &mut [f32], w: f32, x: &[f32], y: Option<&[f32]>) {
    use std::arch::x86_64::*;
    let n = out.len();
    assert!(x.len() >= n && y.is_none_or(|y| y.len() >= n));
    let (po, px) = (out.as_mut_ptr(), x.as_ptr());
    let wv = _mm512_set1_ps(w);
    let mut i = 0;
    // SAFETY: (all loads and stores) full accesses cover [i, i + 16) with i + 16 ≤ n, masked
    // ones only lanes below n − i; `x` and `y` hold at least n elements (asserted).
    unsafe {
        let load = |m: __mmask16, i: usize| -> __m512 {
            let xv = _mm512_maskz_loadu_ps(m, px.add(i));
            match y {
                Some(y) => _mm512_add_ps(xv, _mm512_maskz_loadu_ps(m, y.as_ptr().add(i))),
                None => xv,
            }
        };
        while i + 16 <= n {
            let o = _mm512_loadu_ps(po.add(i));
            _mm512_storeu_ps(po.add(i), _mm512_fmadd_ps(wv, load(0xFFFF, i), o));
            i += 16;
        }
        if i < n {
            let m: __mmask16 = ((1u32 << (n - i)) - 1) as u16;
            let o = _mm512_maskz_loadu_ps(m, po.add(i));
            _mm512_mask_storeu_ps(po.add(i), m, _mm512_fmadd_ps(wv, load(m, i), o));
        }
    }
}

/// `Σ a_i b_i` with four 16-lane accumulators; the tail (< 16) through a masked load.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
fn dot512(a: &[f32], b: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let n = a.len().min(b.len());
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc = [_mm512_setzero_ps(); 4];
    let mut i = 0;
    // SAFETY: (all loads below) every full load reads [i, i + 16) with i + 16 ≤ n, and the
    // masked load reads only the lanes below n − i; both slices have at least n elements.
    unsafe {
        while i + 64 <= n {
            for (j, acc_j) in acc.iter_mut().enumerate() {
                let (x, y) = (
                    _mm512_loadu_ps(pa.add(i + 16 * j)),
                    _mm512_loadu_ps(pb.add(i + 16 * j)),
                );
                *acc_j = _mm512_fmadd_ps(x, y, *acc_j);
            }
            i += 64;
        }
        while i + 16 <= n {
            acc[0] = _mm512_fmadd_ps(
                _mm512_loadu_ps(pa.add(i)),
                _mm512_loadu_ps(pb.add(i)),
                acc[0],
            );
            i += 16;
        }
        if i < n {
            let m: __mmask16 = (1u32 << (n - i)) as u16 - 1;
            let (x, y) = (
                _mm512_maskz_loadu_ps(m, pa.add(i)),
                _mm512_maskz_loadu_ps(m, pb.add(i)),
            );
            acc[1] = _mm512_fmadd_ps(x, y, acc[1]);
        }
    }
    let s = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
    _mm512_reduce_add_ps(s)
}

/// A unit of kernel work, generic over the primitives. Implementations mark `run` as
/// `#[inline(always)]` so it is compiled inside the ISA frame of [`dispatch`]; `simd` is the
/// value whose methods are the primitives (`simd.dot(a, b)`).
pub trait WithSimd {
    type Output;
    fn run<S: Simd>(self, simd: S) -> Self::Output;
}

/// Run `task` with the primitives for `isa`. At AVX-512 the primitives are a value holding
/// pulp's `V4` token; a CPU with the `Isa` level but not every feature pulp asks for (BW, CD,
/// VL) runs the AVX2 form.
pub fn dispatch<T: WithSimd>(isa: Isa, task: T) -> T::Output {
    match isa.level() {
        #[cfg(target_arch = "x86_64")]
        Level::Avx512 => {
            if let Some(v4) = pulp::x86::V4::try_new() {
                #[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
                fn frame<T: WithSimd>(t: T, simd: Lanes512) -> T::Output {
                    t.run(simd)
                }
                // SAFETY: `v4` exists, so pulp's detection found AVX-512F/DQ (and AVX2, FMA)
                // on this CPU: the features this frame is compiled with.
                return unsafe { frame(task, Lanes512(v4)) };
            }
            dispatch(Isa::at_most(Level::Avx2), task)
        }
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 => {
            #[target_feature(enable = "avx2,fma")]
            fn frame<T: WithSimd>(t: T) -> T::Output {
                t.run(Lanes)
            }
            // SAFETY: an `Isa` at Avx2 is only created by detection, after
            // `is_x86_feature_detected!` confirmed avx2 and fma on this CPU.
            unsafe { frame(task) }
        }
        _ => task.run(Scalar),
    }
}

/// Run the closure `f` inside [`dispatch`]'s frame for `isa`, so that its loops (inlined into
/// the frame) are compiled for that instruction set: code outside a frame is compiled for the
/// x86-64 baseline (SSE2), where an elementwise loop over f32 runs 4 lanes at a time and one
/// over f64 only 2. The closure must be marked `#[inline(always)]` at the call site
/// (`in_frame(isa, #[inline(always)] || …)`): a closure is its own function, and LLVM declines
/// to inline a large one into the frame, which leaves its body compiled for the baseline (seen
/// in the assembly: the frame was a bare jump to the closure).
#[inline(always)]
pub fn in_frame<R, F: FnOnce() -> R>(isa: Isa, f: F) -> R {
    struct Task<F>(F);
    impl<R, F: FnOnce() -> R> WithSimd for Task<F> {
        type Output = R;
        #[inline(always)]
        fn run<S: Simd>(self, _simd: S) -> R {
            (self.0)()
        }
    }
    dispatch(isa, Task(f))
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
        impl WithSimd for All<'_> {
            type Output = Vec<f32>;
            #[inline(always)]
            fn run<S: Simd>(self, simd: S) -> Vec<f32> {
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
            let want = All(&x, &y, &g, n).run(Scalar);
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
