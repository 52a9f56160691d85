//! `racelab bench --distributed`: forward+backward of the distributed operator on generated
//! inputs (each rank generates only its slice, from the counter-based generator at the
//! tokens' global positions, so every rank count sees the same tensors), timed per rank count,
//! with the collectives' share and the bytes per layer; `--check` compares the result with
//! the single-process kernels on rank 0.

use super::stream::gen_chunk;
use super::{slice_of, Comm, Distributed, Traffic};
use racelab_core::backend::{Backend, GradsMut, Heads, PlanesF32, RaceParams};
use racelab_core::error::{RaceError, Result};
use racelab_core::hashing::Planes;
use racelab_core::params::Combine;
use racelab_core::params::{Beta, Bits, Seed, Tables};
use serde::Serialize;
use std::time::Instant;

/// What to time.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    /// Tokens in the whole sequence, or per rank with `weak`.
    pub n: usize,
    /// Weak scaling: `n` tokens per rank (strong: `n` in all).
    pub weak: bool,
    /// Heads.
    pub heads: usize,
    /// Query and key width `d` (values have the same width).
    pub d: usize,
    /// Bits per table `P` (`2^P` buckets).
    pub p: usize,
    /// Tables `L`.
    pub l: usize,
    /// Soft-hash inverse temperature β.
    pub beta: f64,
    /// Seed of the inputs and planes.
    pub seed: u64,
    /// Causal attention (Algorithm 2): token i sees keys `0..=i`.
    pub causal: bool,
    /// Timed runs (the median is reported).
    pub runs: usize,
    /// Also check the result against the single-process kernels.
    pub check: bool,
}

/// One timed rank count.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Ranks the tokens were split over.
    pub ranks: usize,
    /// How the ranks talked (`threads` or `mpi`).
    pub transport: String,
    /// Rayon threads per rank.
    pub threads_per_rank: usize,
    /// Tokens in the whole sequence, or per rank with `weak`.
    pub n: usize,
    /// Weak scaling: `n` tokens per rank (strong: `n` in all).
    pub weak: bool,
    /// Heads.
    pub heads: usize,
    /// Query and key width `d` (values have the same width).
    pub d: usize,
    /// Bits per table `P` (`2^P` buckets).
    pub p: usize,
    /// Tables `L`.
    pub l: usize,
    /// Soft-hash inverse temperature β.
    pub beta: f64,
    /// Causal attention (Algorithm 2): token i sees keys `0..=i`.
    pub causal: bool,
    /// Timed runs (the median is reported).
    pub runs: usize,
    /// Median over runs of the slowest rank's forward+backward seconds.
    pub seconds: f64,
    /// Median over runs of the slowest rank's seconds inside collectives (waiting included).
    pub collective_seconds: f64,
    /// `collective_seconds / seconds`.
    pub collective_share: f64,
    /// Collectives per forward+backward and the bytes one rank contributes to them.
    pub collectives_per_layer: u64,
    /// Bytes one rank contributes to them.
    pub bytes_per_layer: u64,
    /// Tokens (all ranks) per second.
    pub tokens_per_s: f64,
    /// The largest peak RSS over ranks.
    pub peak_rss_bytes: u64,
    /// With one rank: the single-process kernels' forward+backward through the same
    /// contract ([`racelab_core::cpu::CpuRace`]) on the same inputs, median seconds (what the
    /// distributed path adds at one rank: its slice totals and collectives).
    pub one_process_seconds: Option<f64>,
    /// With one rank: the median over the pairs of distributed / single-process seconds.
    pub one_process_ratio: Option<f64>,
    /// With `--check`: forward, dq, dk, dv (largest error over the largest entry) and dβ
    /// (relative) against the single-process kernels.
    pub check: Option<[f64; 5]>,
    /// Seed of the inputs and planes.
    pub seed: u64,
    /// Machine, revision and time of the run.
    pub provenance: racelab_core::provenance::Provenance,
}

