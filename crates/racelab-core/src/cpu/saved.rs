//! What a forward keeps for its backward ([`Ctx`]): segment banks, denominators, the saved
//! `u = tanh(W·)` of queries and keys, block-start states and the recomputed rows; and the
//! per-row finish `o = num/den` with its flag for rows f32 cannot hold.

use crate::backend::Heads;
pub use crate::backend::Recomputed;

/// What the forward pass keeps for the backward pass.
#[derive(Debug, Clone, Default)]
pub struct Ctx {
    pub causal: bool,
    pub segs: Vec<(usize, usize)>,
    /// Non-causal: one total bank per head. Causal: the bank entering each (head, segment),
    /// `heads × segs` of them (chunk-boundary states; never per-token states).
    pub banks: Vec<Vec<f64>>,
    /// Per token: the Algorithm-1 denominator `Den_i` (including the `1/L` for RACE).
    pub den: Vec<f32>,
    /// Saved by the blocked soft-RACE forwards: `u = tanh(W q_i)` and `u = tanh(W k_j)` per
    /// token (`[heads, n, L·P]` each, 4–16 floats per token against `d` for a row of Q), so
    /// the backward neither re-reads Q and K nor projects them again. Empty when not saved
    /// (the per-token engine's forward); the backward then recomputes them from Q and K.
    pub uq: Vec<f32>,
    pub uk: Vec<f32>,
    /// Saved by the blocked causal forward when each head is one segment: the f32 state
    /// `S = [B | A]` entering every block of [`crate::cpu::soft::causal::TB`] tokens
    /// (`[heads, ⌈n/TB⌉, m·w]`: chunk-boundary states, `m·w/TB` floats per token), so the
    /// backward rebuilds prefix states from the nearest block start in a single reverse pass.
    /// Empty otherwise (the backward then takes two passes).
    pub states: Vec<f32>,
    /// The rows the kernel flagged (denominator below [`crate::shared::recompute::den_floor`]) and
    /// [`crate::cpu::recompute`] finished exactly; the backward adds their exact share.
    pub recomputed: Recomputed,
}

/// A forward's recycled buffers ([`Ctx::recycle`]): the denominators (`[heads, n]`) and the
/// saved `u` of the queries and of the keys (`[heads, n, L·P]` each).
#[derive(Debug, Default)]
pub struct Buffers {
    pub den: Vec<f32>,
    pub uq: Vec<f32>,
    pub uk: Vec<f32>,
}

impl Ctx {
    /// This context's buffers, resized for a forward over `q`, `k` with `map`'s `L·P`:
    /// the denominators and the saved `u` of queries and keys (contents are overwritten).
    pub(crate) fn recycle(
        self,
        map: &crate::cpu::features::SoftMap,
        q: &Heads,
        k: &Heads,
    ) -> Buffers {
        let lp = map.planes.l * map.planes.p;
        let (mut den, mut uq, mut uk) = (self.den, self.uq, self.uk);
        den.resize(q.heads * q.n, 0.0);
        uq.resize(q.heads * q.n * lp, 0.0);
        uk.resize(k.heads * k.n * lp, 0.0);
        Buffers { den, uq, uk }
    }

    /// The saved `u` of the queries and of the keys when they match `[heads, n, lp]` for
    /// these inputs, else empty slices (the backward then recomputes the features from Q
    /// and K, so a context from another engine or of another shape is never misread).
    pub(crate) fn saved_u(&self, q: &Heads, k: &Heads, lp: usize) -> (&[f32], &[f32]) {
        let fits = |u: &[f32], x: &Heads| u.len() == x.heads * x.n * lp;
        let uq: &[f32] = if fits(&self.uq, q) { &self.uq } else { &[] };
        let uk: &[f32] = if fits(&self.uk, k) { &self.uk } else { &[] };
        (uq, uk)
    }
}

/// Output of the forward pass.
#[derive(Debug, Clone)]
pub struct ForwardOut {
    pub o: Vec<f32>,
    pub empty_rows: usize,
    pub ctx: Ctx,
}

/// `o = num/den` for one row; or zeros and `den = 0` for a row whose `den` is below `floor`
/// ([`crate::shared::recompute::den_floor`]) or not finite: the row is *flagged* (returns true), for
/// [`crate::cpu::recompute`] to finish or the caller to report.
#[inline(always)]
pub(crate) fn finish_row(
    acc: &[f32],
    o: &mut [f32],
    den: &mut f32,
    den_scale: f32,
    floor: f32,
) -> bool {
    let dv = o.len();
    let d = acc[dv];
    if !(d >= floor && d.is_finite()) {
        o.iter_mut().for_each(|x| *x = 0.0);
        *den = 0.0;
        return true;
    }
    let inv = 1.0 / d;
    for (x, &a) in o.iter_mut().zip(&acc[..dv]) {
        *x = a * inv;
    }
    *den = d * den_scale;
    false
}

/// Exclusive prefix (forward) or suffix (`reverse`) sums of per-segment banks, per head.
pub fn exclusive_scan(
    totals: &[Vec<f64>],
    heads: usize,
    segs: usize,
    reverse: bool,
) -> Vec<Vec<f64>> {
    let len = totals.first().map(|t| t.len()).unwrap_or(0);
    let mut out = vec![Vec::new(); heads * segs];
    for h in 0..heads {
        let mut run = vec![0.0f64; len];
        let order: Vec<usize> = if reverse {
            (0..segs).rev().collect()
        } else {
            (0..segs).collect()
        };
        for s in order {
            out[h * segs + s] = run.clone();
            run.iter_mut()
                .zip(&totals[h * segs + s])
                .for_each(|(r, t)| *r += t);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::finish_row;

    /// A denominator at or above the floor gives `num/den`; one below it (tiny, subnormal,
    /// zero) or not finite is flagged: a zero row and `den = 0`.
    #[test]
    fn finish_row_flags_denominators_below_the_floor() {
        let num = [3.0f32, -1.5, 0.25];
        let floor = 1e-25f32;
        for (scale, kept) in [
            (1.0f32, true),
            (1e-20, true),
            (1e-26, false),
            (1e-40, false),
        ] {
            let acc: Vec<f32> = num.iter().chain(&[2.0]).map(|x| x * scale).collect();
            let (mut o, mut den) = ([9.0f32; 3], 9.0f32);
            assert_eq!(finish_row(&acc, &mut o, &mut den, 0.5, floor), !kept);
            if kept {
                for (got, want) in o.iter().zip([1.5f32, -0.75, 0.125]) {
                    assert!((got - want).abs() <= 1e-6, "scale {scale:e}: {o:?}");
                }
                assert_eq!(den, acc[3] * 0.5);
            } else {
                assert_eq!((o, den), ([0.0; 3], 0.0), "scale {scale:e}");
            }
        }
        for d in [0.0, f32::NAN, f32::INFINITY] {
            let (mut o, mut den) = ([1.0f32; 3], 1.0f32);
            assert!(finish_row(
                &[1.0, 1.0, 1.0, d],
                &mut o,
                &mut den,
                0.5,
                floor
            ));
            assert_eq!((o, den), ([0.0; 3], 0.0));
        }
    }
}
