//! The `racelab` command line. Library errors are wrapped in `anyhow` here, at the edge.

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use racelab::experiments::registry;
use racelab::io::{read_npy, read_planes, write_npy, write_planes, Dtype};
use racelab::params::DEFAULT_BETA;
use racelab::{experiments, AttendOptions, Combine, Device, Method};
use serde_json::json;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Parser)]
#[command(
    name = "racelab",
    version,
    about = "RACE attention lab: exact, hashed and soft-hashed attention side by side"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

/// Options every subcommand shares.
#[derive(Args, Clone)]
struct Common {
    /// Seed of every random draw (planes, inputs, features).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Output folder (CSV, PNG, SVG) — or the output file for `attend`.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Print one JSON object on stdout instead of the human summary.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run one operator on user Q/K/V (.npy, shapes [N,d], [H,N,d] or [B,H,N,d]).
    Attend(AttendArgs),
    /// Run every experiment that exists and write figures/REPORT.md.
    Reproduce(ReproduceArgs),
    /// Time the fast kernels against exact attention and the machine's measured limits.
    Bench(BenchArgs),
    /// Sequence-parallel RACE: the measured scaling runs against the time model, and the
    /// model's projection to a cluster (writes docs/bench/distributed*.csv and the figure).
    DistributedModel(DistModelArgs),
    /// Fig. 3-style heatmaps: softmax, angular (gamma 1, 6, 10, 12), soft and hard S-hat.
    Fig3(Fig3Args),
    /// Soft-hash bias by exact quadrature vs kappa^P, over P and beta.
    Bias(ExpArgs),
    /// Sampling error alone (bias removed) vs L and N, quantiles over seeds.
    Variance(ExpArgs),
    /// Theorem 2: the bound calibrated and tested on held-out seeds; the bias at L = infinity
    /// (g^P by quadrature) per input family; the sampling error alone.
    Theorem(ExpArgs),
    /// Algorithm 2 (causal) vs causal angular attention and its causal L = infinity limit, by
    /// prefix position.
    Causal(ExpArgs),
    /// The authors' regime: beta = e^t/sqrt(d_head), raw and unit Q/K, both combine rules.
    Authors(ExpArgs),
    /// Singular values and numerical rank of S-hat vs LR and L(R-1)+1.
    Rank(ExpArgs),
    /// Lemma 10 counterexample and the repaired condition.
    Lemma10(ExpArgs),
    /// Soft RACE as beta -> infinity: hard LSH on rows sharing a bucket, the nearest key's
    /// value on the others; each row's decay rate against the predicted one.
    Limit(ExpArgs),
    /// Error/cost trade-offs over P, L, beta; matched-state comparison.
    Tradeoff(ExpArgs),
    /// Paper (Algorithm 1) vs authors' combine rule, against angular attention.
    Combine(ExpArgs),
    /// Trained models on MQAR: summary, figure and claims from figures/mqar/mqar.csv
    /// (trained by `python experiments/mqar/mqar.py`).
    Mqar(ExpArgs),
    /// Real transformer Q/K/V: heatmaps per head, RACE errors, tanh saturation (default: the
    /// bundled MiniLM sample).
    Real(ExpArgs),
}

#[derive(Args, Clone)]
struct ExpArgs {
    /// Small grids (minutes on 2 cores).
    #[arg(long)]
    quick: bool,
    /// A TOML config replacing the built-in experiments/<name>.toml.
    #[arg(long)]
    config: Option<PathBuf>,
    /// A directory of real Q/K/V (experiments/extract_qk.py format; e.g. experiments/data/minilm)
    /// to use instead of synthetic inputs (fig3, theorem, tradeoff, combine, real).
    #[arg(long)]
    data: Option<PathBuf>,
    #[command(flatten)]
    common: Common,
}

#[derive(Args)]
struct Fig3Args {
    /// User queries (.npy, [N,d]; for [H,N,d] or [B,H,N,d] the first head is used).
    #[arg(long, requires = "k")]
    q: Option<PathBuf>,
    /// User keys (.npy), same shape rules as --q.
    #[arg(long, requires = "q")]
    k: Option<PathBuf>,
    #[command(flatten)]
    exp: ExpArgs,
}