impl std::fmt::Display for Row {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}forward+backward, {} ranks × {} threads ({}), N = {}{}, {} heads, d = {}, (P,L) = ({},{}): {:.4} s, {:.1}% in {} collectives, {} bytes per rank per layer, {:.3e} tokens/s",
            if self.causal { "causal " } else { "" },
            self.ranks,
            self.threads_per_rank,
            self.transport,
            self.n,
            if self.weak { " (weak scaling)" } else { "" },
            self.heads,
            self.d,
            self.p,
            self.l,
            self.seconds,
            100.0 * self.collective_share,
            self.collectives_per_layer,
            self.bytes_per_layer,
            self.tokens_per_s
        )?;
        if let Some(c) = self.check {
            write!(
                f,
                "; against one process: forward {:.2e}, dq {:.2e}, dk {:.2e}, dv {:.2e}, dbeta {:.2e}",
                c[0], c[1], c[2], c[3], c[4]
            )?;
        }
        Ok(())
    }
}

/// `[heads, b − a, cols]` rows `a..b` of the generated `[heads, n, cols]` tensor `seed`.
fn generate(seed: u64, heads: usize, n: usize, (a, b): (usize, usize), cols: usize) -> Vec<f32> {
    let mut buf = Vec::new();
    gen_chunk(&mut buf, seed, heads, n, a, b - a, cols);
    buf
}

/// Largest |a − b| over the largest |b|.
fn rel(a: &[f32], b: &[f32]) -> f64 {
    let scale = b.iter().fold(0.0f64, |m, &x| m.max(x.abs() as f64));
    let err = a
        .iter()
        .zip(b)
        .fold(0.0f64, |m, (&x, &y)| m.max((x as f64 - y as f64).abs()));
    if a.iter().all(|x| x.is_finite()) {
        err / scale.max(1e-300)
    } else {
        f64::INFINITY
    }
}

/// The median of `x`.
fn median(mut x: Vec<f64>) -> f64 {
    x.sort_by(f64::total_cmp);
    x[x.len() / 2]
}

/// The largest value of `x` over ranks (one all-reduce).
fn max_over_ranks(comm: &impl Comm, x: &[f64]) -> Vec<f64> {
    let mut b: Vec<u64> = x.iter().map(|v| v.to_bits()).collect();
    comm.all_max(&mut b);
    b.into_iter().map(f64::from_bits).collect()
}

