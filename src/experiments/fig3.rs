//! `racelab fig3`: kernel heatmaps in the style of the paper's Fig. 3: softmax weights (at
//! the model's logit scale for real inputs), angular `κ^γ` for γ = 1, 6, 10, 12, and each
//! soft-RACE `Ŝ` (several (P, L, beta)) and hard `Ŝ` beside its target `κ^P` on one colour
//! scale, with the share of saturated soft-hash bits in its title. Row 0 is at the top.
//!
//! The claim: each soft panel converges to its L = ∞ limit `g^P` (quadrature) like L^-1/2,
//! leaving the soft-hash bias `‖g^P − κ^P‖_F/‖κ^P‖_F`, reported as the floor.

use super::data::unit_rows;
use super::{claim_id, data, f, load_config, write_csv, Claim, Ctx, ExpResult, Measure};
use crate::error::Result;
use crate::hashing::{soft_feature_bank, Planes};
use crate::params::{Bits, Seed, Tables};
use crate::reference::angular::{angular_matrix, kappa};
use crate::reference::expected::GTable;
use crate::reference::kernels::{hard_matrix, soft_matrix};
use crate::reference::softmax::softmax_matrix;
use crate::stats::loglog_slope;
use crate::tensor::Mat;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct Config {
    pub n: usize,
    pub d: usize,
    pub clusters: usize,
    pub noise: f64,
    pub softmax_scale: f64,
    pub gammas: Vec<f64>,
    pub soft: Vec<(usize, usize, f64)>,
    pub hard: (usize, usize),
    /// L values of each soft panel's convergence study.
    pub convergence_ls: Vec<usize>,
}

/// Inputs for a Fig. 3 run on given Q/K.
#[derive(Debug, Clone)]
pub struct FigInputs {
    pub q: Mat<f64>,
    pub k: Mat<f64>,
    /// What the inputs are, for the caption.
    pub label: String,
    /// File stem (`fig3_real`, `fig3_user`).
    pub stem: String,
    /// The softmax logit scale (a model's 1/√d_head); `None` uses the config's.
    pub softmax_scale: Option<f64>,
}

/// Share of soft-hash bits with |tanh(wᵀx)| > 0.99 over the rows of `xs`.
pub fn saturated_share(planes: &Planes, xs: &[&Mat<f64>]) -> f64 {
    let mut z = vec![0.0; planes.p()];
    let (mut sat, mut tot) = (0usize, 0usize);
    for x in xs {
        for l in 0..planes.l() {
            for i in 0..x.rows {
                planes.project(l, x.row(i), &mut z);
                sat += z.iter().filter(|t| t.tanh().abs() > 0.99).count();
                tot += planes.p();
            }
        }
    }
    sat as f64 / tot.max(1) as f64
}

/// `‖a − b‖_F / ‖b‖_F`.
fn rel_frob(a: &Mat<f64>, b: &Mat<f64>) -> f64 {
    crate::analysis::metrics::rms_row_err(&a.data, &b.data, 1)
        / crate::analysis::metrics::frob(&b.data)
}

/// Soft Ŝ from the first `l` tables of `planes` for each `l` in `ls` (one pass over tables).
fn soft_prefixes(
    q: &Mat<f64>,
    k: &Mat<f64>,
    planes: &Planes,
    beta: f64,
    ls: &[usize],
) -> Vec<Mat<f64>> {
    let r = planes.r();
    let fq = soft_feature_bank(planes, &q.data, q.rows, beta);
    let fk = soft_feature_bank(planes, &k.data, k.rows, beta);
    let mut sum = Mat::zeros(q.rows, k.rows);
    let mut out = Vec::new();
    for t in 0..planes.l() {
        for i in 0..q.rows {
            let a = &fq[(t * q.rows + i) * r..(t * q.rows + i + 1) * r];
            for j in 0..k.rows {
                let b = &fk[(t * k.rows + j) * r..(t * k.rows + j + 1) * r];
                sum.data[i * k.rows + j] += crate::hashing::dot(a, b);
            }
        }
        if ls.contains(&(t + 1)) {
            let mut m = sum.clone();
            m.data.iter_mut().for_each(|x| *x /= (t + 1) as f64);
            out.push(m);
        }
    }
    out
}

/// `g(θ_ij)^P` for unit rows: the L = ∞ soft kernel.
fn expected_matrix(q: &Mat<f64>, k: &Mat<f64>, table: &GTable, p: usize) -> Mat<f64> {
    let mut m = Mat::zeros(q.rows, k.rows);
    for i in 0..q.rows {
        for j in 0..k.rows {
            let theta = std::f64::consts::PI * (1.0 - kappa(q.row(i), k.row(j)));
            m.data[i * k.rows + j] = table.g(theta).powi(p as i32);
        }
    }
    m
}

