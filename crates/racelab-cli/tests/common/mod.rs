//! Shared test helpers: the core's (seeded inputs, labelled closeness checks) and the
//! command line's.
#![allow(dead_code)]

#[path = "../../../racelab-core/tests/common/mod.rs"]
mod core_common;
pub use core_common::*;

use std::path::Path;
use std::process::Command;

/// `racelab attend` on `dir/q.npy`, `dir/k.npy`, `dir/v.npy`, writing `dir/o.npy`, with
/// `extra` arguments.
pub fn attend_command(dir: &Path, extra: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_racelab"));
    c.arg("attend");
    for name in ["q", "k", "v"] {
        c.arg(format!("--{name}"))
            .arg(dir.join(format!("{name}.npy")));
    }
    c.arg("--out").arg(dir.join("o.npy")).args(extra);
    c
}

/// `racelab attend` run in `dir` on `q.npy`, `k.npy`, `v.npy` there (relative paths).
pub fn attend_relative(dir: &std::path::Path) -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_racelab"));
    c.arg("attend").current_dir(dir);
    for name in ["q", "k", "v"] {
        c.arg(format!("--{name}")).arg(format!("{name}.npy"));
    }
    c
}

/// [`attend_relative`] with `args`: the exit code and stderr.
pub fn attend_here(dir: &std::path::Path, args: &[&str]) -> (Option<i32>, String) {
    let o = attend_relative(dir).args(args).output().unwrap();
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stderr).to_string(),
    )
}
