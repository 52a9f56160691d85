//! Outputs of the blocked kernels: plain stores for small outputs, non-temporal (streaming)
//! stores for outputs of at least [`STREAM_MIN_BYTES`], written straight or queued behind the
//! computation ([`Out::queued`], [`super::Behind`]).

use super::{finish_until, ABuf, Behind};
use crate::cpu::simd::{Isa, Level};

/// Outputs at least this large (bytes) are written with non-temporal stores ([`Out`]):
/// beyond the last-level cache, where the data would be evicted before it is read again.
pub const STREAM_MIN_BYTES: usize = 1 << 25;

/// How a kernel writes one output tensor: plainly, or (`stream`) with non-temporal stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Out {
    pub stream: bool,
    /// With `stream`: whether [`Behind`] queues the writes behind the computation (else each
    /// block is streamed out as soon as it is computed, as [`Out::produce`] does).
    pub queue: bool,
}

impl Out {
    /// The policy for an output of `len` floats: stream when it is at least
    /// [`STREAM_MIN_BYTES`] and the CPU has AVX-512 or AVX2.
    pub fn for_len(isa: Isa, len: usize) -> Self {
        let vector = isa.level() != Level::Scalar;
        Out {
            stream: vector && len * 4 >= STREAM_MIN_BYTES,
            queue: false,
        }
    }

    /// `dst = src` (same length), with non-temporal stores for the aligned middle when
    /// streaming (whole 64-byte lines with AVX-512, 32-byte halves with AVX: the whole lines
    /// measured 1–3% faster end to end at `(2, 2)`). Call [`Out::fence`] before the thread's
    /// results are used elsewhere.
    pub fn write(self, dst: &mut [f32], src: &[f32]) {
        assert_eq!(dst.len(), src.len(), "Out::write: lengths differ");
        #[cfg(target_arch = "x86_64")]
        if self.stream && std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: AVX-512F was detected at run time; `stream_avx512` keeps every access in
            // bounds.
            unsafe { stream_avx512(dst, src) };
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if self.stream && std::arch::is_x86_feature_detected!("avx") {
            // SAFETY: AVX was detected at run time; `stream_avx` keeps every access in bounds.
            unsafe { stream_avx(dst, src) };
            return;
        }
        dst.copy_from_slice(src);
    }

    /// Compute a block of an output with `f`: straight into `dst`, or (streaming) into
    /// `scratch` (at least `dst.len()` long) and then [`Out::write`] to `dst`.
    pub fn produce(self, dst: &mut [f32], scratch: &mut [f32], f: impl FnOnce(&mut [f32])) {
        if self.stream {
            let s = &mut scratch[..dst.len()];
            f(s);
            self.write(dst, s);
        } else {
            f(dst);
        }
    }

    /// This policy with [`Behind`]'s queue on or off. Queued write-behind pays where the
    /// kernel is close to memory-bound and not where it is arithmetic-bound (measured with
    /// `examples/timing.rs`, N = 2^20, two threads): 16–20% faster at `(2, 2)`,
    /// even at `(3, 3)`, 12% slower at `(4, 4)`; the blocked passes queue for banks of at
    /// most 16 features.
    pub fn queued(self, queue: bool) -> Out {
        Out { queue, ..self }
    }

    /// Run `f` with a [`Behind`] writing the segment `seg` in blocks of at most `block`
    /// floats; every write it queued is finished, and fenced, when this returns (or unwinds).
    pub fn behind<R>(
        self,
        seg: &mut [f32],
        block: usize,
        f: impl FnOnce(&mut Behind<'_>) -> R,
    ) -> R {
        /// Finishes this thread's pending writes even if `f` panics (the queue points into
        /// `seg` and the scratch, which must outlive it).
        struct Finish(Out);
        impl Drop for Finish {
            fn drop(&mut self) {
                finish_until(u64::MAX);
                self.0.fence();
            }
        }
        let cap = if self.stream { block } else { 0 };
        let mut b = Behind {
            out: self,
            seg: seg.as_mut_ptr(),
            len: seg.len(),
            bufs: [ABuf::zeroed(cap), ABuf::zeroed(cap)],
            cur: 0,
            last: [0; 2],
            next: 0,
            _seg: std::marker::PhantomData,
        };
        let _finish = Finish(self);
        f(&mut b)
    }

    /// Order this thread's non-temporal stores before anything it does next (an `sfence`);
    /// a no-op when not streaming.
    pub fn fence(self) {
        // (Under Miri the writes are plain copies: nothing to order.)
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        if self.stream {
            // SAFETY: SSE is part of the x86-64 baseline; `sfence` has no other effect.
            unsafe { std::arch::x86_64::_mm_sfence() };
        }
    }
}

/// [`Out::write`]'s streaming copy with `LANES`-float vectors: plain stores up to the first
/// `4·LANES`-byte boundary of `dst`, then `store(dst + i, src + i)` (one aligned streaming
/// store) per vector, plain stores for the rest. Inlined into the target-feature wrappers
/// below, so `store`'s intrinsics compile for their ISA.
///
/// # Safety
/// `store` must write `LANES` floats from its source to its (aligned) destination and nothing
/// else; `dst.len() == src.len()`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn stream_by<const LANES: usize>(
    dst: &mut [f32],
    src: &[f32],
    store: impl Fn(*mut f32, *const f32),
) {
    let n = dst.len();
    let head = (dst.as_ptr().align_offset(4 * LANES)).min(n);
    dst[..head].copy_from_slice(&src[..head]);
    let mut i = head;
    while i + LANES <= n {
        // `i + LANES ≤ n` for both slices; `dst + i` is aligned (`head` aligned it and `i`
        // advances by whole vectors).
        store(dst[i..].as_mut_ptr(), src[i..].as_ptr());
        i += LANES;
    }
    dst[i..].copy_from_slice(&src[i..]);
}

/// [`stream_by`] with 32-byte `vmovntps ymm`.
///
/// # Safety
/// The CPU must support AVX; `dst.len() == src.len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn stream_avx(dst: &mut [f32], src: &[f32]) {
    use std::arch::x86_64::{_mm256_loadu_ps, _mm256_stream_ps};
    // SAFETY: the store writes 8 floats to a 32-byte-aligned, in-bounds address (`stream_by`).
    unsafe {
        stream_by::<8>(
            dst,
            src,
            #[inline(always)]
            |d, s| _mm256_stream_ps(d, _mm256_loadu_ps(s)),
        )
    }
}

/// [`stream_by`] with whole 64-byte lines (`vmovntps zmm`).
///
/// # Safety
/// The CPU must support AVX-512F; `dst.len() == src.len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn stream_avx512(dst: &mut [f32], src: &[f32]) {
    use std::arch::x86_64::{_mm512_loadu_ps, _mm512_stream_ps};
    // SAFETY: the store writes 16 floats to a 64-byte-aligned, in-bounds address (`stream_by`).
    unsafe {
        stream_by::<16>(
            dst,
            src,
            #[inline(always)]
            |d, s| _mm512_stream_ps(d, _mm512_loadu_ps(s)),
        )
    }
}
