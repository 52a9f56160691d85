//! The fast forward engine for every "features, then sums over keys" estimator.
//!
//! Non-causal (two streaming passes): keys build `[B_f | A_f] = Σ_j φ_f(k_j) [v_j, 1]`
//! per (head, segment), reduced in f64; queries read `Σ_f φ_f(q_i) [B_f | A_f] = [num | den]`.
//!
//! Causal (chunked scan, Algorithm 2): (1) per-segment totals, (2) an exclusive f64 scan over
//! segments, (3) per segment, tokens in order: add the key, then read with the query (token t
//! sees itself). With at least twice as many heads as threads there is one segment per head
//! and step (1) is skipped.
//!
//! State per (head, segment) is one bank of `m × bank_width(dv)` numbers; no `N × m × d` array is
//! ever formed. A row with denominator 0 is 0 and counted.

use super::features::FeatureMap;
use super::simd::{dispatch, Isa, Simd, WithSimd};
use super::state::{bank_width, ext_buffer, plan_segments, split_out, Bank, Heads};
use rayon::prelude::*;

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
    /// `S = [B | A]` entering every block of [`super::blocked_causal::TB`] tokens
    /// (`[heads, ⌈n/TB⌉, m·w]`: chunk-boundary states, `m·w/TB` floats per token), so the
    /// backward rebuilds prefix states from the nearest block start in a single reverse pass.
    /// Empty otherwise (the backward then takes two passes).
    pub states: Vec<f32>,
    /// The rows the kernel flagged (denominator below [`super::recompute::den_floor`]) and
    /// [`super::recompute`] finished exactly; the backward adds their exact share.
    pub recomputed: super::recompute::Recomputed,
}

impl Ctx {
    /// This context's buffers, resized for a forward over `q`, `k` with `map`'s `L·P`:
    /// the denominators and the saved `u` of queries and keys (contents are overwritten).
    pub(crate) fn recycle(
        self,
        map: &super::SoftMap,
        q: &Heads,
        k: &Heads,
    ) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let lp = map.planes.l * map.planes.p;
        let (mut den, mut uq, mut uk) = (self.den, self.uq, self.uk);
        den.resize(q.heads * q.n, 0.0);
        uq.resize(q.heads * q.n * lp, 0.0);
        uk.resize(k.heads * k.n * lp, 0.0);
        (den, uq, uk)
    }

    /// Floats per token and head the production forwards keep: the denominator, the saved
    /// `u` of queries and keys (`L·P` each) and, causal, the block-start states
    /// ([`Ctx::states`], `m·w` per block of [`super::blocked_causal::TB`] tokens; at most,
    /// since they are kept only with one segment per head).
    pub fn floats_per_token(l: usize, p: usize, dv: usize, causal: bool) -> f64 {
        let (m, w) = ((l << p) as f64, super::state::bank_width(dv) as f64);
        let states = if causal {
            m * w / super::blocked_causal::TB as f64
        } else {
            0.0
        };
        1.0 + 2.0 * (l * p) as f64 + states
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

struct TotalsTask<'a, F> {
    map: &'a F,
    k: Heads<'a>,
    v: Heads<'a>,
    h: usize,
    range: (usize, usize),
}

impl<F: FeatureMap> WithSimd for TotalsTask<'_, F> {
    type Output = Vec<f64>;
    #[inline(always)]
    fn run<S: Simd>(self) -> Vec<f64> {
        let (m, dv) = (self.map.width(), self.v.cols);
        let mut bank = Bank::new(m, bank_width(dv), None);
        let mut phi = vec![0.0f32; m];
        let mut ext = ext_buffer(dv);
        for j in self.range.0..self.range.1 {
            self.map
                .features::<S>(self.k.row(self.h, j), true, &mut phi);
            ext[..dv].copy_from_slice(self.v.row(self.h, j));
            bank.add::<S>(&phi, 1.0, &ext);
            bank.tick();
        }
        bank.total()
    }
}

/// `Σ_j φ(k_j) [v_j, 1]` over `range` of head `h`, in f64.
fn bank_total<F: FeatureMap>(
    isa: Isa,
    map: &F,
    k: Heads,
    v: Heads,
    h: usize,
    range: (usize, usize),
) -> Vec<f64> {
    dispatch(
        isa,
        TotalsTask {
            map,
            k,
            v,
            h,
            range,
        },
    )
}

