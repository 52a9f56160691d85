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

use args::{Cmd, Parsed};
use racelab::error::Spelling;

fn main() {
    default_sigpipe();
    // The library's messages name arguments as flags (`--max-memory`, `--device reference`).
    racelab::error::set_spelling(Spelling::Cli);
    let r = match args::parse() {
        Parsed::Experiment(name, a) => experiments::run_named(name, &a),
        Parsed::Cmd(cmd) => match cmd {
            Cmd::Attend(a) => attend::run(a),
            Cmd::Bound(a) => bound::run(a),
            Cmd::Reproduce(a) => experiments::run_reproduce(a),
            Cmd::Bench(a) => bench::run(a),
            Cmd::DistributedModel(a) => distributed::run_model(a),
            Cmd::Fig3(a) => experiments::run_fig3(a),
            Cmd::Real(a) => experiments::run_real(a),
        },
    };
    if let Err(e) = r {
        error_line(&format!("error: {e:#}"));
        if wants_json() {
            // The library's error names its argument; the command line's own refusals
            // say "invalid parameter `NAME`".
            let arg = match e
                .chain()
                .find_map(|c| c.downcast_ref::<racelab::RaceError>())
            {
                Some(r) => r.arg().map(|a| Spelling::Cli.arg(a)),
                None => e
                    .to_string()
                    .strip_prefix("invalid parameter `")
                    .and_then(|rest| rest.split_once('`'))
                    .map(|(name, _)| Spelling::Cli.arg(name)),
            };
            json_error(&format!("{e:#}"), arg.as_deref());
        }
        std::process::exit(2);
    }
}

/// Whether the command line asks for JSON (`--json`, on any subcommand).
pub(crate) fn wants_json() -> bool {
    std::env::args_os().skip(1).any(|a| a == "--json")
}

/// A failed run under `--json`: one object on stdout, `{"error": msg, "argument": flag}`
/// (`argument` null where no one argument is at fault), as the run's output would have been.
pub(crate) fn json_error(msg: &str, argument: Option<&str>) {
    use std::io::Write;
    let obj = serde_json::json!({ "error": msg, "argument": argument });
    let _ = std::io::stdout()
        .lock()
        .write_all(format!("{obj}\n").as_bytes());
}

/// A reader that closes the pipe (`racelab bench | head`) ends the process quietly, as it ends
/// `cat`: the Rust runtime ignores SIGPIPE, so a write to the closed pipe fails with EPIPE and
/// `println!` panics. Restoring the default action makes the write end the process instead
/// (exit by signal 13; a staging folder it leaves is removed by the next run, as after SIGKILL).
fn default_sigpipe() {
    #[cfg(unix)]
    // SAFETY: `signal` with `SIG_DFL` installs no handler of ours (nothing runs in signal
    // context); it is called first in `main`, before any other thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
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
