//! Streaming scale mode: forward+backward of soft RACE on inputs generated chunk by chunk
//! from a counter-based generator, so no N-sized array exists and the backward regenerates
//! what it needs. Memory is O(chunk · heads · d + L·R·d) per process; over a group of ranks
//! ([`run_on`], [`crate`]) each rank streams its slice of the token axis and the
//! ranks exchange only states.
//!
//! Non-causal: (1) keys → `[B | A]` per head (all-reduced over ranks); (2) per query chunk:
//! `O` from the banks (consumed into a checksum) and, with `G`, `∂ℓ/∂q` and `[dB | dA]`
//! (all-reduced); (3) keys and values regenerated → `∂ℓ/∂k`, `∂ℓ/∂v`.
//!
//! Causal: (1) the slice's key total, exclusive-scanned over ranks: the state entering the
//! slice; (2) chunks in order: the chunked causal forward from the running state (`O` into the
//! checksum) and the chunk's `Σ φ(q) ĝᵀ`, summed and suffix-scanned over ranks; (3) chunks in
//! reverse: the forward again (the backward needs its saved values), then the backward with
//! the keys' suffix state `dS` from the chunks and ranks after it. The state entering a chunk in
//! (3) is the one after it less the chunk's key total (f64). About twice the work of an
//! in-memory forward+backward, in bounded memory.
//!
//! Gradients are consumed into checksums too: the point is throughput and peak memory at
//! 10^8–10^9 tokens.

use super::{slice_of, Comm, Solo};
use racelab_core::backend::{BackwardInputs, ForwardInputs, GradsMut, Heads, PlanesF32};
use racelab_core::cpu::{CpuRace, SliceSaved};
use racelab_core::error::{RaceError, Result};
use racelab_core::hashing::Planes;
use racelab_core::params::{Bits, Seed, Tables};
use racelab_core::provenance::{peak_rss_bytes, reset_peak_rss};
use racelab_core::shared::{Banks, Partial, SoftMap};
use rayon::prelude::*;
use serde::Serialize;
use std::time::Instant;

/// Tokens per chunk.
pub const CHUNK: usize = 1 << 15;

/// Result of a streaming run.
#[derive(Debug, Clone, Serialize)]
pub struct StreamReport {
    /// Tokens in the whole sequence.
    pub n: usize,
    /// Heads.
    pub heads: usize,
    /// Query and key width `d` (values have the same width).
    pub d: usize,
    /// Bits per table `P` (`2^P` buckets).
    pub p: usize,
    /// Tables `L`.
    pub l: usize,
    /// Causal attention (Algorithm 2): token i sees keys `0..=i`.
    pub causal: bool,
    /// Ranks the tokens were split over, and how they talked.
    pub ranks: usize,
    /// How the ranks talked (`threads` or `mpi`).
    pub transport: String,
    /// The slowest rank's seconds, and its seconds in collectives.
    pub seconds: f64,
    /// Of them, the slowest rank's seconds in collectives.
    pub collective_seconds: f64,
    /// Tokens (all ranks) per second.
    pub tokens_per_s: f64,
    /// The largest peak RSS over ranks, and each rank's.
    pub peak_rss_bytes: u64,
    /// Each rank's peak RSS.
    pub peak_rss_bytes_per_rank: Vec<u64>,
    /// Tokens per chunk each rank streams.
    pub chunk: usize,
    /// Sum of every output and gradient entry (compares runs).
    pub checksum: f64,
    /// Soft-hash inverse temperature β.
    pub beta: f32,
    /// Seed of the inputs (`seed`, `seed + 1`, …) and of the planes.
    pub seed: u64,
    /// Machine, revision and time of the run.
    pub provenance: racelab_core::provenance::Provenance,
}

