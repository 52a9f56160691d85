//! The command line's arguments: one struct per subcommand, every flag with its help text.

use clap::{Args, Parser, Subcommand};
use racelab::experiments::registry;
use racelab::io::Dtype;
use racelab::params::DEFAULT_BETA;
use racelab::{Combine, Device, MethodKind};
use std::path::PathBuf;

/// A parsed command line: one of [`Cmd`], or an experiment of the registry by name.
pub enum Parsed {
    /// A subcommand with arguments of its own.
    Cmd(Cmd),
    /// `racelab NAME [ExpArgs]` for an experiment of [`registry::ENTRIES`] with a help line.
    Experiment(&'static str, ExpArgs),
}

/// Parse the command line. The experiments' subcommands are generated from the registry
/// ([`registry::ENTRIES`], each with its help line and the flags of [`ExpArgs`]). Every flag
/// that takes a value takes one with a leading minus (`--seed -1`, `--out -x`): the value
/// reaches its parser, whose message names the flag, instead of being read as an unknown flag.
pub fn parse() -> Parsed {
    use clap::{CommandFactory, FromArgMatches};
    let experiments = || {
        registry::ENTRIES
            .iter()
            .filter_map(|e| e.about.map(|about| (e.name, about)))
    };
    let cmd = experiments().fold(Cli::command(), |cmd, (name, about)| {
        cmd.subcommand(ExpArgs::augment_args(clap::Command::new(name)).about(about))
    });
    let cmd = cmd.mut_subcommands(|sub| {
        let names: Vec<clap::Id> = sub
            .get_arguments()
            .filter(|a| a.get_action().takes_values())
            .map(|a| a.get_id().clone())
            .collect();
        names.into_iter().fold(sub, |sub, id| {
            sub.mut_arg(id, |a| a.allow_negative_numbers(true))
        })
    });
    let m = match cmd.try_get_matches() {
        Ok(m) => m,
        Err(e) => parse_failed(e),
    };
    if let Some((name, sub)) = m.subcommand() {
        if let Some((name, _)) = experiments().find(|(n, _)| *n == name) {
            let a = ExpArgs::from_arg_matches(sub).unwrap_or_else(|e| parse_failed(e));
            return Parsed::Experiment(name, a);
        }
    }
    Parsed::Cmd(
        Cli::from_arg_matches(&m)
            .unwrap_or_else(|e| parse_failed(e))
            .cmd,
    )
}

/// A command line clap refused: its own message (and exit 0 for `--help`, `--version`), and
/// with `--json` also one JSON object on stdout naming the flag ([`crate::json_error`]).
fn parse_failed(e: clap::Error) -> ! {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let help = matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    );
    if !help && crate::wants_json() {
        // The flag as written in the usage (`--p <P>`): its first word.
        let flag = match e.get(ContextKind::InvalidArg) {
            Some(ContextValue::String(s)) => s.split_whitespace().next().map(str::to_string),
            _ => None,
        };
        let msg = e.to_string();
        let first = msg
            .lines()
            .next()
            .unwrap_or("")
            .trim_start_matches("error: ");
        crate::json_error(first, flag.as_deref());
    }
    e.exit()
}

/// The command line.
#[derive(Parser)]
#[command(
    name = "racelab",
    version,
    about = "RACE attention lab: exact, hashed and soft-hashed attention side by side"
)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Cmd,
}

/// Options every subcommand shares.
#[derive(Args, Clone)]
pub struct Common {
    /// Seed of every random draw (planes, inputs, features): 0 to 4294967295 (the experiments
    /// derive their draws' seeds from it by products and sums that stay within 64 bits).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(..=u32::MAX as u64))]
    pub seed: u64,
    /// Output folder (CSV, PNG, SVG) — or the output file for `attend`.
    #[arg(long, value_parser = output_path)]
    pub out: Option<PathBuf>,
    /// Print one JSON object on stdout instead of the human summary.
    #[arg(long)]
    pub json: bool,
}

