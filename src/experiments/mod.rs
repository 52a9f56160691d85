//! The experiments: one module per claim family, each with a TOML config
//! (`experiments/<name>.toml`, embedded as the built-in default, `[quick]` and `[full]`
//! tables), CSV written before any figure, figures drawn from those rows, and claim rows
//! with a measured value and a verdict for `figures/REPORT.md`.

pub mod authors;
pub mod bias;
pub mod causal;
pub mod combine;
pub mod cost;
pub mod data;
pub mod fig3;
pub mod lemma10;
pub mod limit;
pub mod mqar;
pub mod rank;
pub mod real;
pub mod registry;
pub mod report;
pub mod staging;
pub mod theorem;
pub mod tradeoff;
pub mod variance;
pub mod verdict;

pub use verdict::{Claim, Measure, Verdict};

use crate::error::{RaceError, Result};
use crate::provenance::Provenance;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use std::path::{Path, PathBuf};

/// Where and how an experiment runs.
#[derive(Debug, Clone)]
pub struct Ctx {
    pub out: PathBuf,
    pub seed: u64,
    pub quick: bool,
    /// A user config file replacing the built-in one.
    pub config: Option<PathBuf>,
    /// A directory of real Q/K/V (`experiments/extract_qk.py` format) to run on instead of
    /// synthetic inputs (fig3, theorem, tradeoff, combine).
    pub data: Option<PathBuf>,
}

/// Whole-matrix inputs `(q, k, v)`.
pub type Qkv<'a> = (
    &'a crate::tensor::Mat<f64>,
    &'a crate::tensor::Mat<f64>,
    &'a crate::tensor::Mat<f64>,
);

/// The f64 soft-RACE output `Ô` (reference estimator) on whole matrices.
pub fn soft_out(
    (q, k, v): Qkv,
    planes: &crate::hashing::Planes,
    beta: f64,
    causal: bool,
    combine: crate::params::Combine,
) -> crate::tensor::Mat<f64> {
    crate::reference::race::soft_race(q.view(), k.view(), v.view(), planes, beta, causal, combine).o
}

/// The same non-causal `Ô` from the production f32 CPU kernels (one head), returned in f64.
/// The studies whose errors are far above f32 rounding (relative errors ≥ 1e-3 against
/// ~1e-6 for the kernels, the core's `tests/backends.rs`) use it for their inner loops; the f64
/// reference stays the ground truth where a quantity is near rounding.
pub fn soft_out_f32(
    (q, k, v): Qkv,
    planes: &crate::hashing::Planes,
    beta: f64,
) -> Result<crate::tensor::Mat<f64>> {
    use crate::backend::{Backend, Heads, PlanesF32, RaceParams};
    let to32 = |m: &crate::tensor::Mat<f64>| m.data.iter().map(|&x| x as f32).collect::<Vec<f32>>();
    let (q32, k32, v32) = (to32(q), to32(k), to32(v));
    let params = RaceParams::new(
        crate::params::Bits(planes.p()),
        crate::params::Tables(planes.l()),
        crate::params::Beta(beta),
    )?;
    let out = crate::cpu::CpuRace::detected().forward(
        &params,
        &PlanesF32::from_planes(planes),
        Heads::new(1, q.rows, q.cols, &q32)?,
        Heads::new(1, k.rows, k.cols, &k32)?,
        Heads::new(1, v.rows, v.cols, &v32)?,
    )?;
    Ok(crate::tensor::Mat::from_vec(
        q.rows,
        v.cols,
        out.o.iter().map(|&x| x as f64).collect(),
    ))
}

/// One input of a study over input families: `(family, instance, q, k, v)`.
pub type Instance = (
    String,
    usize,
    crate::tensor::Mat<f64>,
    crate::tensor::Mat<f64>,
    crate::tensor::Mat<f64>,
);

