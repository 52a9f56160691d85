//! The backend contract: one trait for the soft-RACE operator, implemented by every backend
//! on the same inputs, planes and parameters.
//!
//! - [`Backend`]: forward (`Ô`, Algorithm 1 or causal Algorithm 2), forward+backward (`Ô`
//!   and `∂ℓ/∂q, ∂ℓ/∂k, ∂ℓ/∂v, ∂ℓ/∂β` for an upstream `G = ∂ℓ/∂Ô`), the same into the
//!   caller's buffers on a validated [`Problem`] ([`Backend::forward_into`] returns what the
//!   backward needs, [`Saved`]; [`Backend::backward_into`]), and a recurrent decoder
//!   ([`Decode::step`]: add `φ(k_t)[v_t, 1]` to the state, read it with `φ(q_t)`);
//! - its implementations: [`reference::ReferenceRace`](crate::reference::ReferenceRace) (f64,
//!   log domain, exact at any β), [`cpu::CpuRace`](crate::cpu::CpuRace) (the production f32
//!   kernels), [`cuda::CudaRace`](crate::cuda::CudaRace) (the CUDA kernels; built without the
//!   `cuda` feature, its stub returns the no-device error);
//! - [`Device`]: which one, as the command line names it ([`crate::attend::for_device`], above
//!   the backends, returns it);
//! - the same contract on ndarray views ([`BackendArrays`], every backend: `ArrayView3` /
//!   `ArrayView4`, f32 or f64, any layout);
//! - the shared types ([`types`]): `[heads, n, cols]` f32 rows ([`Heads`]), planes rounded to
//!   f32 ([`PlanesF32`]), gradients ([`SoftGrads`]);
//! - the parameters travel as one [`RaceParams`] (P, L, β, combine rule, causal), the planes
//!   beside them;
//! - every backend validates through [`check`] (the one validation, [`crate::validate`]).
//!
//! Every backend computes `Ô_i = Σ_l φ_l(q_i)ᵀ B_l / Σ_l φ_l(q_i)ᵀ A_l` with
//! `A_l = Σ_j φ_l(k_j)`, `B_l = Σ_j φ_l(k_j) v_jᵀ` (over `j ≤ i` when causal) on the planes
//! it is given; the f32 backends agree with the reference within the tolerances of
//! `tests/backends.rs`.

#![deny(missing_docs)]

pub mod arrays;
pub mod types;

pub use arrays::{ArrayForward, ArrayGrads, BackendArrays};

pub use crate::params::RaceParams;
pub use types::{
    BackwardInputs, ForwardInputs, GradsMut, Heads, PlanesF32, Problem, Recomputed, Saved,
    SoftGrads,
};

use crate::error::{RaceError, Result};
use crate::method::{Method, PlaneSpec};
use crate::validate::{Budget, Held};
use serde::Serialize;

/// Where an operator runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
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
    /// Every device, in the order the command line lists them.
    pub const ALL: [Device; 3] = [Device::Reference, Device::Cpu, Device::Cuda];

    /// The lowercase name (`--device`).
    pub fn name(&self) -> &'static str {
        match self {
            Device::Reference => "reference",
            Device::Cpu => "cpu",
            Device::Cuda => "cuda",
        }
    }

    /// One line on what runs there (`--help`).
    pub fn about(&self) -> &'static str {
        match self {
            Device::Reference => {
                "The f64 reference (exact; soft RACE in the log domain, exact at any β)"
            }
            Device::Cpu => "The f32 production CPU kernels",
            Device::Cuda => "The f32 CUDA kernels (soft RACE only)",
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
    /// `Ô`, `[heads, n, dv]` row-major.
    pub o: Vec<f32>,
    /// Rows with no key (left 0).
    pub empty_rows: usize,
    /// Rows recomputed exactly, and the seconds it took.
    pub recomputed: Recomputed,
}