/// Run on the built-in structured inputs, or on given Q/K (`[N, d]` each). The angular and
/// RACE panels use unit-normalised Q/K (the theory's setting: angular attention ignores
/// norms, and raw norms saturate the soft hash); softmax uses Q/K as given.
/// The inputs for `user` (or the synthetic clusters), checked: finite, non-zero rows, one d.
fn inputs(ctx: &Ctx, cfg: &Config, user: Option<FigInputs>) -> Result<FigInputs> {
    let inp = match user {
        Some(u) => u,
        None => FigInputs {
            q: data::clustered_unit(cfg.n, cfg.d, cfg.clusters, cfg.noise, ctx.seed, 61),
            k: data::clustered_unit(cfg.n, cfg.d, cfg.clusters, cfg.noise, ctx.seed, 62),
            label: format!(
                "synthetic: {} clusters of unit vectors, d={}, noise {}",
                cfg.clusters, cfg.d, cfg.noise
            ),
            stem: "fig3".to_string(),
            softmax_scale: None,
        },
    };
    for (name, m) in [("q", &inp.q), ("k", &inp.k)] {
        crate::tensor::check_finite(name, &m.data)?;
        crate::tensor::check_nonzero_rows(name, m.view())?;
    }
    if inp.q.cols != inp.k.cols {
        return Err(crate::RaceError::shape(
            "k",
            format!("q has d = {} but k has d = {}", inp.q.cols, inp.k.cols),
        ));
    }
    Ok(inp)
}

/// One soft panel's distances: to its target `κ^P`, to its L = ∞ limit `g^P`, the limit's own
/// bias (the floor), and the share of saturated soft-hash bits.
struct PanelStats {
    p: usize,
    l: usize,
    beta: f64,
    e_kappa: f64,
    e_limit: f64,
    floor: f64,
    sat: f64,
}

/// Compute → CSV → figure `{stem}`: the heatmap panels (softmax, angular, each soft panel
/// beside its target, hard beside its target), with each soft panel's distances.
fn heatmaps(ctx: &Ctx, cfg: &Config, inp: &FigInputs) -> Result<(String, Vec<PanelStats>)> {
    let (q, k) = (&inp.q, &inp.k);
    let d = q.cols;
    let (qu, ku) = (unit_rows(q), unit_rows(k));
    let scale = inp.softmax_scale.unwrap_or(cfg.softmax_scale);
    let sm = softmax_matrix(q, k, scale);
    let row_max: Vec<f64> = (0..sm.rows)
        .map(|i| sm.row(i).iter().cloned().fold(0.0, crate::stats::nan_max))
        .collect();
    let mut panels: Vec<(String, Mat<f64>)> = vec![(
        format!(
            "softmax s={scale:.3} (median row max {:.2})",
            super::quantile(&row_max, 0.5)
        ),
        sm,
    )];
    let mut groups: Vec<usize> = vec![0];
    for (gi, &g) in cfg.gammas.iter().enumerate() {
        panels.push((
            format!("angular gamma={g}"),
            angular_matrix(qu.view(), ku.view(), g),
        ));
        groups.push(1 + gi);
    }
    // A gap keeps every pair below in one row of the (even) grid.
    if panels.len() % 2 == 1 {
        panels.push((String::new(), Mat::zeros(0, 0)));
        groups.push(usize::MAX);
    }
    // Each soft panel beside its target κ^P, on one colour scale.
    let mut stats = Vec::new();
    for (i, &(p, l, beta)) in cfg.soft.iter().enumerate() {
        let planes = Planes::gaussian(Bits(p), Tables(l), d, Seed(ctx.seed + 100 + i as u64))?;
        let s = soft_matrix(qu.view(), ku.view(), &planes, beta);
        let target = angular_matrix(qu.view(), ku.view(), p as f64);
        let limit = expected_matrix(&qu, &ku, &GTable::new(beta, 256), p);
        let sat = saturated_share(&planes, &[&qu, &ku]);
        stats.push(PanelStats {
            p,
            l,
            beta,
            e_kappa: rel_frob(&s, &target),
            e_limit: rel_frob(&s, &limit),
            floor: rel_frob(&limit, &target),
            sat,
        });
        panels.push((
            format!(
                "soft P={p} L={l} beta={beta} ({:.0}% bits sat.)",
                100.0 * sat
            ),
            s,
        ));
        panels.push((format!("target kappa^{p}"), target));
        groups.extend([100 + i, 100 + i]);
    }
    let (hp, hl) = cfg.hard;
    let planes = Planes::gaussian(Bits(hp), Tables(hl), d, Seed(ctx.seed + 99))?;
    panels.push((
        format!("hard P={hp} L={hl}"),
        hard_matrix(qu.view(), ku.view(), &planes),
    ));
    panels.push((
        format!("target kappa^{hp}"),
        angular_matrix(qu.view(), ku.view(), hp as f64),
    ));
    groups.extend([99, 99]);
    let csv = super::heatmaps_via_csv(
        ctx,
        &inp.stem,
        &format!(
            "Fig. 3 style: rows = queries (0 at the top), columns = keys; each RACE panel beside its target kappa^P on one colour scale\nInputs: {}; angular and RACE panels on unit-normalised Q/K. These are not the paper's inputs or model.",
            inp.label
        ),
        &panels,
        Some(&groups),
        6,
        cfg,
    )?;
    Ok((csv, stats))
}

