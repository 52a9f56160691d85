//! Streaming scale mode: forward+backward of soft RACE on inputs generated chunk by chunk
//! from a counter-based generator, so no N-sized array exists and the backward regenerates
//! what it needs. Memory is O(chunk · heads · d + L·R·d).
//!
//! Non-causal only: (1) keys → `[B | A]` per head; (2) per query chunk: `O` from the banks
//! (consumed into a checksum) and, with `G`, `∂ℓ/∂q` and `[dB | dA]`; (3) keys and values
//! regenerated → `∂ℓ/∂k`, `∂ℓ/∂v`. Gradients are consumed into
//! checksums too: the point is throughput and peak memory at 10^8 tokens.

use super::blocked::{key_banks, key_grads, query_grads, read_into};
use super::state::{plan_segments, Heads};
use super::{PlanesF32, SoftMap};
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
    for &(a, b) in &chunks {
        let len = b - a;
        gen_chunk(&mut qb, sq, heads, n, a, len, d);
        gen_chunk(&mut gb, sg, heads, n, a, len, dv);
        let (mut o, mut den) = (vec![0.0f32; heads * len * dv], vec![0.0f32; heads * len]);
        // The chunk's queries' u = tanh(Wq), saved by the read for the query gradients (keys
        // are regenerated in (4) instead: their u over all N would not be bounded memory).
        let mut uq = vec![0.0f32; heads * len * l * p];
        let qh = Heads::new(heads, len, d, &qb);
        let (_, segs) = read_into(&map, isa, qh, &banks, dv, &mut o, &mut den, &mut uq);
        checksum += o.iter().map(|&x| x as f64).sum::<f64>();
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
        checksum += dq.iter().map(|&x| x as f64).sum::<f64>();
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
        checksum += dk.iter().chain(&dvv).map(|&x| x as f64).sum::<f64>();
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