/// A claim's id: `base`, or `base-real` for the run on the real-data sample.
pub fn claim_id(base: &str, real: bool) -> String {
    if real {
        format!("{base}-real")
    } else {
        base.to_string()
    }
}

/// What an experiment returns.
#[derive(Debug, Clone, Serialize)]
pub struct ExpResult {
    pub name: String,
    pub claims: Vec<Claim>,
    /// Figure stems relative to the output folder (`x` for `x.png` and `x.svg`).
    pub figures: Vec<String>,
    pub csv: Vec<String>,
    pub headline: serde_json::Value,
    pub seconds: f64,
    pub seed: u64,
}

impl ExpResult {
    /// An experiment's result from its parts: the CSVs and figures it wrote, its judged claims
    /// and headline figures, timed from `t0`.
    pub fn assemble(
        name: impl Into<String>,
        ctx: &Ctx,
        t0: std::time::Instant,
        (csv, figures): (Vec<String>, Vec<String>),
        (claims, headline): (Vec<Claim>, serde_json::Value),
    ) -> ExpResult {
        ExpResult {
            name: name.into(),
            claims,
            figures,
            csv,
            headline,
            seconds: t0.elapsed().as_secs_f64(),
            seed: ctx.seed,
        }
    }
}

/// `[quick]` and `[full]` variants of one experiment's config. The built-in configs have
/// both; a user's needs only the one its run reads ([`Modes::mode`]).
#[derive(Debug, Clone, Deserialize)]
pub struct Modes<C> {
    pub quick: Option<C>,
    pub full: Option<C>,
}

impl<C> Modes<C> {
    /// The `[quick]` or the `[full]` variant, or an error naming the missing section of `path`.
    pub fn mode(self, quick: bool, path: &str) -> Result<C> {
        let quick_flag = crate::error::arg("quick");
        let (got, name, other) = if quick {
            (
                self.quick,
                "quick",
                format!("without {quick_flag}, for its [full] section"),
            )
        } else {
            (
                self.full,
                "full",
                format!("with {quick_flag}, for its [quick] section"),
            )
        };
        got.ok_or_else(|| RaceError::Config {
            path: path.to_string(),
            msg: format!("no [{name}] section, which this run reads; add one, or run {other}"),
        })
    }
}

/// Load the experiment config: the user's file, or the built-in TOML.
pub fn load_config<C: DeserializeOwned + cost::Costed>(
    ctx: &Ctx,
    builtin: &str,
    name: &str,
) -> Result<C> {
    let (text, path) = match &ctx.config {
        Some(p) => (
            std::fs::read_to_string(p).map_err(|e| RaceError::io(p, e))?,
            p.display().to_string(),
        ),
        None => (
            builtin.to_string(),
            format!("experiments/{name}.toml (built in)"),
        ),
    };
    let modes: Modes<C> = parse_config(&text, &path)?;
    modes.mode(ctx.quick, &path)
}

/// Parse a config's text (its `quick` and `full` tables); `path` names it in errors. The text
/// is parsed into a TOML table, then read into the config ([`config_from_table`]): the two
/// steps the fuzz target `config` drives.
pub fn parse_config<C: DeserializeOwned + cost::Costed>(
    text: &str,
    path: &str,
) -> Result<Modes<C>> {
    let table: toml::Table = toml::from_str(text).map_err(|e| RaceError::Config {
        path: path.to_string(),
        msg: e.to_string(),
    })?;
    config_from_table(&table, path)
}

