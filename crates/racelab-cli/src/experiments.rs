//! The experiment subcommands and `reproduce`: run through the registry, print the claims.

use crate::args::{Common, ExpArgs, Fig3Args, ReproduceArgs};
use anyhow::Result;
use racelab::attend::human_seconds;
use racelab::experiments::staging::Staging;
use racelab::experiments::{self, registry};
use serde_json::json;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The staging folder of the run in progress (`None` once its files have moved in).
static ACTIVE: Mutex<Option<PathBuf>> = Mutex::new(None);
/// Held while the finished files move in: a signal then waits for the move to end.
static MOVING: Mutex<()> = Mutex::new(());

/// On SIGINT or SIGTERM: remove the run's staging folder, say what `out` holds, and exit 130
/// or 143 (128 + the signal).
fn stop_cleanly_on_signals(out: &Path) -> Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])?;
    let out = out.display().to_string();
    std::thread::spawn(move || {
        if let Some(sig) = signals.forever().next() {
            let _moving = MOVING.lock().unwrap_or_else(|e| e.into_inner());
            let staged = ACTIVE.lock().unwrap_or_else(|e| e.into_inner()).take();
            let (name, kept) = match staged {
                Some(dir) => {
                    std::fs::remove_dir_all(&dir).ok();
                    (
                        if sig == SIGINT { "SIGINT" } else { "SIGTERM" },
                        format!("this run's staging folder was removed; `{out}` holds what it held before, unchanged"),
                    )
                }
                None => (
                    if sig == SIGINT { "SIGINT" } else { "SIGTERM" },
                    format!("this run had finished; `{out}` holds its files"),
                ),
            };
            crate::error_line(&format!("interrupted ({name}): {kept}"));
            std::process::exit(128 + sig);
        }
    });
    Ok(())
}

/// The test hook `RACELAB_TEST_INTERRUPT=STEP:INT|TERM`: the process signals itself as `STEP`
/// starts (tests/experiments.rs interrupts `reproduce` there).
fn test_interrupt(step: &str) {
    let Ok(spec) = std::env::var("RACELAB_TEST_INTERRUPT") else {
        return;
    };
    if let Some((at, sig)) = spec.rsplit_once(':') {
        if at == step {
            let sig = if sig == "TERM" {
                signal_hook::consts::SIGTERM
            } else {
                signal_hook::consts::SIGINT
            };
            signal_hook::low_level::raise(sig).ok();
            // The handler exits the process; wait for it rather than go on writing.
            std::thread::sleep(std::time::Duration::from_secs(60));
        }
    }
}

/// Run `f` into a staging folder beside `ctx.out` and move its files in when it has finished
/// ([`Staging`]); SIGINT and SIGTERM stop it cleanly.
fn staged<T>(ctx: &experiments::Ctx, f: impl FnOnce(&experiments::Ctx) -> Result<T>) -> Result<T> {
    let staging = Staging::begin(&ctx.out)?;
    *ACTIVE.lock().unwrap_or_else(|e| e.into_inner()) = Some(staging.path().to_path_buf());
    stop_cleanly_on_signals(&ctx.out)?;
    let inner = experiments::Ctx {
        out: staging.path().to_path_buf(),
        ..ctx.clone()
    };
    let r = f(&inner)?;
    let _moving = MOVING.lock().unwrap_or_else(|e| e.into_inner());
    staging.finish()?;
    *ACTIVE.lock().unwrap_or_else(|e| e.into_inner()) = None;
    Ok(r)
}

/// The experiment context of `a` (`--out` defaults to figures/).
fn exp_ctx(a: &ExpArgs) -> Result<experiments::Ctx> {
    Ok(experiments::Ctx {
        config: a.config.clone(),
        data: a.data.clone(),
        ..ctx_of(&a.common, a.quick)?
    })
}

/// The context every experiment command shares: `--out` (default figures/; a folder or a new
/// path, checked before any work), `--seed`, `--quick`; no config or data of its own.
fn ctx_of(common: &Common, quick: bool) -> Result<experiments::Ctx> {
    let out = common
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("figures"));
    racelab::io::check_output_dir(&out, "out")?;
    Ok(experiments::Ctx {
        out,
        seed: common.seed,
        quick,
        config: None,
        data: None,
    })
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
    let ctx = exp_ctx(a)?;
    let r = staged(&ctx, |ctx| {
        test_interrupt(name);
        // An experiment reports no progress of its own: its elapsed time, after the first
        // seconds.
        let ticker = crate::ticker::Ticker::start(name.to_string(), None);
        let r = f(ctx);
        drop(ticker);
        Ok(r?)
    })?;
    print_result(&r, a.common.json);
    Ok(())
}

/// `reproduce`: every experiment, its claims, and figures/REPORT.md.
pub fn run_reproduce(a: ReproduceArgs) -> Result<()> {
    let ctx = ctx_of(&a.common, a.quick)?;
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
    let (results, _, total) = staged(&ctx, |ctx| {
        Ok(registry::reproduce(
            ctx,
            a.seeds as usize,
            &|n| bar.set_length(n),
            &|name| {
                bar.set_message(name.to_string());
                if logged {
                    step(name, "started");
                }
                test_interrupt(name);
            },
            &|name, r| {
                step(
                    name,
                    &format!("{:.1} s, {} claims", r.seconds, r.claims.len()),
                );
                bar.inc(1);
            },
        )?)
    })?;
    let report = ctx.out.join("REPORT.md");
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