/// `[heads, len, cols]` chunk of the virtual `[heads, n, cols]` tensor `seed`, from token `t0`.
pub(crate) fn gen_chunk(
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
            racelab_core::cpu::machine::fill_run(hb, seed, ((h * n + t0) * cols) as u64);
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

/// What a streamed run computes: `N` tokens of `heads` heads with `d = dv` (Q, K, V and the
/// upstream gradient generated from `seed`, `seed + 1`, …), planes `(P, L)` from `seed`, at
/// `beta`, causal or not.
#[derive(Debug, Clone, Copy)]
pub struct StreamSpec {
    /// Tokens in the whole sequence.
    pub n: usize,
    /// Heads.
    pub heads: usize,
    /// Query and key width `d` (values have the same width).
    pub d: usize,
    /// Bits per table `P` (`2^P` buckets).
    pub p: usize,
    /// Tables `L`.
    pub l: usize,
    /// Soft-hash inverse temperature β.
    pub beta: f32,
    /// Seed of the inputs (`seed`, `seed + 1`, …) and of the planes.
    pub seed: u64,
    /// Causal attention (Algorithm 2): token i sees keys `0..=i`.
    pub causal: bool,
}

/// Run streaming forward+backward on one process.
pub fn run(spec: StreamSpec, progress: &dyn Fn(&str)) -> Result<StreamReport> {
    run_on(&Solo, spec, progress)
}

/// Add `part` into `acc`, head by head.
fn add_banks(acc: &mut [Vec<f64>], part: &[Vec<f64>], sign: f64) {
    for (a, b) in acc.iter_mut().zip(part) {
        a.iter_mut().zip(b).for_each(|(x, y)| *x += sign * y);
    }
}

/// Per-head banks through one collective `op` of `comm`; returns its seconds.
fn reduce(comm: &dyn Comm, banks: &mut [Vec<f64>], op: fn(&dyn Comm, &mut [f64])) -> f64 {
    let t = Instant::now();
    let mut flat: Vec<f64> = banks.iter().flatten().copied().collect();
    op(comm, &mut flat);
    let len = banks.first().map_or(1, |b| b.len().max(1));
    for (b, x) in banks.iter_mut().zip(flat.chunks(len)) {
        b.copy_from_slice(x);
    }
    t.elapsed().as_secs_f64()
}

/// The generated inputs of one chunk (`q`, `k`, `v`, `g` of tokens `a..b`).
#[derive(Default)]
struct Chunk {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
}

/// What every pass of a run shares.
struct Run<'a> {
    map: SoftMap<'a>,
    isa: racelab_core::cpu::Isa,
    n: usize,
    heads: usize,
    d: usize,
    seeds: [u64; 4],
}

impl Run<'_> {
    fn gen(&self, c: &mut Chunk, (a, b): (usize, usize), with_q: bool) {
        let (n, h, d, [sq, sk, sv, sg]) = (self.n, self.heads, self.d, self.seeds);
        gen_chunk(&mut c.k, sk, h, n, a, b - a, d);
        gen_chunk(&mut c.v, sv, h, n, a, b - a, d);
        if with_q {
            gen_chunk(&mut c.q, sq, h, n, a, b - a, d);
            gen_chunk(&mut c.g, sg, h, n, a, b - a, d);
        }
    }
    fn heads<'b>(&self, x: &'b [f32], len: usize) -> Result<Heads<'b>> {
        Heads::new(self.heads, len, self.d, x)
    }
    fn zeros(&self) -> Result<Banks> {
        racelab_core::shared::zero_banks(&self.map, self.heads, self.d)
    }
    /// The partial kernel every pass runs ([`Partial`]).
    fn kernel(&self) -> CpuRace {
        CpuRace { isa: self.isa }
    }
    fn key_totals(&self, c: &Chunk, len: usize) -> Result<Banks> {
        let (k, v) = (self.heads(&c.k, len)?, self.heads(&c.v, len)?);
        self.kernel().key_banks(&self.map, k, v)
    }
    /// The causal forward of a chunk from `before`: `(o, flagged rows, saved)`.
    fn causal_forward(
        &self,
        c: &Chunk,
        len: usize,
        before: &[Vec<f64>],
    ) -> Result<(Vec<f32>, usize, SliceSaved)> {
        let mut o = vec![0.0f32; self.heads * len * self.d];
        let (q, k, v) = (
            self.heads(&c.q, len)?,
            self.heads(&c.k, len)?,
            self.heads(&c.v, len)?,
        );
        let x = ForwardInputs::new(q, k, v);
        let (flagged, saved) = self.kernel().causal_forward(
            &self.map,
            x,
            (before, self.n),
            &mut o,
            SliceSaved::default(),
        )?;
        Ok((o, flagged, saved))
    }
    /// The chunk's `Σ φ(q) ĝᵀ` per head, from its forward.
    fn query_totals(&self, c: &Chunk, len: usize, o: &[f32], saved: &SliceSaved) -> Result<Banks> {
        let (q, g, oh) = (
            self.heads(&c.q, len)?,
            self.heads(&c.g, len)?,
            self.heads(o, len)?,
        );
        self.kernel().query_totals(&self.map, saved, q, g, oh)
    }
}