/// The subcommands with arguments of their own (the experiments' are generated from the
/// registry: [`parse`]).
#[derive(Subcommand)]
pub enum Cmd {
    /// Run one operator on user Q/K/V (.npy, shapes [N,d], [H,N,d] or [B,H,N,d]).
    Attend(AttendArgs),
    /// The proved soft-hash bias bound at L = infinity, row by row, on your Q/K/V beside the
    /// measured bias (O_inf from g^P by quadrature).
    Bound(BoundArgs),
    /// Run every experiment that exists and write figures/REPORT.md.
    Reproduce(ReproduceArgs),
    /// Time the fast kernels against exact attention and the machine's measured limits.
    Bench(BenchArgs),
    /// Sequence-parallel RACE: the measured scaling runs against the time model, and the
    /// model's projection to a cluster (writes docs/bench/distributed*.csv and the figure).
    DistributedModel(DistModelArgs),
    /// Fig. 3-style heatmaps: softmax, angular (gamma 1, 6, 10, 12), soft and hard S-hat.
    Fig3(Fig3Args),
    /// Real transformer Q/K/V: heatmaps per head, RACE errors, tanh saturation (default: the
    /// bundled MiniLM sample).
    Real(ExpArgs),
}

#[derive(Args, Clone)]
pub struct ExpArgs {
    /// Small grids (minutes on 2 cores).
    #[arg(long)]
    pub quick: bool,
    /// A TOML config replacing the built-in experiments/<name>.toml.
    #[arg(long, value_parser = input_file)]
    pub config: Option<PathBuf>,
    /// A directory of real Q/K/V (experiments/extract_qk.py format; e.g. experiments/data/minilm)
    /// to use instead of synthetic inputs (fig3, theorem, tradeoff, combine, real).
    #[arg(long, value_parser = input_dir)]
    pub data: Option<PathBuf>,
    #[command(flatten)]
    pub common: Common,
}

#[derive(Args)]
pub struct Fig3Args {
    /// User queries (.npy, [N,d]; for [H,N,d] or [B,H,N,d] the first head is used).
    #[arg(long, requires = "k", value_parser = input_file)]
    pub q: Option<PathBuf>,
    /// User keys (.npy), same shape rules as --q.
    #[arg(long, requires = "q", value_parser = input_file)]
    pub k: Option<PathBuf>,
    #[command(flatten)]
    pub exp: ExpArgs,
}

#[derive(Args)]
pub struct BenchArgs {
    /// Sequence lengths (comma-separated). Default 2^10..2^20.
    #[arg(long, value_delimiter = ',')]
    pub n: Vec<usize>,
    /// Bits per table, paired with --l.
    #[arg(long, value_delimiter = ',', default_values_t = vec![2, 3, 4])]
    pub p: Vec<usize>,
    /// Tables, paired with --p.
    #[arg(long, value_delimiter = ',', default_values_t = vec![2, 3, 4])]
    pub l: Vec<usize>,
    /// Heads per row (batch 1).
    #[arg(long, default_value_t = 4)]
    pub heads: usize,
    /// Head dimension of queries, keys and values.
    #[arg(long, default_value_t = 128)]
    pub d: usize,
    /// Soft-hash inverse temperature (the kernels' cost does not depend on it below 16).
    #[arg(long, default_value_t = DEFAULT_BETA, value_parser = beta)]
    pub beta: f64,
    /// Time causal attention (Algorithm 2).
    #[arg(long)]
    pub causal: bool,
    /// Time each (P,L) causal and non-causal, runs alternated, and report the ratio.
    #[arg(long, conflicts_with_all = ["causal", "reference"])]
    pub causal_ratio: bool,
    /// Time forward+backward (default: forward only).
    #[arg(long)]
    pub backward: bool,
    /// Also time the exact quadratic references (softmax, angular).
    #[arg(long)]
    pub reference: bool,
    /// Which kernels to time.
    #[arg(long, value_parser = named(&Device::ALL, Device::name, Device::about), default_value = "cpu")]
    pub device: Device,
    /// Timed runs per row (median reported; at least 3; short rows get more, up to 0.25 s;
    /// at most 1000).
    #[arg(long, default_value_t = 3, value_parser = runs)]
    pub runs: usize,
    /// Stop timing a reference when its next run is predicted to exceed this (seconds).
    #[arg(long, default_value_t = 30.0, value_parser = positive)]
    pub ref_budget: f64,
    /// Long-sequence accuracy of the causal f32 scan vs f64 (N default 1e6,1e7,1e8; d=4).
    #[arg(long)]
    pub accuracy: bool,
    /// Streaming scale mode: forward+backward on inputs generated chunk by chunk.
    #[arg(long)]
    pub stream: bool,
    /// Sequence-parallel over MPI (start with `mpirun -np R`; needs a build with
    /// `--features mpi`): forward+backward timed with the collectives' share and bytes per
    /// layer (with --stream: each rank streams its slice).
    #[arg(long)]
    pub distributed: bool,
    /// With --distributed: --n is tokens per rank (weak scaling) instead of in all.
    #[arg(long)]
    pub weak: bool,
    /// With --distributed: compare with the single-process kernels on rank 0 (small N).
    #[arg(long)]
    pub check: bool,
    #[command(flatten)]
    pub common: Common,
}

