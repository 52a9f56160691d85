//! What the three parts share: the configuration, the L = ∞ output, the error measure and the
//! inputs at `n` tokens.

use crate::analysis::metrics::{frob, rms_row_err};
use crate::experiments::{data, Ctx};
use crate::reference::angular::kappa;
use crate::reference::expected::GTable;
use crate::reference::kernels::kernel_attention;
use crate::tensor::Mat;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct Config {
    pub d: usize,
    pub dv: usize,
    pub ps: Vec<usize>,
    pub ls: Vec<usize>,
    pub betas: Vec<f64>,
    pub ns: Vec<usize>,
    pub spread: f64,
    pub delta: f64,
    /// Plane seeds per grid point (odd ones calibrate, even ones test).
    pub seeds: usize,
    /// Beta of the sampling-error slope (the nearest grid value is used).
    pub sampling_beta: f64,
    /// Nodes of the g(θ) tables.
    pub n_theta: usize,
    /// The L = ∞ study: tokens, betas, input seeds, and the clustered family's shape.
    pub limit_n: usize,
    pub limit_betas: Vec<f64>,
    pub limit_seeds: usize,
    pub limit_clusters: usize,
    pub limit_noise: f64,
    /// The bound is calibrated at `L ≥ calibrate_from_l` and tested at the smaller L, and the
    /// other way round.
    pub calibrate_from_l: usize,
    /// The bound's held-out splits in beta and in P (reported, not judged).
    pub fit_split_beta: f64,
    pub fit_split_p: usize,
    /// The sampling rate is fitted over `L ≥ sampling_from_l`.
    pub sampling_from_l: usize,
    /// The `C·P/beta²` form is calibrated below this beta and tested above it, and the
    /// other way round.
    pub form_split_beta: f64,
    /// ... and calibrated below this P and tested at and above it, and the other way round.
    pub form_split_p: usize,
    /// The tied family's asymptotic rate is fitted for beta ≥ this.
    pub tied_fit_from_beta: f64,
    /// Input draws per synthetic family (and MiniLM heads per layer) of the explicit-bound
    /// test.
    pub explicit_seeds: usize,
}

/// `(row-major kernel) → attention`: the L = ∞ output `Σ_j g(θ_ij)^P v_j / Σ_j g(θ_ij)^P`.
pub fn limit_output(
    q: &Mat<f64>,
    k: &Mat<f64>,
    v: &Mat<f64>,
    table: &GTable,
    p: usize,
    causal: bool,
) -> Mat<f64> {
    let mut s = Mat::zeros(q.rows, k.rows);
    for i in 0..q.rows {
        for j in 0..k.rows {
            let theta = std::f64::consts::PI * (1.0 - kappa(q.row(i), k.row(j)));
            s.data[i * k.rows + j] = table.g(theta).powi(p as i32);
        }
    }
    kernel_attention(&s, v.view(), causal).o
}

/// `‖a − b‖_rms / ‖b‖_rms`.
pub fn rel_rms(a: &Mat<f64>, b: &Mat<f64>) -> f64 {
    rms_row_err(&a.data, &b.data, b.rows) / (frob(&b.data) / (b.rows as f64).sqrt())
}

/// The fit's grid point: `(n, p, l, beta)`.
pub(super) type Point = (usize, usize, usize, f64);

/// Real inputs (unit rows) with their label, when `--data` is given.
pub(super) type RealInputs = Option<crate::experiments::real::UnitInputs>;

/// The inputs at `n` tokens: the first `n` rows of the real inputs, or the synthetic family.
pub(super) fn inputs_at(ctx: &Ctx, cfg: &Config, real: &RealInputs, n: usize) -> [Mat<f64>; 3] {
    match real {
        Some((q, k, v, _)) => [
            crate::experiments::data::take_rows(q, n),
            crate::experiments::data::take_rows(k, n),
            crate::experiments::data::take_rows(v, n),
        ],
        None => {
            let q = data::concentrated_unit(n, cfg.d, cfg.spread, ctx.seed, 41);
            let k = data::concentrated_unit(n, cfg.d, cfg.spread, ctx.seed, 42);
            let v = data::values_from_keys(&k, cfg.dv, ctx.seed + 43);
            [q, k, v]
        }
    }
}
