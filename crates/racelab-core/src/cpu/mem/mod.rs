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

mod abuf;
mod out;

pub use abuf::ABuf;
#[cfg(test)]
use abuf::HUGE;
pub use out::Out;
#[cfg(test)]
pub(crate) use out::STREAM_MIN_BYTES;

/// The next block's input rows, prefetched a few lines at a time by the [`drip`]s of the
/// current block. Creating one arms this thread's drip with the rows and ends the previous
/// block: the number of drips that block made sets how many lines each drip of this one
/// prefetches, so the lines are spread evenly over the whole block. Dropping it disarms the
/// drip.
///
/// Why: one core reads about 35 GB/s here, about what the kernels need at `(2, 2)`, so the
/// reads must overlap the arithmetic. The hardware prefetchers follow the kernels' reads
/// (several rows at once) poorly, and a burst of hundreds of software prefetches fills the
/// line-fill buffers and stalls the core until they drain; a few lines per drip do neither.
/// The same drips also stream queued output blocks ([`Behind`], [`Out::queued`]) for the
/// non-causal passes of banks of at most 16 features, where the output stores are the
/// largest cost left (`docs/performance.md`).
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
        // (Miri has no prefetch: there the walk only keeps its count.)
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        // SAFETY: a prefetch hint never faults and has no architectural effect; the address
        // is not dereferenced. (SSE is part of the x86-64 baseline.)
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                std::ptr::without_provenance::<i8>(p),
            )
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
/// line-aligned), queued by [`Behind::produce`] as write number `seq`. Pointers, not
/// addresses, so that the accesses keep the provenance of the slices they came from.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pend {
    dst: *mut u8,
    src: *const u8,
    end: *const u8,
    seq: u64,
}

impl Pend {
    const NONE: Pend = Pend {
        dst: std::ptr::null_mut(),
        src: std::ptr::null(),
        end: std::ptr::null(),
        seq: 0,
    };
    fn lines(&self) -> usize {
        (self.end.addr() - self.src.addr()) / 64
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
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        unsafe {
            use std::arch::x86_64::{_mm_loadu_ps, _mm_stream_ps};
            let (d, s) = (w.dst as *mut f32, w.src as *const f32);
            for j in 0..4 {
                _mm_stream_ps(d.add(4 * j), _mm_loadu_ps(s.add(4 * j)));
            }
        }
        #[cfg(any(not(target_arch = "x86_64"), miri))]
        // SAFETY: as above (plain copies where there are no streaming stores, and under Miri,
        // which checks these accesses but has no streaming stores).
        unsafe {
            std::ptr::copy_nonoverlapping(w.src, w.dst, 64)
        };
        w.dst = w.dst.wrapping_add(64);
        w.src = w.src.wrapping_add(64);
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
fn queue(dst: *mut u8, src: *const u8, bytes: usize) -> u64 {
    let seq = WSEQ.with(|c| c.get()) + 1;
    WSEQ.with(|c| c.set(seq));
    let p = Pend {
        dst,
        src,
        end: src.wrapping_add(bytes),
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
    /// The end of the segment's floats handed out so far: a range handed out next starts at
    /// or after it, so it never overlaps a write still queued.
    next: usize,
    _seg: std::marker::PhantomData<&'s mut [f32]>,
}

impl Behind<'_> {
    /// Compute the `len` floats at `offset` of the segment with `f`: straight into the
    /// segment without streaming; otherwise into a scratch buffer (whose previous write is
    /// finished first), then its unaligned ends are copied and its lines queued. Offsets
    /// increase: a range that starts before the end of one already handed out panics.
    pub fn produce(&mut self, offset: usize, len: usize, f: impl FnOnce(&mut [f32])) {
        let what = "Behind::produce: past the segment";
        crate::cpu::extent::assert_range(offset, len, self.len, what);
        assert!(
            offset >= self.next,
            "Behind::produce: {offset} is before {}, the end of a range already handed out",
            self.next
        );
        self.next = offset + len;
        // SAFETY: in bounds (asserted, without wrapping); the segment is exclusively borrowed
        // for the scope, and no queued write of this `Behind` targets memory this call hands
        // out: every queued write lies below `next` as it was before this call, which this
        // range starts at or after (asserted).
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
                dst[head..].as_mut_ptr() as *mut u8,
                buf[head..].as_ptr() as *const u8,
            );
            self.last[self.cur] = queue(d, s, 4 * body);
        }
        self.cur ^= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::simd::Isa;

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
    #[cfg_attr(miri, ignore = "64 MiB buffers and /proc/self/smaps: not under Miri")]
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
