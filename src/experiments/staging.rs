//! A run's outputs written into a staging folder beside `--out` and moved in when the run has
//! finished, so that `REPORT.md`, `claims.json` and every figure and CSV in `--out` always come
//! from one run. A run that stops early (an error, SIGINT, SIGTERM) removes its staging folder
//! and leaves `--out` as it was.

use crate::error::{RaceError, Result};
use std::path::{Path, PathBuf};

/// The results a run reads from its own output folder (the trained MQAR rows, and the
/// verdicts the new report is compared with), copied into the staging folder before the run.
const READ_FROM_OUT: &[&str] = &[
    "claims.json",
    "mqar/mqar.csv",
    "mqar/mqar.meta.json",
    "mqar/mqar_sweep.csv",
];

/// One run's staging folder (`.NAME.staging-PID` beside the output folder `NAME`).
#[derive(Debug)]
pub struct Staging {
    out: PathBuf,
    dir: PathBuf,
    done: bool,
}

impl Staging {
    /// Create the staging folder beside `out` (a folder or a new path), with copies of the
    /// results the run reads from `out`.
    pub fn begin(out: &Path) -> Result<Staging> {
        let name = out
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "out".into());
        let parent = match out.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        std::fs::create_dir_all(&parent).map_err(|e| RaceError::io(&parent, e))?;
        remove_stale(&parent, &format!(".{name}.staging-"));
        let dir = parent.join(format!(".{name}.staging-{}", std::process::id()));
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(|e| RaceError::io(&dir, e))?;
        }
        std::fs::create_dir_all(&dir).map_err(|e| RaceError::io(&dir, e))?;
        let staging = Staging {
            out: out.to_path_buf(),
            dir,
            done: false,
        };
        for rel in READ_FROM_OUT {
            let from = out.join(rel);
            if from.is_file() {
                let to = staging.dir.join(rel);
                if let Some(p) = to.parent() {
                    std::fs::create_dir_all(p).map_err(|e| RaceError::io(p, e))?;
                }
                std::fs::copy(&from, &to).map_err(|e| RaceError::io(&to, e))?;
            }
        }
        Ok(staging)
    }

    /// Where the run writes.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Move every file of the finished run into the output folder (replacing files of the same
    /// name; each move is a rename on the same file system), then remove the staging folder.
    pub fn finish(mut self) -> Result<()> {
        std::fs::create_dir_all(&self.out).map_err(|e| RaceError::io(&self.out, e))?;
        // The report and its twin last: until they arrive, no report in `out` claims the
        // new figures; the old ones go first.
        for old in ["REPORT.md", "claims.json"] {
            if self.dir.join(old).is_file() {
                let p = self.out.join(old);
                if p.is_file() {
                    std::fs::remove_file(&p).map_err(|e| RaceError::io(&p, e))?;
                }
            }
        }
        let mut files = Vec::new();
        collect(&self.dir, &mut files)?;
        let last = |p: &PathBuf| {
            p.parent() == Some(self.dir.as_path()) && {
                let n = p.file_name().map(|n| n.to_string_lossy().into_owned());
                matches!(n.as_deref(), Some("REPORT.md" | "claims.json"))
            }
        };
        files.sort_by_key(|p| last(p));
        for f in &files {
            let rel = f.strip_prefix(&self.dir).unwrap_or(f);
            let to = self.out.join(rel);
            if let Some(p) = to.parent() {
                std::fs::create_dir_all(p).map_err(|e| RaceError::io(p, e))?;
            }
            std::fs::rename(f, &to).map_err(|e| RaceError::io(&to, e))?;
        }
        std::fs::remove_dir_all(&self.dir).map_err(|e| RaceError::io(&self.dir, e))?;
        self.done = true;
        Ok(())
    }
}

impl Drop for Staging {
    /// A run that did not finish leaves no staging folder.
    fn drop(&mut self) {
        if !self.done {
            std::fs::remove_dir_all(&self.dir).ok();
        }
    }
}

/// Remove the staging folders `PREFIX<pid>` in `parent` whose process is gone (a run killed
/// by SIGKILL, which no handler sees).
fn remove_stale(parent: &Path, prefix: &str) {
    if !Path::new("/proc/self").exists() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(pid) = name
            .strip_prefix(prefix)
            .and_then(|p| p.parse::<u32>().ok())
        {
            if !Path::new(&format!("/proc/{pid}")).exists() {
                std::fs::remove_dir_all(e.path()).ok();
            }
        }
    }
}

/// Every file below `dir`.
fn collect(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for e in std::fs::read_dir(dir).map_err(|e| RaceError::io(dir, e))? {
        let p = e.map_err(|e| RaceError::io(dir, e))?.path();
        if p.is_dir() {
            collect(&p, out)?;
        } else {
            out.push(p);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_finished_run_replaces_and_an_unfinished_one_leaves_nothing() {
        let root = std::env::temp_dir().join(format!("racelab-staging-{}", std::process::id()));
        let out = root.join("figs");
        std::fs::create_dir_all(out.join("mqar")).unwrap();
        std::fs::write(out.join("REPORT.md"), "old").unwrap();
        std::fs::write(out.join("a.csv"), "old").unwrap();
        std::fs::write(out.join("mqar/mqar.csv"), "trained").unwrap();
        // Unfinished: dropped without finish.
        {
            let s = Staging::begin(&out).unwrap();
            assert_eq!(
                std::fs::read_to_string(s.path().join("mqar/mqar.csv")).unwrap(),
                "trained"
            );
            std::fs::write(s.path().join("a.csv"), "new").unwrap();
        }
        assert_eq!(std::fs::read_to_string(out.join("a.csv")).unwrap(), "old");
        assert_eq!(
            std::fs::read_dir(&root).unwrap().count(),
            1,
            "a staging folder left"
        );
        // Finished: the new set moves in.
        let s = Staging::begin(&out).unwrap();
        std::fs::create_dir_all(s.path().join("seeds/1")).unwrap();
        std::fs::write(s.path().join("a.csv"), "new").unwrap();
        std::fs::write(s.path().join("seeds/1/b.csv"), "new").unwrap();
        std::fs::write(s.path().join("REPORT.md"), "new").unwrap();
        s.finish().unwrap();
        for f in ["a.csv", "seeds/1/b.csv", "REPORT.md"] {
            assert_eq!(std::fs::read_to_string(out.join(f)).unwrap(), "new", "{f}");
        }
        assert_eq!(
            std::fs::read_to_string(out.join("mqar/mqar.csv")).unwrap(),
            "trained"
        );
        assert_eq!(std::fs::read_dir(&root).unwrap().count(), 1);
        std::fs::remove_dir_all(&root).ok();
    }
}
