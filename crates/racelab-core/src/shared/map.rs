//! The soft map every backend runs: planes `[L, P, d]` (f32) at inverse temperature `β`, checked
//! once. Each backend evaluates `φ_l(x)_r = Π_p a_p^{b_{r,p}} (1 − a_p)^{1 − b_{r,p}}`,
//! `a_p = σ(2β·tanh(w_{l,p}ᵀx))`, its own way (the CPU kernels: `crate::cpu::features`; the
//! CUDA kernels: `race.cu`), from the same map and the same precision switch.

use crate::backend::PlanesF32;

/// From this beta on, the soft map's projections `z = W x`, `u = tanh z` and the bit
/// probabilities `σ(±2βu)` are computed in f64 and rounded once to f32 (`crate::cpu::features`'s `bit_probs_f64`):
/// the exponent `2β·u` magnifies any absolute rounding of `z` or `u` (an f32 dot product's
/// `≈ 2^-24·Σ|w_c x_c|`, an f32 `u`'s `2^-24·|u|`) by `2β`, into every weight whose bit is not
/// saturated. Below it (ordinary beta) the f32 path is kept, at full speed. The CUDA kernels
/// take the same switch (`race.cu`, `PROJ_F64_BETA`).
pub const PROJ_F64_BETA: f32 = 16.0;

/// Soft RACE features on f32 planes at inverse temperature β. Made only by [`SoftMap::new`]
/// or [`SoftMap::for_params`], which check β and the combine rule, so no kernel runs on an
/// unchecked map.
#[derive(Debug, Clone, Copy)]
pub struct SoftMap<'a> {
    pub(crate) planes: &'a PlanesF32,
    pub(crate) beta: f32,
}

impl<'a> SoftMap<'a> {
    /// The map of `planes` at `beta` (finite, > 0 in f32).
    pub fn new(planes: &'a PlanesF32, beta: f32) -> crate::error::Result<Self> {
        crate::params::validate_beta(beta as f64)?;
        crate::params::validate_pl(planes.p, planes.l)?;
        Ok(SoftMap { planes, beta })
    }

    /// The map of the kernels for `params` on `planes`: the paper's combine rule (the
    /// authors' has no kernel), P and L of the planes.
    pub fn for_params(
        params: &crate::params::RaceParams,
        planes: &'a PlanesF32,
    ) -> crate::error::Result<Self> {
        if params.combine != crate::params::Combine::Paper {
            return Err(crate::error::RaceError::param(
                "combine",
                format!(
                    "the authors' combine rule has no kernel; use {} or {}",
                    crate::error::setting("device", "reference"),
                    crate::error::setting("combine", "paper")
                ),
            ));
        }
        params.validate()?;
        if (planes.p, planes.l) != (params.p, params.l) {
            return Err(crate::error::RaceError::shape(
                "planes",
                format!(
                    "planes are [L, P] = [{}, {}] but the parameters say L = {}, P = {}",
                    planes.l, planes.p, params.l, params.p
                ),
            ));
        }
        SoftMap::new(planes, params.beta as f32)
    }

    /// The planes.
    pub fn planes(&self) -> &'a PlanesF32 {
        self.planes
    }
    /// `β` (f32).
    pub fn beta(&self) -> f32 {
        self.beta
    }
}