/// Every number of a config finite, and every list under a key free of repeats (a grid with a
/// NaN or a repeated point measures nothing new and poisons its fits), the key named as
/// `[section].key`.
fn check_config_values(table: &toml::Table, path: &str) -> Result<()> {
    fn walk(v: &toml::Value, key: &str, path: &str) -> Result<()> {
        let bad = |msg: String| {
            Err(RaceError::Config {
                path: path.to_string(),
                msg: format!("`{key}`: {msg}"),
            })
        };
        match v {
            toml::Value::Float(x) if !x.is_finite() => bad(format!("{x} is not a finite number")),
            toml::Value::Table(t) => {
                for (k, v) in t {
                    let name = if key.is_empty() {
                        format!("[{k}]")
                    } else {
                        format!("{key}.{k}")
                    };
                    walk(v, &name, path)?;
                }
                Ok(())
            }
            toml::Value::Array(items) => {
                for (i, x) in items.iter().enumerate() {
                    walk(x, &format!("{key}[{i}]"), path)?;
                }
                // A list under a key is a grid; a list inside a list is one point of it (a
                // (P, L) pair may repeat a number).
                if !key.ends_with(']') {
                    for (i, a) in items.iter().enumerate() {
                        if let Some(j) = items[..i].iter().position(|b| b == a) {
                            return bad(format!(
                                "{a} is listed twice (entries {j} and {i}); give each value once"
                            ));
                        }
                    }
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }
    walk(&toml::Value::Table(table.clone()), "", path)
}

/// A config read from a parsed TOML table; `path` names it in errors.
pub fn config_from_table<C: DeserializeOwned + cost::Costed>(
    table: &toml::Table,
    path: &str,
) -> Result<Modes<C>> {
    check_config_values(table, path)?;
    let modes = Modes::<C>::deserialize(table.clone()).map_err(|e| RaceError::Config {
        path: path.to_string(),
        msg: e.to_string(),
    })?;
    if modes.quick.is_none() && modes.full.is_none() {
        return Err(RaceError::Config {
            path: path.to_string(),
            msg: "neither a [quick] nor a [full] section; give the one the run reads".into(),
        });
    }
    // What each mode asks of the machine, before any work ([`cost`]).
    if let Some(c) = &modes.quick {
        cost::check(c, path, "quick")?;
    }
    if let Some(c) = &modes.full {
        cost::check(c, path, "full")?;
    }
    Ok(modes)
}

/// Write a CSV (header + rows) and a `.meta.json` sidecar with provenance and parameters.
pub fn write_csv(
    ctx: &Ctx,
    name: &str,
    header: &[&str],
    rows: &[Vec<String>],
    params: &impl Serialize,
) -> Result<String> {
    std::fs::create_dir_all(&ctx.out).map_err(|e| RaceError::io(&ctx.out, e))?;
    let mut s = header.join(",");
    s.push('\n');
    for r in rows {
        // Fields are numbers or simple labels; a comma would shift every later column.
        debug_assert!(
            r.iter().all(|x| !x.contains(',')),
            "CSV field with a comma in {name}"
        );
        s.push_str(
            &r.iter()
                .map(|x| x.replace(',', ";"))
                .collect::<Vec<_>>()
                .join(","),
        );
        s.push('\n');
    }
    let p = ctx.out.join(format!("{name}.csv"));
    crate::io::write_atomic(&p, s.as_bytes())?;
    let meta = serde_json::json!({
        "csv": format!("{name}.csv"),
        "seed": ctx.seed,
        "quick": ctx.quick,
        "params": params,
        "provenance": Provenance::collect(crate::cpu::detected_isa().name()),
    });
    let m = ctx.out.join(format!("{name}.meta.json"));
    crate::io::write_atomic(
        &m,
        serde_json::to_string_pretty(&meta)
            .unwrap_or_default()
            .as_bytes(),
    )?;
    Ok(format!("{name}.csv"))
}

/// Read back a CSV written by [`write_csv`] (figures are drawn from these rows).
pub fn read_csv(ctx: &Ctx, name: &str) -> Result<(Vec<String>, Vec<Vec<String>>)> {
    let p = ctx.out.join(format!("{name}.csv"));
    let text = std::fs::read_to_string(&p).map_err(|e| RaceError::io(&p, e))?;
    let (header, mut rows) = split_csv(&text);
    inject_nan(name, &header, &mut rows);
    Ok((header, rows))
}

/// A CSV without quoting (as [`write_csv`] and `mqar.py` write it): its header and rows.
pub fn split_csv(text: &str) -> (Vec<String>, Vec<Vec<String>>) {
    let mut lines = text.lines();
    let header = lines
        .next()
        .unwrap_or("")
        .split(',')
        .map(String::from)
        .collect();
    let rows = lines
        .map(|l| l.split(',').map(String::from).collect())
        .collect();
    (header, rows)
}

/// The test hook `RACELAB_TEST_NAN=STEM:COLUMN[,STEM:COLUMN…]`: every value of the named
/// column of CSV `STEM` reads back as NaN, so a test can drive a NaN through an experiment's
/// own path from its CSV to its claims (crates/racelab-cli/tests/nan_injection.rs) and see it arrive as "not
/// testable: k non-finite values", never dropped.
fn inject_nan(name: &str, header: &[String], rows: &mut [Vec<String>]) {
    let Ok(spec) = std::env::var("RACELAB_TEST_NAN") else {
        return;
    };
    for target in spec.split(',') {
        let Some((stem, column)) = target.split_once(':') else {
            continue;
        };
        if stem != name {
            continue;
        }
        if let Some(i) = header.iter().position(|h| h == column) {
            for r in rows.iter_mut() {
                if let Some(cell) = r.get_mut(i) {
                    *cell = "NaN".into();
                }
            }
        }
    }
}

/// Column `name` of CSV rows parsed as f64 (NaN for a missing column or field, so a misnamed
/// column can only make a verdict fail, never read another column's numbers).
pub fn col(header: &[String], rows: &[Vec<String>], name: &str) -> Vec<f64> {
    let i = header.iter().position(|h| h == name);
    debug_assert!(i.is_some(), "no CSV column `{name}`");
    rows.iter()
        .map(|r| {
            i.and_then(|i| r.get(i))
                .and_then(|x| x.parse().ok())
                .unwrap_or(f64::NAN)
        })
        .collect()
}

/// Column `name` as strings (empty for a missing column).
pub fn col_s(header: &[String], rows: &[Vec<String>], name: &str) -> Vec<String> {
    let i = header.iter().position(|h| h == name);
    debug_assert!(i.is_some(), "no CSV column `{name}`");
    rows.iter()
        .map(|r| i.and_then(|i| r.get(i)).cloned().unwrap_or_default())
        .collect()
}

/// Several numeric columns of the CSV `name` this run wrote.
pub fn read_cols<const K: usize>(ctx: &Ctx, name: &str, names: [&str; K]) -> Result<[Vec<f64>; K]> {
    let (h, r) = read_csv(ctx, name)?;
    Ok(names.map(|n| col(&h, &r, n)))
}

/// `x` formatted for CSV (full precision).
pub fn f(x: f64) -> String {
    format!("{x:.9e}")
}

/// Path of a figure stem in the output folder.
pub fn fig(ctx: &Ctx, stem: &str) -> PathBuf {
    ctx.out.join(stem)
}

pub use crate::stats::quantile;

/// The relative path used in REPORT.md for a figure stem.
pub fn rel(out: &Path, stem: &str) -> String {
    let _ = out;
    format!("{stem}.png")
}

/// Write named matrices as one long CSV (`panel, query, key, value`) and draw the heatmaps
/// from that CSV (`cols` panels per row). Panels with the same `groups` entry share one
/// colour scale (`None`: each its own). Returns the CSV's file name.
pub fn heatmaps_via_csv(
    ctx: &Ctx,
    stem: &str,
    title: &str,
    panels: &[(String, crate::tensor::Mat<f64>)],
    groups: Option<&[usize]>,
    cols: usize,
    params: &impl Serialize,
) -> Result<String> {
    let mut rows = Vec::new();
    for (name, m) in panels {
        for i in 0..m.rows {
            for j in 0..m.cols {
                rows.push(vec![
                    name.clone(),
                    i.to_string(),
                    j.to_string(),
                    f(m.at(i, j)),
                ]);
            }
        }
    }
    let csv = write_csv(
        ctx,
        stem,
        &["panel", "query", "key", "value"],
        &rows,
        params,
    )?;
    let (_, r) = read_csv(ctx, stem)?;
    let mut drawn: Vec<crate::plot::Panel> = panels
        .iter()
        .map(|(name, m)| {
            let mut mm = crate::tensor::Mat::zeros(m.rows, m.cols);
            let key = name.replace(',', ";");
            for row in r.iter().filter(|row| row[0] == key) {
                let (i, j): (usize, usize) =
                    (row[1].parse().unwrap_or(0), row[2].parse().unwrap_or(0));
                mm.data[i * m.cols + j] = row[3].parse().unwrap_or(f64::NAN);
            }
            crate::plot::Panel {
                title: name.clone(),
                m: mm,
                range: None,
            }
        })
        .collect();
    if let Some(g) = groups {
        let range = |ix: &[usize]| {
            crate::stats::min_max(ix.iter().flat_map(|&i| drawn[i].m.data.iter().cloned()))
        };
        let ranges: Vec<Option<(f64, f64)>> = (0..drawn.len())
            .map(|i| {
                let same: Vec<usize> = (0..drawn.len()).filter(|&j| g.get(j) == g.get(i)).collect();
                (same.len() > 1).then(|| range(&same))
            })
            .collect();
        for (p, r) in drawn.iter_mut().zip(ranges) {
            p.range = r;
        }
    }
    crate::plot::heatmaps(&fig(ctx, stem), title, &drawn, cols)?;
    Ok(csv)
}

#[cfg(test)]
mod config_tests {
    use super::check_config_values;

    /// A user's config needs only the section its run reads; the other run is refused naming
    /// the missing section and the flag that reads the one given.
    #[test]
    fn a_config_with_one_section_serves_the_run_that_reads_it() {
        let text = include_str!("../../experiments/limit.toml");
        let quick_only = &text[..text.find("[full]").expect("limit.toml has [full]")];
        let m = super::parse_config::<super::limit::Config>(quick_only, "q.toml").unwrap();
        assert!(m.clone().mode(true, "q.toml").is_ok());
        let e = m.mode(false, "q.toml").unwrap_err().to_string();
        assert!(
            e.contains("no [full] section") && e.contains("with `quick`"),
            "{e}"
        );
        let e = super::parse_config::<super::limit::Config>("x = 1\n", "n.toml").unwrap_err();
        assert!(e.to_string().contains("neither"), "{e}");
    }

    fn check(text: &str) -> Result<(), String> {
        let t: toml::Table = toml::from_str(text).unwrap();
        check_config_values(&t, "c.toml").map_err(|e| e.to_string())
    }

    /// A NaN, an infinity or a repeated grid point is refused naming its key; a point of a grid
    /// may repeat a number.
    #[test]
    fn configs_refuse_non_finite_and_repeated_grid_values() {
        assert!(check("[quick]\nbetas = [1.0, 4.0]\npl = [[2, 2], [3, 3]]\n").is_ok());
        let e = check("[quick]\nfit = [16.0, nan]\n").unwrap_err();
        assert!(
            e.contains("`[quick].fit[1]`") && e.contains("finite"),
            "{e}"
        );
        let e = check("[full]\nspread = inf\n").unwrap_err();
        assert!(e.contains("`[full].spread`"), "{e}");
        let e = check("[quick]\nns = [128, 512, 128]\n").unwrap_err();
        assert!(e.contains("`[quick].ns`") && e.contains("twice"), "{e}");
        let e = check("[quick]\npl = [[2, 2], [2, 2]]\n").unwrap_err();
        assert!(e.contains("`[quick].pl`"), "{e}");
    }
}
