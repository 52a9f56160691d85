//! Streaming scale mode: forward+backward of soft RACE on inputs generated chunk by chunk
//! from a counter-based generator, so no N-sized array exists and the backward regenerates
//! what it needs. Memory is O(chunk · heads · d + L·R·d).
//!
//! Non-causal only: (1) keys → `[B | A]` per head; (2) per query chunk: `O` from the banks
//! (consumed into a checksum) and, with `G`, `∂ℓ/∂q` and `[dB | dA]`; (3) keys and values
//! regenerated → `∂ℓ/∂k`, `∂ℓ/∂v`. Gradients are consumed into
//! checksums too: the point is throughput and peak memory at 10^8 tokens.

use super::soft::{key_banks, key_grads, query_grads, read_into};
use super::state::plan_segments;
use super::SoftMap;
use crate::backend::{Heads, PlanesF32};
use crate::error::{RaceError, Result};
use crate::hashing::Planes;
use crate::provenance::{peak_rss_bytes, reset_peak_rss};
use rayon::prelude::*;
use serde::Serialize;
use std::time::Instant;

/// Tokens per chunk.
pub const CHUNK: usize = 1 << 15;

/// Result of a streaming run.
#[derive(Debug, Clone, Serialize)]
pub struct StreamReport {
    pub n: usize,
    pub heads: usize,
    pub d: usize,
    pub p: usize,
    pub l: usize,
    pub seconds: f64,
    pub tokens_per_s: f64,
    pub peak_rss_bytes: u64,
    pub chunk: usize,
    pub checksum: f64,
    pub beta: f32,
    pub seed: u64,
    pub provenance: crate::provenance::Provenance,
}

/// `[heads, len, cols]` chunk of the virtual `[heads, n, cols]` tensor `seed`, from token `t0`.
fn gen_chunk(
    buf: &mut Vec<f32>,
    seed: u64,
    heads: usize,
    n: usize,
    t0: usize,
    len: usize,
    cols: usize,
) {
    buf.resize(heads * len * cols, 0.0);
    buf.par_chunks_mut(len * cols)
        .enumerate()
        .for_each(|(h, hb)| {
            crate::bench::machine::fill_run(hb, seed, ((h * n + t0) * cols) as u64);
        });
}

/// Sum of `x` in f64, consuming every element (the run's results feed a checksum so that no
/// work can be skipped). Parallel over fixed pieces of 2^16 elements, each summed with 8
/// independent accumulators, and the pieces added in order: the value does not depend on
/// the number of threads. (A plain sequential sum cost about 0.5 ns per element, more than
/// generating the inputs; measured.)
fn checksum_of(x: &[f32]) -> f64 {
    let parts: Vec<f64> = x
        .par_chunks(1 << 16)
        .map(|c| {
            let mut acc = [0.0f64; 8];
            let mut it = c.chunks_exact(8);
            for v in &mut it {
                for (a, &y) in acc.iter_mut().zip(v) {
                    *a += y as f64;
                }
            }
            let tail: f64 = it.remainder().iter().map(|&y| y as f64).sum();
            acc.iter().sum::<f64>() + tail
        })
        .collect();
    parts.iter().sum()
}

