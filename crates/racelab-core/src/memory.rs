//! Refuse work that cannot fit, before allocating it.
//!
//! Every operator's dominant buffers are estimated from the shape and parameters (the
//! estimate counts what the operator allocates beyond its inputs, so it is a lower bound of
//! the peak within a small factor): with `m_f = L·2^P` features per token, `w` the padded
//! bank width (`dv + 1` rounded up to 16), `H` heads, `n` queries, `m` keys and `t` threads,
//!
//! - the f32 kernels: the f32 copies of the inputs and output, one f64 bank `m_f × w` per
//!   (head, segment) plus its f32 views per thread, a block workspace of `128 × m_f` floats
//!   (features, their gradients, products) per thread, and what the forward keeps for the
//!   backward ([`saved_floats_per_token`]);
//! - the f64 reference: soft RACE's log-feature banks `(n + m) × m_f` and its `m_f × (dv+1)`
//!   scaled states, hard LSH's bucket sums, exact attention's `n × m` score matrix, per head,
//!   for as many heads as run at once;
//!
//! and compared with the memory the machine has available (`MemAvailable`) or a given
//! `--max-memory`. A refusal names P, L, N, the bytes needed and the fix.

#![deny(missing_docs)]

use crate::error::{RaceError, Result};

/// Which kernels run the work: their buffers differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernels {
    /// The f64 references (log-feature banks, score matrices).
    Reference,
    /// The f32 kernels (CPU and CUDA: f32 copies, banks, block workspaces, saved values).
    F32,
}

impl Kernels {
    /// How a refusal names them.
    pub fn name(&self) -> &'static str {
        match self {
            Kernels::Reference => "the f64 reference",
            Kernels::F32 => "the f32 kernels",
        }
    }
}

/// Tokens per saved causal state of the f32 kernels (`cpu::soft::TB`; a test there keeps the
/// two equal).
pub const STATE_BLOCK: usize = 128;

/// Row width of a bank for values of width `dv` in the f32 kernels: `dv + 1` (values and mass)
/// rounded up to whole 16-float vectors (the one definition; `shared::layout` re-exports it).
pub fn bank_width(dv: usize) -> usize {
    (dv + 1).next_multiple_of(16)
}

/// Floats per token and head the f32 kernels' forwards keep for the backward: the
/// denominator, the saved `u` of queries and keys (`L·P` each) and, causal, the block-start
/// states (`m·w` per block of [`STATE_BLOCK`] tokens, `m = L·2^P`; at most, since they are
/// kept only with one segment per head). Saturates rather than overflows.
pub fn saved_floats_per_token(l: usize, p: usize, dv: usize, causal: bool) -> f64 {
    let m = l as f64 * 2f64.powi(p.min(1023) as i32);
    let states = if causal {
        m * bank_width(dv) as f64 / STATE_BLOCK as f64
    } else {
        0.0
    };
    1.0 + 2.0 * l as f64 * p as f64 + states
}

/// What an operator is asked to compute, for its memory estimate.
#[derive(Debug, Clone, Copy)]
pub struct Work {
    /// Operator name for the message (`soft`, `hard`, …).
    pub method: &'static str,
    /// Which kernels compute (their buffers are what is counted).
    pub kernels: Kernels,
    /// Features per token and table, `2^P` (1 for methods without tables).
    pub p: usize,
    /// `L`, tables (1 for methods without tables).
    pub l: usize,
    /// Heads (batch × heads).
    pub heads: usize,
    /// `N`, queries per head.
    pub n: usize,
    /// `M`, keys per head.
    pub m: usize,
    /// `d`, the query and key width.
    pub d: usize,
    /// `dv`, the value width.
    pub dv: usize,
    /// Features per token of a non-hashing feature map (linear: d, Performer: its count).
    pub map_features: usize,
    /// Whether the operator materialises an `n × m` score matrix per head (exact attention).
    pub quadratic: bool,
    /// Whether the backward runs too.
    pub backward: bool,
    /// Causal masking (prefix sums kept per block).
    pub causal: bool,
}

fn sat_mul(xs: &[u64]) -> u64 {
    xs.iter().fold(1u64, |a, &x| a.saturating_mul(x))
}

impl Work {
    /// Features per token: `L·2^P` for the hashing methods (saturating), else the map's.
    pub fn features(&self) -> u64 {
        if self.p > 0 {
            (self.l as u64).saturating_mul(1u64.checked_shl(self.p as u32).unwrap_or(u64::MAX))
        } else {
            self.map_features as u64
        }
    }

