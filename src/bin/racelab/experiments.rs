//! The experiment subcommands and `reproduce`: run through the registry, print the claims.

use crate::args::{Common, ExpArgs, Fig3Args, ReproduceArgs};
use anyhow::Result;
use racelab::attend::human_seconds;
use racelab::experiments::{self, registry};
use serde_json::json;
use std::io::IsTerminal;
use std::path::PathBuf;

/// The experiment context of `a` (`--out` defaults to figures/).
fn exp_ctx(a: &ExpArgs) -> experiments::Ctx {
    experiments::Ctx {
        config: a.config.clone(),
        data: a.data.clone(),
        ..ctx_of(&a.common, a.quick)
    }
}

/// The context every experiment command shares: `--out` (default figures/), `--seed`,
/// `--quick`; no config or data of its own.
fn ctx_of(common: &Common, quick: bool) -> experiments::Ctx {
    experiments::Ctx {
        out: common
            .out
            .clone()
            .unwrap_or_else(|| PathBuf::from("figures")),
        seed: common.seed,
        quick,
        config: None,
        data: None,
    }
}

/// An experiment's claims and files, or one JSON object.
fn print_result(r: &experiments::ExpResult, json: bool) {
    if json {
        // The headline figures at top level (the contract's `rows`, `max_shat`, …), plus claims.
        let mut obj = match &r.headline {
            serde_json::Value::Object(m) => m.clone(),
            other => {
                let mut m = serde_json::Map::new();
                m.insert("headline".into(), other.clone());
                m
            }
        };
        for (k, v) in [
            ("name", json!(r.name)),
            ("claims", json!(r.claims)),
            ("csv", json!(r.csv)),
            ("figures", json!(r.figures)),
            ("seconds", json!(r.seconds)),
            ("seed", json!(r.seed)),
        ] {
            obj.insert(k.into(), v);
        }
        println!("{}", serde_json::Value::Object(obj));
        return;
    }
    println!("{} ({:.1} s, seed {})", r.name, r.seconds, r.seed);
    for c in &r.claims {
        println!(
            "  [{}] {}\n      measured: {}",
            c.verdict.text(),
            c.claim,
            c.measured
        );
    }
    println!(
        "  wrote {} and {}",
        r.csv.join(", "),
        r.figures
            .iter()
            .map(|f| format!("{f}.png/.svg"))
            .collect::<Vec<_>>()
            .join(", ")
    );
}

/// Run one experiment with the context its arguments give, and print its result.
fn run_exp(
    name: &str,
    a: &ExpArgs,
    f: impl FnOnce(&experiments::Ctx) -> racelab::Result<experiments::ExpResult>,
) -> Result<()> {
    let ctx = exp_ctx(a);
    // An experiment reports no progress of its own: its elapsed time, after the first seconds.
    let ticker = crate::ticker::Ticker::start(name.to_string(), None);
    let r = f(&ctx);
    drop(ticker);
    let r = r?;
    print_result(&r, a.common.json);
    Ok(())
}

/// `reproduce`: every experiment, its claims, and figures/REPORT.md.
pub fn run_reproduce(a: ReproduceArgs) -> Result<()> {
    let ctx = ctx_of(&a.common, a.quick);
    let bar = indicatif::ProgressBar::new(registry::reproduce_steps().len() as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    // On a terminal the bar; when stderr is a file or a pipe (where the bar is hidden) a line
    // as each step starts and ends.
    let logged = !std::io::stderr().is_terminal();
    let step = |name: &str, what: &str| {
        let (at, of) = (bar.position() + 1, bar.length().unwrap_or(0));
        let line = format!("{at}/{of} {name}: {what}");
        if logged {
            crate::progress(&format!(
                "{}: {line}",
                human_seconds(bar.elapsed().as_secs_f64())
            ));
        } else {
            bar.println(line);
        }
    };
    let (results, report, total) = registry::reproduce(
        &ctx,
        a.seeds as usize,
        &|n| bar.set_length(n),
        &|name| {
            bar.set_message(name.to_string());
            if logged {
                step(name, "started");
            }
        },
        &|name, r| {
            step(
                name,
                &format!("{:.1} s, {} claims", r.seconds, r.claims.len()),
            );
            bar.inc(1);
        },
    )?;
    bar.finish_and_clear();
    if a.common.json {
        let claims: Vec<_> = results.iter().flat_map(|r| r.claims.clone()).collect();
        println!(
            "{}",
            json!({ "report": report.display().to_string(), "seconds": total, "claims": claims })
        );
    } else {
        for r in &results {
            print_result(r, false);
        }
        println!("wrote {} ({:.1} s)", report.display(), total);
    }
    Ok(())
}

/// An experiment of the registry by name.
pub fn run_named(name: &str, a: &ExpArgs) -> Result<()> {
    run_exp(name, a, |c| registry::run(name, c))
}

/// `fig3`: the built-in inputs, or the user's `--q`/`--k`.
pub fn run_fig3(a: Fig3Args) -> Result<()> {
    let user = match (&a.q, &a.k) {
        (Some(q), Some(k)) => Some(registry::user_fig3_inputs(q, k)?),
        _ => None,
    };
    match user {
        Some(u) => run_exp("fig3", &a.exp, |ctx| experiments::fig3::run(ctx, Some(u))),
        None => run_exp("fig3", &a.exp, |ctx| registry::run("fig3", ctx)),
    }
}

/// `real`: `--data`, or the bundled MiniLM sample.
pub fn run_real(a: ExpArgs) -> Result<()> {
    match a.data.clone().or_else(experiments::real::bundled) {
        Some(dir) => run_exp("real", &a, |ctx| experiments::real::run(ctx, &dir)),
        None => anyhow::bail!("no real data: pass --data DIR (made by experiments/extract_qk.py); the bundled experiments/data/minilm was not found"),
    }
}
