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

use crate::backend::{ForwardInputs, Heads};
use crate::cpu::features::FeatureMap;
use crate::cpu::saved::{exclusive_scan, finish_row, Ctx, ForwardOut};
use crate::cpu::simd::{dispatch, Isa, Kernel, Simd, Token};
use crate::cpu::state::{bank_width, ext_buffer, plan_segments, split_out, Bank, KeyTotals};
use rayon::prelude::*;

struct TotalsTask<'a, F> {
    map: &'a F,
    k: Heads<'a>,
    v: Heads<'a>,
    h: usize,
    range: (usize, usize),
}

impl<F: FeatureMap> Kernel for TotalsTask<'_, F> {
    type Output = Vec<f64>;
    #[inline(always)]
    fn run<T: Token>(self, t: T) -> Vec<f64> {
        let simd = t.rows();
        let (m, dv) = (self.map.width(), self.v.cols);
        let mut bank = Bank::new(m, bank_width(dv), None);
        let mut phi = vec![0.0f32; m];
        let mut ext = ext_buffer(dv);
        for j in self.range.0..self.range.1 {
            self.map
                .features(simd, self.k.row(self.h, j), true, &mut phi);
            ext[..dv].copy_from_slice(self.v.row(self.h, j));
            bank.add(simd, &phi, 1.0, &ext);
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
    /// [`crate::shared::recompute::den_floor`] for this map and the number of keys.
    floor: f32,
}

impl<F: FeatureMap> Kernel for ReadTask<'_, F> {
    type Output = usize;
    #[inline(always)]
    fn run<T: Token>(self, t: T) -> usize {
        let simd = t.rows();
        let m = self.map.width();
        let (dv, w) = (self.dv, bank_width(self.dv));
        let mut phi = vec![0.0f32; m];
        let mut acc = vec![0.0f32; w];
        let mut empty = 0;
        for (t, i) in (self.range.0..self.range.1).enumerate() {
            self.map
                .features(simd, self.q.row(self.h, i), false, &mut phi);
            acc.iter_mut().for_each(|a| *a = 0.0);
            for (f, &p) in phi.iter().enumerate() {
                if p != 0.0 {
                    simd.axpy(&mut acc, p, &self.bank[f * w..(f + 1) * w]);
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

impl<F: FeatureMap> Kernel for CausalTask<'_, F> {
    type Output = usize;
    #[inline(always)]
    fn run<T: Token>(self, t: T) -> usize {
        let simd = t.rows();
        let (m, dv) = (self.map.width(), self.v.cols);
        let mut bank = Bank::new(m, bank_width(dv), Some(self.base));
        let mut phi = vec![0.0f32; m];
        let mut ext = ext_buffer(dv);
        let mut acc = vec![0.0f32; bank_width(dv)];
        let mut empty = 0;
        for (t, i) in (self.range.0..self.range.1).enumerate() {
            self.map
                .features(simd, self.k.row(self.h, i), true, &mut phi);
            ext[..dv].copy_from_slice(self.v.row(self.h, i));
            bank.add(simd, &phi, 1.0, &ext);
            self.map
                .features(simd, self.q.row(self.h, i), false, &mut phi);
            bank.read(simd, &phi, &mut acc);
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
    let x = ForwardInputs::new(q, k, v);
    let (empty_rows, ctx) = forward_into(map, x, causal, isa, &mut o, Vec::new());
    ForwardOut { o, empty_rows, ctx }
}

/// [`forward`] writing into a caller's `o` (`[heads, n, dv]`) and reusing `den`'s allocation,
/// so repeated calls (benchmarks, training loops) do not pay page faults for fresh buffers.
/// Returns the empty-row count and the context. Soft RACE's flagged rows are recomputed
/// exactly ([`crate::shared::recompute`]); other maps' flagged rows are zero and counted as empty.
pub fn forward_into<F: FeatureMap>(
    map: &F,
    x: ForwardInputs,
    causal: bool,
    isa: Isa,
    o: &mut [f32],
    den: Vec<f32>,
) -> (usize, Ctx) {
    let (flagged, mut ctx) = engine_forward(map, x, causal, isa, o, den);
    match map.as_soft() {
        Some(soft) => {
            let empty =
                crate::cpu::recompute::finish_forward(soft, x, causal, flagged, o, &mut ctx);
            (empty, ctx)
        }
        None => (flagged, ctx),
    }
}

/// The per-token engine itself: flagged rows are zero and counted.
fn engine_forward<F: FeatureMap>(
    map: &F,
    x: ForwardInputs,
    causal: bool,
    isa: Isa,
    o: &mut [f32],
    mut den: Vec<f32>,
) -> (usize, Ctx) {
    let ForwardInputs { q, k, v } = x;
    let (heads, n, dv) = (q.heads, q.n, v.cols);
    assert_eq!(
        o.len(),
        heads * n * dv,
        "forward_into: o has the wrong length"
    );
    let m = map.width();
    let floor = crate::shared::recompute::den_floor(m, k.n);
    let segs = plan_segments(k.n.max(n), heads);
    den.resize(heads * n, 0.0);
    if !causal {
        let banks = key_banks(map, k, v, isa);
        let qseg = plan_segments(n, heads);
        let keys = KeyTotals {
            banks: &banks,
            dv,
            floor,
        };
        let empty = read_banks(map, isa, q, keys, &qseg, (o, &mut den));
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

/// Non-causal pass 2: `o_i = num_i/den_i` from the per-head banks into `o` (`[heads, n, dv]`)
/// and `den` (`[heads, n]`) over the query segments `segs`; returns the flagged rows
/// (denominator below the keys' floor, see [`finish_row`]).
pub fn read_banks<F: FeatureMap>(
    map: &F,
    isa: Isa,
    q: Heads,
    keys: KeyTotals,
    segs: &[(usize, usize)],
    (o, den): (&mut [f32], &mut [f32]),
) -> usize {
    let KeyTotals { banks, dv, floor } = keys;
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