/// Time forward+backward over `comm`'s ranks; every rank returns the row.
pub fn run<C: Comm + Send + Sync>(comm: C, s: &Spec) -> Result<Row> {
    let (size, rank) = (comm.size(), comm.rank());
    if s.n == 0 || s.heads == 0 || s.d == 0 || s.runs == 0 {
        return Err(RaceError::param(
            "n",
            format!(
                "{}, {}, {} and {} must be at least 1",
                racelab_core::error::arg("n"),
                racelab_core::error::arg("heads"),
                racelab_core::error::arg("d"),
                racelab_core::error::arg("runs")
            ),
        ));
    }
    let n = if s.weak { s.n * size } else { s.n };
    let (h, d) = (s.heads, s.d);
    if s.check && n * h * d > 1 << 24 {
        return Err(RaceError::param(
            "check",
            format!(
                "{} computes the whole sequence on rank 0 too; {n} tokens × {h} heads × d = {d} \
                 is more than 2^24 values: use a smaller {}",
                racelab_core::error::arg("check"),
                racelab_core::error::arg("n")
            ),
        ));
    }
    // The same spec on every rank: a refusal here is every rank's.
    let params = RaceParams::new(Bits(s.p), Tables(s.l), Beta(s.beta))?
        .with_combine(Combine::Paper)
        .with_causal(s.causal);
    let planes =
        PlanesF32::from_planes(&Planes::gaussian(Bits(s.p), Tables(s.l), d, Seed(s.seed))?);
    let range = slice_of(n, size, rank);
    let nr = range.1 - range.0;
    let gen = |i: u64| generate(s.seed + i, h, n, range, d);
    let (q, k, v, g) = (gen(0), gen(1), gen(2), gen(3));
    // This rank's rows (none, and the error, if they do not fit: the agreement then ends the
    // run on every rank).
    let mut local = Ok(());
    let [qh, kh, vh, gh] = [&q, &k, &v, &g].map(|x| match Heads::new(h, nr, d, x) {
        Ok(x) => x,
        Err(e) => {
            local = Err(e);
            Heads::empty()
        }
    });
    let local = local.and_then(|_| super::check_slice(&params, &planes, &qh, &kh, &vh, Some(&gh)));
    let dist = Distributed::trusting(comm);
    dist.agree(&params, &planes, &qh, &kh, &vh, Some(&gh), local)?;
    dist.take_traffic();
    racelab_core::provenance::reset_peak_rss();
    // Output and gradients allocated once and the context recycled, as a training loop
    // would: the timing is the kernels' and the collectives', not the page faults'.
    let (mut o, mut dq, mut dk, mut dv) = (
        vec![0.0f32; h * nr * d],
        vec![0.0f32; h * nr * d],
        vec![0.0f32; h * nr * d],
        vec![0.0f32; h * nr * d],
    );
    let mut ctx = racelab_core::cpu::SliceSaved::default();
    let mut dbeta = 0.0;
    let mut per_layer = Traffic::default();
    let (mut secs, mut colls, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    // With one rank, the single-process kernels run after each distributed run (pairs, so
    // both see the same state of the machine).
    let mut one = if size == 1 {
        Some(OneProcess::new(&params, &planes, (qh, kh, vh, gh))?)
    } else {
        None
    };
    let mut one_secs = Vec::new();
    // One untimed run (first touch of the pages, caches), then the timed ones.
    for i in 0..=s.runs {
        dist.take_traffic();
        dist.comm.barrier();
        let t = Instant::now();
        let grads = GradsMut {
            dq: &mut dq,
            dk: &mut dk,
            dv: &mut dv,
        };
        let x = (qh, kh, vh, gh);
        (dbeta, ctx) = dist.forward_backward_into(&params, &planes, x, &mut o, grads, ctx)?;
        let sec = t.elapsed().as_secs_f64();
        let tr = dist.take_traffic();
        if i == 0 {
            per_layer = tr;
            continue;
        }
        let m = max_over_ranks(&dist.comm, &[sec, tr.seconds]);
        secs.push(m[0]);
        colls.push(m[1]);
        if let Some(one) = one.as_mut() {
            let t1 = one.step()?;
            one_secs.push(t1);
            ratios.push(sec / t1);
        }
    }
    let peak = max_over_ranks(
        &dist.comm,
        &[racelab_core::provenance::peak_rss_bytes() as f64],
    )[0];
    let one_process_seconds = one.is_some().then(|| median(one_secs));
    let one_process_ratio = one.is_some().then(|| median(ratios));
    let last = (o, dq, dk, dv, dbeta);
    let check = if s.check {
        check_against_one_process(&dist.comm, &params, &planes, s, n, &last)?
    } else {
        None
    };
    let (seconds, collective_seconds) = (median(secs), median(colls));
    Ok(Row {
        ranks: size,
        transport: dist.comm.transport(),
        threads_per_rank: rayon::current_num_threads(),
        n,
        weak: s.weak,
        heads: h,
        d,
        p: s.p,
        l: s.l,
        beta: s.beta,
        causal: s.causal,
        runs: s.runs,
        seconds,
        collective_seconds,
        collective_share: collective_seconds / seconds.max(1e-12),
        collectives_per_layer: per_layer.collectives,
        bytes_per_layer: per_layer.bytes,
        tokens_per_s: n as f64 / seconds,
        peak_rss_bytes: peak as u64,
        one_process_seconds,
        one_process_ratio,
        check,
        seed: s.seed,
        provenance: racelab_core::provenance::Provenance::collect(
            racelab_core::cpu::detected_isa().name(),
        ),
    })
}

/// The single-process kernels' forward+backward on the same inputs, through the backend
/// contract's into-buffer form with buffers and saved state reused as [`run`] does (the
/// problem validated once, so a step times the kernels alone).
struct OneProcess<'a> {
    race: racelab_core::cpu::CpuRace,
    pb: racelab_core::backend::Problem<'a>,
    o: Vec<f32>,
    gr: racelab_core::backend::SoftGrads,
    saved: racelab_core::backend::Saved,
}

