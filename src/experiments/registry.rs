//! The experiments, by name: what each command runs, which take real data (`--data`), and
//! the sequence `racelab reproduce` runs (the synthetic studies, then the real-data section
//! on the bundled MiniLM sample when it is present). The command line only parses arguments
//! and prints; everything it runs is reachable from here, and so from tests.

use super::{fig3, real, Ctx, ExpResult};
use crate::error::{RaceError, Result};
use crate::io::read_npy;
use crate::tensor::Mat;
use std::path::{Path, PathBuf};

/// An experiment run on a context.
pub type Run = fn(&Ctx) -> Result<ExpResult>;

/// One experiment as the command line and `reproduce` know it.
#[derive(Clone, Copy)]
pub struct Entry {
    /// Its name (the subcommand, the report's section).
    pub name: &'static str,
    /// What it computes.
    pub run: Run,
    /// Whether it accepts `--data DIR` (real Q/K/V instead of its synthetic inputs).
    pub takes_data: bool,
    /// The help line of its subcommand (`racelab NAME`), or `None` where it has none of its
    /// own (a step of `reproduce` only, or a subcommand with arguments of its own: `fig3`).
    pub about: Option<&'static str>,
}

/// Every experiment a subcommand runs by name (`fig3` and `real` take their inputs
/// separately: [`fig3_on`], [`real::run`]).
pub const ENTRIES: &[Entry] = &[
    Entry {
        name: "factorisation",
        run: super::report::factorisation,
        takes_data: false,
        about: None,
    },
    Entry {
        name: "rank",
        run: super::rank::run,
        takes_data: false,
        about: Some(
            "Singular values and numerical rank of S-hat vs LR and L(R-1)+1",
        ),
    },
    Entry {
        name: "lemma10",
        run: super::lemma10::run,
        takes_data: false,
        about: Some(
            "Lemma 10 counterexample and the repaired condition",
        ),
    },
    Entry {
        name: "limit",
        run: super::limit::run,
        takes_data: false,
        about: Some(
            "Soft RACE as beta -> infinity: hard LSH on rows sharing a bucket, the nearest key's value on the others; each row's decay rate against the predicted one",
        ),
    },
    Entry {
        name: "bias",
        run: super::bias::run,
        takes_data: false,
        about: Some(
            "Soft-hash bias by exact quadrature vs kappa^P, over P and beta",
        ),
    },
    Entry {
        name: "combine",
        run: super::combine::run,
        takes_data: true,
        about: Some(
            "Paper (Algorithm 1) vs authors' combine rule, against angular attention",
        ),
    },
    Entry {
        name: "fig3",
        run: |c| fig3_on(c, c.data.as_deref()),
        takes_data: true,
        about: None,
    },
    Entry {
        name: "variance",
        run: super::variance::run,
        takes_data: false,
        about: Some(
            "Sampling error alone (bias removed) vs L and N, quantiles over seeds",
        ),
    },
    Entry {
        name: "theorem",
        run: super::theorem::run,
        takes_data: true,
        about: Some(
            "Theorem 2: the bound calibrated and tested on held-out seeds; the bias at L = infinity (g^P by quadrature) per input family; the sampling error alone",
        ),
    },
    Entry {
        name: "causal",
        run: super::causal::run,
        takes_data: false,
        about: Some(
            "Algorithm 2 (causal) vs causal angular attention and its causal L = infinity limit, by prefix position",
        ),
    },
    Entry {
        name: "authors",
        run: super::authors::run,
        takes_data: false,
        about: Some(
            "The authors' regime: beta = e^t/sqrt(d_head), raw and unit Q/K, both combine rules",
        ),
    },
    Entry {
        name: "tradeoff",
        run: super::tradeoff::run,
        takes_data: true,
        about: Some(
            "Error/cost trade-offs over P, L, beta; matched-state comparison",
        ),
    },
    Entry {
        name: "mqar",
        run: super::mqar::run,
        takes_data: false,
        about: Some(
            "Trained models on MQAR: summary, figure and claims from figures/mqar/mqar.csv (trained by `python experiments/mqar/mqar.py`)",
        ),
    },
    Entry {
        name: "scaling",
        run: super::report::scaling,
        takes_data: false,
        about: None,
    },
];

