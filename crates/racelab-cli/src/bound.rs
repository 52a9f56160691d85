//! `racelab bound`: the proved L = ∞ bias bound of soft RACE, row by row, on the user's Q/K/V
//! beside the measured bias (`racelab::bound`).

use crate::args::BoundArgs;
use anyhow::Result;
use racelab::bound::rows::{bound_heads, normalize_rows};
use racelab::bound::BETA_MIN_COVERED;
use racelab::io::{read_npy_header, read_npy_native};
use serde_json::json;
use std::time::Instant;

/// The assumptions of the bound, as the output states them.
const ASSUMPTIONS: &str = "unit query and key rows (the soft hash does not normalise; --normalize bounds the unit-row problem); any angles (no separation needed: the per-pair bound is O(1/beta) within about 0.66/beta of a tie or its opposite, O(cot θ/beta²) beyond); every beta > 0; rows with U_i ≤ Σ_j δ_ij are vacuous and reported as such";

pub fn run(a: BoundArgs) -> Result<()> {
    if let Some(out) = &a.out {
        let f = &a.files;
        let inputs = [
            ("q", f.q.as_path()),
            ("k", f.k.as_path()),
            ("v", f.v.as_path()),
        ];
        racelab::io::check_output_file(out, "out", &inputs, &[])?;
    }
    // The inputs as f64, checked against memory from their headers before reading.
    let bytes: u64 = [&a.files.q, &a.files.k, &a.files.v]
        .iter()
        .map(|p| read_npy_header(p).map(|h| (h.count() as u64).saturating_mul(8)))
        .collect::<racelab::Result<Vec<u64>>>()?
        .into_iter()
        .fold(0, u64::saturating_add);
    let (limit, source) = racelab::memory::budget(None);
    if limit > 0 && bytes.saturating_mul(2) > limit {
        anyhow::bail!(
            "too large for memory: --q, --k and --v as f64 take {} (twice that while read), more than {source} ({}); give fewer rows",
            racelab::memory::human(bytes),
            racelab::memory::human(limit)
        );
    }
    let (mut q, mut k, v) = (
        read_npy_native(&a.files.q)?.into_f64(),
        read_npy_native(&a.files.k)?.into_f64(),
        read_npy_native(&a.files.v)?.into_f64(),
    );
    if a.normalize {
        normalize_rows(&mut q, "q")?;
        normalize_rows(&mut k, "k")?;
    }
    let start = Instant::now();
    let rep = bound_heads((&q, &k, &v), a.p, a.beta, a.causal)?;
    let seconds = start.elapsed().as_secs_f64();
    if let Some(path) = &a.out {
        racelab::io::write_with(path, |w| {
            use std::io::Write;
            writeln!(w, "head,row,measured,bound,tolerance,ratio")?;
            for (h, rows) in rep.rows.iter().enumerate() {
                for (i, r) in rows.iter().enumerate() {
                    let b = r.bound.map_or("vacuous".into(), |b| format!("{b:e}"));
                    let ra = r.ratio().map_or("".into(), |x| format!("{x:e}"));
                    writeln!(w, "{h},{i},{:e},{b},{:e},{ra}", r.measured, r.tolerance)?;
                }
            }
            Ok(())
        })?;
    }
    let max_ratio = rep.max_ratio();
    let violation = rep.violation();
    if a.json {
        let rows: Vec<_> = rep
            .rows
            .iter()
            .enumerate()
            .flat_map(|(h, rows)| {
                rows.iter().enumerate().map(move |(i, r)| {
                    json!({"head": h, "row": i, "measured": r.measured, "bound": r.bound,
                           "tolerance": r.tolerance, "ratio": r.ratio(), "vacuous": r.bound.is_none()})
                })
            })
            .collect();
        println!(
            "{}",
            json!({
                "p": rep.p, "beta": rep.beta, "causal": rep.causal, "normalized": a.normalize,
                "heads": rep.heads, "n": rep.n, "m": rep.m,
                "rows": rows,
                "max_ratio": max_ratio,
                "vacuous_rows": rep.vacuous(),
                "holds": violation.is_none(),
                "beta_min_covered": BETA_MIN_COVERED,
                "g_error": rep.g_error,
                "assumptions": ASSUMPTIONS,
                "seconds": seconds,
                "revision": racelab::provenance::Provenance::collect("-").git_revision,
                "out": a.out.as_ref().map(|p| p.display().to_string()),
            })
        );
    } else {
        println!(
            "soft RACE at L = ∞, P = {}, beta = {}{}: ‖O_∞,i − O_i‖ (O_∞ from g^P by quadrature, g within {:.1e}) against the proved bound Σ_j δ_ij‖v_j − O_i‖/(U_i − Σ_j δ_ij)",
            rep.p,
            rep.beta,
            if rep.causal { ", causal" } else { "" },
            rep.g_error
        );
        println!(
            "{:>5} {:>7} {:>12} {:>12} {:>8}",
            "head", "row", "measured", "bound", "ratio"
        );
        for (h, rows) in rep.rows.iter().enumerate() {
            for (i, r) in rows.iter().enumerate() {
                match (r.bound, r.ratio()) {
                    (Some(b), Some(x)) => {
                        println!("{h:>5} {i:>7} {:>12.4e} {b:>12.4e} {x:>8.4}", r.measured)
                    }
                    _ => println!(
                        "{h:>5} {i:>7} {:>12.4e} {:>12} {:>8}",
                        r.measured, "vacuous", "-"
                    ),
                }
            }
        }
        println!(
            "largest (measured − tolerance)/bound: {}; {} of {} rows vacuous (U_i ≤ Σ_j δ_ij); proved for every beta > 0; assumes {ASSUMPTIONS}",
            max_ratio.map_or("none (every row vacuous)".into(), |x| format!("{x:.4}")),
            rep.vacuous(),
            rep.heads * rep.n
        );
    }
    if let Some((h, i, r)) = violation {
        anyhow::bail!(
            "the proved bound is exceeded at head {h}, row {i}: measured {:e} > bound {:e} + tolerance {:e}; this is a bug in racelab, please report it with these inputs",
            r.measured,
            r.bound.unwrap_or(f64::NAN),
            r.tolerance
        );
    }
    Ok(())
}