#[derive(Args)]
struct BenchArgs {
    /// Sequence lengths (comma-separated). Default 2^10..2^20.
    #[arg(long, value_delimiter = ',')]
    n: Vec<usize>,
    /// Bits per table, paired with --l.
    #[arg(long, value_delimiter = ',', default_values_t = vec![2, 3, 4])]
    p: Vec<usize>,
    /// Tables, paired with --p.
    #[arg(long, value_delimiter = ',', default_values_t = vec![2, 3, 4])]
    l: Vec<usize>,
    #[arg(long, default_value_t = 4)]
    heads: usize,
    #[arg(long, default_value_t = 128)]
    d: usize,
    /// Soft-hash inverse temperature (the kernels' cost does not depend on it below 16).
    #[arg(long, default_value_t = DEFAULT_BETA, allow_negative_numbers = true)]
    beta: f64,
    #[arg(long)]
    causal: bool,
    /// Time each (P,L) causal and non-causal, runs alternated, and report the ratio.
    #[arg(long, conflicts_with_all = ["causal", "reference"])]
    causal_ratio: bool,
    /// Time forward+backward (default: forward only).
    #[arg(long)]
    backward: bool,
    /// Also time the exact quadratic references (softmax, angular).
    #[arg(long)]
    reference: bool,
    /// Which kernels to time.
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    device: Device,
    /// Timed runs per row (median reported; at least 3; short rows get more, up to 0.25 s).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Stop timing a reference when its next run is predicted to exceed this (seconds).
    #[arg(long, default_value_t = 30.0)]
    ref_budget: f64,
    /// Long-sequence accuracy of the causal f32 scan vs f64 (N default 1e6,1e7,1e8; d=4).
    #[arg(long)]
    accuracy: bool,
    /// Streaming scale mode: forward+backward on inputs generated chunk by chunk.
    #[arg(long)]
    stream: bool,
    /// Sequence-parallel over MPI (start with `mpirun -np R`; needs a build with
    /// `--features mpi`): forward+backward timed with the collectives' share and bytes per
    /// layer (with --stream: each rank streams its slice).
    #[arg(long)]
    distributed: bool,
    /// With --distributed: --n is tokens per rank (weak scaling) instead of in all.
    #[arg(long)]
    weak: bool,
    /// With --distributed: compare with the single-process kernels on rank 0 (small N).
    #[arg(long)]
    check: bool,
    #[command(flatten)]
    common: Common,
}

#[derive(Args)]
struct DistModelArgs {
    /// JSON rows of `bench --distributed` (experiments/distributed/scaling.sh writes them).
    #[arg(long, default_value = "docs/bench/distributed.jsonl")]
    runs: PathBuf,
    /// Folder for bench/distributed.csv, bench/distributed-projection.csv and
    /// figures/distributed-scaling.png.
    #[arg(long, default_value = "docs")]
    out: PathBuf,
    /// Tokens of the projection.
    #[arg(long, default_value_t = 1e12)]
    tokens: f64,
    /// Node counts of the projection.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1, 8, 64, 1024])]
    nodes: Vec<usize>,
    /// Also project for another kind of node: NAME=CAUSAL:SECONDS_PER_TOKEN, its measured
    /// forward+backward seconds per token of the same shape (CAUSAL: true or false); repeat.
    #[arg(long)]
    node: Vec<String>,
}

#[derive(Args)]
struct AttendArgs {
    #[arg(long)]
    q: PathBuf,
    #[arg(long)]
    k: PathBuf,
    #[arg(long)]
    v: PathBuf,
    /// The operator.
    #[arg(long, value_enum)]
    method: Method,
    /// Bits per table (R = 2^P buckets).
    #[arg(long, default_value_t = 2)]
    p: usize,
    /// Number of tables.
    #[arg(long, default_value_t = 2)]
    l: usize,
    /// Soft-hash inverse temperature.
    #[arg(long, default_value_t = DEFAULT_BETA, allow_negative_numbers = true)]
    beta: f64,
    /// Angular power.
    #[arg(long, default_value_t = 2.0, allow_negative_numbers = true)]
    gamma: f64,
    /// Logit scale for softmax/Performer (default 1/sqrt(d)).
    #[arg(long, allow_negative_numbers = true)]
    scale: Option<f64>,
    /// Performer feature count.
    #[arg(long, default_value_t = 256)]
    features: usize,
    #[arg(long)]
    causal: bool,
    /// Use these planes ([L, P, d] .npy) instead of drawing them from --seed.
    #[arg(long)]
    planes: Option<PathBuf>,
    /// Performer features ω ([m, d] .npy) instead of drawing them from --seed.
    #[arg(long)]
    omega: Option<PathBuf>,
    /// Save the planes used to this .npy file.
    #[arg(long)]
    save_planes: Option<PathBuf>,
    /// How the tables are combined: paper (Algorithm 1) or authors (per-bucket means).
    #[arg(long, value_enum, default_value_t = Combine::Paper)]
    combine: Combine,
    /// Output dtype: f32 or f64 (default: that of --q).
    #[arg(long)]
    dtype: Option<String>,
    /// Where to compute: reference (f64, exact), cpu (f32 kernels) or cuda (f32, soft only).
    #[arg(long, value_enum, default_value_t = Device::Reference)]
    device: Device,
    /// Memory budget (e.g. 8G, 512M; default: what the machine has available). Work whose
    /// buffers would exceed it is refused before anything is allocated.
    #[arg(long, value_parser = parse_memory)]
    max_memory: Option<u64>,
    /// Sequence-parallel over MPI (start with `mpirun -np R`; soft RACE on the CPU kernels,
    /// needs a build with `--features mpi`): each rank reads and computes its slice of the
    /// token axis; rank 0 writes --out.
    #[arg(long)]
    distributed: bool,
    /// With --distributed: each rank writes its slice to DIR/o.rank-NNNNN.npy (rank 0 also
    /// DIR/shards.json) instead of rank 0 writing --out.
    #[arg(long)]
    out_shards: Option<PathBuf>,
    #[command(flatten)]
    common: Common,
}