/// Compute → CSV `{stem}_convergence`: each soft panel's distance to its L = ∞ limit over the
/// config's L values (planes of the largest L, read by prefixes), mean over plane seeds.
fn convergence_csv(ctx: &Ctx, cfg: &Config, inp: &FigInputs) -> Result<String> {
    let d = inp.q.cols;
    let (qu, ku) = (unit_rows(&inp.q), unit_rows(&inp.k));
    let mut rows = Vec::new();
    for (i, &(p, _, beta)) in cfg.soft.iter().enumerate() {
        let limit = expected_matrix(&qu, &ku, &GTable::new(beta, 256), p);
        let floor = rel_frob(&limit, &angular_matrix(qu.view(), ku.view(), p as f64));
        let ls = cfg.convergence_ls.clone();
        let per_seed: Vec<Vec<f64>> = (0..CONVERGENCE_SEEDS)
            .into_par_iter()
            .map(|sd| {
                let lmax = ls.iter().cloned().max().unwrap_or(1);
                let pl = Planes::gaussian(
                    Bits(p),
                    Tables(lmax),
                    d,
                    Seed(ctx.seed * 7_919 + 1_000 * (i as u64 + 1) + sd as u64),
                )
                .expect("valid P, L");
                soft_prefixes(&qu, &ku, &pl, beta, &ls)
                    .iter()
                    .map(|m| rel_frob(m, &limit))
                    .collect()
            })
            .collect();
        for (j, &lv) in ls.iter().enumerate() {
            let mean = per_seed.iter().map(|v| v[j]).sum::<f64>() / per_seed.len() as f64;
            rows.push(vec![
                p.to_string(),
                beta.to_string(),
                lv.to_string(),
                f(mean),
                f(floor),
            ]);
        }
    }
    write_csv(
        ctx,
        &format!("{}_convergence", inp.stem),
        &["p", "beta", "l", "rel_frob_vs_limit", "limit_vs_kappa_p"],
        &rows,
        cfg,
    )
}

/// The claim: each soft panel's slope in L towards its limit, fitted from the convergence CSV.
fn claims(
    ctx: &Ctx,
    inp: &FigInputs,
    stats: &[PanelStats],
) -> Result<(Vec<Claim>, serde_json::Value)> {
    let (h, r) = super::read_csv(ctx, &format!("{}_convergence", inp.stem))?;
    let (pc, bc, lc, ec) = (
        super::col(&h, &r, "p"),
        super::col(&h, &r, "beta"),
        super::col(&h, &r, "l"),
        super::col(&h, &r, "rel_frob_vs_limit"),
    );
    let mut slopes = Vec::new();
    let mut summary = Vec::new();
    for st in stats {
        let pts: Vec<(f64, f64)> = (0..r.len())
            .filter(|&i| pc[i] == st.p as f64 && bc[i] == st.beta)
            .map(|i| (lc[i], ec[i]))
            .collect();
        let slope = if pts.len() >= 2 {
            loglog_slope(&pts)
        } else {
            f64::NAN
        };
        slopes.push(slope);
        summary.push(format!(
            "({},{},{}): vs κ^P {:.3}, vs g^P {:.3}, bias floor ‖g^P − κ^P‖ {:.3}, slope in L {slope:.2}, {:.1}% bits saturated",
            st.p, st.l, st.beta, st.e_kappa, st.e_limit, st.floor, 100.0 * st.sat
        ));
    }
    let claims = vec![Claim::judged(
        &claim_id("fig3-race-target", inp.stem != "fig3"),
        format!("[{}] {}", inp.label, summary.join("; ")),
        Measure::Values(slopes.clone()),
        format!("mean over {CONVERGENCE_SEEDS} plane seeds"),
    )?];
    let headline = serde_json::json!({"race_panels": summary, "slopes_in_l": slopes});
    Ok((claims, headline))
}

pub fn run(ctx: &Ctx, user: Option<FigInputs>) -> Result<ExpResult> {
    let t0 = std::time::Instant::now();
    let cfg: Config = load_config(ctx, include_str!("../../experiments/fig3.toml"), "fig3")?;
    let inp = inputs(ctx, &cfg, user)?;
    let (csv, stats) = heatmaps(ctx, &cfg, &inp)?;
    let csv2 = convergence_csv(ctx, &cfg, &inp)?;
    Ok(ExpResult::assemble(
        inp.stem.clone(),
        ctx,
        t0,
        (vec![csv, csv2], vec![inp.stem.clone()]),
        claims(ctx, &inp, &stats)?,
    ))
}

/// Plane seeds averaged in the convergence study.
const CONVERGENCE_SEEDS: usize = 4;
