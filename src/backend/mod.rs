//! The backend contract: one trait for the soft-RACE operator, implemented by every backend
//! on the same inputs, planes and parameters.
//!
//! - [`SoftRace`]: forward (`Ô`, Algorithm 1 or causal Algorithm 2), forward+backward (`Ô`
//!   and `∂ℓ/∂q, ∂ℓ/∂k, ∂ℓ/∂v, ∂ℓ/∂β` for an upstream `G = ∂ℓ/∂Ô`), and a recurrent decoder
//!   ([`Decode::step`]: add `φ(k_t)[v_t, 1]` to the state, read it with `φ(q_t)`);
//! - its implementations: [`reference::ReferenceRace`](crate::reference::ReferenceRace) (f64,
//!   log domain, exact at any β), [`cpu::CpuRace`](crate::cpu::CpuRace) (the production f32
//!   kernels), [`cuda::CudaRace`](crate::cuda::CudaRace) (the CUDA kernels; built without the
//!   `cuda` feature, its stub returns the no-device error);
//! - [`Device`]: which one, as the command line names it ([`crate::attend::for_device`], above
//!   the backends, returns it);
//! - the shared types ([`types`]): `[heads, n, cols]` f32 rows ([`Heads`]), planes rounded to
//!   f32 ([`PlanesF32`]), gradients ([`SoftGrads`]);
//! - the parameters travel as one [`RaceParams`] (P, L, β, combine rule, causal, seed).
//!
//! Every backend computes `Ô_i = Σ_l φ_l(q_i)ᵀ B_l / Σ_l φ_l(q_i)ᵀ A_l` with
//! `A_l = Σ_j φ_l(k_j)`, `B_l = Σ_j φ_l(k_j) v_jᵀ` (over `j ≤ i` when causal) on the planes
//! it is given; the f32 backends agree with the reference within the tolerances of
//! `tests/backends.rs`.

pub mod types;

pub use crate::params::RaceParams;
pub use types::{BackwardInputs, ForwardInputs, GradsMut, Heads, PlanesF32, Recomputed, SoftGrads};

use crate::error::{RaceError, Result};
use serde::Serialize;

/// Where an operator runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    /// The f64 reference (exact; soft RACE in the log domain, exact at any β).
    Reference,
    /// The f32 production CPU kernels.
    Cpu,
    /// The f32 CUDA kernels (soft RACE only).
    Cuda,
}

impl Device {
    pub fn name(&self) -> &'static str {
        match self {
            Device::Reference => "reference",
            Device::Cpu => "cpu",
            Device::Cuda => "cuda",
        }
    }

    /// The kernels this device runs, for the memory estimate.
    pub fn kernels(&self) -> crate::memory::Kernels {
        match self {
            Device::Reference => crate::memory::Kernels::Reference,
            Device::Cpu | Device::Cuda => crate::memory::Kernels::F32,
        }
    }
}

impl std::str::FromStr for Device {
    type Err = RaceError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "reference" => Ok(Device::Reference),
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda),
            _ => Err(RaceError::param(
                "device",
                format!("`{s}` is not a device; use reference, cpu or cuda"),
            )),
        }
    }
}

/// A forward's result: `Ô` (`[heads, n, dv]`), the rows with no key, and the rows an f32
/// backend flagged and recomputed exactly.
#[derive(Debug, Clone, Default)]
pub struct Forward {
    pub o: Vec<f32>,
    pub empty_rows: usize,
    pub recomputed: Recomputed,
}

