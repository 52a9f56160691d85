//! Memory-traffic helpers of the blocked kernels: software prefetch of the next block's input
//! rows, a few lines at a time spread over the current block ([`Ahead`] arms it, the kernels'
//! loops call [`drip`]), and non-temporal stores of large outputs ([`Out`]).
//!
//! At the paper shape the non-causal forward+backward moves about 4.5 KiB per token and head
//! (Q, K, V, G read once or twice; O, dQ, dK, dV written once), so past the caches the
//! kernels are as much memory streams as arithmetic. A plain store to a line not in cache
//! first reads it (read-for-ownership), so each output costs twice its size in traffic;
//! streaming (non-temporal) stores write whole lines without reading them, but leave
//! nothing in cache, which only pays when the output is larger than the caches.

use super::simd::{Isa, Level};

/// The next block's input rows, prefetched a few lines at a time by the [`drip`]s of the
/// current block. Creating one arms this thread's drip with the rows and ends the previous
/// block: the number of drips that block made sets how many lines each drip of this one
/// prefetches, so the lines are spread evenly over the whole block. (With huge pages,
/// `examples/timing.rs`, N = 2^20, two threads, alternated runs: an even share is
/// 2–3% faster at `(2, 2)` non-causal and 2–5% causal than the earlier 1.5×, and 0.75× or 3×
/// are slower; `(4, 4)` within ±2%.) Dropping it disarms the drip.
///
/// Why: one core here reads about 35 GB/s, about what the kernels need at `(2, 2)`, so the
/// reads must overlap the arithmetic. The hardware prefetchers follow the kernels' reads
/// (several rows at once) poorly, and a burst of hundreds of software prefetches fills the
/// line-fill buffers and stalls the core until they drain. Measured at `(2, 2)`, one core,
/// `examples/timing.rs`: about 1240 cycles per token and head with the prefetches issued in
/// three to six bursts per block, about 1000–1050 dripped (non-causal), and 1900 → 1700
/// causal. Streaming the output blocks out by drips as well (a queue of pending
/// non-temporal writes, a few lines every few drips) was tried and not kept: about 4.5%
/// faster at `(2, 2)` non-causal, 2–4% slower at `(4, 4)` and causal (medians of 4–8
/// alternated runs), for a queue of raw output addresses kept in thread-local state. Tried
/// again with huge pages (commit `fbfde3ef40db`, reverted): 7–12%
/// faster at `(2, 2)` in `examples/timing.rs` (two heads), but in `racelab bench` (four
/// heads, N = 2^20) 1% at `(2, 2)` and 13% slower at `(4, 4)` non-causal. Restored for the non-causal passes of banks of at most 16 features only
/// ([`Out::queued`], [`Behind`]): after cuts in their arithmetic the same
/// queue made `(2, 2)` 7% faster in `examples/timing.rs` (N = 2^20, two threads).
pub struct Ahead<'a> {
    _parts: std::marker::PhantomData<&'a [f32]>,
}

/// This thread's drip: the armed ranges (byte addresses; never dereferenced) and counters.
mod drip_state {
    use std::cell::Cell;

    thread_local! {
        /// The current range `[next line, end)`.
        pub(super) static CUR: Cell<(usize, usize)> = const { Cell::new((0, 0)) };
        /// Further ranges of the armed block, and how many of them are left.
        pub(super) static MORE: Cell<[(usize, usize); 5]> = const { Cell::new([(0, 0); 5]) };
        pub(super) static LEFT: Cell<usize> = const { Cell::new(0) };
        /// Lines per drip.
        pub(super) static PER: Cell<usize> = const { Cell::new(1) };
        /// Drips since the last [`super::Ahead::new`].
        pub(super) static CALLS: Cell<usize> = const { Cell::new(0) };
        /// Drips the last whole block made (the write-behind's pacing).
        pub(super) static BLOCK_CALLS: Cell<usize> = const { Cell::new(64) };
        /// The oldest pending write-behind ([`super::Behind`]) and the ones queued after it.
        pub(super) static WCUR: Cell<super::Pend> = const { Cell::new(super::Pend::NONE) };
        pub(super) static WMORE: Cell<[super::Pend; super::WQ]> =
            const { Cell::new([super::Pend::NONE; super::WQ]) };
        pub(super) static WN: Cell<usize> = const { Cell::new(0) };
        /// The last write's sequence number, and lines written per drip.
        pub(super) static WSEQ: Cell<u64> = const { Cell::new(0) };
        pub(super) static WPER: Cell<usize> = const { Cell::new(1) };
        /// Whether any write is pending.
        pub(super) static WON: Cell<bool> = const { Cell::new(false) };
    }
}
use drip_state::{BLOCK_CALLS, CALLS, CUR, LEFT, MORE, PER, WCUR, WMORE, WN, WON, WPER, WSEQ};

