//! Outputs of the blocked kernels: plain stores for small outputs, non-temporal (streaming)
//! stores for outputs of at least [`STREAM_MIN_BYTES`], written straight or queued behind the
//! computation ([`Out::queued`], [`super::Behind`]).

use super::{finish_until, ABuf, Behind};
use crate::cpu::simd::{dispatch, Isa, Kernel, Level, Token};

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
        if self.stream {
            // The widest stores the CPU has, whatever level the kernels run at: streaming is
            // about memory, not arithmetic.
            return dispatch(Isa::best(), Stream { dst, src });
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

/// [`Out::write`]'s streaming copy, as a kernel: whole 64-byte lines with the AVX-512 token,
/// 32-byte halves with the AVX2 one (methods of the token), a plain copy otherwise.
struct Stream<'a> {
    dst: &'a mut [f32],
    src: &'a [f32],
}

impl Kernel for Stream<'_> {
    type Output = ();
    #[inline(always)]
    fn run<T: Token>(self, t: T) {
        let Stream { dst, src } = self;
        assert_eq!(dst.len(), src.len(), "Out::write: lengths differ");
        #[cfg(target_arch = "x86_64")]
        {
            if let Some(v4) = t.v4() {
                let f = v4.avx512f;
                return stream_by::<16>(
                    dst,
                    src,
                    #[inline(always)]
                    |d, s| {
                        // SAFETY: `d` and `s` are arrays of the 16 floats read and written, and
                        // `stream_by` passes `d` 64-byte aligned.
                        unsafe { f._mm512_stream_ps(d.as_mut_ptr(), f._mm512_loadu_ps(s.as_ptr())) }
                    },
                );
            }
            if let Some(v3) = t.v3() {
                let avx = v3.avx;
                return stream_by::<8>(
                    dst,
                    src,
                    #[inline(always)]
                    |d, s| {
                        // SAFETY: `d` and `s` are arrays of the 8 floats read and written, and
                        // `stream_by` passes `d` 32-byte aligned.
                        unsafe {
                            avx._mm256_stream_ps(d.as_mut_ptr(), avx._mm256_loadu_ps(s.as_ptr()))
                        }
                    },
                );
            }
        }
        let _ = t;
        dst.copy_from_slice(src);
    }
}

/// The streaming copy with `LANES`-float vectors: plain stores up to the first
/// `4·LANES`-byte boundary of `dst`, then `store(dst[i..], src[i..])` (one streaming store of
/// `LANES` floats to a `4·LANES`-byte-aligned destination) per vector, plain stores for the
/// rest. Inlined into [`Stream`]'s kernel, so `store`'s intrinsics compile in its frame.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn stream_by<const LANES: usize>(
    dst: &mut [f32],
    src: &[f32],
    store: impl Fn(&mut [f32; LANES], &[f32; LANES]),
) {
    let n = dst.len();
    assert_eq!(n, src.len(), "stream_by: lengths differ");
    let head = (dst.as_ptr().align_offset(4 * LANES)).min(n);
    dst[..head].copy_from_slice(&src[..head]);
    let mut i = head;
    while i + LANES <= n {
        // `dst + i` is aligned: `head` aligned it and `i` advances by whole vectors.
        let d: &mut [f32; LANES] = (&mut dst[i..i + LANES]).try_into().expect("LANES floats");
        let s: &[f32; LANES] = src[i..i + LANES].try_into().expect("LANES floats");
        store(d, s);
        i += LANES;
    }
    dst[i..].copy_from_slice(&src[i..]);
}