fn run_distributed_model(a: DistModelArgs) -> Result<()> {
    use racelab::distributed::{model::Interconnect, scaling};
    let rows = scaling::read_rows(&a.runs)?;
    let (bench, figs) = (a.out.join("bench"), a.out.join("figures"));
    std::fs::create_dir_all(&bench)?;
    std::fs::create_dir_all(&figs)?;
    let net = Interconnect::IB_HDR;
    let mut other = Vec::new();
    for spec in &a.node {
        let parsed = spec.split_once('=').and_then(|(name, rest)| {
            let (causal, secs) = rest.split_once(':')?;
            Some((
                name.to_string(),
                causal.parse::<bool>().ok()?,
                secs.parse::<f64>().ok()?,
            ))
        });
        match parsed {
            Some((name, causal, secs)) if secs > 0.0 => other.push(scaling::Node { name, causal, seconds_per_token: secs }),
            _ => anyhow::bail!("invalid parameter `node`: `{spec}`; give NAME=CAUSAL:SECONDS_PER_TOKEN, e.g. h200=false:1.37e-8"),
        }
    }
    let rep = scaling::run(
        &rows,
        &figs.join("distributed-scaling"),
        a.tokens,
        &a.nodes,
        &net,
        &other,
    )?;
    scaling::write_csv(&bench.join("distributed.csv"), &rep.rows)?;
    scaling::write_csv(&bench.join("distributed-projection.csv"), &rep.projections)?;
    println!(
        "{:>7} {:>6} {:>6} {:>8} {:>12} {:>10} {:>10} {:>9}",
        "scaling", "causal", "ranks", "threads", "N", "measured", "model", "coll %"
    );
    for r in &rep.rows {
        println!(
            "{:>7} {:>6} {:>6} {:>8} {:>12} {:>10.3} {:>10.3} {:>9.2}",
            r.scaling,
            r.causal,
            r.ranks,
            r.threads_per_rank,
            r.n,
            r.seconds,
            r.model_seconds,
            100.0 * r.collective_share
        );
    }
    println!("projection over {}:", net.name);
    println!(
        "{:>28} {:>6} {:>6} {:>12} {:>12} {:>12} {:>10}",
        "node", "causal", "nodes", "tokens/node", "compute s", "comm s", "comm %"
    );
    for p in &rep.projections {
        println!(
            "{:>28} {:>6} {:>6} {:>12.3e} {:>12.1} {:>12.3e} {:>10.2e}",
            p.node,
            p.causal,
            p.nodes,
            p.tokens_per_node,
            p.compute_seconds,
            p.communication_seconds,
            100.0 * p.communication_share
        );
    }
    Ok(())
}