/// One drip: prefetch the next few lines armed by the current [`Ahead`] (nothing when none
/// is armed). The kernels' inner loops call it: each `gemm` tile and every 16 steps of its
/// `k` loop, each dot-product tile, each transpose tile, every few rows of the elementwise
/// phases, and [`Ahead::step`] between phases.
#[inline(always)]
pub fn drip() {
    CALLS.with(|c| c.set(c.get() + 1));
    let (p, end) = CUR.with(|c| c.get());
    if p < end {
        drip_lines(p, end);
    }
    if WON.with(|c| c.get()) {
        write_some();
    }
}

/// [`drip`]'s write-behind share, out of line (the kernels' inner loops stay small).
#[inline(never)]
fn write_some() {
    let w = WCUR.with(|c| c.get());
    if w.src < w.end {
        write_lines(w, WPER.with(|c| c.get()));
    }
}

#[inline(always)]
fn drip_lines(mut p: usize, end: usize) {
    for _ in 0..PER.with(|c| c.get()) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a prefetch hint never faults and has no architectural effect; the address
        // is not dereferenced. (SSE is part of the x86-64 baseline.)
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p as *const i8)
        };
        p += 64;
        if p >= end {
            next_range();
            return;
        }
    }
    CUR.with(|c| c.set((p, end)));
}

/// Move to the armed block's next range (or disarm after the last).
#[cold]
fn next_range() {
    let left = LEFT.with(|c| c.get());
    let next = if left > 0 {
        let more = MORE.with(|c| c.get());
        LEFT.with(|c| c.set(left - 1));
        more[more.len() - left]
    } else {
        (0, 0)
    };
    CUR.with(|c| c.set(next));
}

impl<'a> Ahead<'a> {
    /// Arm this thread's drip with `parts` (at most 6) for the current block.
    pub fn new(parts: &[&'a [f32]]) -> Self {
        let calls = CALLS.with(|c| c.replace(0)).max(1);
        BLOCK_CALLS.with(|c| c.set(calls));
        // The non-empty parts as line-aligned byte ranges (no allocation: once per block).
        let mut ranges = [(0usize, 0usize); 6];
        let mut n = 0;
        for x in parts.iter().filter(|x| !x.is_empty()) {
            assert!(n < 6, "Ahead: at most 6 parts");
            let a = x.as_ptr() as usize;
            ranges[n] = (a & !63, a + 4 * x.len());
            n += 1;
        }
        let lines: usize = ranges[..n].iter().map(|(a, e)| (e - a).div_ceil(64)).sum();
        PER.with(|c| c.set(lines.div_ceil(calls).max(1)));
        let mut more = [(0, 0); 5];
        let rest = n.saturating_sub(1);
        more[5 - rest..].copy_from_slice(&ranges[1..1 + rest]);
        MORE.with(|c| c.set(more));
        LEFT.with(|c| c.set(rest));
        CUR.with(|c| c.set(if n > 0 { ranges[0] } else { (0, 0) }));
        Ahead {
            _parts: std::marker::PhantomData,
        }
    }

    /// One more [`drip`] (the passes call it between phases).
    #[inline]
    pub fn step(&mut self) {
        drip();
    }
}

impl Drop for Ahead<'_> {
    fn drop(&mut self) {
        CUR.with(|c| c.set((0, 0)));
        LEFT.with(|c| c.set(0));
    }
}

/// A pending streamed write: the bytes `[src, end)` go to `dst..` (64-byte lines; `dst`
/// line-aligned), queued by [`Behind::produce`] as write number `seq`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pend {
    dst: usize,
    src: usize,
    end: usize,
    seq: u64,
}

impl Pend {
    const NONE: Pend = Pend {
        dst: 0,
        src: 0,
        end: 0,
        seq: 0,
    };
    fn lines(&self) -> usize {
        (self.end - self.src) / 64
    }
}

/// Pending writes queued behind the oldest one (beyond that, the oldest is finished at once).
const WQ: usize = 6;