#[derive(Args)]
pub struct DistModelArgs {
    /// JSON rows of `bench --distributed` (experiments/distributed/scaling.sh writes them;
    /// default: docs/bench/distributed.jsonl here, else the checkout's this binary was built
    /// from).
    #[arg(long, value_parser = input_file)]
    pub runs: Option<PathBuf>,
    /// Folder for bench/distributed.csv, bench/distributed-projection.csv and
    /// figures/distributed-scaling.png (default: the docs/ folder of the default --runs).
    #[arg(long, value_parser = output_path)]
    pub out: Option<PathBuf>,
    /// Tokens of the projection.
    #[arg(long, default_value_t = 1e12, value_parser = positive)]
    pub tokens: f64,
    /// Node counts of the projection.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1, 8, 64, 1024], value_parser = count)]
    pub nodes: Vec<usize>,
    /// Also project for another kind of node: NAME=CAUSAL:SECONDS_PER_TOKEN, its measured
    /// forward+backward seconds per token of the same shape (CAUSAL: true or false); repeat.
    #[arg(long)]
    pub node: Vec<String>,
}

/// The Q, K, V files of `attend` and `bound`.
#[derive(Args)]
pub struct QkvFiles {
    /// Queries (.npy, f32 or f64; [N, d], [H, N, d] or [B, H, N, d]).
    #[arg(long, value_parser = input_file)]
    pub q: PathBuf,
    /// Keys (.npy), the shape of --q with as many keys as --v has rows.
    #[arg(long, value_parser = input_file)]
    pub k: PathBuf,
    /// Values (.npy; [.., N, dv]).
    #[arg(long, value_parser = input_file)]
    pub v: PathBuf,
}