/// `attend --distributed`: checks what this build and the arguments allow, then runs the job
/// on MPI's world ([`racelab::distributed::job`]).
fn run_attend_distributed(a: AttendArgs) -> Result<()> {
    if a.method != Method::Soft || a.device != Device::Cpu && a.device != Device::Reference {
        anyhow::bail!("invalid parameter `distributed`: it runs soft RACE on the CPU kernels; use --method soft --device cpu");
    }
    if a.device == Device::Reference {
        anyhow::bail!("invalid parameter `device`: --distributed runs the f32 CPU kernels on every rank; add --device cpu");
    }
    let dtype = match a.dtype.as_deref() {
        None => None,
        Some("f32") => Some(Dtype::F32),
        Some("f64") => Some(Dtype::F64),
        Some(other) => anyhow::bail!("invalid parameter `dtype`: `{other}`; use f32 or f64"),
    };
    let job = racelab::distributed::job::AttendJob {
        q: a.q,
        k: a.k,
        v: a.v,
        params: racelab::RaceParams {
            p: a.p,
            l: a.l,
            beta: a.beta,
            combine: a.combine,
            causal: a.causal,
            seed: a.common.seed,
        },
        planes: a.planes,
        out: a.common.out,
        out_shards: a.out_shards,
        dtype,
    };
    let json = a.common.json;
    mpi_run(|comm| {
        let report = racelab::distributed::job::attend(comm, &job)?;
        Ok(report.map(|r| {
            if json {
                serde_json::to_string(&r).unwrap_or_default()
            } else {
                r.to_string()
            }
        }))
    })
}

/// `bench --distributed`: the in-memory timing ([`racelab::distributed::bench`]) or, with
/// --stream, the streaming run over ranks; rank 0 prints the row.
fn run_bench_distributed(a: BenchArgs, (p, l): (usize, usize)) -> Result<()> {
    use racelab::distributed::job::JobError;
    let spec = racelab::distributed::bench::Spec {
        n: a.n
            .first()
            .copied()
            .unwrap_or(if a.stream { 1_000_000_000 } else { 1 << 18 }),
        weak: a.weak,
        heads: a.heads,
        d: a.d,
        p,
        l,
        beta: a.beta,
        seed: a.common.seed,
        causal: a.causal,
        runs: a.runs,
        check: a.check,
    };
    if a.stream && (a.weak || a.check) {
        anyhow::bail!(
            "invalid parameter `stream`: the streaming run takes neither --weak nor --check"
        );
    }
    let (out, json) = (a.common.out.clone(), a.common.json);
    mpi_run(|comm| {
        use racelab::distributed::Comm;
        let rank = comm.rank();
        let (line, text) = if a.stream {
            let show = |m: &str| {
                if rank == 0 {
                    progress(m)
                }
            };
            let stream = racelab::cpu::stream::StreamSpec {
                n: spec.n,
                heads: spec.heads,
                d: spec.d,
                p,
                l,
                beta: spec.beta as f32,
                seed: spec.seed,
                causal: spec.causal,
            };
            let rep = racelab::cpu::stream::run_on(comm, stream, &show)?;
            (serde_json::to_string(&rep).unwrap_or_default(), format!(
                "streaming {}forward+backward over {} ({}): N = {}, {} heads, d = {}, (P,L) = ({p},{l}): {:.1} s ({:.1}% in collectives), {:.3e} tokens/s, peak RSS per rank {:?} MiB",
                if rep.causal { "causal " } else { "" }, rep.ranks, rep.transport, rep.n, rep.heads, rep.d, rep.seconds,
                100.0 * rep.collective_seconds / rep.seconds, rep.tokens_per_s,
                rep.peak_rss_bytes_per_rank.iter().map(|b| b >> 20).collect::<Vec<_>>()
            ))
        } else {
            let row = racelab::distributed::bench::run(comm, &spec)?;
            (
                serde_json::to_string(&row).unwrap_or_default(),
                row.to_string(),
            )
        };
        if rank != 0 {
            return Ok(None);
        }
        if let Some(path) = &out {
            std::fs::write(path, format!("{line}\n"))
                .map_err(|e| JobError::from(racelab::RaceError::io(path, e)))?;
        }
        Ok(Some(if json { line } else { text }))
    })
}

/// Run `job` on MPI's world and print rank 0's report. An error every rank has (decided by a
/// collective) is printed by each rank, which then exits with code 2; an error of one rank
/// is printed and ends the job with `MPI_Abort`.
#[cfg(feature = "mpi")]
fn mpi_run(
    job: impl FnOnce(
        &racelab::distributed::mpi::MpiComm,
    ) -> std::result::Result<Option<String>, racelab::distributed::job::JobError>,
) -> Result<()> {
    use racelab::distributed::Comm;
    let comm = racelab::distributed::mpi::MpiComm::init()
        .context("MPI could not be initialised with serialized threads (or was already)")?;
    let (rank, size) = (comm.rank(), comm.size());
    match job(&comm) {
        Ok(Some(text)) => {
            println!("{text}");
            Ok(())
        }
        Ok(None) => Ok(()),
        Err(e) if e.every_rank => {
            error_line(&format!("error (rank {rank} of {size}): {}", e.error));
            drop(comm);
            std::process::exit(2)
        }
        Err(e) => {
            error_line(&format!(
                "error (rank {rank} of {size}, ending the job with MPI_Abort): {}",
                e.error
            ));
            comm.abort(2)
        }
    }
}

