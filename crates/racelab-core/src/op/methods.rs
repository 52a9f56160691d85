//! The other operators, each of the same shape as [`super::SoftRace`]: a validating
//! constructor, [`Device`] by `on`, and `forward` on views (formulas: [`super`]).

use super::{operator_common, Bits, Causal, Device, Features, Gamma, Planes, Scale, Seed, Tables};
use crate::error::Result;
use crate::method::{FeatureSpec, Method, PlaneSpec};
use crate::params::{validate_gamma, validate_pl, validate_scale};
use crate::tensor::Element;
use ndarray::{Array, ArrayView, Dimension};

/// Exact softmax attention, `softmax(s·QKᵀ)V` (`O(N²)` per head).
#[derive(Debug, Clone)]
pub struct Softmax {
    method: Method,
    device: Device,
}

impl Softmax {
    /// Logit scale `s = 1/√d` (the inputs' `d`), on the CPU kernels.
    pub fn new() -> Self {
        Softmax {
            method: Method::Softmax { scale: None },
            device: Device::Cpu,
        }
    }
    /// Logit scale `s` (finite, > 0), on the CPU kernels.
    pub fn scaled(scale: Scale) -> Result<Self> {
        validate_scale(scale.0)?;
        Ok(Softmax {
            method: Method::Softmax {
                scale: Some(scale.0),
            },
            device: Device::Cpu,
        })
    }
    operator_common!();
}

impl Default for Softmax {
    fn default() -> Self {
        Self::new()
    }
}

/// Exact softmax attention at scale `1/√d` on the CPU kernels ([`Softmax::new`]).
pub fn softmax<T: Element, D: Dimension>(
    q: ArrayView<'_, T, D>,
    k: ArrayView<'_, T, D>,
    v: ArrayView<'_, T, D>,
    causal: Causal,
) -> Result<Array<T, D>> {
    Softmax::new().forward(q, k, v, causal)
}

/// Exact angular attention, weights `(1 − θ_ij/π)^γ` (`O(N²)` per head): at `γ = P` the
/// attention hard LSH estimates, and soft RACE as `β → ∞`.
#[derive(Debug, Clone)]
pub struct Angular {
    method: Method,
    device: Device,
}

impl Angular {
    /// Power `γ` (finite, > 0), on the CPU kernels.
    pub fn new(gamma: Gamma) -> Result<Self> {
        validate_gamma(gamma.0)?;
        Ok(Angular {
            method: Method::Angular { gamma: gamma.0 },
            device: Device::Cpu,
        })
    }
    operator_common!();
}

/// Hard LSH: each table's sign code `h_l(x)` on `P` planes; query `i` weighs key `j` by the
/// number of tables where their codes collide (`Ô_i = Σ_l B_l[h_l(q_i)] / Σ_l A_l[h_l(q_i)]`,
/// bucket counts `A_l` and value sums `B_l`). A query colliding with no key is left 0.
#[derive(Debug, Clone)]
pub struct HardLsh {
    method: Method,
    device: Device,
}

impl HardLsh {
    /// Hard LSH on planes `[L, P, d]` drawn from `seed` for inputs of dimension `d`.
    pub fn new(bits: Bits, tables: Tables, seed: Seed, d: usize) -> Result<Self> {
        validate_pl(bits.0, tables.0)?;
        Self::with_planes(&Planes::gaussian(bits, tables, d, seed)?)
    }
    /// Hard LSH on given planes (their `L`, `P` and `d` hold).
    pub fn with_planes(planes: &Planes) -> Result<Self> {
        planes.check(planes.d, planes.p, planes.l)?;
        Ok(HardLsh {
            method: Method::Hard {
                planes: PlaneSpec::Given(planes.clone()),
            },
            device: Device::Cpu,
        })
    }
    operator_common!();
}

/// Linear attention with features `elu(x) + 1` (`O(N)` per head).
#[derive(Debug, Clone)]
pub struct Linear {
    method: Method,
    device: Device,
}

impl Linear {
    /// Linear attention on the CPU kernels.
    pub fn new() -> Self {
        Linear {
            method: Method::Linear,
            device: Device::Cpu,
        }
    }
    operator_common!();
}

impl Default for Linear {
    fn default() -> Self {
        Self::new()
    }
}

/// Performer (FAVOR+) with `m` positive random features, an unbiased estimate of the
/// softmax kernel `exp(s·qᵀk)`.
#[derive(Debug, Clone)]
pub struct Performer {
    method: Method,
    device: Device,
}

impl Performer {
    /// `m` features `ω` drawn from `seed` (i.i.d. N(0, 1), `d` from the inputs), logit scale
    /// `1/√d`.
    pub fn new(features: Features, seed: Seed) -> Result<Self> {
        let features = FeatureSpec::Draw {
            m: features.0,
            seed: seed.0,
        };
        features.check(None)?;
        Ok(Performer {
            method: Method::Performer {
                features,
                scale: None,
            },
            device: Device::Cpu,
        })
    }
    /// The same features at logit scale `s` (finite, > 0).
    pub fn scaled(mut self, scale: Scale) -> Result<Self> {
        validate_scale(scale.0)?;
        if let Method::Performer { scale: s, .. } = &mut self.method {
            *s = Some(scale.0);
        }
        Ok(self)
    }
    operator_common!();
}
