//! The one error type of the library. Every variant names the argument at fault and, where
//! there is one, the fix. The CLI wraps it in `anyhow` at the edge only.
//!
//! **Arguments in the front end's words.** An error carries the argument's library name
//! (`p`, `max_memory`: [`RaceError::arg`]). A message that tells the user what to pass
//! spells it through [`arg`] and [`setting`], in the [`Spelling`] its front end sets once at
//! start ([`set_spelling`]): the command line's `--max-memory` and `--device reference`,
//! Python's `max_memory=` and `device="reference"`, the library's `` `max_memory` `` and
//! `device = reference`. No message is rewritten after it is made.

#![deny(missing_docs)]

use std::sync::atomic::{AtomicU8, Ordering};
use thiserror::Error;

/// How the user names an argument: the front end that shows the library's messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spelling {
    /// Rust callers: the library's own name, `` `max_memory` ``.
    Library,
    /// The `racelab` command line: `--max-memory`.
    Cli,
    /// The Python package: the keyword `max_memory=`.
    Python,
}

static SPELLING: AtomicU8 = AtomicU8::new(0);

/// Set the spelling of every message made from now on (a front end calls it once, first).
pub fn set_spelling(s: Spelling) {
    SPELLING.store(s as u8, Ordering::Relaxed);
}

/// The spelling messages are made in ([`Spelling::Library`] unless a front end set another).
pub fn spelling() -> Spelling {
    match SPELLING.load(Ordering::Relaxed) {
        1 => Spelling::Cli,
        2 => Spelling::Python,
        _ => Spelling::Library,
    }
}

impl Spelling {
    /// The argument of library name `name` as this front end's user writes it. A name that
    /// is not one identifier (`q/k`) is kept as it is.
    pub fn arg(self, name: &str) -> String {
        let plain = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        match self {
            _ if !plain => name.to_string(),
            Spelling::Library => format!("`{name}`"),
            Spelling::Cli => format!("--{}", name.replace('_', "-")),
            Spelling::Python => format!("{name}="),
        }
    }

    /// The argument given `value`: `--device reference`, `device="reference"` (a number
    /// unquoted: `p=2`), `device = reference`.
    pub fn setting(self, name: &str, value: impl std::fmt::Display) -> String {
        let value = value.to_string();
        match self {
            Spelling::Library => format!("`{name} = {value}`"),
            Spelling::Cli => format!("{} {value}", self.arg(name)),
            Spelling::Python if value.parse::<f64>().is_ok() => format!("{name}={value}"),
            Spelling::Python => format!("{name}=\"{value}\""),
        }
    }
}

/// [`Spelling::arg`] in the spelling set by the front end.
pub fn arg(name: &str) -> String {
    spelling().arg(name)
}

/// [`Spelling::setting`] in the spelling set by the front end.
pub fn setting(name: &str, value: impl std::fmt::Display) -> String {
    spelling().setting(name, value)
}

/// Result alias used throughout racelab.
pub type Result<T, E = RaceError> = std::result::Result<T, E>;