#[cfg(not(feature = "mpi"))]
fn mpi_run(
    _job: impl FnOnce(
        &racelab::distributed::Solo,
    ) -> std::result::Result<Option<String>, racelab::distributed::job::JobError>,
) -> Result<()> {
    anyhow::bail!("this racelab was built without MPI: build it with `cargo build --release --features mpi` (needs an MPI library; Debian: libopenmpi-dev openmpi-bin libclang-dev) and start it with mpirun")
}

fn parse_memory(s: &str) -> std::result::Result<u64, String> {
    racelab::memory::parse_bytes(s).map_err(|e| e.to_string())
}

#[derive(Args)]
struct ReproduceArgs {
    /// Small grids; finishes in minutes.
    #[arg(long)]
    quick: bool,
    /// Independent master seeds for every empirical claim (from --seed on): inputs and planes
    /// are redrawn per seed, and seeds that disagree make the verdict "unstable (k/K holds)".
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=100))]
    seeds: u64,
    #[command(flatten)]
    common: Common,
}

fn main() {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Attend(a) => run_attend(a),
        Cmd::Reproduce(a) => run_reproduce(a),
        Cmd::Bench(a) => run_bench(a),
        Cmd::DistributedModel(a) => run_distributed_model(a),
        Cmd::Fig3(a) => {
            let user = match (&a.q, &a.k) {
                (Some(q), Some(k)) => Some(registry::user_fig3_inputs(q, k)),
                _ => None,
            };
            match user.transpose() {
                Ok(Some(u)) => run_exp(&a.exp, |ctx| experiments::fig3::run(ctx, Some(u))),
                Ok(None) => run_exp(&a.exp, |ctx| registry::run("fig3", ctx)),
                Err(e) => Err(e.into()),
            }
        }
        Cmd::Bias(a) => run_exp(&a, |c| registry::run("bias", c)),
        Cmd::Variance(a) => run_exp(&a, |c| registry::run("variance", c)),
        Cmd::Theorem(a) => run_exp(&a, |c| registry::run("theorem", c)),
        Cmd::Causal(a) => run_exp(&a, |c| registry::run("causal", c)),
        Cmd::Authors(a) => run_exp(&a, |c| registry::run("authors", c)),
        Cmd::Rank(a) => run_exp(&a, |c| registry::run("rank", c)),
        Cmd::Lemma10(a) => run_exp(&a, |c| registry::run("lemma10", c)),
        Cmd::Limit(a) => run_exp(&a, |c| registry::run("limit", c)),
        Cmd::Tradeoff(a) => run_exp(&a, |c| registry::run("tradeoff", c)),
        Cmd::Combine(a) => run_exp(&a, |c| registry::run("combine", c)),
        Cmd::Mqar(a) => run_exp(&a, |c| registry::run("mqar", c)),
        Cmd::Real(a) => {
            let dir = a.data.clone().or_else(experiments::real::bundled);
            match dir {
                Some(dir) => run_exp(&a, |ctx| experiments::real::run(ctx, &dir)),
                None => Err(anyhow::anyhow!("no real data: pass --data DIR (made by experiments/extract_qk.py); the bundled experiments/data/minilm was not found")),
            }
        }
    };
    if let Err(e) = r {
        error_line(&format!("error: {e:#}"));
        std::process::exit(2);
    }
}

/// `msg` and a newline to stderr in one write: `eprintln!` writes its pieces one by one, and
/// the ranks of an MPI job share one stderr, where pieces of their lines would interleave.
fn error_line(msg: &str) {
    use std::io::Write;
    let _ = std::io::stderr()
        .lock()
        .write_all(format!("{msg}\n").as_bytes());
}

