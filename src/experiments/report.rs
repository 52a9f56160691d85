//! `figures/REPORT.md`: one row per claim (source, measured value, verdict), the figures
//! embedded, and the run's provenance. Also two small experiments that only the report runs:
//! the φ factorisation check and a scaling check of the kernels.

use super::verdict::Kind;
use super::{f, write_csv, Claim, Ctx, ExpResult, Measure, Verdict};
use crate::bench::{self, BenchConfig};
use crate::error::Result;
use crate::hashing::{soft_features, soft_features_direct, Planes};
use crate::params::{Bits, Seed, Tables};
use crate::provenance::Provenance;
use crate::rng::SeededRng;

/// φ factorisation (`proofs-notes/phi-factorisation.md`), compute → CSV `factorisation`: the largest difference between
/// the factorised and the direct softmax features per (P, beta), and whether the factorised
/// ones stayed finite.
fn factorisation_csv(ctx: &Ctx) -> Result<String> {
    let mut rng = SeededRng::new(ctx.seed, crate::rng::stream::EXPERIMENT);
    let mut rows = Vec::new();
    for p in 1..=8usize {
        let d = 16;
        let planes = Planes::gaussian(Bits(p), Tables(1), d, Seed(ctx.seed + p as u64))?;
        for e in -6..=6 {
            let beta = 10f64.powi(e);
            let (mut worst, mut finite) = (0.0f64, true);
            for _ in 0..50 {
                let x = rng.normals(d);
                let (mut a, mut b) = (vec![0.0; 1 << p], vec![0.0; 1 << p]);
                soft_features(&planes, 0, &x, beta, &mut a);
                soft_features_direct(&planes, 0, &x, beta, &mut b);
                finite &= a.iter().all(|v| v.is_finite());
                worst = worst.max(
                    a.iter()
                        .zip(&b)
                        .map(|(u, w)| (u - w).abs())
                        .fold(0.0, crate::stats::nan_max),
                );
            }
            rows.push(vec![
                p.to_string(),
                f(beta),
                f(worst),
                (finite as u8).to_string(),
            ]);
        }
    }
    write_csv(
        ctx,
        "factorisation",
        &["p", "beta", "max_abs_diff", "finite"],
        &rows,
        &serde_json::json!({"inputs": "N(0,1), d=16, 50 per cell"}),
    )
}

/// The factorisation claim, from its CSV; and where the textbook softmax without
/// max-subtraction overflows (`exp(beta·uᵀv_r)` past `beta·P > ln f64::MAX`, at P = 8).
fn factorisation_claim(ctx: &Ctx) -> Result<(Claim, serde_json::Value)> {
    let (h, r) = super::read_csv(ctx, "factorisation")?;
    let (bc, dc, fc) = (
        super::col(&h, &r, "beta"),
        super::col(&h, &r, "max_abs_diff"),
        super::col(&h, &r, "finite"),
    );
    let worst_moderate = (0..r.len())
        .filter(|&i| bc[i] <= 1.0)
        .map(|i| dc[i])
        .fold(0.0, crate::stats::nan_max);
    let worst_all = dc.iter().cloned().fold(0.0, crate::stats::nan_max);
    let all_finite = fc.iter().all(|&x| x == 1.0);
    let naive_overflow_beta =
        crate::stats::min_all(bc.iter().cloned().filter(|&b| b * 8.0 > f64::MAX.ln()));
    let claim = Claim::judged(
        "phi-factorisation",
        format!("max |φ_factorised − φ_direct| = {worst_moderate:.1e} for beta ≤ 1 and {worst_all:.1e} over beta ∈ [1e-6, 1e6], P ≤ 8; factorised finite everywhere: {all_finite}; an unstabilised softmax overflows from beta·P > 709 (beta = {naive_overflow_beta:.0e} at P = 8)"),
        Measure::value(if all_finite { worst_all } else { f64::INFINITY }),
        "the direct form's logits carry ~eps·beta·P rounding, which bounds the agreement at large beta",
    )?;
    let headline =
        serde_json::json!({"max_diff_beta_le_1": worst_moderate, "max_diff_all": worst_all});
    Ok((claim, headline))
}