/// Run streaming forward+backward over the ranks of `comm`, each streaming its slice of the
/// token axis ([`slice_of`]); every rank returns the same report.
pub fn run_on(comm: &dyn Comm, spec: StreamSpec, progress: &dyn Fn(&str)) -> Result<StreamReport> {
    let StreamSpec {
        n,
        heads,
        d,
        p,
        l,
        beta,
        seed,
        causal,
    } = spec;
    if n == 0 || heads == 0 || d == 0 {
        return Err(RaceError::param("n", "streaming needs N, heads and d ≥ 1"));
    }
    let planes = PlanesF32::from_planes(&Planes::gaussian(Bits(p), Tables(l), d, Seed(seed))?);
    let r = Run {
        map: SoftMap::new(&planes, beta)?,
        isa: racelab_core::cpu::detected_isa(),
        n,
        heads,
        d,
        seeds: [seed, seed + 1, seed + 2, seed + 3],
    };
    let (size, rank) = (comm.size(), comm.rank());
    let (s0, s1) = slice_of(n, size, rank);
    reset_peak_rss();
    comm.barrier();
    let t = Instant::now();
    let chunks: Vec<(usize, usize)> = (s0..s1)
        .step_by(CHUNK)
        .map(|a| (a, (a + CHUNK).min(s1)))
        .collect();
    let (status, coll) = if causal {
        causal_stream(comm, &r, &chunks, progress)?
    } else {
        plain_stream(comm, &r, &chunks, progress)?
    };
    // One all-reduce: flagged rows, ∂ℓ/∂β and the checksum over all ranks.
    let t1 = Instant::now();
    let mut st = status;
    comm.all_sum(&mut st);
    let coll = coll + t1.elapsed().as_secs_f64();
    let seconds = t.elapsed().as_secs_f64();
    if st[0] > 0.0 {
        return Err(RaceError::param(
            "beta",
            format!(
                "{} query rows have a denominator below f32's range at beta = {beta}; the \
                 streaming mode keeps no keys to recompute them exactly: use a smaller {}, \
                 or `racelab attend` (which does)",
                st[0],
                racelab_core::error::arg("beta")
            ),
        ));
    }
    // The slowest rank's time and collective time, and every rank's peak memory.
    let mut peaks = vec![0u64; size + 2];
    peaks[rank] = peak_rss_bytes();
    peaks[size] = seconds.to_bits();
    peaks[size + 1] = coll.to_bits();
    comm.all_max(&mut peaks);
    let seconds = f64::from_bits(peaks[size]);
    Ok(StreamReport {
        n,
        heads,
        d,
        p,
        l,
        causal,
        ranks: size,
        transport: comm.transport(),
        seconds,
        collective_seconds: f64::from_bits(peaks[size + 1]),
        tokens_per_s: n as f64 / seconds,
        peak_rss_bytes: peaks[..size].iter().copied().max().unwrap_or(0),
        peak_rss_bytes_per_rank: peaks[..size].to_vec(),
        chunk: CHUNK,
        checksum: st[2] + st[1],
        beta,
        seed,
        provenance: racelab_core::provenance::Provenance::collect(
            racelab_core::cpu::detected_isa().name(),
        ),
    })
}