/// Run streaming forward+backward.
#[allow(clippy::too_many_arguments)]
pub fn run(
    n: usize,
    heads: usize,
    d: usize,
    p: usize,
    l: usize,
    beta: f32,
    seed: u64,
    causal: bool,
    progress: &dyn Fn(&str),
) -> Result<StreamReport> {
    if causal {
        return Err(RaceError::param(
            "causal",
            "the streaming mode runs the non-causal operator only; drop --causal",
        ));
    }
    if n == 0 || heads == 0 || d == 0 {
        return Err(RaceError::param("n", "streaming needs N, heads and d ≥ 1"));
    }
    let planes = PlanesF32::from_planes(&Planes::gaussian(l, p, d, seed)?);
    let map = SoftMap {
        planes: &planes,
        beta,
    };
    let dv = d;
    let isa = super::simd::detected_isa();
    let (m, w) = (l << p, super::state::bank_width(dv));
    let (sq, sk, sv, sg) = (seed, seed + 1, seed + 2, seed + 3);
    reset_peak_rss();
    let t = Instant::now();
    let chunks: Vec<(usize, usize)> = (0..n.div_ceil(CHUNK))
        .map(|c| (c * CHUNK, ((c + 1) * CHUNK).min(n)))
        .collect();
    let (mut qb, mut kb, mut vb, mut gb) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut dq, mut dk, mut dvv) = (Vec::new(), Vec::new(), Vec::new());
    let mut checksum = 0.0f64;
    // (1) keys.
    progress("stream: keys → banks");
    let mut banks = vec![vec![0.0f64; m * w]; heads];
    for &(a, b) in &chunks {
        gen_chunk(&mut kb, sk, heads, n, a, b - a, d);
        gen_chunk(&mut vb, sv, heads, n, a, b - a, dv);
        for (tot, part) in banks.iter_mut().zip(key_banks(
            &map,
            isa,
            Heads::new(heads, b - a, d, &kb),
            Heads::new(heads, b - a, dv, &vb),
            &mut [],
        )) {
            tot.iter_mut().zip(&part).for_each(|(x, y)| *x += y);
        }
    }
    // (2) queries → O, and (3) query gradients (O itself is not needed: see `query_grads`).
    progress("stream: queries → O, dQ, [dB | dA]");
    let mut dbanks = vec![vec![0.0f64; m * w]; heads];
    let mut dbeta = 0.0;
    // Output, denominators and the queries' u = tanh(Wq) (saved by the read for the query
    // gradients; keys are regenerated in (4) instead: their u over all N would not be bounded
    // memory), allocated once: the read overwrites them for every chunk.
    let (mut o, mut den, mut uq) = (Vec::new(), Vec::new(), Vec::new());
    for &(a, b) in &chunks {
        let len = b - a;
        gen_chunk(&mut qb, sq, heads, n, a, len, d);
        gen_chunk(&mut gb, sg, heads, n, a, len, dv);
        o.resize(heads * len * dv, 0.0);
        den.resize(heads * len, 0.0);
        uq.resize(heads * len * l * p, 0.0);
        let qh = Heads::new(heads, len, d, &qb);
        let floor = super::recompute::den_floor(m, n);
        let (flagged, segs) =
            read_into(&map, isa, qh, &banks, dv, &mut o, &mut den, &mut uq, floor);
        if flagged > 0 {
            return Err(RaceError::param(
                "beta",
                format!(
                    "{flagged} query rows of tokens {a}..{b} have a denominator below f32's \
                     range at beta = {beta}; the streaming mode keeps no keys to recompute \
                     them exactly: use a smaller --beta, or `racelab attend` (which does)"
                ),
            ));
        }
        checksum += checksum_of(&o);
        dq.resize(heads * len * d, 0.0);
        let (parts, db) = query_grads(
            &map,
            isa,
            &banks,
            &segs,
            &den,
            qh,
            &uq,
            Heads::new(heads, len, dv, &gb),
            &mut dq,
        );
        checksum += checksum_of(&dq);
        dbeta += db;
        for (tot, part) in dbanks.iter_mut().zip(&parts) {
            tot.iter_mut().zip(part).for_each(|(x, y)| *x += y);
        }
    }
    // (4) keys and values → dK, dV.
    progress("stream: keys → dK, dV");
    for &(a, b) in &chunks {
        let len = b - a;
        gen_chunk(&mut kb, sk, heads, n, a, len, d);
        gen_chunk(&mut vb, sv, heads, n, a, len, dv);
        let segs = plan_segments(len, heads);
        let (kh, vh) = (
            Heads::new(heads, len, d, &kb),
            Heads::new(heads, len, dv, &vb),
        );
        dk.resize(heads * len * d, 0.0);
        dvv.resize(heads * len * dv, 0.0);
        let db = key_grads(&map, isa, &dbanks, &segs, kh, &[], vh, &mut dk, &mut dvv);
        dbeta += db;
        checksum += checksum_of(&dk) + checksum_of(&dvv);
    }
    let seconds = t.elapsed().as_secs_f64();
    Ok(StreamReport {
        n,
        heads,
        d,
        p,
        l,
        seconds,
        tokens_per_s: n as f64 / seconds,
        peak_rss_bytes: peak_rss_bytes(),
        chunk: CHUNK,
        checksum: checksum + dbeta,
        beta,
        seed,
        provenance: crate::provenance::Provenance::collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{BackwardInputs, GradsMut};

    /// The streamed pipeline (three passes over chunks, inputs regenerated) against the
    /// in-memory kernels on the same generated tensors: the checksum of o, dq, dk, dv and
    /// ∂ℓ/∂β agrees to f32 rounding. N spans two full chunks and a partial one.
    #[test]
    fn streaming_matches_the_in_memory_kernels() {
        let (n, heads, d, p, l, beta, seed) = (2 * CHUNK + 1234, 2, 16, 2, 2, 4.0f32, 11);
        let rep = run(n, heads, d, p, l, beta, seed, false, &|_| {}).unwrap();
        let planes = PlanesF32::from_planes(&Planes::gaussian(l, p, d, seed).unwrap());
        let map = SoftMap {
            planes: &planes,
            beta,
        };
        let full = |s: u64| {
            let mut b = Vec::new();
            gen_chunk(&mut b, s, heads, n, 0, n, d);
            b
        };
        let (q, k, v, g) = (full(seed), full(seed + 1), full(seed + 2), full(seed + 3));
        let isa = super::super::simd::detected_isa();
        fn h(x: &[f32], heads: usize, n: usize, d: usize) -> Heads<'_> {
            Heads::new(heads, n, d, x)
        }
        let mut o = vec![0.0f32; heads * n * d];
        let (_, ctx) = super::super::soft_forward_into(
            &map,
            h(&q, heads, n, d),
            h(&k, heads, n, d),
            h(&v, heads, n, d),
            false,
            isa,
            &mut o,
            Default::default(),
        );
        let (mut dq, mut dk, mut dv) = (o.clone(), o.clone(), o.clone());
        let dbeta = crate::cpu::soft_backward_into(
            &map,
            &ctx,
            BackwardInputs::new(
                h(&q, heads, n, d),
                h(&k, heads, n, d),
                h(&v, heads, n, d),
                h(&o, heads, n, d),
                h(&g, heads, n, d),
            ),
            isa,
            GradsMut {
                dq: &mut dq,
                dk: &mut dk,
                dv: &mut dv,
            },
        );
        let want = checksum_of(&o) + checksum_of(&dq) + checksum_of(&dk) + checksum_of(&dv) + dbeta;
        let scale: f64 = [&o, &dq, &dk, &dv]
            .iter()
            .flat_map(|x| x.iter())
            .map(|&x| (x as f64).abs())
            .sum();
        let err = (rep.checksum - want).abs() / scale;
        assert!(
            err < 1e-6,
            "streamed checksum {} vs in-memory {want}: {err:.2e} of Σ|x|",
            rep.checksum
        );
    }
}
