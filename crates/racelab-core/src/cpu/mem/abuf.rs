//! 64-byte-aligned buffers ([`ABuf`]), backed by transparent huge pages from [`HUGE_MIN`]
//! bytes on (allocated, advised, then zeroed, so the pages are not touched before the advice).

/// A zero-initialised f32 buffer aligned to 64 bytes (one cache line, one AVX-512 vector), used
/// as a slice (`Deref<Target = [f32]>`). Full-vector loads from rows that start off a line
/// boundary split across two lines: `super::super::gemm::Nt` runs at about 55% of peak on
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
    /// The allocation of `len` floats: `Layout::array` refuses a size past `isize::MAX` bytes
    /// (a panic, "capacity overflow", as `Vec` has), never a smaller allocation.
    fn layout(len: usize) -> std::alloc::Layout {
        let bytes = std::alloc::Layout::array::<f32>(len)
            .expect("ABuf: capacity overflow")
            .size()
            .max(64);
        let align = if bytes >= HUGE_MIN { HUGE } else { 64 };
        std::alloc::Layout::from_size_align(bytes, align).expect("ABuf: capacity overflow")
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
pub(crate) const HUGE_MIN: usize = 4 << 20;
/// A transparent huge page (x86-64: 2 MiB).
pub(crate) const HUGE: usize = 2 << 20;

/// Advise `[addr, addr + bytes)` (its whole pages) as transparent huge pages, for regions of
/// at least 4 MiB not yet touched; a failure (THP unavailable) is ignored.
fn advise_huge(addr: usize, bytes: usize) {
    #[cfg(all(target_os = "linux", not(miri)))]
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
    #[cfg(any(not(target_os = "linux"), miri))]
    let _ = (addr, bytes);
}
