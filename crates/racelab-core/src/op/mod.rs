//! # Operators: one object per attention method, one vocabulary
//!
//! Each method is a value built by a validating constructor (its fields are private) and run
//! on ndarray views `[N, d]`, `[H, N, d]` or `[B, H, N, d]` (f32 or f64, any layout): the
//! output has the inputs' rank and element type, `[.., N, dv]`.
//!
//! | operator | weights of query `i` on key `j` | cost |
//! |---|---|---|
//! | [`SoftRace`] | `Σ_l φ_l(q_i)ᵀφ_l(k_j)`, soft features of `L` tables of `P` planes at `β` | `O(N·L·2^P)` |
//! | [`HardLsh`] | `#{l : h_l(q_i) = h_l(k_j)}`, sign codes on the same planes | `O(N·L)` |
//! | [`Softmax`] | `exp(s·q_iᵀk_j)`, `s = 1/√d` unless given | `O(N²)` |
//! | [`Angular`] | `(1 − θ_ij/π)^γ` | `O(N²)` |
//! | [`Linear`] | `(elu(q_i)+1)ᵀ(elu(k_j)+1)` | `O(N)` |
//! | [`Performer`] | `φ(q_i)ᵀφ(k_j)`, `φ(x) = exp(ω√s·x − s|x|²/2)/√m`, `m` Gaussian rows `ω` | `O(N·m)` |
//!
//! `Ô_i = Σ_j w_ij v_j / Σ_j w_ij` over every key `j`, or over `j ≤ i` with [`Causal::Yes`]
//! (soft RACE: Algorithm 1, causal Algorithm 2).
//!
//! The counts are newtypes, so a swapped P and L does not compile:
//!
//! ```compile_fail
//! use racelab_core::op::{Beta, Bits, Seed, SoftRace, Tables};
//! let op = SoftRace::new(Tables(8), Bits(2), Beta(10.0), Seed(0), 64); // P and L swapped
//! ```
//!
//! ```
//! use ndarray::Array4;
//! use racelab_core::op::{Beta, Bits, Causal, Seed, SoftRace, Tables};
//! # fn main() -> racelab_core::Result<()> {
//! let (q, k, v) = (Array4::<f32>::ones((1, 2, 16, 8)), Array4::ones((1, 2, 16, 8)), Array4::ones((1, 2, 16, 8)));
//! let op = SoftRace::new(Bits(2), Tables(4), Beta(10.0), Seed(0), 8)?;
//! let o = op.forward(q.view(), k.view(), v.view(), Causal::Yes)?;
//! assert_eq!(o.shape(), &[1, 2, 16, 8]);
//! let (o, saved) = op.forward_train(q.view(), k.view(), v.view(), Causal::No)?;
//! let g = op.backward(&saved, o.view())?;
//! assert_eq!(g.dq.shape(), q.shape());
//! # Ok(()) }
//! ```
//!
//! The device is the operator's ([`SoftRace::on`], the CPU kernels unless asked): f32 views
//! reach the f32 kernels with no copy; the f64 reference widens them exactly.

#![deny(missing_docs)]

mod methods;
mod soft;

pub use crate::backend::{Decode, Device};
pub use crate::hashing::Planes;
pub use crate::params::{Beta, Bits, Features, Gamma, Scale, Seed, Tables};
pub use methods::{softmax, Angular, HardLsh, Linear, Performer, Softmax};
pub use soft::{Grads, SoftRace, Trained, Workspace};

use crate::error::{RaceError, Result};
use crate::method::Method;
use crate::tensor::{standard_rows, Element, TensorRef};
use ndarray::{Array, ArrayView, Dimension, IxDyn};

/// Whether query `i` sees every key (`No`) or only keys `j ≤ i` (`Yes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Causal {
    /// Every key (soft RACE: Algorithm 1).
    #[default]
    No,
    /// Keys at or before the query (soft RACE: Algorithm 2).
    Yes,
}

impl Causal {
    /// `true` for [`Causal::Yes`].
    pub fn is_causal(self) -> bool {
        self == Causal::Yes
    }
}

impl From<bool> for Causal {
    fn from(causal: bool) -> Self {
        if causal {
            Causal::Yes
        } else {
            Causal::No
        }
    }
}

/// `device` for `method`, refused when it cannot run it (CUDA runs soft RACE only) or is
/// not there (no CUDA driver or device).
fn checked_device(method: &Method, device: Device) -> Result<Device> {
    if device == Device::Cuda {
        if !matches!(method, Method::Soft { .. }) {
            return Err(RaceError::param(
                "device",
                format!(
                    "the CUDA backend runs soft RACE only, not `{}`; use Device::Cpu or \
                     Device::Reference",
                    method.name()
                ),
            ));
        }
        crate::cuda::ensure_device()?;
    }
    Ok(device)
}

/// `O` for `method` on `device` (the one entry point, [`crate::attend::attend_in`]), shaped
/// like `q` with `v`'s last axis.
fn run<T: Element, D: Dimension>(
    method: &Method,
    device: Device,
    [q, k, v]: [ArrayView<'_, T, D>; 3],
    causal: Causal,
) -> Result<Array<T, D>> {
    let (qr, kr, vr) = (standard_rows(&q), standard_rows(&k), standard_rows(&v));
    let opts = crate::attend::AttendOptions::new(method.clone()).causal(causal.is_causal());
    let r = crate::attend::attend_in(
        &TensorRef::new("q", q.shape().to_vec(), &qr)?,
        &TensorRef::new("k", k.shape().to_vec(), &kr)?,
        &TensorRef::new("v", v.shape().to_vec(), &vr)?,
        &opts,
        device,
    )?;
    Array::from_shape_vec(IxDyn(&r.o.shape), r.o.data)
        .and_then(|a| a.into_dimensionality::<D>())
        .map_err(|e| RaceError::shape("o", e.to_string()))
}

/// The methods every operator shares: its device, and the forward on views.
macro_rules! operator_common {
    () => {
        /// The same operator on `device` ([`Device::Cpu`] unless asked), refused when the
        /// device cannot run it (CUDA runs soft RACE only) or is not there.
        pub fn on(mut self, device: $crate::op::Device) -> $crate::error::Result<Self> {
            self.device = $crate::op::checked_device(&self.method, device)?;
            Ok(self)
        }

        /// The device this operator runs on.
        pub fn device(&self) -> $crate::op::Device {
            self.device
        }

        /// `Ô` (`[.., N, dv]`, the inputs' rank and element type) for `q`, `k` (`[.., N, d]`)
        /// and `v` (`[.., N, dv]`), every key or ([`Causal::Yes`]) the keys at or before each
        /// query. Bad shapes, non-finite values and work too large for memory are refused
        /// before anything is computed.
        pub fn forward<T: $crate::tensor::Element, D: ndarray::Dimension>(
            &self,
            q: ndarray::ArrayView<'_, T, D>,
            k: ndarray::ArrayView<'_, T, D>,
            v: ndarray::ArrayView<'_, T, D>,
            causal: $crate::op::Causal,
        ) -> $crate::error::Result<ndarray::Array<T, D>> {
            $crate::op::run(&self.method, self.device, [q, k, v], causal)
        }
    };
}
pub(crate) use operator_common;

#[cfg(test)]
mod tests;
