//! The `racelab` command line: [`args`] parses, one file per command runs it (`attend`,
//! `bench`, the experiments and `reproduce`, the distributed model and MPI runs). Library
//! errors are wrapped in `anyhow` here, at the edge.

mod args;
mod attend;
mod bench;
mod bound;
mod distributed;
mod experiments;
mod ticker;

use args::Cmd;

fn main() {
    let cli = args::parse();
    let r = match cli.cmd {
        Cmd::Attend(a) => attend::run(a),
        Cmd::Bound(a) => bound::run(a),
        Cmd::Reproduce(a) => experiments::run_reproduce(a),
        Cmd::Bench(a) => bench::run(a),
        Cmd::DistributedModel(a) => distributed::run_model(a),
        Cmd::Fig3(a) => experiments::run_fig3(a),
        Cmd::Bias(a) => experiments::run_named("bias", &a),
        Cmd::Variance(a) => experiments::run_named("variance", &a),
        Cmd::Theorem(a) => experiments::run_named("theorem", &a),
        Cmd::Causal(a) => experiments::run_named("causal", &a),
        Cmd::Authors(a) => experiments::run_named("authors", &a),
        Cmd::Rank(a) => experiments::run_named("rank", &a),
        Cmd::Lemma10(a) => experiments::run_named("lemma10", &a),
        Cmd::Limit(a) => experiments::run_named("limit", &a),
        Cmd::Tradeoff(a) => experiments::run_named("tradeoff", &a),
        Cmd::Combine(a) => experiments::run_named("combine", &a),
        Cmd::Mqar(a) => experiments::run_named("mqar", &a),
        Cmd::Real(a) => experiments::run_real(a),
    };
    if let Err(e) = r {
        error_line(&format!("error: {e:#}"));
        std::process::exit(2);
    }
}

/// `msg` and a newline to stderr in one write: `eprintln!` writes its pieces one by one, and
/// the ranks of an MPI job share one stderr, where pieces of their lines would interleave.
pub(crate) fn error_line(msg: &str) {
    use std::io::Write;
    let _ = std::io::stderr()
        .lock()
        .write_all(format!("{msg}\n").as_bytes());
}

/// A progress line on stderr.
pub(crate) fn progress(msg: &str) {
    eprintln!("[racelab] {msg}");
}
