//! What every output records beside its numbers: git revision, machine, time, ISA, threads.

#![deny(missing_docs)]

use serde::Serialize;

/// Provenance of one run.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Provenance {
    /// The commit the code was built from (`unknown` outside a git checkout).
    pub git_revision: String,
    /// Whether the tree had uncommitted changes (outputs excluded).
    pub git_dirty: bool,
    /// The CPU model.
    pub cpu: String,
    /// Logical cores.
    pub cores: usize,
    /// Worker threads used (rayon).
    pub threads: usize,
    /// Physical memory, GiB.
    pub memory_gib: f64,
    /// The SIMD level the kernels dispatched to.
    pub isa: String,
    /// When the run started, seconds since 1970.
    pub unix_time: u64,
    /// The crate version.
    pub racelab_version: String,
}

fn git(args: &[&str]) -> Option<String> {
    let out = std::process::Command::new("git")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Whether revision `a` is an ancestor of (or equal to) revision `b` in this checkout's
/// history; `None` where git or either revision is not there.
pub fn git_is_ancestor(a: &str, b: &str) -> Option<bool> {
    let out = std::process::Command::new("git")
        .args(["merge-base", "--is-ancestor", a, b])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()?;
    match out.status.code() {
        Some(0) => Some(true),
        Some(1) => Some(false),
        _ => None,
    }
}

impl Provenance {
    /// The machine, revision and time of a run; `isa` is the SIMD level the kernels detected
    /// (`cpu::detected_isa().name()`), given by the caller so this file names nothing above it.
    pub fn collect(isa: &str) -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split(':').nth(1))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|| "unknown".into());
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let mem_kb: f64 = meminfo
            .lines()
            .find(|l| l.starts_with("MemTotal"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|s| s.parse().ok())
            .unwrap_or(0.0);
        // A binary carried to another machine (scripts/gpu-check.sh --prebuild) states its build
        // revision in RACELAB_BUILD_REV ("<rev>" or "<rev>+dirty"): the checkout there, if
        // any, need not be the one it was built from.
        let (git_revision, git_dirty) = match std::env::var("RACELAB_BUILD_REV") {
            Ok(r) if !r.trim().is_empty() => {
                let r = r.trim();
                (
                    r.trim_end_matches("+dirty").to_string(),
                    r.ends_with("+dirty"),
                )
            }
            _ => (
                git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into()),
                // Outputs under figures/ are what a run writes; they do not make the code dirty.
                git(&[
                    "status",
                    "--porcelain",
                    "--untracked-files=no",
                    "--",
                    ".",
                    ":!figures",
                ])
                .map(|s| !s.is_empty())
                .unwrap_or(false),
            ),
        };
        Provenance {
            git_revision,
            git_dirty,
            cpu,
            cores: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            threads: rayon::current_num_threads(),
            memory_gib: mem_kb / 1024.0 / 1024.0,
            isa: isa.to_string(),
            unix_time: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            racelab_version: env!("CARGO_PKG_VERSION").to_string(),
        }
    }

    /// One line for human summaries and CSV headers.
    pub fn line(&self) -> String {
        format!(
            "racelab {} @ {}{} | {} | {} cores, {} threads, {:.1} GiB, {}",
            self.racelab_version,
            self.git_revision,
            if self.git_dirty { "+dirty" } else { "" },
            self.cpu,
            self.cores,
            self.threads,
            self.memory_gib,
            self.isa
        )
    }
}

/// Current peak resident set size of this process (VmHWM), in bytes.
pub fn peak_rss_bytes() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmHWM"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

/// Reset the peak-RSS counter to the current RSS (Linux `clear_refs` 5); false if unsupported.
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Available memory (MemAvailable), in bytes.
pub fn available_memory_bytes() -> u64 {
    let s = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("MemAvailable"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .unwrap_or(8 << 30)
}