/// Stream up to `n` lines of the oldest pending write (moving to the next when it is done).
#[inline(always)]
fn write_lines(mut w: Pend, n: usize) {
    for _ in 0..n {
        // SAFETY: a queued write's `[src, end)` lies in a live scratch buffer and its
        // destination in a segment exclusively borrowed by a live `Behind` scope (both stay
        // alive until `Out::behind` has finished every write it queued); `dst` is 64-byte
        // aligned and whole lines are written. SSE is part of the x86-64 baseline.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            use std::arch::x86_64::{_mm_loadu_ps, _mm_stream_ps};
            let (d, s) = (w.dst as *mut f32, w.src as *const f32);
            for j in 0..4 {
                _mm_stream_ps(d.add(4 * j), _mm_loadu_ps(s.add(4 * j)));
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        // SAFETY: as above (plain copies where there are no streaming stores).
        unsafe {
            std::ptr::copy_nonoverlapping(w.src as *const u8, w.dst as *mut u8, 64)
        };
        w.dst += 64;
        w.src += 64;
        if w.src >= w.end {
            next_write();
            return;
        }
    }
    WCUR.with(|c| c.set(w));
}

/// The oldest pending write is done: the next queued one becomes the oldest.
#[cold]
fn next_write() {
    let n = WN.with(|c| c.get());
    let mut more = WMORE.with(|c| c.get());
    let next = if n > 0 { more[0] } else { Pend::NONE };
    more.copy_within(1.., 0);
    WMORE.with(|c| c.set(more));
    WN.with(|c| c.set(n.saturating_sub(1)));
    WCUR.with(|c| c.set(next));
    WON.with(|c| c.set(next.src < next.end));
}

/// Finish every pending write numbered `seq` or lower (all of them with `u64::MAX`).
fn finish_until(seq: u64) {
    loop {
        let w = WCUR.with(|c| c.get());
        if w.src >= w.end || w.seq > seq {
            return;
        }
        write_lines(w, w.lines());
    }
}

/// Queue a write; returns its sequence number. Lines per drip are set so that everything
/// pending is written over about one block's drips.
fn queue(dst: usize, src: usize, bytes: usize) -> u64 {
    let seq = WSEQ.with(|c| c.get()) + 1;
    WSEQ.with(|c| c.set(seq));
    let p = Pend {
        dst,
        src,
        end: src + bytes,
        seq,
    };
    if WN.with(|c| c.get()) == WQ {
        let w = WCUR.with(|c| c.get());
        finish_until(w.seq);
    }
    let cur = WCUR.with(|c| c.get());
    WON.with(|c| c.set(true));
    if cur.src >= cur.end {
        WCUR.with(|c| c.set(p));
    } else {
        let n = WN.with(|c| c.get());
        let mut more = WMORE.with(|c| c.get());
        more[n] = p;
        WMORE.with(|c| c.set(more));
        WN.with(|c| c.set(n + 1));
    }
    let n = WN.with(|c| c.get());
    let pending: usize = WCUR.with(|c| c.get()).lines()
        + WMORE.with(|c| c.get())[..n]
            .iter()
            .map(Pend::lines)
            .sum::<usize>();
    let calls = BLOCK_CALLS.with(|c| c.get()).max(1);
    WPER.with(|c| c.set(pending.div_ceil(calls).max(1)));
    seq
}

/// One output segment written block by block *behind* the computation (see [`Out::behind`]):
/// each block is computed into one of two scratch buffers, and with streaming its whole
/// lines are queued and written a few at a time by the following [`drip`]s, so the stores
/// overlap the next block's arithmetic instead of stalling the core in one burst.
pub struct Behind<'s> {
    out: Out,
    seg: *mut f32,
    len: usize,
    bufs: [ABuf; 2],
    cur: usize,
    /// The sequence number of each buffer's last queued write (0: none).
    last: [u64; 2],
    _seg: std::marker::PhantomData<&'s mut [f32]>,
}

