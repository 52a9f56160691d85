//! `racelab distributed-model`, and the MPI world every `--distributed` run starts in.

use crate::args::DistModelArgs;
#[cfg(feature = "mpi")]
use crate::error_line;
#[cfg(feature = "mpi")]
use anyhow::Context;
use anyhow::Result;

/// `distributed-model`: the measured scaling runs against the time model, and its projection.
pub fn run_model(a: DistModelArgs) -> Result<()> {
    use racelab::distributed::{model::Interconnect, scaling};
    // The records' docs/ folder: here, or the checkout's this binary was built from, so the
    // command runs from any folder.
    let docs = {
        let here = std::path::PathBuf::from("docs");
        if here.join("bench/distributed.jsonl").exists() {
            here
        } else {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs")
        }
    };
    let runs = a
        .runs
        .clone()
        .unwrap_or_else(|| docs.join("bench/distributed.jsonl"));
    let out = a.out.clone().unwrap_or(docs);
    racelab::io::check_output_dir(&out, "out")?;
    let rows = scaling::read_rows(&runs)?;
    let (bench, figs) = (out.join("bench"), out.join("figures"));
    for dir in [&bench, &figs] {
        std::fs::create_dir_all(dir).map_err(|e| racelab::RaceError::io(dir, e))?;
    }
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

/// Run `job` on MPI's world and print rank 0's report. An error every rank has (decided by a
/// collective) is printed by each rank, which then exits with code 2; an error of one rank
/// is printed and ends the job with `MPI_Abort`.
#[cfg(feature = "mpi")]
pub(crate) fn mpi_run(
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
pub(crate) fn mpi_run(
    _job: impl FnOnce(
        &racelab::distributed::Solo,
    ) -> std::result::Result<Option<String>, racelab::distributed::job::JobError>,
) -> Result<()> {
    anyhow::bail!("--distributed: this racelab was built without MPI: build it with `cargo build --release --features mpi` (needs an MPI library; Debian: libopenmpi-dev openmpi-bin libclang-dev) and start it with mpirun")
}