struct ReadTask<'a, F> {
    map: &'a F,
    dv: usize,
    q: Heads<'a>,
    h: usize,
    range: (usize, usize),
    bank: &'a [f32],
    o: &'a mut [f32],
    den: &'a mut [f32],
    /// [`super::recompute::den_floor`] for this map and the number of keys.
    floor: f32,
}

/// `o = num/den` for one row; or zeros and `den = 0` for a row whose `den` is below `floor`
/// ([`super::recompute::den_floor`]) or not finite: the row is *flagged* (returns true), for
/// [`super::recompute`] to finish or the caller to report.
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

impl<F: FeatureMap> WithSimd for ReadTask<'_, F> {
    type Output = usize;
    #[inline(always)]
    fn run<S: Simd>(self) -> usize {
        let m = self.map.width();
        let (dv, w) = (self.dv, bank_width(self.dv));
        let mut phi = vec![0.0f32; m];
        let mut acc = vec![0.0f32; w];
        let mut empty = 0;
        for (t, i) in (self.range.0..self.range.1).enumerate() {
            self.map
                .features::<S>(self.q.row(self.h, i), false, &mut phi);
            acc.iter_mut().for_each(|a| *a = 0.0);
            for (f, &p) in phi.iter().enumerate() {
                if p != 0.0 {
                    S::axpy(&mut acc, p, &self.bank[f * w..(f + 1) * w]);
                }
            }
            empty += finish_row(
                &acc,
                &mut self.o[t * dv..(t + 1) * dv],
                &mut self.den[t],
                self.map.den_scale(),
                self.floor,
            ) as usize;
        }
        empty
    }
}

struct CausalTask<'a, F> {
    map: &'a F,
    q: Heads<'a>,
    k: Heads<'a>,
    v: Heads<'a>,
    h: usize,
    range: (usize, usize),
    base: &'a [f64],
    o: &'a mut [f32],
    den: &'a mut [f32],
    floor: f32,
}

impl<F: FeatureMap> WithSimd for CausalTask<'_, F> {
    type Output = usize;
    #[inline(always)]
    fn run<S: Simd>(self) -> usize {
        let (m, dv) = (self.map.width(), self.v.cols);
        let mut bank = Bank::new(m, bank_width(dv), Some(self.base));
        let mut phi = vec![0.0f32; m];
        let mut ext = ext_buffer(dv);
        let mut acc = vec![0.0f32; bank_width(dv)];
        let mut empty = 0;
        for (t, i) in (self.range.0..self.range.1).enumerate() {
            self.map
                .features::<S>(self.k.row(self.h, i), true, &mut phi);
            ext[..dv].copy_from_slice(self.v.row(self.h, i));
            bank.add::<S>(&phi, 1.0, &ext);
            self.map
                .features::<S>(self.q.row(self.h, i), false, &mut phi);
            bank.read::<S>(&phi, &mut acc);
            empty += finish_row(
                &acc,
                &mut self.o[t * dv..(t + 1) * dv],
                &mut self.den[t],
                self.map.den_scale(),
                self.floor,
            ) as usize;
            bank.tick();
        }
        empty
    }
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

/// Run the forward pass of `map` on `[heads, n, d]` inputs.
pub fn forward<F: FeatureMap>(
    map: &F,
    q: Heads,
    k: Heads,
    v: Heads,
    causal: bool,
    isa: Isa,
) -> ForwardOut {
    let mut o = vec![0.0f32; q.heads * q.n * v.cols];
    let (empty_rows, ctx) = forward_into(map, q, k, v, causal, isa, &mut o, Vec::new());
    ForwardOut { o, empty_rows, ctx }
}

/// [`forward`] writing into a caller's `o` (`[heads, n, dv]`) and reusing `den`'s allocation,
/// so repeated calls (benchmarks, training loops) do not pay page faults for fresh buffers.
/// Returns the empty-row count and the context. Soft RACE's flagged rows are recomputed
/// exactly ([`super::recompute`]); other maps' flagged rows are zero and counted as empty.
#[allow(clippy::too_many_arguments)]
pub fn forward_into<F: FeatureMap>(
    map: &F,
    q: Heads,
    k: Heads,
    v: Heads,
    causal: bool,
    isa: Isa,
    o: &mut [f32],
    den: Vec<f32>,
) -> (usize, Ctx) {
    let (flagged, mut ctx) = engine_forward(map, q, k, v, causal, isa, o, den);
    match map.as_soft() {
        Some(soft) => {
            let empty =
                super::recompute::finish_forward(soft, q, k, v, causal, flagged, o, &mut ctx);
            (empty, ctx)
        }
        None => (flagged, ctx),
    }
}