impl Behind<'_> {
    /// Compute the `len` floats at `offset` of the segment with `f`: straight into the
    /// segment without streaming; otherwise into a scratch buffer (whose previous write is
    /// finished first), then its unaligned ends are copied and its lines queued.
    pub fn produce(&mut self, offset: usize, len: usize, f: impl FnOnce(&mut [f32])) {
        assert!(
            offset + len <= self.len,
            "Behind::produce: past the segment"
        );
        // SAFETY: in bounds (asserted); the segment is exclusively borrowed for the scope, and
        // no queued write of this `Behind` targets memory this call hands out: without
        // streaming nothing is queued, and with it only scratch is handed to `f`.
        let dst = unsafe { std::slice::from_raw_parts_mut(self.seg.add(offset), len) };
        if !self.out.stream {
            f(dst);
            return;
        }
        if !self.out.queue {
            let buf = &mut self.bufs[0][..len];
            f(buf);
            self.out.write(dst, buf);
            return;
        }
        assert!(
            len <= self.bufs[0].len(),
            "Behind::produce: block larger than its scratch"
        );
        finish_until(self.last[self.cur]);
        let buf = &mut self.bufs[self.cur][..len];
        f(buf);
        let head = dst.as_ptr().align_offset(64).min(len);
        let body = (len - head) / 16 * 16;
        dst[..head].copy_from_slice(&buf[..head]);
        dst[head + body..].copy_from_slice(&buf[head + body..]);
        if body > 0 {
            let (d, s) = (
                dst[head..].as_mut_ptr() as usize,
                buf[head..].as_ptr() as usize,
            );
            self.last[self.cur] = queue(d, s, 4 * body);
        }
        self.cur ^= 1;
    }
}

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
            _seg: std::marker::PhantomData,
        };
        let _finish = Finish(self);
        f(&mut b)
    }

    /// Order this thread's non-temporal stores before anything it does next (an `sfence`);
    /// a no-op when not streaming.
    pub fn fence(self) {
        #[cfg(target_arch = "x86_64")]
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

/// A zero-initialised f32 buffer aligned to 64 bytes (one cache line, one AVX-512 vector), used
/// as a slice (`Deref<Target = [f32]>`). Full-vector loads from rows that start off a line
/// boundary split across two lines: [`super::gemm::gemm_nt`] runs at about 55% of peak on
/// misaligned operands against about 80% aligned (`examples/gemm_micro.rs`, `SHIFT`). Buffers
/// of at least 4 MiB are also aligned to 2 MiB and advised as transparent huge pages (Linux
/// `madvise`, best effort) before their first touch, the zeroing: streaming through gigabytes
/// of 4 KiB pages costs TLB misses. (Before this, the allocator's own zeroing
/// touched the pages first and nothing was on huge pages; with them, non-causal (2,2)
/// forward+backward at N = 2^20, two threads, `examples/timing.rs`, runs 2–4% faster in
/// alternated runs.)
pub struct ABuf {
    ptr: std::ptr::NonNull<f32>,
    len: usize,
}

// SAFETY: `ABuf` owns its allocation exclusively, like `Vec<f32>`.
unsafe impl Send for ABuf {}
// SAFETY: shared access only hands out `&[f32]`.
unsafe impl Sync for ABuf {}

impl ABuf {
    fn layout(len: usize) -> std::alloc::Layout {
        let bytes = (len * 4).max(64);
        let align = if bytes >= HUGE_MIN { HUGE } else { 64 };
        std::alloc::Layout::from_size_align(bytes, align).expect("ABuf: size overflow")
    }

    /// `len` zeros.
    pub fn zeroed(len: usize) -> Self {
        let layout = Self::layout(len);
        // The allocator's own zeroing would touch every page before `madvise` (for alignments
        // above 16 `alloc_zeroed` is `alloc` then a memset), leaving 4 KiB pages: allocate,
        // advise, then zero, so the zeroing is the first touch.
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc(layout) } as *mut f32;
        let Some(ptr) = std::ptr::NonNull::new(raw) else {
            std::alloc::handle_alloc_error(layout)
        };
        advise_huge(raw as usize, len * 4);
        // SAFETY: `raw` is valid for `len` f32 writes (the layout holds at least `4·len` bytes).
        unsafe { std::ptr::write_bytes(raw, 0, len) };
        ABuf { ptr, len }
    }

    /// A copy of `x`.
    pub fn from_slice(x: &[f32]) -> Self {
        let mut b = Self::zeroed(x.len());
        b.copy_from_slice(x);
        b
    }
}

impl std::ops::Deref for ABuf {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        // SAFETY: `ptr` points to `len` initialised f32 owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for ABuf {
    fn deref_mut(&mut self) -> &mut [f32] {
        // SAFETY: as in `deref`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for ABuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with exactly this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr() as *mut u8, Self::layout(self.len)) }
    }
}