#[derive(Args)]
pub struct AttendArgs {
    #[command(flatten)]
    pub files: QkvFiles,
    /// The operator.
    #[arg(long, value_parser = named(&MethodKind::ALL, MethodKind::name, MethodKind::about))]
    pub method: MethodKind,
    /// Bits per table (R = 2^P buckets) [default: 2, or the --planes file's P].
    #[arg(long)]
    pub p: Option<usize>,
    /// Number of tables [default: 2, or the --planes file's L].
    #[arg(long)]
    pub l: Option<usize>,
    /// Soft-hash inverse temperature.
    #[arg(long, default_value_t = DEFAULT_BETA, value_parser = beta)]
    pub beta: f64,
    /// Angular power.
    #[arg(long, default_value_t = 2.0, value_parser = gamma)]
    pub gamma: f64,
    /// Logit scale for softmax/Performer (default 1/sqrt(d)).
    #[arg(long, value_parser = scale)]
    pub scale: Option<f64>,
    /// Performer feature count.
    #[arg(long, default_value_t = 256)]
    pub features: usize,
    /// Causal attention: query i sees keys 0..=i (Algorithm 2 for soft RACE).
    #[arg(long)]
    pub causal: bool,
    /// Use these planes ([L, P, d] .npy) instead of drawing them from --seed.
    #[arg(long, value_parser = input_file)]
    pub planes: Option<PathBuf>,
    /// Performer features ω ([m, d] .npy) instead of drawing them from --seed.
    #[arg(long, value_parser = input_file)]
    pub omega: Option<PathBuf>,
    /// Save the planes used to this .npy file.
    #[arg(long, value_parser = output_path)]
    pub save_planes: Option<PathBuf>,
    /// How the tables are combined: paper (Algorithm 1) or authors (per-bucket means).
    #[arg(long, value_parser = named(&Combine::ALL, Combine::name, Combine::about), default_value = "paper")]
    pub combine: Combine,
    /// Output dtype (default: that of --q).
    #[arg(long, value_parser = named(&Dtype::ALL, Dtype::name, Dtype::about))]
    pub dtype: Option<Dtype>,
    /// Where to compute: reference (f64, exact), cpu (f32 kernels) or cuda (f32, soft only).
    #[arg(long, value_parser = named(&Device::ALL, Device::name, Device::about), default_value = "reference")]
    pub device: Device,
    /// Memory budget (e.g. 8G, 512M; default: what the machine has available). Work whose
    /// buffers would exceed it is refused before anything is allocated.
    #[arg(long, value_parser = parse_memory)]
    pub max_memory: Option<u64>,
    /// Run exact softmax or angular attention even when its predicted time (from a timed
    /// probe of the same kernel, quadratic in N) is over a minute.
    #[arg(long)]
    pub allow_slow: bool,
    /// Sequence-parallel over MPI (start with `mpirun -np R`; soft RACE on the CPU kernels,
    /// needs a build with `--features mpi`): each rank reads and computes its slice of the
    /// token axis; rank 0 writes --out.
    #[arg(long)]
    pub distributed: bool,
    /// With --distributed: each rank writes its slice to DIR/o.rank-NNNNN.npy (rank 0 also
    /// DIR/shards.json) instead of rank 0 writing --out.
    #[arg(long, value_parser = output_path)]
    pub out_shards: Option<PathBuf>,
    #[command(flatten)]
    pub common: Common,
}

#[derive(Args)]
pub struct BoundArgs {
    #[command(flatten)]
    pub files: QkvFiles,
    /// Bits per table: the L = infinity kernel is g^P against angular attention's kappa^P.
    #[arg(long)]
    pub p: usize,
    /// Soft-hash inverse temperature (1e-3 to 1e6, where the quadrature of g is checked).
    #[arg(long, value_parser = beta)]
    pub beta: f64,
    /// Causal attention: query i sees keys 0..=i.
    #[arg(long)]
    pub causal: bool,
    /// Normalise the query and key rows to unit length first (the bound is proved for unit
    /// rows; without this flag rows of another norm are refused).
    #[arg(long)]
    pub normalize: bool,
    /// Also write every row (head, row, measured, bound, tolerance, ratio) to this CSV.
    #[arg(long, value_parser = output_path)]
    pub out: Option<PathBuf>,
    /// Print one JSON object on stdout: rows [{head, row, measured, bound, ...}], max_ratio,
    /// beta_min_covered.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct ReproduceArgs {
    /// Small grids; finishes in minutes.
    #[arg(long)]
    pub quick: bool,
    /// Independent master seeds for every empirical claim (from --seed on): inputs and planes
    /// are redrawn per seed, and seeds that disagree make the verdict "unstable (k/K hold)".
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=100))]
    pub seeds: u64,
    #[command(flatten)]
    pub common: Common,
}