/// The per-token engine itself: flagged rows are zero and counted.
#[allow(clippy::too_many_arguments)]
fn engine_forward<F: FeatureMap>(
    map: &F,
    q: Heads,
    k: Heads,
    v: Heads,
    causal: bool,
    isa: Isa,
    o: &mut [f32],
    mut den: Vec<f32>,
) -> (usize, Ctx) {
    let (heads, n, dv) = (q.heads, q.n, v.cols);
    assert_eq!(
        o.len(),
        heads * n * dv,
        "forward_into: o has the wrong length"
    );
    let m = map.width();
    let floor = super::recompute::den_floor(m, k.n);
    let segs = plan_segments(k.n.max(n), heads);
    den.resize(heads * n, 0.0);
    if !causal {
        let banks = key_banks(map, k, v, isa);
        let qseg = plan_segments(n, heads);
        let empty = read_banks(map, q, &banks, dv, &qseg, o, &mut den, isa, floor);
        return (
            empty,
            Ctx {
                causal,
                segs: qseg,
                banks,
                den,
                uq: Vec::new(),
                uk: Vec::new(),
                states: Vec::new(),
                recomputed: Default::default(),
            },
        );
    }
    let totals: Vec<Vec<f64>> = if segs.len() > 1 {
        (0..heads * segs.len())
            .into_par_iter()
            .map(|i| bank_total(isa, map, k, v, i / segs.len(), segs[i % segs.len()]))
            .collect()
    } else {
        vec![vec![0.0; m * bank_width(dv)]; heads]
    };
    let bases = exclusive_scan(&totals, heads, segs.len(), false);
    let opieces = split_out(o, n, dv, &segs);
    let dpieces = split_out(&mut den, n, 1, &segs);
    let empty: usize = opieces
        .into_par_iter()
        .zip(dpieces.into_par_iter())
        .map(|((h, s, op), (_, _, dp))| {
            dispatch(
                isa,
                CausalTask {
                    map,
                    q,
                    k,
                    v,
                    h,
                    range: segs[s],
                    base: &bases[h * segs.len() + s],
                    o: op,
                    den: dp,
                    floor,
                },
            )
        })
        .sum();
    (
        empty,
        Ctx {
            uq: Vec::new(),
            uk: Vec::new(),
            states: Vec::new(),
            recomputed: Default::default(),
            causal,
            segs,
            banks: bases,
            den,
        },
    )
}

/// Non-causal pass 1: `[B | A] = Σ_j φ(k_j)[v_j, 1]` per head (f64), parallel over segments.
pub fn key_banks<F: FeatureMap>(map: &F, k: Heads, v: Heads, isa: Isa) -> Vec<Vec<f64>> {
    let (heads, m, dv) = (k.heads, map.width(), v.cols);
    let kseg = plan_segments(k.n, heads);
    let parts: Vec<Vec<f64>> = (0..heads * kseg.len())
        .into_par_iter()
        .map(|i| bank_total(isa, map, k, v, i / kseg.len(), kseg[i % kseg.len()]))
        .collect();
    parts
        .chunks(kseg.len())
        .map(|c| {
            c.iter()
                .fold(vec![0.0f64; m * bank_width(dv)], |mut acc, p| {
                    acc.iter_mut().zip(p).for_each(|(a, b)| *a += b);
                    acc
                })
        })
        .collect()
}

/// Non-causal pass 2: `o_i = num_i/den_i` from the per-head banks; returns the flagged rows
/// (denominator below `floor`, see [`finish_row`]).
#[allow(clippy::too_many_arguments)]
pub fn read_banks<F: FeatureMap>(
    map: &F,
    q: Heads,
    banks: &[Vec<f64>],
    dv: usize,
    segs: &[(usize, usize)],
    o: &mut [f32],
    den: &mut [f32],
    isa: Isa,
    floor: f32,
) -> usize {
    let n = q.n;
    let banks32: Vec<Vec<f32>> = banks
        .iter()
        .map(|b| b.iter().map(|&x| x as f32).collect())
        .collect();
    let opieces = split_out(o, n, dv, segs);
    let dpieces = split_out(den, n, 1, segs);
    opieces
        .into_par_iter()
        .zip(dpieces.into_par_iter())
        .map(|((h, s, op), (_, _, dp))| {
            dispatch(
                isa,
                ReadTask {
                    map,
                    dv,
                    q,
                    h,
                    range: segs[s],
                    bank: &banks32[h],
                    o: op,
                    den: dp,
                    floor,
                },
            )
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

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