/// Recurrent decoding of one head (Algorithm 2 one token at a time).
pub trait Decode: Send {
    /// Consume `(q_t, k_t, v_t)` and return `Ô_t`.
    fn step(&mut self, q: &[f32], k: &[f32], v: &[f32]) -> Result<Vec<f32>>;
    /// Tokens consumed so far.
    fn len(&self) -> usize;
    /// No token consumed yet.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The soft-RACE operator on one backend. `q`, `k` are `[heads, n, d]`, `v` and `g`
/// `[heads, n, dv]`; `planes` are `[L, P, d]` and must match `params.p`, `params.l`.
pub trait Backend: Send + Sync {
    /// The device this backend runs on.
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
    /// `Ô` written into `o` (`[heads, n, dv]`, overwritten) for a validated problem, and what
    /// the backward needs. `reuse` is an earlier forward's [`Saved`] whose buffers a backend
    /// may recycle (`Saved::default()` for none): a training loop or a benchmark then does
    /// not pay fresh pages every step. The default runs [`Backend::forward`] and copies.
    fn forward_into(&self, pb: &Problem, o: &mut [f32], reuse: Saved) -> Result<Saved> {
        drop(reuse);
        pb.check_output("o", o)?;
        let ForwardInputs { q, k, v } = pb.inputs();
        let f = self.forward(pb.params(), pb.planes(), q, k, v)?;
        o.copy_from_slice(&f.o);
        Ok(Saved::stateless(f.empty_rows, f.recomputed))
    }
    /// The gradients of `ℓ` with `∂ℓ/∂Ô = pb.grad()` written into `grads` (overwritten), for
    /// the forward that returned `saved` and `o`; returns `∂ℓ/∂β`. The default runs
    /// [`Backend::forward_backward`] (recomputing the forward) and copies.
    fn backward_into(
        &self,
        pb: &Problem,
        saved: &Saved,
        o: &[f32],
        grads: GradsMut,
    ) -> Result<f64> {
        let _ = saved;
        let x = pb.backward_inputs(o, &grads)?;
        let (_, gr) = self.forward_backward(pb.params(), pb.planes(), x.q, x.k, x.v, x.g)?;
        grads.dq.copy_from_slice(&gr.dq);
        grads.dk.copy_from_slice(&gr.dk);
        grads.dv.copy_from_slice(&gr.dv);
        Ok(gr.dbeta)
    }
    /// A decoder with empty state for values of width `dv` (refused, naming P, L and the bytes,
    /// when its `L·2^P × (dv + 1)` state cannot fit: [`decoder_fits`]).
    fn decoder(
        &self,
        params: &RaceParams,
        planes: &PlanesF32,
        dv: usize,
    ) -> Result<Box<dyn Decode>>;
}

/// The checks every backend makes before it computes: the one validation
/// ([`crate::validate::check`]) of soft RACE with `params` on `planes` (P, L, β, the planes
/// against the parameters and the inputs' `d`), the shapes of `q`, `k`, `v` (and `g`),
/// finiteness, and whether the work fits in memory ([`crate::memory`], estimated for the f32
/// kernels: the reference needs less per head). The inputs are the caller's, already in
/// memory: only what the call allocates is counted.
pub fn check(
    params: &RaceParams,
    planes: &PlanesF32,
    q: &Heads,
    k: &Heads,
    v: &Heads,
    g: Option<&Heads>,
) -> Result<()> {
    check_within(params, planes, [q, k, v], g, Budget::holding(Held::Inputs)).map(|_| ())
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
    Ok(check_within(params, planes, [q, k, v], g, Budget::unchecked())?.work)
}

/// [`check`] against `budget`.
pub fn check_within(
    params: &RaceParams,
    planes: &PlanesF32,
    qkv: [&Heads; 3],
    g: Option<&Heads>,
    budget: Budget,
) -> Result<crate::validate::Checked> {
    let method = soft_method(params, planes)?;
    fn t<'a>(name: &str, x: &Heads<'a>) -> Result<crate::tensor::TensorRef<'a, f32>> {
        crate::tensor::TensorRef::new(name, vec![x.heads, x.n, x.cols], x.data)
    }
    let [q, k, v] = qkv;
    let (q, k, v) = (t("q", q)?, t("k", k)?, t("v", v)?);
    let g = g.map(|g| t("g", g)).transpose()?;
    crate::validate::check(crate::validate::Call {
        method: &method,
        causal: params.causal,
        q: &q,
        k: &k,
        v: &v,
        g: g.as_ref(),
        kernels: crate::memory::Kernels::F32,
        budget,
    })
}

/// Soft RACE with `params` on the given `planes`, which must have the parameters' P and L.
pub fn soft_method(params: &RaceParams, planes: &PlanesF32) -> Result<Method> {
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
    Ok(Method::Soft {
        planes: PlaneSpec::Given(planes.to_planes()),
        beta: params.beta,
        combine: params.combine,
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