/// The value parser of one of the core's named enums (`Device`, `MethodKind`, `Combine`,
/// `Dtype`): exactly the names `name` gives `all`, listed with their `about` line in `--help`
/// and in the error.
fn named<T: Copy + Send + Sync + 'static>(
    all: &'static [T],
    name: fn(&T) -> &'static str,
    about: fn(&T) -> &'static str,
) -> impl clap::builder::TypedValueParser<Value = T> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    let values = all
        .iter()
        .map(|v| PossibleValue::new(name(v)).help(about(v)));
    PossibleValuesParser::new(values).try_map(move |s: String| {
        all.iter()
            .copied()
            .find(|v| name(v) == s)
            .ok_or_else(|| format!("`{s}` is not one of the listed values"))
    })
}

/// `--max-memory`: a byte count with an optional K/M/G/T suffix.
pub fn parse_memory(s: &str) -> std::result::Result<u64, String> {
    racelab::memory::parse_bytes(s).map_err(|e| e.to_string())
}

/// A finite number above zero (every real-valued flag: β, γ, the logit scale, budgets, token
/// counts).
pub fn positive(s: &str) -> std::result::Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 => Ok(x),
        Ok(x) => Err(format!("{x} is not a finite number above 0")),
        Err(_) => Err(format!("`{s}` is not a number")),
    }
}

/// A real number that `check` takes, refused with the library's own message.
fn checked_real(
    s: &str,
    check: fn(f64) -> racelab::Result<()>,
) -> std::result::Result<f64, String> {
    let x = s
        .trim()
        .parse::<f64>()
        .map_err(|_| format!("`{s}` is not a number"))?;
    check(x).map(|()| x).map_err(|e| e.to_string())
}

/// `--beta`: the library's check.
pub fn beta(s: &str) -> std::result::Result<f64, String> {
    checked_real(s, racelab::params::validate_beta)
}

/// `--gamma`: the library's check.
pub fn gamma(s: &str) -> std::result::Result<f64, String> {
    checked_real(s, racelab::params::validate_gamma)
}

/// `--scale`: the library's check.
pub fn scale(s: &str) -> std::result::Result<f64, String> {
    checked_real(s, racelab::params::validate_scale)
}

/// `bench --runs`: 1 to 1000 timed runs per row (a median of 1000 is long settled; more would
/// only hold the machine).
pub fn runs(s: &str) -> std::result::Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if (1..=1000).contains(&n) => Ok(n),
        Ok(n) => Err(format!("{n} timed runs per row: give 1 to 1000")),
        Err(_) => Err(format!("`{s}` is not a whole number from 1 to 1000")),
    }
}

/// A count of at least one.
pub fn count(s: &str) -> std::result::Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(0) => Err("0 is not a count: give 1 or more".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("`{s}` is not a whole number of 1 or more")),
    }
}

/// A file that exists (read before any work starts).
pub fn input_file(s: &str) -> std::result::Result<PathBuf, String> {
    let p = PathBuf::from(s);
    if s.is_empty() {
        Err("an empty path: give a file".into())
    } else if p.is_dir() {
        Err(format!("`{s}` is a folder: give a file"))
    } else if !p.is_file() {
        Err(format!("no file `{s}`"))
    } else {
        Ok(p)
    }
}

/// A folder that exists.
pub fn input_dir(s: &str) -> std::result::Result<PathBuf, String> {
    let p = PathBuf::from(s);
    if s.is_empty() {
        Err("an empty path: give a folder".into())
    } else if !p.is_dir() {
        Err(format!("no folder `{s}`"))
    } else {
        Ok(p)
    }
}

/// A path to write to: not empty.
pub fn output_path(s: &str) -> std::result::Result<PathBuf, String> {
    if s.is_empty() {
        Err("an empty path: give a file or folder to write".into())
    } else {
        Ok(PathBuf::from(s))
    }
}