/// The non-causal stream of one rank's `chunks`: `([flagged, ∂ℓ/∂β, checksum], seconds in
/// collectives)` (this rank's shares).
fn plain_stream(
    comm: &dyn Comm,
    r: &Run,
    chunks: &[(usize, usize)],
    progress: &dyn Fn(&str),
) -> Result<([f64; 3], f64)> {
    let (map, kernel, heads, d) = (&r.map, r.kernel(), r.heads, r.d);
    let mut c = Chunk::default();
    let (mut dq, mut dk, mut dvv) = (Vec::new(), Vec::new(), Vec::new());
    let (mut checksum, mut flagged_rows, mut dbeta) = (0.0f64, 0usize, 0.0f64);
    // (1) keys.
    progress("stream: keys → banks");
    let mut banks = r.zeros()?;
    for &(a, b) in chunks {
        r.gen(&mut c, (a, b), false);
        add_banks(&mut banks, &r.key_totals(&c, b - a)?, 1.0);
    }
    let mut coll = reduce(comm, &mut banks, |c, x| c.all_sum(x));
    // (2) queries → O, and (3) query gradients (O itself is not needed: see `query_grads`).
    progress("stream: queries → O, dQ, [dB | dA]");
    let mut dbanks = r.zeros()?;
    // The output and what the read keeps for the query gradients (denominators, the queries'
    // u = tanh(Wq); keys are regenerated in (4) instead: their u over all N would not be
    // bounded memory), allocated once: each chunk's read recycles the last one's buffers.
    let (mut o, mut saved) = (Vec::new(), SliceSaved::default());
    for &(a, b) in chunks {
        let len = b - a;
        r.gen(&mut c, (a, b), true);
        o.resize(heads * len * d, 0.0);
        let qh = r.heads(&c.q, len)?;
        let reuse = std::mem::take(&mut saved);
        let flagged;
        (flagged, saved) = kernel.read(map, qh, (&banks, d), r.n, &mut o, reuse)?;
        flagged_rows += flagged;
        checksum += checksum_of(&o);
        dq.resize(heads * len * d, 0.0);
        let gh = r.heads(&c.g, len)?;
        let (parts, db) = kernel.query_grads(map, &saved, qh, gh, &mut dq)?;
        checksum += checksum_of(&dq);
        dbeta += db;
        add_banks(&mut dbanks, &parts, 1.0);
    }
    coll += reduce(comm, &mut dbanks, |c, x| c.all_sum(x));
    // (4) keys and values → dK, dV.
    progress("stream: keys → dK, dV");
    for &(a, b) in chunks {
        let len = b - a;
        r.gen(&mut c, (a, b), false);
        let (kh, vh) = (r.heads(&c.k, len)?, r.heads(&c.v, len)?);
        dk.resize(heads * len * d, 0.0);
        dvv.resize(heads * len * d, 0.0);
        dbeta += kernel.key_grads(map, &dbanks, (kh, vh), (&mut dk, &mut dvv))?;
        checksum += checksum_of(&dk) + checksum_of(&dvv);
    }
    Ok(([flagged_rows as f64, dbeta, checksum], coll))
}

/// The causal stream of one rank's `chunks` (see the module docs); returns as
/// [`plain_stream`].
fn causal_stream(
    comm: &dyn Comm,
    r: &Run,
    chunks: &[(usize, usize)],
    progress: &dyn Fn(&str),
) -> Result<([f64; 3], f64)> {
    let (map, kernel, heads, d) = (&r.map, r.kernel(), r.heads, r.d);
    let mut c = Chunk::default();
    let (mut checksum, mut flagged_rows, mut dbeta) = (0.0f64, 0usize, 0.0f64);
    // (1) The slice's key total; the state entering the slice.
    progress("stream: keys → the state entering each rank");
    // (The last rank's total reaches no one, the scan being exclusive; nor do rank 0's
    // queries' sums in (2): neither is computed.)
    let (first, last) = (comm.rank() == 0, comm.rank() + 1 == comm.size());
    let mut total = r.zeros()?;
    for &(a, b) in chunks.iter().filter(|_| !last) {
        r.gen(&mut c, (a, b), false);
        add_banks(&mut total, &r.key_totals(&c, b - a)?, 1.0);
    }
    let mut before = total.clone();
    let mut coll = reduce(comm, &mut before, |c, x| c.exscan_sum(x));
    // (2) Forward in order: O, and the queries' Σ φ(q) ĝᵀ of the slice.
    progress("stream: causal forward → O, Σ φ(q) ĝᵀ");
    let (mut running, mut after) = (before.clone(), r.zeros()?);
    for &(a, b) in chunks {
        let len = b - a;
        r.gen(&mut c, (a, b), true);
        let (o, flagged, saved) = r.causal_forward(&c, len, &running)?;
        flagged_rows += flagged;
        checksum += checksum_of(&o);
        if !first {
            add_banks(&mut after, &r.query_totals(&c, len, &o, &saved)?, 1.0);
        }
        add_banks(&mut running, &r.key_totals(&c, len)?, 1.0);
    }
    coll += reduce(comm, &mut after, |c, x| c.exscan_sum_rev(x));
    // (3) Backward in reverse: the forward again, then the backward from the suffix state.
    progress("stream: causal backward (reverse) → dQ, dK, dV");
    for &(a, b) in chunks.iter().rev() {
        let len = b - a;
        r.gen(&mut c, (a, b), true);
        add_banks(&mut running, &r.key_totals(&c, len)?, -1.0);
        let (o, _, saved) = r.causal_forward(&c, len, &running)?;
        let (mut dq, mut dk, mut dvv) = (
            vec![0.0f32; heads * len * d],
            vec![0.0f32; heads * len * d],
            vec![0.0f32; heads * len * d],
        );
        let (q, k, v) = (
            r.heads(&c.q, len)?,
            r.heads(&c.k, len)?,
            r.heads(&c.v, len)?,
        );
        let (g, oh) = (r.heads(&c.g, len)?, r.heads(&o, len)?);
        let grads = GradsMut {
            dq: &mut dq,
            dk: &mut dk,
            dv: &mut dvv,
        };
        let x = BackwardInputs::new(q, k, v, oh, g);
        dbeta += kernel.causal_backward(map, &saved, x, &after, grads)?;
        checksum += checksum_of(&dq) + checksum_of(&dk) + checksum_of(&dvv);
        add_banks(&mut after, &r.query_totals(&c, len, &o, &saved)?, 1.0);
    }
    Ok(([flagged_rows as f64, dbeta, checksum], coll))
}