/// Every experiment's config reader on `text` (the fuzz target `config` and its corpus replay
/// in `tests/fuzz_corpus.rs`): by experiment, an error or a config, never a panic.
pub fn parse_configs(text: &str) -> Vec<(&'static str, Result<()>)> {
    // The TOML is parsed once; each config is read from the parsed table, as
    // [`super::parse_config`] reads it from the text.
    let table: toml::Table = match toml::from_str(text) {
        Ok(t) => t,
        Err(e) => {
            let msg = e.to_string();
            return CONFIGS
                .iter()
                .map(|(name, _)| {
                    let err = RaceError::Config {
                        path: name.to_string(),
                        msg: msg.clone(),
                    };
                    (*name, Err(err))
                })
                .collect();
        }
    };
    CONFIGS
        .iter()
        .map(|(name, read)| (*name, read(&table, name)))
        .collect()
}

/// A config reader on a parsed table.
type ReadConfig = fn(&toml::Table, &str) -> Result<()>;

fn read_config<C: serde::de::DeserializeOwned + super::cost::Costed>(
    t: &toml::Table,
    name: &str,
) -> Result<()> {
    super::config_from_table::<C>(t, name).map(|_| ())
}

/// Every experiment with a config, and its reader.
const CONFIGS: [(&str, ReadConfig); 11] = [
    ("lemma10", read_config::<super::lemma10::Config>),
    ("theorem", read_config::<super::theorem::Config>),
    ("fig3", read_config::<super::fig3::Config>),
    ("limit", read_config::<super::limit::Config>),
    ("variance", read_config::<super::variance::Config>),
    ("rank", read_config::<super::rank::Config>),
    ("tradeoff", read_config::<super::tradeoff::Config>),
    ("causal", read_config::<super::causal::Config>),
    ("bias", read_config::<super::bias::Config>),
    ("combine", read_config::<super::combine::Config>),
    ("authors", read_config::<super::authors::Config>),
];

/// The entry called `name`.
pub fn entry(name: &str) -> Result<Entry> {
    ENTRIES
        .iter()
        .copied()
        .find(|e| e.name == name)
        .ok_or_else(|| {
            RaceError::param(
                "experiment",
                format!(
                    "`{name}` is not an experiment; use one of {}",
                    ENTRIES
                        .iter()
                        .map(|e| e.name)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )
        })
}

/// Run the experiment `name` on `ctx`, refusing `--data` where it does not apply.
pub fn run(name: &str, ctx: &Ctx) -> Result<ExpResult> {
    let e = entry(name)?;
    if ctx.data.is_some() && !e.takes_data {
        return Err(RaceError::param(
            "data",
            format!(
                "`{name}` runs on its own synthetic inputs (the theory's setting) and does not take {}",
                crate::error::arg("data")
            ),
        ));
    }
    (e.run)(ctx)
}

/// Fig. 3 on the synthetic inputs, or on a real-data directory's middle layer.
pub fn fig3_on(ctx: &Ctx, data: Option<&Path>) -> Result<ExpResult> {
    let inputs = data.map(real_fig3_inputs).transpose()?;
    fig3::run(ctx, inputs)
}

/// A step's run, which may carry its own inputs (a real-data directory).
pub type BoxedRun = Box<dyn Fn(&Ctx) -> Result<ExpResult>>;

/// One step of `reproduce`: a name, how to run it on the report's context, and whether it is
/// rerun at the other master seeds (`replicated`; declared so that the run's step count is
/// known from the start, and checked against each first result).
pub struct Step {
    pub name: &'static str,
    pub run: BoxedRun,
    pub replicated: bool,
}

/// The entries whose claims are all computed checks or read from committed results: run once.
const NOT_REPLICATED: [&str; 4] = ["factorisation", "rank", "bias", "mqar"];

/// What `racelab reproduce` runs, in order: every entry, then (when the bundled real-data
/// sample is present; it is tracked, so no download) Fig. 3, the real-data study, the
/// theorem, the trade-offs and the combine rules on it.
pub fn reproduce_steps() -> Vec<Step> {
    let mut steps: Vec<Step> = ENTRIES
        .iter()
        .map(|e| {
            let run = e.run;
            Step {
                name: e.name,
                run: Box::new(move |c: &Ctx| {
                    run(&Ctx {
                        data: None,
                        ..c.clone()
                    })
                }),
                replicated: !NOT_REPLICATED.contains(&e.name),
            }
        })
        .collect();
    if let Some(dir) = real::bundled() {
        let on_real = |name: &'static str, run: Run, dir: &PathBuf| {
            let dir = dir.clone();
            Step {
                name,
                run: Box::new(move |c: &Ctx| {
                    run(&Ctx {
                        data: Some(dir.clone()),
                        ..c.clone()
                    })
                }),
                replicated: true,
            }
        };
        let d2 = dir.clone();
        steps.push(Step {
            name: "fig3 (real)",
            run: Box::new(move |c: &Ctx| fig3_on(c, Some(&d2))),
            replicated: true,
        });
        let d3 = dir.clone();
        steps.push(Step {
            name: "real",
            run: Box::new(move |c: &Ctx| real::run(c, &d3)),
            replicated: true,
        });
        steps.push(on_real("theorem (real)", super::theorem::run, &dir));
        steps.push(on_real("tradeoff (real)", super::tradeoff::run, &dir));
        steps.push(on_real("combine (real)", super::combine::run, &dir));
    }
    steps
}

