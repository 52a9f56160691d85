//! The backend contract on ndarray views: [`BackendArrays`], implemented for every
//! [`Backend`] (the reference, the CPU and CUDA kernels, `Distributed`).
//!
//! `q`, `k`, `v` (and `g`) are `ArrayView2` `[n, cols]`, `ArrayView3` `[heads, n, cols]` or
//! `ArrayView4` `[batch, heads, n, cols]`, f32 or f64, in any layout. A view in standard (row-major,
//! contiguous) layout is read where it lies; any other layout (permuted axes, steps) is copied
//! once into row-major order, and [`ArrayForward::copied`] says which were. f32 views reach the
//! f32 kernels with no copy; f64 views are rounded to f32 for them (the reference widens f32
//! back exactly). Outputs come back as arrays of the inputs' rank and element type.

use super::{Backend, Heads, PlanesF32, RaceParams, Recomputed};
use crate::error::{RaceError, Result};
use crate::tensor::{standard_rows, Element};
use ndarray::{Array, ArrayView, Dimension, IxDyn};
use std::borrow::Cow;

/// A forward on arrays: `Ô` (`[.., n, dv]`, the inputs' rank and type) and what the call did.
#[derive(Debug, Clone)]
pub struct ArrayForward<T, D: Dimension> {
    /// `Ô`, `[.., n, dv]`.
    pub o: Array<T, D>,
    /// Rows with no key (0 in `o`).
    pub empty_rows: usize,
    /// Rows an f32 backend flagged and recomputed exactly.
    pub recomputed: Recomputed,
    /// Which of `q`, `k`, `v` were copied into row-major order (not in standard layout).
    pub copied: [bool; 3],
}

/// The gradients of a forward+backward on arrays, shaped like `q`, `k`, `v`.
#[derive(Debug, Clone)]
pub struct ArrayGrads<T, D: Dimension> {
    /// `∂ℓ/∂q`, shaped like `q`.
    pub dq: Array<T, D>,
    /// `∂ℓ/∂k`, shaped like `k`.
    pub dk: Array<T, D>,
    /// `∂ℓ/∂v`, shaped like `v`.
    pub dv: Array<T, D>,
    /// `∂ℓ/∂β`.
    pub dbeta: f64,
}

/// One input as f32 rows `[heads, n, cols]` (heads: the product of the leading axes), and
/// whether its layout made a copy.
pub(crate) struct Rows<'a> {
    pub(crate) data: Cow<'a, [f32]>,
    pub(crate) dims: [usize; 3],
    pub(crate) copied: bool,
}

impl Rows<'_> {
    pub(crate) fn heads(&self) -> Heads<'_> {
        let [h, n, c] = self.dims;
        Heads::of(h, n, c, &self.data)
    }
}

pub(crate) fn rows<'a, T: Element, D: Dimension>(
    name: &str,
    a: &ArrayView<'a, T, D>,
) -> Result<Rows<'a>> {
    let shape = a.shape();
    if !(2..=4).contains(&shape.len()) {
        return Err(RaceError::shape(
            name,
            format!(
                "{name} has shape {shape:?}; give [n, cols], [heads, n, cols] or [batch, heads, n, cols]"
            ),
        ));
    }
    let r = shape.len();
    let dims = [shape[..r - 2].iter().product(), shape[r - 2], shape[r - 1]];
    let laid = standard_rows(a);
    let copied = matches!(laid, Cow::Owned(_));
    let data = match laid {
        Cow::Borrowed(s) => T::as_f32(s),
        Cow::Owned(v) => Cow::Owned(T::as_f32(&v).into_owned()),
    };
    Ok(Rows { data, dims, copied })
}

/// `like`'s leading axes with `cols` columns (an output's shape from its input's).
pub(crate) fn with_cols(like: &[usize], cols: usize) -> Vec<usize> {
    let mut shape = like.to_vec();
    if let Some(last) = shape.last_mut() {
        *last = cols;
    }
    shape
}

/// `data` as an array of `like`'s leading axes and `cols` columns.
pub(crate) fn shaped<T: Element, D: Dimension>(
    like: &[usize],
    cols: usize,
    data: Vec<f32>,
) -> Result<Array<T, D>> {
    Array::from_shape_vec(IxDyn(&with_cols(like, cols)), T::from_f32(data))
        .and_then(|a| a.into_dimensionality::<D>())
        .map_err(|e| RaceError::shape("o", e.to_string()))
}

/// The soft-RACE contract on ndarray views (module docs), for every backend.
pub trait BackendArrays: Backend {
    /// [`Backend::forward`] on views `[.., n, d]`, `[.., n, d]`, `[.., n, dv]`.
    fn forward_array<T: Element, D: Dimension>(
        &self,
        params: &RaceParams,
        planes: &PlanesF32,
        q: ArrayView<'_, T, D>,
        k: ArrayView<'_, T, D>,
        v: ArrayView<'_, T, D>,
    ) -> Result<ArrayForward<T, D>> {
        let (qr, kr, vr) = (rows("q", &q)?, rows("k", &k)?, rows("v", &v)?);
        let f = self.forward(params, planes, qr.heads(), kr.heads(), vr.heads())?;
        Ok(ArrayForward {
            o: shaped(q.shape(), vr.dims[2], f.o)?,
            empty_rows: f.empty_rows,
            recomputed: f.recomputed,
            copied: [qr.copied, kr.copied, vr.copied],
        })
    }

    /// [`Backend::forward_backward`] on views, with the upstream gradient `g` shaped like
    /// the output.
    fn forward_backward_array<T: Element, D: Dimension>(
        &self,
        params: &RaceParams,
        planes: &PlanesF32,
        [q, k, v]: [ArrayView<'_, T, D>; 3],
        g: ArrayView<'_, T, D>,
    ) -> Result<(ArrayForward<T, D>, ArrayGrads<T, D>)> {
        let (qr, kr, vr, gr) = (
            rows("q", &q)?,
            rows("k", &k)?,
            rows("v", &v)?,
            rows("g", &g)?,
        );
        let (f, grads) = self.forward_backward(
            params,
            planes,
            qr.heads(),
            kr.heads(),
            vr.heads(),
            gr.heads(),
        )?;
        let fwd = ArrayForward {
            o: shaped(q.shape(), vr.dims[2], f.o)?,
            empty_rows: f.empty_rows,
            recomputed: f.recomputed,
            copied: [qr.copied, kr.copied, vr.copied],
        };
        let grads = ArrayGrads {
            dq: shaped(q.shape(), qr.dims[2], grads.dq)?,
            dk: shaped(k.shape(), kr.dims[2], grads.dk)?,
            dv: shaped(v.shape(), vr.dims[2], grads.dv)?,
            dbeta: grads.dbeta,
        };
        Ok((fwd, grads))
    }
}

impl<B: Backend + ?Sized> BackendArrays for B {}