#[cfg(test)]
mod tests {
    use super::*;
    use racelab_core::backend::Backend;

    const SHAPE: (usize, usize, usize, usize, usize, f32, u64) =
        (2 * CHUNK + 1234, 2, 16, 2, 2, 4.0, 11);

    /// Checksum of o, dq, dk, dv and ∂ℓ/∂β from the in-memory kernels on the generated
    /// tensors, and the scale Σ|x| it is compared at.
    fn in_memory(causal: bool) -> (f64, f64) {
        let (n, heads, d, p, l, beta, seed) = SHAPE;
        let planes =
            PlanesF32::from_planes(&Planes::gaussian(Bits(p), Tables(l), d, Seed(seed)).unwrap());
        let params = racelab_core::params::RaceParams::new(
            Bits(p),
            Tables(l),
            racelab_core::params::Beta(beta as f64),
        )
        .unwrap()
        .with_causal(causal);
        let full = |s: u64| {
            let mut b = Vec::new();
            gen_chunk(&mut b, s, heads, n, 0, n, d);
            b
        };
        let (q, k, v, g) = (full(seed), full(seed + 1), full(seed + 2), full(seed + 3));
        fn h(x: &[f32], heads: usize, n: usize, d: usize) -> Heads<'_> {
            Heads::new(heads, n, d, x).unwrap()
        }
        let [qh, kh, vh, gh] = [&q, &k, &v, &g].map(|x| h(x, heads, n, d));
        // The single-process kernels through the backend contract.
        let (f, gr) = CpuRace::detected()
            .forward_backward(&params, &planes, qh, kh, vh, gh)
            .unwrap();
        let (o, dq, dk, dv, dbeta) = (f.o, gr.dq, gr.dk, gr.dv, gr.dbeta);
        let want = checksum_of(&o) + checksum_of(&dq) + checksum_of(&dk) + checksum_of(&dv) + dbeta;
        let scale: f64 = [&o, &dq, &dk, &dv]
            .iter()
            .flat_map(|x| x.iter())
            .map(|&x| (x as f64).abs())
            .sum();
        (want, scale)
    }

    /// The streamed pipeline (inputs regenerated chunk by chunk) against the in-memory
    /// kernels on the same generated tensors, causal and not, on one process and over three
    /// ranks (threads): the checksum of o, dq, dk, dv and ∂ℓ/∂β agrees to f32 rounding. N
    /// spans two full chunks and a partial one.
    #[test]
    fn streaming_matches_the_in_memory_kernels() {
        let (n, heads, d, p, l, beta, seed) = SHAPE;
        for causal in [false, true] {
            let (want, scale) = in_memory(causal);
            let spec = StreamSpec {
                n,
                heads,
                d,
                p,
                l,
                beta,
                seed,
                causal,
            };
            let one = run(spec, &|_| {}).unwrap();
            let ranks: Vec<StreamReport> = std::thread::scope(|s| {
                let hs: Vec<_> = crate::thread_group(3)
                    .into_iter()
                    .map(|c| s.spawn(move || run_on(&c, spec, &|_| {}).unwrap()))
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            for rep in std::iter::once(&one).chain(&ranks) {
                let err = (rep.checksum - want).abs() / scale;
                assert!(
                    err < 1e-6,
                    "causal={causal}, {} ranks: streamed checksum {} vs in-memory {want}: {err:.2e} of Σ|x|",
                    rep.ranks,
                    rep.checksum
                );
            }
        }
    }
}
