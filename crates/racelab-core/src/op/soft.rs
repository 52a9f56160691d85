//! Soft RACE as one operator object: forward, forward for training, backward, the
//! into-buffer forward and the decoder, on the same planes and device.
//!
//! `φ_l(x)_r = Π_p a_p^{b_{r,p}} (1 − a_p)^{1 − b_{r,p}}`, `a_p = σ(2β·tanh(w_{l,p}ᵀx))`;
//! `Ô_i = Σ_l φ_l(q_i)ᵀ B_l / Σ_l φ_l(q_i)ᵀ A_l` with `A_l = Σ_j φ_l(k_j)`,
//! `B_l = Σ_j φ_l(k_j) v_jᵀ` (causal: prefix sums over `j ≤ i`).
//!
//! The planes are drawn in f64 from the seed and rounded once to f32: every device (the f32
//! kernels and the f64 reference) hashes with these same values.

use super::{operator_common, Beta, Bits, Causal, Device, Planes, Seed, Tables};
use crate::backend::arrays::{rows, shaped, with_cols, Rows};
use crate::backend::{Backend, Decode, GradsMut, PlanesF32, Problem, RaceParams, Saved};
use crate::error::{RaceError, Result};
use crate::method::{Method, PlaneSpec};
use crate::params::Combine;
use crate::tensor::Element;
use crate::validate::{Budget, Held};
use ndarray::{Array, ArrayView, ArrayViewMut, Dimension};
use std::sync::Arc;

/// Soft RACE (Algorithm 1; causal, Algorithm 2) at `P` bits, `L` tables and inverse
/// temperature `β` on fixed planes `[L, P, d]`, on one device.
#[derive(Debug, Clone)]
pub struct SoftRace {
    params: RaceParams,
    pub(super) planes: Arc<PlanesF32>,
    method: Method,
    device: Device,
}

impl SoftRace {
    /// Soft RACE on planes `[L, P, d]` drawn from `seed` (i.i.d. N(0, 1), then rounded to
    /// f32) for inputs of dimension `d`, on the CPU kernels. Refused, naming the argument, for
    /// `P` outside 1..=20, `L = 0`, `β` not finite and > 0, `d = 0`, or planes too large for
    /// memory.
    pub fn new(bits: Bits, tables: Tables, beta: Beta, seed: Seed, d: usize) -> Result<Self> {
        let params = RaceParams::new(bits, tables, beta)?;
        let drawn = Planes::gaussian(bits, tables, d, seed)?;
        Ok(Self::build(params, PlanesF32::from_planes(&drawn)))
    }

    /// Soft RACE on given planes (their `L`, `P` and `d` hold; rounded to f32) at `beta`, on
    /// the CPU kernels.
    pub fn with_planes(planes: &Planes, beta: Beta) -> Result<Self> {
        planes.check(planes.d, planes.p, planes.l)?;
        let params = RaceParams::new(Bits(planes.p), Tables(planes.l), beta)?;
        Ok(Self::build(params, PlanesF32::from_planes(planes)))
    }

    fn build(params: RaceParams, planes: PlanesF32) -> Self {
        let method = Method::Soft {
            planes: PlaneSpec::Given(planes.to_planes()),
            beta: params.beta,
            combine: Combine::Paper,
        };
        SoftRace {
            params,
            planes: Arc::new(planes),
            method,
            device: Device::Cpu,
        }
    }

    operator_common!();

    /// `P`.
    pub fn bits(&self) -> Bits {
        Bits(self.params.p)
    }
    /// `L`.
    pub fn tables(&self) -> Tables {
        Tables(self.params.l)
    }
    /// `β`.
    pub fn beta(&self) -> Beta {
        Beta(self.params.beta)
    }
    /// The planes every device hashes with (f64 values holding the f32 ones exactly).
    pub fn planes(&self) -> &Planes {
        match &self.method {
            Method::Soft {
                planes: PlaneSpec::Given(p),
                ..
            } => p,
            _ => unreachable!("SoftRace::build makes a soft method on given planes"),
        }
    }

    pub(super) fn params(&self, causal: Causal) -> RaceParams {
        RaceParams {
            causal: causal.is_causal(),
            ..self.params
        }
    }

    fn backend(&self) -> Result<Box<dyn Backend>> {
        crate::attend::for_device(self.device)
    }