/// φ factorisation (`proofs-notes/phi-factorisation.md`): factorised vs direct softmax over P and beta, finiteness,
/// and where the un-stabilised softmax overflows.
pub fn factorisation(ctx: &Ctx) -> Result<ExpResult> {
    let t0 = std::time::Instant::now();
    let csv = factorisation_csv(ctx)?;
    let (claim, headline) = factorisation_claim(ctx)?;
    Ok(ExpResult {
        name: "factorisation".into(),
        claims: vec![claim],
        figures: vec![],
        csv: vec![csv],
        headline,
        seconds: t0.elapsed().as_secs_f64(),
        seed: ctx.seed,
    })
}

/// The scaling claims, from a bench report: the kernels' and exact softmax's fitted
/// exponents, with the crossover and the floor ratios at the largest N.
fn scaling_claims(rep: &bench::BenchReport, heads: usize, d: usize) -> Result<Vec<Claim>> {
    let fit = |s: &str| {
        rep.fits
            .iter()
            .find(|x| x.series == s)
            .map(|x| x.exponent)
            .unwrap_or(f64::NAN)
    };
    let (k22, k44, sm) = (fit("race (2,2)"), fit("race (4,4)"), fit("softmax"));
    let nmax = rep
        .rows
        .iter()
        .filter(|r| r.method == "race")
        .map(|r| r.n)
        .max()
        .unwrap_or(0);
    let floors: Vec<String> = rep
        .rows
        .iter()
        .filter(|r| r.method == "race" && r.n == nmax)
        .map(|r| {
            format!(
                "({},{}) {:.1}× floor",
                r.p.unwrap_or(0),
                r.l.unwrap_or(0),
                r.ratio_to_floor
            )
        })
        .collect();
    let cross: Vec<String> = rep
        .crossovers
        .iter()
        .map(|c| {
            format!(
                "{}: {}",
                c.series,
                c.n.map(|n| n.to_string())
                    .unwrap_or_else(|| "not reached".into())
            )
        })
        .collect();
    let note = format!(
        "{heads} heads, d = {d}, f32 forward+backward on {}; timings are this machine's, ratios are what carries over",
        rep.isa
    );
    let claims = vec![
        Claim::judged(
            "linear-time",
            format!(
                "fitted time ∝ N^e: race (2,2) e = {k22:.2}, (4,4) e = {k44:.2}; crossover vs softmax (fwd+bwd vs fwd only) {}; at N = {nmax}: {} ({:.1} GB/s measured)",
                cross.join(", "),
                floors.join(", "),
                rep.bandwidth_gbs
            ),
            Measure::Rate(crate::stats::max_all([k22, k44])),
            note.clone(),
        )?,
        Claim::judged(
            "exact-quadratic",
            format!("fitted time ∝ N^e: exact softmax e = {sm:.2}"),
            Measure::value(sm),
            note,
        )?,
    ];
    Ok(claims)
}

/// Linear-time claim: fitted exponents of the f32 kernel and the exact references, ratio to
/// the bandwidth floor, from a small `racelab bench` run.
pub fn scaling(ctx: &Ctx) -> Result<ExpResult> {
    let t0 = std::time::Instant::now();
    // Quick: the fit's upper half (2^13, 2^14) is out of the last-level cache, as the full
    // run's is. With 2^10..2^13 it straddled the cache (8 MiB of inputs at 2^12, 16 at 2^13)
    // and, timed to 0.25 s per row, gave (2, 2) exponents of 1.13–1.44 (with three runs a
    // row, 0.85–1.99, wherever one run was interrupted); here 1.02–1.12.
    let (ns, heads, d) = if ctx.quick {
        ((11..=14).map(|e| 1usize << e).collect::<Vec<_>>(), 2, 64)
    } else {
        ((10..=16).map(|e| 1usize << e).collect(), 4, 128)
    };
    let cfg = BenchConfig {
        ns,
        pl: vec![(2, 2), (4, 4)],
        heads,
        d,
        backward: true,
        reference: true,
        seed: ctx.seed,
        runs: 3,
        ref_budget_s: if ctx.quick { 2.0 } else { 12.0 },
        out: Some(ctx.out.join("bench")),
        ..Default::default()
    };
    let rep = bench::run(&cfg, &|_| {})?;
    let claims = scaling_claims(&rep, heads, d)?;
    Ok(ExpResult {
        name: "scaling".into(),
        claims,
        figures: vec!["bench/time_vs_n".into()],
        csv: vec!["bench/bench.csv".into()],
        headline: serde_json::to_value(&rep.fits).unwrap_or_default(),
        seconds: t0.elapsed().as_secs_f64(),
        seed: ctx.seed,
    })
}