impl<'a> OneProcess<'a> {
    fn new(
        params: &RaceParams,
        planes: &'a PlanesF32,
        x: (Heads<'a>, Heads<'a>, Heads<'a>, Heads<'a>),
    ) -> Result<Self> {
        let (q, k, v, g) = x;
        let pb = racelab_core::backend::Problem::with_grad(params, planes, q, k, v, g)?;
        let mut one = OneProcess {
            race: racelab_core::cpu::CpuRace::detected(),
            pb,
            o: vec![0.0f32; pb.output_len()],
            gr: racelab_core::backend::SoftGrads::zeros(q, k, v),
            saved: Default::default(),
        };
        one.step()?; // first touch
        Ok(one)
    }

    /// One forward+backward; its seconds.
    fn step(&mut self) -> Result<f64> {
        let t0 = Instant::now();
        let reuse = std::mem::take(&mut self.saved);
        let saved = self.race.forward_into(&self.pb, &mut self.o, reuse)?;
        self.race
            .backward_into(&self.pb, &saved, &self.o, self.gr.as_mut())?;
        self.saved = saved;
        Ok(t0.elapsed().as_secs_f64())
    }
}

/// Gather the ranks' results on rank 0 and compare them with the single-process kernels on
/// the whole generated sequence; every rank returns rank 0's errors.
fn check_against_one_process<C: Comm>(
    comm: &C,
    params: &RaceParams,
    planes: &PlanesF32,
    s: &Spec,
    n: usize,
    (o, dq, dk, dv, dbeta): &(Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>, f64),
) -> Result<Option<[f64; 5]>> {
    let (size, h, d) = (comm.size(), s.heads, s.d);
    let rows: Vec<usize> = (0..size)
        .map(|r| {
            let (a, b) = slice_of(n, size, r);
            b - a
        })
        .collect();
    let gathered: Vec<Option<Vec<Vec<f32>>>> = [o, dq, dk, dv]
        .iter()
        .map(|x| comm.gather_to_root(x))
        .collect();
    let mut errs = [0.0f64; 5];
    if comm.rank() == 0 {
        let whole = |i: u64| generate(s.seed + i, h, n, (0, n), d);
        let (q, k, v, g) = (whole(0), whole(1), whole(2), whole(3));
        let [qw, kw, vw, gw] = [
            Heads::new(h, n, d, &q)?,
            Heads::new(h, n, d, &k)?,
            Heads::new(h, n, d, &v)?,
            Heads::new(h, n, d, &g)?,
        ];
        let (wf, wg) = racelab_core::cpu::CpuRace::detected()
            .forward_backward(params, planes, qw, kw, vw, gw)?;
        for (i, (parts, want)) in gathered
            .iter()
            .zip([&wf.o, &wg.dq, &wg.dk, &wg.dv])
            .enumerate()
        {
            let got = super::job::assemble(parts.as_ref().expect("rank 0 gathers"), &rows, h, d);
            errs[i] = rel(&got, want);
        }
        errs[4] = (dbeta - wg.dbeta).abs() / wg.dbeta.abs().max(1e-12);
    }
    let errs = max_over_ranks(comm, &errs);
    Ok(Some([errs[0], errs[1], errs[2], errs[3], errs[4]]))
}
