//! The layout every soft-RACE backend shares: a bank's row width, the f32 block a long sum
//! flushes into f64, and the segments the token axis is split into.
//!
//! A bank holds, per feature, one row `[B_f | A_f]` of width `w = bank_width(dv)`: the value
//! sums and, in column `dv`, the mass, padded with zeros to whole 16-float (64-byte) vectors.
//! Long sums add [`FLUSH`] tokens in f32, then move them into f64
//! (`proofs-notes/long-sums.md`). A head's tokens are split into contiguous segments
//! ([`plan_segments`]) whose totals start from exclusive f64 scans: the CPU kernels and the
//! distributed backend use the same plan, so their sums round alike.

/// Row width of a bank for values of width `dv`: `dv + 1` rounded up to a multiple of 16
/// (defined with the memory model, which counts these rows).
pub use crate::memory::bank_width;

/// Values in one bank of `m` rows for values of width `dv` (`m · bank_width(dv)`), computed
/// without wrapping: `None` past `usize`.
pub fn bank_len(m: usize, dv: usize) -> Option<usize> {
    dv.checked_add(1)
        .and_then(|x| x.checked_next_multiple_of(16))
        .and_then(|w| w.checked_mul(m))
}

/// Tokens accumulated in f32 before the block is moved into the f64 base.
pub const FLUSH: usize = 256;

/// Split `n` tokens into contiguous segments `[(start, end)]` so that heads × segments keeps
/// every thread busy (one segment per head when there are at least twice as many heads as
/// threads; no segment shorter than [`FLUSH`] unless the whole is).
pub fn plan_segments(n: usize, heads: usize) -> Vec<(usize, usize)> {
    let threads = rayon::current_num_threads().max(1);
    let want = if heads >= 2 * threads {
        1
    } else {
        (2 * threads).div_ceil(heads.max(1))
    };
    let segs = want.min(n.div_ceil(FLUSH)).max(1);
    let len = n.div_ceil(segs);
    (0..segs)
        .map(|s| (s * len, ((s + 1) * len).min(n)))
        .filter(|(a, b)| a < b)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::plan_segments;

    /// The segments tile `0..n` in order, none empty, for any head count.
    #[test]
    fn segments_tile_the_tokens() {
        for n in [0usize, 1, 255, 256, 257, 10_000] {
            for heads in [1usize, 2, 7, 64] {
                let segs = plan_segments(n, heads);
                let mut at = 0;
                for &(a, b) in &segs {
                    assert_eq!(a, at, "n = {n}, heads = {heads}: {segs:?}");
                    assert!(b > a, "n = {n}, heads = {heads}: {segs:?}");
                    at = b;
                }
                assert_eq!(at, n, "n = {n}, heads = {heads}: {segs:?}");
            }
        }
    }
}