/// The verdict cell of a claim row: the verdict, the seeds that agree, the borderline flag
/// and the correction, then the detail and what the verdict means.
fn verdict_cell(c: &Claim) -> String {
    let agree = seeds_agree(c);
    let mut tags = Vec::new();
    if let Some(p) = &c.provenance {
        tags.push(format!("{} training seeds pooled", p.seeds.len()));
    } else if c.seed_invariant {
        tags.push("1 input: the seeds do not change it".into());
    } else if c.seeds.len() > 1 && !matches!(c.verdict, Verdict::Unstable { .. }) {
        tags.push(format!("{agree}/{} seeds", c.seeds.len()));
    }
    if c.borderline {
        tags.push("borderline".into());
    }
    if let Some(corr) = &c.correction {
        tags.push(corr.clone());
    }
    format!(
        "**{}**{} ({}): {}{}",
        c.verdict.text(),
        if tags.is_empty() {
            String::new()
        } else {
            format!(" [{}]", tags.join("; "))
        },
        esc(&c.detail),
        esc(&c.meaning),
        if c.note.is_empty() {
            String::new()
        } else {
            format!(" — {}", esc(&c.note))
        }
    )
}

/// How many seeds agree: with the verdict, or for an unstable one with the most common seed
/// verdict.
pub fn seeds_agree(c: &Claim) -> usize {
    let count = |v: &Verdict| c.seeds.iter().filter(|s| s.verdict == *v).count();
    match c.verdict {
        Verdict::Unstable { .. } => c.seeds.iter().map(|s| count(&s.verdict)).max().unwrap_or(0),
        v => count(&v),
    }
}

/// One claim of `claims.json`.
fn claim_json(c: &Claim) -> serde_json::Value {
    serde_json::json!({
        "id": c.id,
        "kind": c.kind,
        "verdict": c.verdict.text(),
        "verdict_name": c.verdict,
        "seed_invariant": c.seed_invariant,
        // A claim read from committed training runs pools their seeds in one test: its seeds
        // are the training seeds, and no per-seed verdict exists to agree.
        "seeds_total": c.provenance.as_ref().map_or(c.seeds.len(), |p| p.seeds.len()),
        "seeds_agree": if c.provenance.is_some() { serde_json::Value::Null } else { seeds_agree(c).into() },
        "seeds_pooled": c.provenance.is_some(),
        "seeds": c.seeds,
        "training_seeds": c.provenance.as_ref().map(|p| &p.seeds),
        "revision": c.provenance.as_ref().map(|p| &p.revision),
        "value": c.value,
        "threshold": c.threshold_value,
        "se": c.se,
        "borderline": c.borderline,
        "correction": c.correction,
        "provenance": c.provenance.as_ref().map(|p| &p.text),
    })
}

/// The verdicts of the report this run replaces (`claims.json` in the output folder, copied
/// into the staging folder before the run): its revision and each claim's verdict text.
pub struct Previous {
    pub revision: String,
    pub verdicts: std::collections::BTreeMap<String, String>,
}

impl Previous {
    /// Read `claims.json` from `dir`; `None` where there is none or it does not parse.
    pub fn read(dir: &std::path::Path) -> Option<Previous> {
        let text = std::fs::read_to_string(dir.join("claims.json")).ok()?;
        Previous::parse(&text)
    }
    pub fn parse(text: &str) -> Option<Previous> {
        let v: serde_json::Value = serde_json::from_str(text).ok()?;
        let verdicts = v["claims"]
            .as_array()?
            .iter()
            .filter_map(|c| {
                Some((
                    c["id"].as_str()?.to_string(),
                    c["verdict"].as_str()?.to_string(),
                ))
            })
            .collect();
        Some(Previous {
            revision: v["revision"].as_str()?.to_string(),
            verdicts,
        })
    }
}