fn run_attend(a: AttendArgs) -> Result<()> {
    if a.distributed {
        return run_attend_distributed(a);
    }
    if a.out_shards.is_some() {
        anyhow::bail!("invalid parameter `out-shards`: it writes the slices of a distributed run; add --distributed (under mpirun) or use --out");
    }
    let (method, combine) = (a.method, a.combine);
    let q = read_npy(&a.q)?;
    let k = read_npy(&a.k)?;
    let v = read_npy(&a.v)?;
    let planes = match &a.planes {
        Some(p) => Some(read_planes(p)?),
        None => None,
    };
    let (p, l) = match &planes {
        Some(pl) => (pl.p, pl.l),
        None => (a.p, a.l),
    };
    let opts = AttendOptions {
        method,
        causal: a.causal,
        p,
        l,
        beta: a.beta,
        gamma: a.gamma,
        seed: a.common.seed,
        combine,
        scale: a.scale,
        features: a.features,
        planes,
        omega: match &a.omega {
            Some(p) => Some(registry::read_matrix(p, "omega")?),
            None => None,
        },
        max_memory: a.max_memory,
    };
    let out = a
        .common
        .out
        .clone()
        .context("--out O.npy is required for attend")?;
    let dtype = match a.dtype.as_deref() {
        None => q.dtype,
        Some("f32") => Dtype::F32,
        Some("f64") => Dtype::F64,
        Some(other) => anyhow::bail!("invalid parameter `dtype`: `{other}`; use f32 or f64"),
    };
    let t0 = Instant::now();
    let res = racelab::attend::attend_with(&q.tensor, &k.tensor, &v.tensor, &opts, a.device)?;
    let seconds = t0.elapsed().as_secs_f64();
    write_npy(&out, &res.o.shape, &res.o.data, dtype)?;
    if let (Some(path), Some(pl)) = (&a.save_planes, &res.planes) {
        write_planes(path, pl)?;
    }
    let summary = json!({
        "method": method.name(),
        "q_shape": q.tensor.shape, "k_shape": k.tensor.shape, "v_shape": v.tensor.shape, "o_shape": res.o.shape,
        "causal": a.causal,
        "p": method.uses_planes().then_some(p), "l": method.uses_planes().then_some(l),
        "beta": (method == Method::Soft).then_some(a.beta),
        "gamma": (method == Method::Angular).then_some(a.gamma),
        "combine": (method == Method::Soft).then_some(combine),
        "features": (method == Method::Performer).then_some(a.features),
        "seed": a.common.seed,
        "device": a.device,
        "planes": a.planes.as_ref().map(|p| p.display().to_string()),
        "seconds": seconds,
        "empty_rows": res.empty_rows,
        "recomputed_rows": (method == Method::Soft).then_some(res.recomputed.rows.len()),
        "recompute_seconds": (method == Method::Soft).then_some(res.recomputed.seconds),
        "out": out.display().to_string(),
    });
    if a.common.json {
        println!("{summary}");
    } else {
        println!(
            "{} attention: q {:?} k {:?} v {:?} -> {} ({:.3} s){}",
            method.name(),
            q.tensor.shape,
            k.tensor.shape,
            v.tensor.shape,
            out.display(),
            seconds,
            if res.empty_rows > 0 || method == Method::Hard {
                format!(", {} empty rows", res.empty_rows)
            } else {
                String::new()
            }
        );
    }
    if !res.recomputed.rows.is_empty() {
        eprintln!(
            "note: {} rows had a denominator below what f32 holds and were recomputed exactly \
             in the log domain ({:.3} s)",
            res.recomputed.rows.len(),
            res.recomputed.seconds
        );
    }
    if res.empty_rows > 0 {
        eprintln!(
            "warning: {} rows had denominator 0 and were set to 0 ({})",
            res.empty_rows,
            if method == Method::Hard {
                "queries that collide with no key"
            } else {
                "rows below f32's range that this method's kernel cannot recompute; try \
                 --device reference"
            }
        );
    }
    Ok(())
}

fn exp_ctx(a: &ExpArgs) -> experiments::Ctx {
    experiments::Ctx {
        out: a
            .common
            .out
            .clone()
            .unwrap_or_else(|| PathBuf::from("figures")),
        seed: a.common.seed,
        quick: a.quick,
        config: a.config.clone(),
        data: a.data.clone(),
    }
}

fn print_result(r: &experiments::ExpResult, json: bool) {
    if json {
        // The headline figures at top level (the contract's `rows`, `max_shat`, …), plus claims.
        let mut obj = match &r.headline {
            serde_json::Value::Object(m) => m.clone(),
            other => {
                let mut m = serde_json::Map::new();
                m.insert("headline".into(), other.clone());
                m
            }
        };
        for (k, v) in [
            ("name", json!(r.name)),
            ("claims", json!(r.claims)),
            ("csv", json!(r.csv)),
            ("figures", json!(r.figures)),
            ("seconds", json!(r.seconds)),
            ("seed", json!(r.seed)),
        ] {
            obj.insert(k.into(), v);
        }
        println!("{}", serde_json::Value::Object(obj));
        return;
    }
    println!("{} ({:.1} s, seed {})", r.name, r.seconds, r.seed);
    for c in &r.claims {
        println!(
            "  [{}] {}\n      measured: {}",
            c.verdict.text(),
            c.claim,
            c.measured
        );
    }
    println!(
        "  wrote {} and {}",
        r.csv.join(", "),
        r.figures
            .iter()
            .map(|f| format!("{f}.png/.svg"))
            .collect::<Vec<_>>()
            .join(", ")
    );
}