impl Clone for ABuf {
    fn clone(&self) -> Self {
        Self::from_slice(self)
    }
}

impl std::fmt::Debug for ABuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ABuf({} floats)", self.len)
    }
}

/// Buffers of at least this many bytes are advised as huge pages and aligned to [`HUGE`].
const HUGE_MIN: usize = 4 << 20;
/// A transparent huge page (x86-64: 2 MiB).
const HUGE: usize = 2 << 20;

/// Advise `[addr, addr + bytes)` (its whole pages) as transparent huge pages, for regions of
/// at least 4 MiB not yet touched; a failure (THP unavailable) is ignored.
fn advise_huge(addr: usize, bytes: usize) {
    #[cfg(target_os = "linux")]
    if bytes >= HUGE_MIN {
        extern "C" {
            fn madvise(
                addr: *mut std::ffi::c_void,
                len: usize,
                advice: std::ffi::c_int,
            ) -> std::ffi::c_int;
        }
        const MADV_HUGEPAGE: std::ffi::c_int = 14;
        let (start, end) = (addr.next_multiple_of(4096), (addr + bytes) / 4096 * 4096);
        if end > start {
            // SAFETY: `[start, end)` lies inside one live allocation (page-aligned as madvise
            // requires); MADV_HUGEPAGE only changes how its pages are backed, never their
            // contents.
            let _ = unsafe { madvise(start as *mut std::ffi::c_void, end - start, MADV_HUGEPAGE) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (addr, bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drip_walks_every_armed_line_at_the_measured_rate() {
        let (a, b) = (vec![0.0f32; 1000], vec![0.0f32; 64]);
        let lines = |x: &[f32]| {
            let p = x.as_ptr() as usize;
            (p + 4 * x.len() - (p & !63)).div_ceil(64)
        };
        let total = lines(&a) + lines(&b);
        // First block: no count yet, so everything in one drip.
        let mut ahead = Ahead::new(&[&a, &[], &b]);
        assert_eq!(PER.with(|c| c.get()), total.max(1));
        for _ in 0..9 {
            ahead.step();
        }
        assert_eq!(CUR.with(|c| c.get()), (0, 0), "all lines issued");
        drop(ahead);
        // Second block: 9 drips last time. A drip ends at the end of a range.
        let mut ahead = Ahead::new(&[&a, &b]);
        let per = total.div_ceil(9);
        assert_eq!(PER.with(|c| c.get()), per);
        let mut calls = 0;
        while CUR.with(|c| c.get()) != (0, 0) {
            ahead.step();
            calls += 1;
            assert!(calls <= total, "the walk ends");
        }
        assert_eq!(calls, lines(&a).div_ceil(per) + lines(&b).div_ceil(per));
        assert_eq!(LEFT.with(|c| c.get()), 0);
        drop(ahead);
        assert_eq!(CUR.with(|c| c.get()), (0, 0));
    }

    #[test]
    fn write_behind_writes_every_block_exactly() {
        // Four segments written behind at once (up to 8 queued writes: the queue overflows),
        // blocks of an odd length at several alignments, a few drips between blocks; then
        // every value is in place and nothing around the segments is touched.
        let (blocks, len) = (7usize, 101usize);
        let value = |s: usize, i: usize| (s * 10_000 + i) as f32;
        let fill = |b: &mut Behind<'_>, s: usize, blk: usize| {
            b.produce(blk * len, len, |x| {
                for (j, v) in x.iter_mut().enumerate() {
                    *v = value(s, blk * len + j);
                }
            });
            for _ in 0..blk % 3 {
                drip();
            }
        };
        for (stream, queue) in [(false, false), (true, false), (true, true)] {
            for off in [0usize, 3, 16] {
                let out = Out { stream, queue };
                let mut segs: Vec<Vec<f32>> =
                    (0..4).map(|_| vec![-1.0; off + blocks * len + 5]).collect();
                let [s0, s1, s2, s3] = &mut segs[..] else {
                    unreachable!()
                };
                let r = off..off + blocks * len;
                let (r0, r1, r2, r3) = (r.clone(), r.clone(), r.clone(), r.clone());
                out.behind(&mut s0[r0], len, |b0| {
                    out.behind(&mut s1[r1], len, |b1| {
                        out.behind(&mut s2[r2], len, |b2| {
                            out.behind(&mut s3[r3], len, |b3| {
                                for blk in 0..blocks {
                                    fill(b0, 0, blk);
                                    fill(b1, 1, blk);
                                    fill(b2, 2, blk);
                                    fill(b3, 3, blk);
                                }
                            })
                        })
                    })
                });
                assert_eq!(WCUR.with(|c| c.get()).lines(), 0, "nothing left pending");
                for (s, seg) in segs.iter().enumerate() {
                    for (i, &x) in seg.iter().enumerate() {
                        let want = if r.contains(&i) {
                            value(s, i - off)
                        } else {
                            -1.0
                        };
                        assert_eq!(x, want, "stream {stream} off {off} segment {s} index {i}");
                    }
                }
            }
        }
    }

    #[test]
    fn streaming_write_is_an_exact_copy_at_any_alignment() {
        let isa = crate::cpu::simd::best_supported();
        let out = Out {
            stream: true,
            queue: true,
        };
        for off in 0..9 {
            for len in (0..40).chain([1000, 1003]) {
                let src: Vec<f32> = (0..len).map(|i| i as f32 * 0.5 + 1.0).collect();
                let mut dst = vec![-7.0f32; off + len + 9];
                out.write(&mut dst[off..off + len], &src);
                out.fence();
                assert_eq!(&dst[off..off + len], &src[..], "off {off} len {len}");
                assert!(dst[..off]
                    .iter()
                    .chain(&dst[off + len..])
                    .all(|&x| x == -7.0));
            }
        }
        // The policy streams only large outputs, and only with vector stores.
        assert!(!Out::for_len(isa, 1000).stream);
        assert!(!Out::for_len(Isa::SCALAR, STREAM_MIN_BYTES).stream);
        assert_eq!(
            Out::for_len(isa, STREAM_MIN_BYTES / 4).stream,
            isa != Isa::SCALAR
        );
    }

    /// Bytes of transparent huge pages backing the mapping that holds `addr`, from
    /// `/proc/self/smaps`; `None` where that file is not readable.
    #[cfg(target_os = "linux")]
    fn huge_bytes_at(addr: usize) -> Option<usize> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut inside = false;
        for line in smaps.lines() {
            let head = line.split_whitespace().next().unwrap_or("");
            if let Some((a, b)) = head.split_once('-') {
                if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                {
                    inside = (a..b).contains(&addr);
                    continue;
                }
            }
            if inside {
                if let Some(kb) = line.strip_prefix("AnonHugePages:") {
                    // "AnonHugePages:  2048 kB", as `provenance::peak_rss_bytes` reads VmHWM.
                    let kb = kb.split_whitespace().next()?.parse::<usize>().ok()?;
                    return Some(kb * 1024);
                }
            }
        }
        None
    }

    #[test]
    fn large_buffers_are_zeroed_aligned_and_backed_by_huge_pages() {
        let len = 16 << 20; // 64 MiB of f32
        let b = ABuf::zeroed(len);
        assert_eq!(
            b.as_ptr() as usize % HUGE,
            0,
            "large buffers start on a huge page"
        );
        assert!(b.iter().all(|&x| x == 0.0));
        assert_eq!(ABuf::zeroed(100).as_ptr() as usize % 64, 0);
        #[cfg(target_os = "linux")]
        {
            let mode = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
                .unwrap_or_default();
            if !(mode.contains("[always]") || mode.contains("[madvise]")) {
                eprintln!(
                    "skipped: transparent huge pages are off here ({})",
                    mode.trim()
                );
                return;
            }
            let fallbacks = || {
                std::fs::read_to_string("/proc/vmstat").ok().and_then(|s| {
                    s.lines()
                        .find_map(|l| l.strip_prefix("thp_fault_fallback "))
                        .and_then(|x| x.trim().parse::<u64>().ok())
                })
            };
            let before = fallbacks();
            let b = ABuf::zeroed(len);
            let after = fallbacks();
            let Some(huge) = huge_bytes_at(b.as_ptr() as usize) else {
                eprintln!("skipped: /proc/self/smaps not readable");
                return;
            };
            if huge == 0 && before != after {
                eprintln!("skipped: the kernel fell back to 4 KiB pages (memory fragmented)");
                return;
            }
            // Before the fix the allocator's zeroing touched every page before `madvise`: 0 here.
            assert!(
                huge >= len * 4 / 2,
                "only {huge} bytes of 64 MiB on huge pages"
            );
        }
    }
}