/// Why a claim's verdict moved from the previous report's: the claim's own changes committed
/// after the previous report's revision (by git ancestry), else the code or data between the
/// two revisions.
pub fn what_moved(id: &str, prev_rev: &str, now_rev: &str) -> String {
    let base = id.strip_suffix("-real").unwrap_or(id);
    let changes: Vec<String> = super::verdict::specs()
        .ok()
        .and_then(|s| s.get(id).or_else(|| s.get(base)))
        .map(|spec| {
            spec.changed
                .iter()
                .filter(|ch| crate::provenance::git_is_ancestor(&ch.rev, prev_rev) == Some(false))
                .map(|ch| format!("the claim changed at `{}` ({})", ch.rev, ch.reason))
                .collect()
        })
        .unwrap_or_default();
    if changes.is_empty() {
        format!("the code or data between `{prev_rev}` and `{now_rev}`; the claim itself did not change")
    } else {
        changes.join("; ")
    }
}

/// The opening section: each claim's `finding`, in claims.toml's order, stated where the claim
/// holds (or is loose) and replaced by the verdict's meaning otherwise, with its strength and
/// its claim ids. Built from the judged claims alone, so it cannot say more than they show.
pub fn findings(all: &[&Claim]) -> String {
    let Ok(specs) = super::verdict::specs() else {
        return String::new();
    };
    let order: Vec<&str> = super::verdict::CLAIMS_TOML
        .lines()
        .filter_map(|l| l.strip_prefix('[')?.strip_suffix(']'))
        .collect();
    let mut s = "## What this lab established about arXiv:2510.04008

Each finding is a claim of `experiments/claims.toml` in plain words, printed as stated only where its verdict below is **holds** or **loose**; otherwise the verdict and what it means stand in its place.

".to_string();
    for id in order {
        let Some(text) = specs.get(id).and_then(|sp| sp.finding.as_ref()) else {
            continue;
        };
        let mine: Vec<&&Claim> = all
            .iter()
            .filter(|c| c.id == id || c.id.strip_suffix("-real") == Some(id))
            .collect();
        if mine.is_empty() {
            continue;
        }
        let strength = |c: &Claim| -> String {
            if c.kind == Kind::Computed {
                "computed once to its tolerance".into()
            } else if let Some(p) = &c.provenance {
                format!(
                    "read from committed training runs: {} training seeds pooled in one test, revision {}",
                    p.seeds.len(),
                    p.revision.get(..12).unwrap_or(&p.revision)
                )
            } else if c.seed_invariant {
                "1 input: the master seeds do not change it".into()
            } else {
                format!("{}/{} master seeds agree", seeds_agree(c), c.seeds.len())
            }
        };
        let held = |c: &Claim| matches!(c.verdict, Verdict::Holds | Verdict::Loose);
        let ids = mine
            .iter()
            .map(|c| format!("`{}` **{}** ({})", c.id, c.verdict.text(), strength(c)))
            .collect::<Vec<_>>()
            .join("; ");
        if mine.iter().all(|c| held(c)) {
            s += &format!(
                "- {} [{ids}]
",
                esc(text)
            );
        } else {
            let why: Vec<String> = mine
                .iter()
                .filter(|c| !held(c))
                .map(|c| format!("{}: {}", c.id, esc(&c.meaning)))
                .collect();
            s += &format!(
                "- *Not established here.* {} [{ids}]
",
                why.join("; ")
            );
        }
    }
    s + "
"
}