fn run_exp(
    a: &ExpArgs,
    f: impl FnOnce(&experiments::Ctx) -> racelab::Result<experiments::ExpResult>,
) -> Result<()> {
    let ctx = exp_ctx(a);
    let r = f(&ctx)?;
    print_result(&r, a.common.json);
    Ok(())
}

fn run_reproduce(a: ReproduceArgs) -> Result<()> {
    let ctx = experiments::Ctx {
        out: a
            .common
            .out
            .clone()
            .unwrap_or_else(|| PathBuf::from("figures")),
        seed: a.common.seed,
        quick: a.quick,
        config: None,
        data: None,
    };
    let bar = indicatif::ProgressBar::new(registry::reproduce_steps().len() as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let (results, report, total) = registry::reproduce(
        &ctx,
        a.seeds as usize,
        &|n| bar.set_length(n),
        &|name| bar.set_message(name.to_string()),
        &|name, r| {
            bar.println(format!(
                "{name}: {:.1} s, {} claims",
                r.seconds,
                r.claims.len()
            ));
            bar.inc(1);
        },
    )?;
    bar.finish_and_clear();
    if a.common.json {
        let claims: Vec<_> = results.iter().flat_map(|r| r.claims.clone()).collect();
        println!(
            "{}",
            json!({ "report": report.display().to_string(), "seconds": total, "claims": claims })
        );
    } else {
        for r in &results {
            print_result(r, false);
        }
        println!("wrote {} ({:.1} s)", report.display(), total);
    }
    Ok(())
}

fn progress(msg: &str) {
    eprintln!("[racelab] {msg}");
}

fn run_bench(a: BenchArgs) -> Result<()> {
    use racelab::bench;
    if a.p.len() != a.l.len() {
        anyhow::bail!("invalid parameter `p`/`l`: --p and --l are paired and need the same length (got {} and {})", a.p.len(), a.l.len());
    }
    let pl: Vec<(usize, usize)> = a.p.iter().cloned().zip(a.l.iter().cloned()).collect();
    if a.accuracy {
        let ns = if a.n.is_empty() {
            vec![1_000_000, 10_000_000, 100_000_000]
        } else {
            a.n.clone()
        };
        let (p, l) = pl[0];
        let rows = bench::accuracy::run(&ns, 4, 2, p, l, a.beta, a.common.seed, &progress)?;
        if a.common.json {
            println!(
                "{}",
                json!({ "accuracy": rows, "provenance": racelab::provenance::Provenance::collect() })
            );
        } else {
            println!(
                "causal f32 scan vs f64 recurrence (one head, d=4, dv=2, (P,L)=({p},{l}), beta={})",
                a.beta
            );
            println!(
                "{:>12} {:>16} {:>18} {:>10}",
                "N", "kernel rel err", "naive f32 rel err", "kernel s"
            );
            for r in &rows {
                println!(
                    "{:>12} {:>16.3e} {:>18.3e} {:>10.2}",
                    r.n, r.kernel_rel_err, r.naive_f32_rel_err, r.kernel_seconds
                );
            }
        }
        return Ok(());
    }
    if a.distributed {
        return run_bench_distributed(a, pl[0]);
    }
    if a.weak || a.check {
        anyhow::bail!("invalid parameter `weak`/`check`: they apply to `bench --distributed`; add --distributed (under mpirun)");
    }
    if a.stream {
        let n = a.n.first().copied().unwrap_or(100_000_000);
        let (p, l) = pl[0];
        let spec = racelab::cpu::stream::StreamSpec {
            n,
            heads: a.heads,
            d: a.d,
            p,
            l,
            beta: a.beta as f32,
            seed: a.common.seed,
            causal: a.causal,
        };
        let rep = racelab::cpu::stream::run(spec, &progress)?;
        if a.common.json {
            println!("{}", serde_json::to_string(&rep)?);
        } else {
            println!(
                "streaming {}forward+backward: N = {}, {} heads, d = {}, (P,L) = ({p},{l}): {:.1} s, {:.3e} tokens/s, peak RSS {:.2} GiB",
                if a.causal { "causal " } else { "" },
                rep.n, rep.heads, rep.d, rep.seconds, rep.tokens_per_s, rep.peak_rss_bytes as f64 / (1u64 << 30) as f64
            );
        }
        return Ok(());
    }
    let cfg = bench::BenchConfig {
        ns: if a.n.is_empty() {
            (10..=20).map(|e| 1usize << e).collect()
        } else {
            a.n.clone()
        },
        pl,
        heads: a.heads,
        d: a.d,
        causal: a.causal,
        backward: a.backward,
        reference: a.reference,
        device: a.device,
        beta: a.beta,
        seed: a.common.seed,
        runs: a.runs.max(3),
        ref_budget_s: a.ref_budget,
        causal_ratio: a.causal_ratio,
        row_probe_bytes: bench::ADJACENT_PROBE_BYTES,
        out: Some(a.common.out.clone().unwrap_or_else(|| {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0);
            PathBuf::from(format!("figures/bench/run-{t}"))
        })),
    };
    let rep = bench::run(&cfg, &progress)?;
    if a.common.json {
        println!("{}", serde_json::to_string(&rep)?);
        return Ok(());
    }
    println!("{}", rep.provenance.line());
    println!(
        "measured bandwidth {:.1} GB/s (probes before/after the rows: {:.1}, {:.1}; floors use the larger, or the larger of a row's own probes where it has them), FMA peak {:.0} GFLOP/s ({})",
        rep.bandwidth_gbs,
        rep.bandwidth_probes_gbs[0],
        rep.bandwidth_probes_gbs[1],
        rep.fma_peak_gflops,
        rep.isa
    );
    if let Some(g) = &rep.gpu {
        println!(
            "GPU {}: measured copy bandwidth {:.0} GB/s, FP32 FMA {:.0} GFLOP/s (the race rows' floors){}",
            g.name,
            g.bandwidth_gbs,
            g.fp32_gflops,
            if g.switches.is_empty() {
                String::new()
            } else {
                format!("; {}", g.switches.join(" "))
            }
        );
    }
    println!(
        "{:<10} {:>10} {:>6} {:>7} {:>11} {:>12} {:>10} {:>9} {:>10} {:>10}",
        "method",
        "N",
        "(P,L)",
        "causal",
        "seconds",
        "tokens/s",
        "RSS GiB",
        "x floor",
        "x flops",
        "row probes"
    );
    for r in &rep.rows {
        let pl = match (r.p, r.l) {
            (Some(p), Some(l)) => format!("({p},{l})"),
            _ => "-".into(),
        };
        let xf = r
            .flop_floor_seconds
            .map(|f| format!("{:.2}", r.seconds / f))
            .unwrap_or_default();
        println!(
            "{:<10} {:>10} {:>6} {:>7} {:>11.4e} {:>12.4e} {:>10.2} {:>9.2} {:>10} {:>10}",
            r.method,
            r.n,
            pl,
            if r.causal { "yes" } else { "no" },
            r.seconds,
            r.tokens_per_s,
            r.peak_rss_bytes as f64 / (1u64 << 30) as f64,
            r.ratio_to_floor,
            xf,
            r.bandwidth_probes_gbs
                .map(|[b, a]| format!("{b:.0}/{a:.0}"))
                .unwrap_or_else(|| "-".into())
        );
    }
    for f in &rep.fits {
        println!(
            "fit {}: time ~ N^{:.2} ({} points)",
            f.series, f.exponent, f.points
        );
    }
    for c in &rep.crossovers {
        println!(
            "crossover {} vs exact softmax: {} ({})",
            c.series,
            c.n.map(|n| n.to_string())
                .unwrap_or_else(|| "not reached at measured N".into()),
            c.note
        );
    }
    for c in &rep.causal_ratios {
        let (lo, hi) = c
            .pair_ratios
            .iter()
            .fold((f64::MAX, f64::MIN), |(a, b), &x| (a.min(x), b.max(x)));
        println!(
            "causal / non-causal ({},{}) N = {}: {:.3} (median of the alternated pairs, which span {:.3}–{:.3}; ratio of the rows' medians {:.3})",
            c.p, c.l, c.n, c.median_pair_ratio, lo, hi, c.ratio_of_medians
        );
    }
    for s in &rep.skipped {
        println!("skipped: {s}");
    }
    if let Some(d) = &rep.out_dir {
        println!("wrote {d}/bench.csv, bench.json, time_vs_n.png");
    }
    Ok(())
}