    /// `Ô` and what its backward needs ([`SoftRace::backward`]). f32 views in standard layout
    /// are held where they lie (borrowed for `'a`); others are copied once as f32.
    pub fn forward_train<'a, T: Element, D: Dimension>(
        &self,
        q: ArrayView<'a, T, D>,
        k: ArrayView<'a, T, D>,
        v: ArrayView<'a, T, D>,
        causal: Causal,
    ) -> Result<(Array<T, D>, Trained<'a, D>)> {
        let (qr, kr, vr) = (rows("q", &q)?, rows("k", &k)?, rows("v", &v)?);
        let params = self.params(causal);
        let pb = Problem::new(&params, &self.planes, qr.heads(), kr.heads(), vr.heads())?;
        let mut o = vec![0.0f32; pb.output_len()];
        let saved = self
            .backend()?
            .forward_into(&pb, &mut o, Saved::default())?;
        let out = shaped(q.shape(), vr.dims[2], o.clone())?;
        let shapes = [q.shape().to_vec(), k.shape().to_vec(), v.shape().to_vec()];
        Ok((
            out,
            Trained {
                params,
                planes: Arc::clone(&self.planes),
                device: self.device,
                x: [qr, kr, vr],
                shapes,
                o,
                saved,
                _rank: std::marker::PhantomData,
            },
        ))
    }

    /// The gradients of a loss `ℓ` with `∂ℓ/∂Ô = go` (shaped like the forward's output) for
    /// the forward that returned `trained`: `∂ℓ/∂q`, `∂ℓ/∂k`, `∂ℓ/∂v` shaped like the inputs,
    /// and `∂ℓ/∂β`. Refused when `trained` came from another operator or device.
    pub fn backward<T: Element, D: Dimension>(
        &self,
        trained: &Trained<'_, D>,
        go: ArrayView<'_, T, D>,
    ) -> Result<Grads<T, D>> {
        let same = Arc::ptr_eq(&self.planes, &trained.planes)
            && self.params.beta == trained.params.beta
            && self.device == trained.device;
        if !same {
            return Err(RaceError::param(
                "trained",
                "this forward was made by another operator or on another device; pass the \
                 value this operator's forward_train returned",
            ));
        }
        let want = with_cols(&trained.shapes[0], trained.x[2].dims[2]);
        if go.shape() != want.as_slice() {
            return Err(RaceError::shape(
                "go",
                format!(
                    "go has shape {:?} but the forward's output has {want:?}; pass ∂ℓ/∂Ô shaped \
                     like the output",
                    go.shape()
                ),
            ));
        }
        let g = rows("go", &go)?;
        let [q, k, v] = &trained.x;
        let pb = Problem::within(
            &trained.params,
            &trained.planes,
            [q.heads(), k.heads(), v.heads()],
            Some(g.heads()),
            Budget::holding(Held::Forward),
        )?;
        let [mut dq, mut dk, mut dv] = [q, k, v].map(|x| vec![0.0f32; x.data.len()]);
        let dbeta = self.backend()?.backward_into(
            &pb,
            &trained.saved,
            &trained.o,
            GradsMut {
                dq: &mut dq,
                dk: &mut dk,
                dv: &mut dv,
            },
        )?;
        let [sq, sk, sv] = &trained.shapes;
        Ok(Grads {
            dq: shaped(sq, q.dims[2], dq)?,
            dk: shaped(sk, k.dims[2], dk)?,
            dv: shaped(sv, v.dims[2], dv)?,
            dbeta,
        })
    }

    /// `Ô` written into `o` (f32, standard layout, shaped like the output), reusing the
    /// buffers `ws` kept from an earlier call: the forward of a training or serving loop with
    /// no fresh allocation per step. The kernel's output as it is: unlike
    /// [`SoftRace::forward`], values whose magnitudes all lie below 2^-64 are not rescaled
    /// first, and keep fewer digits in f32.
    pub fn forward_into<D: Dimension>(
        &self,
        q: ArrayView<'_, f32, D>,
        k: ArrayView<'_, f32, D>,
        v: ArrayView<'_, f32, D>,
        causal: Causal,
        mut o: ArrayViewMut<'_, f32, D>,
        ws: &mut Workspace,
    ) -> Result<()> {
        let (qr, kr, vr) = (rows("q", &q)?, rows("k", &k)?, rows("v", &v)?);
        let want = with_cols(q.shape(), vr.dims[2]);
        if o.shape() != want.as_slice() {
            return Err(RaceError::shape(
                "o",
                format!(
                    "o has shape {:?} but the output is {want:?}; allocate o with that shape",
                    o.shape()
                ),
            ));
        }
        let Some(out) = o.as_slice_mut() else {
            return Err(RaceError::shape(
                "o",
                "o is not in standard (row-major, contiguous) layout; pass a standard-layout \
                 array's view_mut()",
            ));
        };
        let params = self.params(causal);
        let pb = Problem::new(&params, &self.planes, qr.heads(), kr.heads(), vr.heads())?;
        let reuse = std::mem::take(&mut ws.saved);
        ws.saved = self.backend()?.forward_into(&pb, out, reuse)?;
        Ok(())
    }

    /// A recurrent decoder (Algorithm 2 one token at a time) with empty state, for values of
    /// width `dv`; refused when its `L·2^P × (dv + 1)` state cannot fit in memory.
    pub fn decoder(&self, dv: usize) -> Result<Box<dyn Decode>> {
        let params = self.params(Causal::Yes);
        self.backend()?.decoder(&params, &self.planes, dv)
    }
}

/// What a [`SoftRace::forward_train`] keeps for its backward: the inputs (borrowed when they
/// were f32 in standard layout), the output, and the backend's saved state.
pub struct Trained<'a, D: Dimension> {
    params: RaceParams,
    planes: Arc<PlanesF32>,
    device: Device,
    x: [Rows<'a>; 3],
    shapes: [Vec<usize>; 3],
    o: Vec<f32>,
    saved: Saved,
    _rank: std::marker::PhantomData<D>,
}

impl<D: Dimension> Trained<'_, D> {
    /// Rows with no key (left 0 in the output).
    pub fn empty_rows(&self) -> usize {
        self.saved.empty_rows
    }
    /// Rows an f32 backend flagged (denominator below its floor) and recomputed exactly.
    pub fn recomputed_rows(&self) -> &[usize] {
        &self.saved.recomputed.rows
    }
}

/// The gradients of a backward, shaped like `q`, `k`, `v`, and `∂ℓ/∂β` (the backend
/// contract's on arrays).
pub type Grads<T, D> = crate::backend::ArrayGrads<T, D>;

/// Buffers [`SoftRace::forward_into`] keeps between calls (empty at first).
#[derive(Default)]
pub struct Workspace {
    saved: Saved,
}

impl Workspace {
    /// An empty workspace.
    pub fn new() -> Self {
        Self::default()
    }
}