/// SHA-256 of the claims file built into this binary, in hex.
pub fn claims_sha256() -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(super::verdict::CLAIMS_TOML.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Write `REPORT.md` and its machine-readable twin `claims.json` into `ctx.out`.
pub fn write_report(
    ctx: &Ctx,
    results: &[ExpResult],
    total_seconds: f64,
    seeds: &[u64],
) -> Result<std::path::PathBuf> {
    let prov = Provenance::collect(crate::cpu::detected_isa().name());
    let all: Vec<&Claim> = results.iter().flat_map(|r| &r.claims).collect();
    let previous = Previous::read(&ctx.out);
    let moved: Vec<(String, String, String)> = previous
        .as_ref()
        .map(|p| {
            all.iter()
                .filter_map(|c| {
                    let old = p.verdicts.get(&c.id)?;
                    (old != &c.verdict.text()).then(|| {
                        (
                            c.id.clone(),
                            old.clone(),
                            what_moved(&c.id, &p.revision, &prov.git_revision),
                        )
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    let seeds_txt = seeds
        .iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let mut s = String::new();
    s += "# racelab report\n\n";
    s += &format!(
        "Generated by `racelab reproduce{}{}` (master seeds {seeds_txt}) from the code at revision `{}`{}.\n\n",
        if ctx.quick { " --quick" } else { "" },
        if seeds.len() == 3 { String::new() } else { format!(" --seeds {}", seeds.len()) },
        prov.git_revision,
        if prov.git_dirty {
            " with uncommitted changes"
        } else {
            ""
        }
    );
    s += &format!("- git revision: `{}`{}\n- machine: {} ({} cores, {} threads, {:.1} GiB, {})\n- master seeds: {seeds_txt}\n- claims: `experiments/claims.toml`, SHA-256 `{}`\n- total run time: {:.1} s\n\n", prov.git_revision, if prov.git_dirty { " (uncommitted changes)" } else { "" }, prov.cpu, prov.cores, prov.threads, prov.memory_gib, prov.isa, claims_sha256(), total_seconds);
    s += &findings(&all);
    s += "## Verdicts that moved\n\n";
    s += &match &previous {
        None => "No `claims.json` was in the output folder before this run: nothing to compare with.\n\n".to_string(),
        Some(p) if moved.is_empty() => format!("Every verdict is the one the replaced report (revision `{}`) gave.\n\n", p.revision),
        Some(p) => format!(
            "{} verdicts differ from the replaced report's (revision `{}`), each with the change that moved it:\n\n{}\n\n",
            moved.len(),
            p.revision,
            moved
                .iter()
                .map(|(id, old, why)| {
                    let now = all.iter().find(|c| &c.id == id).map(|c| c.verdict.text()).unwrap_or_default();
                    format!("- `{id}`: {old} → **{now}**, moved by {}", esc(why))
                })
                .collect::<Vec<_>>()
                .join("\n")
        ),
    };
    let mut by_source: Vec<(String, Vec<String>)> = Vec::new();
    for c in &all {
        if let Some(p) = c.provenance.as_ref().map(|p| &p.text) {
            match by_source.iter_mut().find(|(q, _)| q == p) {
                Some((_, ids)) => ids.push(format!("`{}`", c.id)),
                None => by_source.push((p.clone(), vec![format!("`{}`", c.id)])),
            }
        }
    }
    let committed: Vec<String> = by_source
        .iter()
        .map(|(p, ids)| format!("{} ({})", ids.join(", "), p))
        .collect();
    s += "Every number below was measured in this run, except the rows read from committed results, which name their own revision";
    s += &if committed.is_empty() {
        " (none in this run).".to_string()
    } else {
        format!(": {}.", committed.join(", "))
    };
    s += " Each CSV has a `.meta.json` with its parameters and provenance, and each figure is drawn from its CSV; the figures and CSVs are those of the first master seed, the other seeds' are under `seeds/`.\n\n";
    s += "Each claim, its quantity and its threshold are stated in `experiments/claims.toml` before the run that measures them (its `since` and `changed` revisions); the verdict is computed from the measured numbers by `judge` (`src/experiments/verdict/judge.rs`). Verdicts: **holds** (within the threshold), **loose** (the bound holds; its slack is given), **fails** (the opposite was shown, or a bound violated; the margin is given), **not testable here** (with the reason: non-finite values, too few samples, a timing fit outside its plausible window, or a comparison too small to show either way: *underpowered*, power below 0.8 at the claim's minimum effect, or *inconclusive*), **unstable (k/K hold)** (the independent master seeds disagree; a loose seed counts as one that held). An empirical claim is measured at every master seed, with inputs and planes redrawn; its row gives the first seed's measurement and the seeds that agree, or **1 input** where every seed measured the same value (the seed does not reach the quantity's inputs). **borderline**: the value the verdict turns on lies within one standard error of its threshold. Margins are one-sided Student-t tests with the samples' degrees of freedom; a claim over several comparisons names its multiplicity correction. `claims.json` holds the same verdicts for programs.\n\n";
    let empirical: Vec<&&Claim> = all.iter().filter(|c| c.kind == Kind::Empirical).collect();
    let computed: Vec<&&Claim> = all.iter().filter(|c| c.kind == Kind::Computed).collect();
    s += "## Verdicts (empirical claims)\n\n";
    let same = |a: &Verdict, b: &Verdict| a.name() == b.name();
    for v in [
        Verdict::Holds,
        Verdict::Loose,
        Verdict::Fails,
        Verdict::NotTestable,
        Verdict::Unstable { holds: 0, total: 0 },
    ] {
        let ids: Vec<String> = empirical
            .iter()
            .filter(|c| same(&c.verdict, &v))
            .map(|c| {
                format!(
                    "`{}`{}{}",
                    c.id,
                    match c.verdict {
                        Verdict::Unstable { holds, total } => format!(" ({holds}/{total} hold)"),
                        _ => String::new(),
                    },
                    if c.borderline { " (borderline)" } else { "" }
                )
            })
            .collect();
        s += &format!("- **{}** ({}): {}\n", v.name(), ids.len(), ids.join(", "));
    }
    s += "\n## Computed checks\n\nDeterministic checks (quadratures, identities, constructions), run once at the first master seed and judged against their stated tolerance:\n\n";
    for c in &computed {
        s += &format!(
            "- `{}` ({}): **{}** ({})\n",
            c.id,
            esc(&c.threshold),
            c.verdict.text(),
            esc(&c.detail)
        );
    }
    let specs = super::verdict::specs()?;
    let changed: Vec<String> = specs
        .iter()
        .flat_map(|(id, sp)| {
            sp.changed
                .iter()
                .map(move |ch| format!("- `{id}` at `{}`: {}", ch.rev, esc(&ch.reason)))
        })
        .collect();
    s += &format!(
        "\n## Changed claims\n\n{} changes after a claim's first measurement, each committed before the run that measures it:\n\n{}\n",
        changed.len(),
        changed.join("\n")
    );
    s += "\n## Claims\n\n| id | claim | source | quantity (threshold) | measured | verdict |\n|---|---|---|---|---|---|\n";
    for c in &all {
        s += &format!(
            "| `{}` | {}{} | {} | {} ({}) | {} | {} |\n",
            c.id,
            if c.kind == Kind::Computed {
                "*(computed check)* "
            } else {
                ""
            },
            esc(&c.claim),
            esc(&c.source),
            esc(&c.quantity),
            esc(&c.threshold),
            esc(&c.measured),
            match moved.iter().find(|m| m.0 == c.id) {
                Some((_, old, _)) => format!("{} *(was {old})*", verdict_cell(c)),
                None => verdict_cell(c),
            },
        );
    }
    s += "\n## Experiments\n\n";
    for r in results {
        s += &format!(
            "### {}\n\nRun time {:.1} s, seed {}. Data: {}.\n\n",
            r.name,
            r.seconds,
            r.seed,
            r.csv
                .iter()
                .map(|c| format!("[`{c}`]({c})"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        for fgr in &r.figures {
            s += &format!("![{fgr}]({fgr}.png)\n\n");
        }
    }
    let p = ctx.out.join("REPORT.md");
    crate::io::write_atomic(&p, s.as_bytes())?;
    let twin = serde_json::json!({
        "revision": prov.git_revision,
        "dirty": prov.git_dirty,
        "claims_sha256": claims_sha256(),
        "master_seeds": seeds,
        "quick": ctx.quick,
        "seconds": total_seconds,
        "claims": all.iter().map(|c| claim_json(c)).collect::<Vec<_>>(),
    });
    let j = ctx.out.join("claims.json");
    crate::io::write_atomic(
        &j,
        serde_json::to_string_pretty(&twin)
            .unwrap_or_default()
            .as_bytes(),
    )?;
    Ok(p)
}

fn esc(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}