/// The master seeds of a replicated run: `seeds` consecutive seeds from `ctx.seed`.
pub fn master_seeds(ctx: &Ctx, seeds: usize) -> Vec<u64> {
    (0..seeds.max(1) as u64).map(|k| ctx.seed + k).collect()
}

/// Whether a step's result is replicated at the other master seeds: it has an empirical
/// claim measured in this run (computed checks are deterministic, and rows read from
/// committed results carry their own seeds).
fn replicated(r: &ExpResult) -> bool {
    r.claims
        .iter()
        .any(|c| c.kind == super::verdict::Kind::Empirical && c.provenance.is_none())
}

/// Run every step of [`reproduce_steps`] at each master seed and write `REPORT.md` and
/// `claims.json`: returns the merged results, the report's path and the total seconds.
///
/// The first master seed (`ctx.seed`) runs every step into `ctx.out`: its CSVs and figures
/// are the report's. Each further seed reruns the steps with an empirical claim into
/// `ctx.out/seeds/<seed>/`, with inputs and planes redrawn from that seed; each claim's
/// verdicts are then merged by [`super::verdict::replicate`] (the common verdict, or
/// **unstable (k/K hold)**). `started(label)` and `finished(label, result)` are called around
/// each run (for a progress display; `planned(n)` once, with the number of runs); a failing
/// step stops the run with its name in the error.
pub fn reproduce(
    ctx: &Ctx,
    seeds: usize,
    planned: &dyn Fn(u64),
    started: &dyn Fn(&str),
    finished: &dyn Fn(&str, &ExpResult),
) -> Result<(Vec<ExpResult>, PathBuf, f64)> {
    let t0 = std::time::Instant::now();
    let master = master_seeds(ctx, seeds);
    let steps = reproduce_steps();
    let again = steps.iter().filter(|s| s.replicated).count();
    planned((steps.len() + again * (master.len() - 1)) as u64);
    let run_step = |step: &Step, c: &Ctx, label: &str| -> Result<ExpResult> {
        started(label);
        let r = (step.run)(c).map_err(|e| RaceError::In {
            step: format!("experiment `{label}`"),
            source: Box::new(e),
        })?;
        finished(label, &r);
        Ok(r)
    };
    let mut results = Vec::new();
    for step in &steps {
        let mut r = run_step(step, ctx, step.name)?;
        if replicated(&r) != step.replicated {
            return Err(RaceError::Config {
                path: format!("experiment `{}`", step.name),
                msg: format!(
                    "its claims say it is {}replicated at the other master seeds, its step says \
                     otherwise (registry::NOT_REPLICATED)",
                    if replicated(&r) { "" } else { "not " }
                ),
            });
        }
        r.claims = r.claims.into_iter().map(|c| c.at_seed(ctx.seed)).collect();
        results.push(r);
    }
    let mut extra: Vec<Vec<ExpResult>> = vec![Vec::new(); steps.len()];
    for &seed in &master[1..] {
        let c = Ctx {
            out: ctx.out.join("seeds").join(seed.to_string()),
            seed,
            ..ctx.clone()
        };
        for (i, step) in steps.iter().enumerate() {
            if step.replicated {
                let mut r = run_step(step, &c, &format!("{} [seed {seed}]", step.name))?;
                r.claims = r.claims.into_iter().map(|x| x.at_seed(seed)).collect();
                extra[i].push(r);
            }
        }
    }
    for (r, more) in results.iter_mut().zip(&extra) {
        r.claims = r
            .claims
            .iter()
            .map(|c| {
                if c.kind == super::verdict::Kind::Computed || c.provenance.is_some() {
                    return c.clone();
                }
                let runs: Vec<super::Claim> = std::iter::once(c.clone())
                    .chain(
                        more.iter()
                            .filter_map(|m| m.claims.iter().find(|x| x.id == c.id).cloned()),
                    )
                    .collect();
                super::verdict::replicate(&runs).unwrap_or_else(|| c.clone())
            })
            .collect();
    }
    let total = t0.elapsed().as_secs_f64();
    let report = super::report::write_report(ctx, &results, total, &master)?;
    Ok((results, report, total))
}