/// Recurrent decoding of one head (Algorithm 2 one token at a time).
pub trait Decode: Send {
    /// Consume `(q_t, k_t, v_t)` and return `Ô_t`.
    fn step(&mut self, q: &[f32], k: &[f32], v: &[f32]) -> Result<Vec<f32>>;
    /// Tokens consumed so far.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The soft-RACE operator on one backend. `q`, `k` are `[heads, n, d]`, `v` and `g`
/// `[heads, n, dv]`; `planes` are `[L, P, d]` and must match `params.p`, `params.l`.
pub trait SoftRace: Send + Sync {
    fn device(&self) -> Device;
    /// `Ô` for `params` (`params.causal`: Algorithm 2).
    fn forward(
        &self,
        params: &RaceParams,
        planes: &PlanesF32,
        q: Heads,
        k: Heads,
        v: Heads,
    ) -> Result<Forward>;
    /// `Ô` and the gradients of `ℓ` with `∂ℓ/∂Ô = g`.
    fn forward_backward(
        &self,
        params: &RaceParams,
        planes: &PlanesF32,
        q: Heads,
        k: Heads,
        v: Heads,
        g: Heads,
    ) -> Result<(Forward, SoftGrads)>;
    /// A decoder with empty state for values of width `dv` (refused, naming P, L and the bytes,
    /// when its `L·2^P × (dv + 1)` state cannot fit: [`decoder_fits`]).
    fn decoder(
        &self,
        params: &RaceParams,
        planes: &PlanesF32,
        dv: usize,
    ) -> Result<Box<dyn Decode>>;
}

/// The checks every backend makes before it computes: parameters, planes against them, the
/// shapes of `q`, `k`, `v` (and `g`), finiteness, and whether the work fits in memory
/// ([`crate::memory`], estimated for the f32 kernels: the reference needs less per head). The
/// inputs are the caller's, already in memory: only what the call allocates is counted.
pub fn check(
    params: &RaceParams,
    planes: &PlanesF32,
    q: &Heads,
    k: &Heads,
    v: &Heads,
    g: Option<&Heads>,
) -> Result<()> {
    let work = check_inputs(params, planes, q, k, v, g)?;
    crate::memory::check_need(
        &work,
        work.bytes()
            .saturating_sub(work.resident_input_bytes(false)),
        None,
    )
}

/// [`check`] without the memory check: parameters, planes, shapes and finiteness. Returns the
/// work, for a caller that counts its memory itself (one holding more than the inputs).
pub fn check_inputs(
    params: &RaceParams,
    planes: &PlanesF32,
    q: &Heads,
    k: &Heads,
    v: &Heads,
    g: Option<&Heads>,
) -> Result<crate::memory::Work> {
    params.validate()?;
    if planes.p != params.p || planes.l != params.l {
        return Err(RaceError::shape(
            "planes",
            format!(
                "planes are [L, P] = [{}, {}] but the parameters say L = {}, P = {}",
                planes.l, planes.p, params.l, params.p
            ),
        ));
    }
    if q.cols != planes.d || k.cols != planes.d {
        return Err(RaceError::shape(
            "q/k",
            format!(
                "planes have d = {} but q has {} columns and k {}",
                planes.d, q.cols, k.cols
            ),
        ));
    }
    if q.heads != k.heads || k.heads != v.heads || k.n != v.n {
        return Err(RaceError::shape(
            "k/v",
            format!(
                "q [{}, {}, _], k [{}, {}, _], v [{}, {}, _] do not share heads and keys",
                q.heads, q.n, k.heads, k.n, v.heads, v.n
            ),
        ));
    }
    if params.causal && q.n != k.n {
        return Err(RaceError::shape(
            "q/k",
            format!(
                "causal attention needs as many queries as keys (got {} and {})",
                q.n, k.n
            ),
        ));
    }
    if let Some(g) = g {
        if (g.heads, g.n, g.cols) != (q.heads, q.n, v.cols) {
            return Err(RaceError::shape(
                "g",
                format!(
                    "g is [{}, {}, {}] but the output is [{}, {}, {}]",
                    g.heads, g.n, g.cols, q.heads, q.n, v.cols
                ),
            ));
        }
    }
    for (name, x) in [("q", q), ("k", k), ("v", v)] {
        crate::tensor::check_finite(name, x.data)?;
    }
    if let Some(g) = g {
        crate::tensor::check_finite("g", g.data)?;
    }
    Ok(crate::memory::Work {
        method: "soft",
        kernels: crate::memory::Kernels::F32,
        p: params.p,
        l: params.l,
        heads: q.heads,
        n: q.n,
        m: k.n,
        d: q.cols,
        dv: v.cols,
        map_features: 0,
        quadratic: false,
        backward: g.is_some(),
        causal: params.causal,
    })
}

/// Refuse a decoder whose f64 state `L·2^P × (dv + 1)` exceeds the memory available.
pub fn decoder_fits(params: &RaceParams, dv: usize) -> Result<()> {
    params.validate()?;
    let features = (params.l as u64).saturating_mul(1u64 << params.p);
    let need = features.saturating_mul(dv as u64 + 1).saturating_mul(8);
    let (limit, source) = crate::memory::budget(None);
    if need > limit {
        return Err(RaceError::TooLarge(format!(
            "a decoder with P = {}, L = {} (L·2^P = {features} features) and dv = {dv} keeps {} \
             ({need} bytes) of state, more than {source} ({}); use a smaller P or L",
            params.p,
            params.l,
            crate::memory::human(need),
            crate::memory::human(limit)
        )));
    }
    Ok(())
}