/// Everything that can go wrong in racelab, with a message that names the argument.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum RaceError {
    /// Shapes that do not fit together (Q vs K vs V, planes vs d, …).
    #[error("shape error in `{arg}`: {msg}")]
    Shape {
        /// The argument at fault (its library name).
        arg: String,
        /// What is wrong, and the fix.
        msg: String,
    },
    /// A NaN or ±Inf in an input.
    #[error("`{arg}` contains a non-finite value ({value}) at flat index {index}; clean the input (no NaN or Inf) and retry")]
    NonFinite {
        /// The argument at fault.
        arg: String,
        /// The flat (row-major) index of the first bad value.
        index: usize,
        /// That value (NaN or ±Inf).
        value: f64,
    },
    /// A zero vector where an angle is needed.
    #[error("`{arg}` row {row} is the zero vector, which has no angle; angular/RACE methods need non-zero query and key rows (drop or perturb that row)")]
    ZeroVector {
        /// The argument at fault.
        arg: String,
        /// The zero row's index.
        row: usize,
    },
    /// A hyper-parameter out of its valid range.
    #[error("invalid parameter `{arg}`: {msg}")]
    Param {
        /// The parameter at fault.
        arg: String,
        /// Its valid range, and the fix.
        msg: String,
    },
    /// An empty input (N = 0, d = 0).
    #[error("`{arg}` is empty: {msg}")]
    Empty {
        /// The empty argument.
        arg: String,
        /// Which extent is 0.
        msg: String,
    },
    /// A malformed, truncated or unsupported `.npy` file.
    #[error("bad .npy file `{path}`: {msg}")]
    Npy {
        /// The file.
        path: String,
        /// What is wrong with it.
        msg: String,
    },
    /// A malformed experiment config.
    #[error("bad config `{path}`: {msg}")]
    Config {
        /// The config file.
        path: String,
        /// The key at fault and what it must be.
        msg: String,
    },
    /// Operating-system I/O failure.
    #[error("I/O error on `{path}`: {msg}")]
    Io {
        /// The file or folder.
        path: String,
        /// The operating system's message.
        msg: String,
    },
    /// The CUDA backend was asked for but cannot run.
    #[error("no CUDA device: {0}")]
    NoCuda(String),
    /// Work whose buffers would exceed the memory budget (see [`crate::memory`]).
    #[error("too large for memory: {0}")]
    TooLarge(String),
    /// The ranks of a distributed run disagree, or another rank failed.
    #[error("distributed run: {0}")]
    Distributed(String),
    /// A CUDA driver/NVRTC failure after a device was found.
    #[error("CUDA error: {0}")]
    Cuda(String),
    /// An error of one step of a longer run (an experiment of `reproduce`), kept as it was
    /// (an I/O error stays an I/O error) with the step named.
    #[error("in {step}: {source}")]
    In {
        /// The step (an experiment's name).
        step: String,
        /// The step's own error.
        #[source]
        source: Box<RaceError>,
    },
}

impl RaceError {
    /// The argument at fault, by its library name (`p`, `max_memory`, `v`), where one is.
    pub fn arg(&self) -> Option<&str> {
        match self {
            RaceError::Shape { arg, .. }
            | RaceError::NonFinite { arg, .. }
            | RaceError::ZeroVector { arg, .. }
            | RaceError::Param { arg, .. }
            | RaceError::Empty { arg, .. } => Some(arg),
            RaceError::In { source, .. } => source.arg(),
            _ => None,
        }
    }

    /// [`RaceError::Param`] naming `arg`.
    pub fn param(arg: &str, msg: impl Into<String>) -> Self {
        RaceError::Param {
            arg: arg.into(),
            msg: msg.into(),
        }
    }
    /// [`RaceError::Shape`] naming `arg`.
    pub fn shape(arg: &str, msg: impl Into<String>) -> Self {
        RaceError::Shape {
            arg: arg.into(),
            msg: msg.into(),
        }
    }
    /// [`RaceError::Empty`] naming `arg`.
    pub fn empty(arg: &str, msg: impl Into<String>) -> Self {
        RaceError::Empty {
            arg: arg.into(),
            msg: msg.into(),
        }
    }
    /// [`RaceError::Io`] on `path`.
    pub fn io(path: &std::path::Path, e: impl std::fmt::Display) -> Self {
        RaceError::Io {
            path: path.display().to_string(),
            msg: e.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{RaceError, Spelling};

    /// Each front end's words for one argument, made without rewriting a message.
    #[test]
    fn each_front_end_spells_an_argument_its_way() {
        let cases = [
            (
                Spelling::Library,
                "`max_memory`",
                "`device = reference`",
                "`p = 2`",
            ),
            (Spelling::Cli, "--max-memory", "--device reference", "--p 2"),
            (
                Spelling::Python,
                "max_memory=",
                "device=\"reference\"",
                "p=2",
            ),
        ];
        for (s, mem, dev, p) in cases {
            assert_eq!(s.arg("max_memory"), mem);
            assert_eq!(s.setting("device", "reference"), dev);
            assert_eq!(s.setting("p", 2), p);
            assert_eq!(s.arg("q/k"), "q/k", "{s:?}");
        }
    }

    /// An error of one step keeps its own kind and words: an I/O error inside an experiment
    /// of `reproduce` reads as an I/O error with its path, the step named before it.
    #[test]
    fn a_step_error_keeps_its_kind() {
        let io = RaceError::io(
            std::path::Path::new("figures/x.csv"),
            "No space left on device",
        );
        let e = RaceError::In {
            step: "experiment `limit`".into(),
            source: Box::new(io),
        };
        assert_eq!(
            e.to_string(),
            "in experiment `limit`: I/O error on `figures/x.csv`: No space left on device"
        );
        let p = RaceError::In {
            step: "experiment `rank`".into(),
            source: Box::new(RaceError::param("p", "too many")),
        };
        assert_eq!(p.arg(), Some("p"));
    }
}