/// A 2-D `.npy` as a matrix (`arg` names it in errors).
pub fn read_matrix(path: &Path, arg: &str) -> Result<Mat<f64>> {
    let arr = read_npy(path)?;
    match arr.tensor.shape.as_slice() {
        [r, c] => Ok(Mat::from_vec(*r, *c, arr.tensor.data)),
        s => Err(RaceError::shape(
            arg,
            format!("`{}` must be 2-D [m, d], got shape {s:?}", path.display()),
        )),
    }
}

/// The first head of a `[N,d]`, `[H,N,d]` or `[B,H,N,d]` `.npy` as a matrix.
pub fn first_head(path: &Path) -> Result<Mat<f64>> {
    let arr = read_npy(path)?;
    let label = path.display().to_string();
    let [_, _, n, d] = arr.tensor.bhnd(&label)?;
    if n == 0 || d == 0 {
        return Err(RaceError::empty(&label, format!("N = {n}, d = {d}")));
    }
    Ok(Mat::from_vec(n, d, arr.tensor.data[..n * d].to_vec()))
}

/// Fig. 3's inputs from user `.npy` files (first head of each).
pub fn user_fig3_inputs(q: &Path, k: &Path) -> Result<fig3::FigInputs> {
    Ok(fig3::FigInputs {
        q: first_head(q)?,
        k: first_head(k)?,
        label: format!("user Q {} / K {}", q.display(), k.display()),
        stem: "fig3_user".into(),
        softmax_scale: None,
    })
}

/// Fig. 3's inputs from a real-data directory: raw Q/K of the middle stored layer, head 0,
/// the first 96 tokens, with the model's softmax scale from its `meta.json`.
pub fn real_fig3_inputs(dir: &Path) -> Result<fig3::FigInputs> {
    let rd = real::RealData::open(dir)?;
    let layer = rd.mid_layer();
    let (q, k, _) = rd.head(layer, 0)?;
    let n = q.rows.min(96);
    Ok(fig3::FigInputs {
        q: super::data::take_rows(&q, n),
        k: super::data::take_rows(&k, n),
        label: format!("{} layer {layer} head 0, first {n} tokens", rd.model),
        stem: "fig3_real".into(),
        softmax_scale: Some(rd.scale),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve_and_data_is_refused_where_it_does_not_apply() {
        assert!(entry("bias").is_ok());
        let e = entry("nope").err().unwrap().to_string();
        assert!(e.contains("`experiment`") && e.contains("tradeoff"), "{e}");
        let ctx = Ctx {
            out: std::env::temp_dir(),
            seed: 0,
            quick: true,
            config: None,
            data: Some(PathBuf::from("somewhere")),
        };
        let e = run("bias", &ctx).err().unwrap().to_string();
        assert!(e.contains("`data`"), "{e}");
        // Every entry has a distinct name, and reproduce runs each of them.
        let steps = reproduce_steps();
        for e in ENTRIES {
            assert_eq!(ENTRIES.iter().filter(|x| x.name == e.name).count(), 1);
            assert!(steps.iter().any(|s| s.name == e.name), "{}", e.name);
        }
    }
}