    /// Estimated bytes the operator allocates beyond its inputs.
    pub fn bytes(&self) -> u64 {
        let threads = rayon::current_num_threads().max(1) as u64;
        let (h, n, m, d, dv) = (
            self.heads as u64,
            self.n as u64,
            self.m as u64,
            self.d as u64,
            self.dv as u64,
        );
        let mf = self.features();
        // The planes, f64 and their f32 copy.
        let planes = sat_mul(&[self.l as u64, self.p as u64, d, 12]);
        let at_once = h.min(threads);
        match self.kernels {
            Kernels::Reference => {
                let per_head = if self.quadratic {
                    sat_mul(&[n, m, 8])
                } else {
                    // Log-feature banks of queries and keys, states, the output.
                    sat_mul(&[n + m, mf, 8]).saturating_add(sat_mul(&[mf, dv + 2, 8 * 2]))
                };
                let grads = if self.backward { 2 } else { 1 };
                sat_mul(&[at_once, per_head, grads])
                    .saturating_add(sat_mul(&[h, n, dv, 8]))
                    .saturating_add(planes)
            }
            Kernels::F32 => {
                let copies = sat_mul(&[h, 4]).saturating_mul(
                    (n * d + m * d + m * dv + n * dv) * if self.backward { 2 } else { 1 },
                );
                if self.quadratic {
                    // Blocked exact attention: a tile of scores per thread.
                    return copies.saturating_add(sat_mul(&[threads, 256, m.max(1), 4]));
                }
                let state = kernel_state_bytes(mf, self.heads, self.dv);
                copies
                    .saturating_add(state)
                    .saturating_add(self.saved_bytes())
                    .saturating_add(planes)
            }
        }
    }
}

impl Work {
    /// What the f32 kernels' forward keeps for the backward
    /// ([`saved_floats_per_token`] per token; 0 without tables).
    pub fn saved_bytes(&self) -> u64 {
        if self.p == 0 {
            return 0;
        }
        let per_token = saved_floats_per_token(self.l, self.p, self.dv, self.causal);
        // Causal states grow with m_f: floats_per_token counts them per token.
        let f = per_token * (self.heads as f64) * (self.n as f64) * 4.0;
        if f >= u64::MAX as f64 {
            u64::MAX
        } else {
            f as u64
        }
    }

    /// The f32 inputs of the f32 kernels that a caller already holds in memory: `q`, `k`, `v`,
    /// and for a backward `g` (and the forward's output `o` when `with_output`). Counted in
    /// [`Work::bytes`] as copies; a caller passing its own f32 rows subtracts them.
    pub fn resident_input_bytes(&self, with_output: bool) -> u64 {
        let (n, m, d, dv) = (self.n as u64, self.m as u64, self.d as u64, self.dv as u64);
        let mut floats = n * d + m * d + m * dv;
        if self.backward {
            floats += n * dv * if with_output { 2 } else { 1 };
        }
        sat_mul(&[self.heads as u64, floats, 4])
    }
}

/// The f32 kernels' state for `features` per token (`L·2^P`, or a feature map's width):
/// one f64 bank `features × w` per (head, segment) plus its f32 views per thread, and a block
/// workspace of `128 × features` floats (features, their gradients, products) per thread.
pub fn kernel_state_bytes(features: u64, heads: usize, dv: usize) -> u64 {
    let threads = rayon::current_num_threads().max(1) as u64;
    let h = heads as u64;
    let w = bank_width(dv) as u64;
    let segments = (2 * threads).div_ceil(h.max(1)).max(1);
    sat_mul(&[h, segments, features, w, 8])
        .saturating_add(sat_mul(&[threads, features, w, 4 * 3]))
        .saturating_add(sat_mul(&[threads, 128, features, 4 * 6]))
}

/// The memory budget: `max_memory` when given, else what the machine has available.
pub fn budget(max_memory: Option<u64>) -> (u64, String) {
    match max_memory {
        Some(b) => (b, crate::error::arg("max_memory")),
        None => (
            crate::provenance::available_memory_bytes(),
            "the memory this machine has available".to_string(),
        ),
    }
}

/// Refuse an allocation of `count` items of `size` bytes (`what`, e.g. "the planes
/// [L, P, d] = [1000000, 20, 10000]") when the product overflows or exceeds the machine's
/// available memory; `fix` says what to lower.
pub fn check_alloc(what: &str, count: Option<usize>, size: usize, fix: &str) -> Result<()> {
    let (limit, source) = budget(None);
    let need = count.and_then(|c| c.checked_mul(size)).map(|b| b as u64);
    match need {
        Some(b) if limit == 0 || b <= limit => Ok(()),
        _ => Err(RaceError::TooLarge(format!(
            "{what} need {}, more than {source} ({}); {fix}",
            need.map_or_else(|| "more bytes than a 64-bit count holds".to_string(), human),
            human(limit)
        ))),
    }
}

/// Refuse `work` if its estimate exceeds the budget.
pub fn check(work: &Work, max_memory: Option<u64>) -> Result<()> {
    check_need(work, work.bytes(), max_memory)
}

/// Refuse `work` if `need` bytes (its estimate, less what the caller already holds) exceed the
/// budget.
pub fn check_need(work: &Work, need: u64, max_memory: Option<u64>) -> Result<()> {
    let (limit, source) = budget(max_memory);
    if limit == 0 || need <= limit {
        return Ok(());
    }
    let tables = if work.p > 0 {
        format!(
            "P = {}, L = {} (L·2^P = {} features per token), ",
            work.p,
            work.l,
            work.features()
        )
    } else if work.method == "performer" {
        format!("m = {} features per token, ", work.map_features)
    } else {
        String::new()
    };
    use crate::error::arg;
    let fix = if work.p > 0 {
        format!(
            "use a smaller {} (the state doubles with each bit) or {}, fewer tokens or heads",
            arg("p"),
            arg("l")
        )
    } else if work.method == "performer" {
        format!("use fewer {}, tokens or heads", arg("features"))
    } else if work.quadratic {
        "use fewer tokens (exact attention's scores grow as N²) or a linear-time method".into()
    } else {
        "use fewer tokens or heads".into()
    };
    Err(RaceError::TooLarge(format!(
        "`{}` on {} with {tables}N = {} queries, {} keys, {} heads, d = {}, dv = {} needs about {} \
         ({} bytes), more than {source} ({}); {fix}, or set {} if more is available",
        work.method,
        work.kernels.name(),
        work.n,
        work.m,
        work.heads,
        work.d,
        work.dv,
        human(need),
        need,
        human(limit),
        arg("max_memory")
    )))
}

/// Bytes as `12.3 GiB`.
pub fn human(b: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut x = b as f64;
    let mut u = 0;
    while x >= 1024.0 && u + 1 < units.len() {
        x /= 1024.0;
        u += 1;
    }
    format!("{x:.1} {}", units[u])
}

/// Parse a byte count: `1000000`, `512M`, `8G`, `8GiB`, `1.5T` (binary units).
pub fn parse_bytes(s: &str) -> Result<u64> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => {
            return Err(RaceError::param(
                "max-memory",
                format!("`{s}` is not a byte count; use e.g. 8G, 512M or 1000000"),
            ))
        }
    };
    match num.parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 => Ok((x * scale as f64) as u64),
        _ => Err(RaceError::param(
            "max-memory",
            format!("`{s}` is not a positive byte count; use e.g. 8G, 512M or 1000000"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn soft(p: usize, l: usize, n: usize) -> Work {
        Work {
            method: "soft",
            kernels: Kernels::F32,
            p,
            l,
            heads: 1,
            n,
            m: n,
            d: 64,
            dv: 64,
            map_features: 0,
            quadratic: false,
            backward: false,
            causal: false,
        }
    }

    #[test]
    fn the_issue_case_is_refused_with_p_l_n_and_bytes() {
        let e = check(&soft(20, 100, 300), Some(8 << 30))
            .unwrap_err()
            .to_string();
        for part in [
            "P = 20",
            "L = 100",
            "N = 300",
            "bytes",
            "`max_memory`",
            "smaller `p`",
        ] {
            assert!(e.contains(part), "{part} missing from: {e}");
        }
        // Its state alone is L·2^P·w·8 bytes: at least 100·2^20·80·8.
        assert!(soft(20, 100, 300).bytes() >= 100 * (1 << 20) * 80 * 8);
    }

    #[test]
    fn ordinary_work_fits_and_estimates_grow_with_the_work() {
        assert!(check(&soft(2, 2, 4096), Some(1 << 30)).is_ok());
        assert!(soft(3, 2, 4096).bytes() > soft(2, 2, 4096).bytes());
        assert!(soft(2, 2, 8192).bytes() > soft(2, 2, 4096).bytes());
        // Absurd parameters saturate instead of overflowing.
        assert_eq!(soft(63, usize::MAX, 1).features(), u64::MAX);
        assert!(check(&soft(63, usize::MAX, 1), None).is_err());
    }

    #[test]
    fn byte_counts_parse_and_bad_ones_name_the_argument() {
        assert_eq!(parse_bytes("1000").unwrap(), 1000);
        assert_eq!(parse_bytes("8G").unwrap(), 8 << 30);
        assert_eq!(parse_bytes("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_bytes("1.5k").unwrap(), 1536);
        for bad in ["", "-3G", "8Q", "G"] {
            let e = parse_bytes(bad).unwrap_err().to_string();
            assert!(e.contains("max-memory"), "{bad}: {e}");
        }
    }
}
