//! Row-major tensors laid out like PyTorch: `[N, d]`, `[H, N, d]` or `[B, H, N, d]`.
//!
//! Batch and heads are independent problems, so every estimator is written for one head
//! (`MatRef`, an `N × d` row-major view) and lifted to `[B, H, N, d]` by [`Tensor::heads`].

#![deny(missing_docs)]

use crate::error::{RaceError, Result};
use std::borrow::Cow;

/// The element types racelab reads, computes in and writes: `f32` (the kernels' own) and
/// `f64` (the references'). Conversions borrow when the type already matches, so an f32
/// input reaches the f32 kernels and an f64 input the reference without a copy.
pub trait Element: Copy + Default + Send + Sync + Into<f64> + std::fmt::Debug + 'static {
    /// The rows as f32: borrowed for f32, rounded for f64.
    fn as_f32(data: &[Self]) -> Cow<'_, [f32]>;
    /// The rows as f64: borrowed for f64, widened (exactly) for f32.
    fn as_f64(data: &[Self]) -> Cow<'_, [f64]>;
    /// f32 results in this type (moved for f32).
    fn from_f32(v: Vec<f32>) -> Vec<Self>;
    /// f64 results in this type (moved for f64, rounded for f32).
    fn from_f64(v: Vec<f64>) -> Vec<Self>;
}

impl Element for f32 {
    fn as_f32(data: &[f32]) -> Cow<'_, [f32]> {
        Cow::Borrowed(data)
    }
    fn as_f64(data: &[f32]) -> Cow<'_, [f64]> {
        Cow::Owned(data.iter().map(|&x| x as f64).collect())
    }
    fn from_f32(v: Vec<f32>) -> Vec<f32> {
        v
    }
    fn from_f64(v: Vec<f64>) -> Vec<f32> {
        v.into_iter().map(|x| x as f32).collect()
    }
}

impl Element for f64 {
    fn as_f32(data: &[f64]) -> Cow<'_, [f32]> {
        Cow::Owned(data.iter().map(|&x| x as f32).collect())
    }
    fn as_f64(data: &[f64]) -> Cow<'_, [f64]> {
        Cow::Borrowed(data)
    }
    fn from_f32(v: Vec<f32>) -> Vec<f64> {
        v.into_iter().map(|x| x as f64).collect()
    }
    fn from_f64(v: Vec<f64>) -> Vec<f64> {
        v
    }
}

/// A borrowed row-major tensor: a shape and the caller's data (a [`Tensor`]'s, a slice, or a
/// standard-layout ndarray view's).
#[derive(Debug, Clone)]
pub struct TensorRef<'a, T> {
    /// The extents, outermost first.
    pub shape: Vec<usize>,
    /// The elements, row-major.
    pub data: &'a [T],
}

impl<'a, T: Copy> TensorRef<'a, T> {
    /// A view of `data` as `shape`, refused (naming `arg`) when the lengths disagree.
    pub fn new(arg: &str, shape: Vec<usize>, data: &'a [T]) -> Result<Self> {
        let n = shape.iter().try_fold(1usize, |a, &x| a.checked_mul(x));
        if n != Some(data.len()) {
            return Err(RaceError::shape(
                arg,
                format!(
                    "shape {shape:?} does not hold the {} elements given",
                    data.len()
                ),
            ));
        }
        Ok(TensorRef { shape, data })
    }

    /// The shape as `[B, H, N, d]`, accepting rank 2, 3 or 4.
    pub fn bhnd(&self, arg: &str) -> Result<[usize; 4]> {
        match self.shape.as_slice() {
            [n, d] => Ok([1, 1, *n, *d]),
            [h, n, d] => Ok([1, *h, *n, *d]),
            [b, h, n, d] => Ok([*b, *h, *n, *d]),
            s => Err(RaceError::shape(
                arg,
                format!(
                    "rank {} shape {:?}; expected [N,d], [H,N,d] or [B,H,N,d]",
                    s.len(),
                    s
                ),
            )),
        }
    }

    /// The independent `N × d` problems (batch × heads), in order.
    pub fn heads(&self, arg: &str) -> Result<Vec<MatRef<'a, T>>> {
        let [b, h, n, d] = self.bhnd(arg)?;
        let data = self.data;
        Ok((0..b * h)
            .map(|i| MatRef::of(n, d, &data[i * n * d..(i + 1) * n * d]))
            .collect())
    }
}

/// An owned row-major tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor<T> {
    /// The extents, outermost first.
    pub shape: Vec<usize>,
    /// The elements, row-major.
    pub data: Vec<T>,
}

/// A borrowed `rows × cols` row-major matrix.
#[derive(Debug, Clone, Copy)]
pub struct MatRef<'a, T> {
    /// Rows.
    pub rows: usize,
    /// Columns (the row length).
    pub cols: usize,
    /// The elements, row-major.
    pub data: &'a [T],
}

/// An owned `rows × cols` row-major matrix.
#[derive(Debug, Clone, PartialEq)]
pub struct Mat<T> {
    /// Rows.
    pub rows: usize,
    /// Columns (the row length).
    pub cols: usize,
    /// The elements, row-major.
    pub data: Vec<T>,
}

impl<'a, T> MatRef<'a, T> {
    /// `data` as `rows × cols`, or an error naming `data` when its length is not
    /// `rows · cols`.
    pub fn new(rows: usize, cols: usize, data: &'a [T]) -> Result<Self> {
        if rows.checked_mul(cols) != Some(data.len()) {
            return Err(RaceError::shape(
                "data",
                format!(
                    "a {rows} × {cols} matrix needs rows·cols values, got {}",
                    data.len()
                ),
            ));
        }
        Ok(MatRef { rows, cols, data })
    }

    /// `data` as one row (`1 × data.len()`).
    pub fn single_row(data: &'a [T]) -> Self {
        MatRef {
            rows: 1,
            cols: data.len(),
            data,
        }
    }

    /// [`MatRef::new`] for the crate's own buffers, whose lengths it made.
    pub(crate) fn of(rows: usize, cols: usize, data: &'a [T]) -> Self {
        debug_assert_eq!(rows * cols, data.len(), "MatRef: rows*cols != len");
        MatRef { rows, cols, data }
    }
    /// Row `i` (`cols` elements).
    #[inline]
    pub fn row(&self, i: usize) -> &'a [T] {
        &self.data[i * self.cols..(i + 1) * self.cols]
    }
}

impl<T: Copy + Default> Mat<T> {
    /// A `rows × cols` matrix of zeros.
    pub fn zeros(rows: usize, cols: usize) -> Self {
        Mat {
            rows,
            cols,
            data: vec![T::default(); rows * cols],
        }
    }
    /// `data` (row-major, `rows · cols` long) as a matrix.
    pub fn from_vec(rows: usize, cols: usize, data: Vec<T>) -> Self {
        assert_eq!(rows * cols, data.len(), "Mat: rows*cols != len");
        Mat { rows, cols, data }
    }
    /// A borrowed view.
    pub fn view(&self) -> MatRef<'_, T> {
        MatRef {
            rows: self.rows,
            cols: self.cols,
            data: &self.data,
        }
    }
    /// Row `i`.
    #[inline]
    pub fn row(&self, i: usize) -> &[T] {
        &self.data[i * self.cols..(i + 1) * self.cols]
    }
    /// Row `i`, writable.
    #[inline]
    pub fn row_mut(&mut self, i: usize) -> &mut [T] {
        &mut self.data[i * self.cols..(i + 1) * self.cols]
    }
    /// Entry `(i, j)`.
    #[inline]
    pub fn at(&self, i: usize, j: usize) -> T {
        self.data[i * self.cols + j]
    }
}

impl<T: Copy> Tensor<T> {
    /// `data` as `shape`, refused when the lengths disagree.
    pub fn new(shape: Vec<usize>, data: Vec<T>) -> Result<Self> {
        let n = shape.iter().try_fold(1usize, |a, &x| a.checked_mul(x));
        if n != Some(data.len()) {
            return Err(RaceError::shape(
                "tensor",
                format!(
                    "shape {shape:?} does not hold the {} elements given",
                    data.len()
                ),
            ));
        }
        Ok(Tensor { shape, data })
    }

    /// A borrowed view of the whole tensor.
    pub fn view(&self) -> TensorRef<'_, T> {
        TensorRef {
            shape: self.shape.clone(),
            data: &self.data,
        }
    }

    /// The shape as `[B, H, N, d]`, accepting rank 2, 3 or 4.
    pub fn bhnd(&self, arg: &str) -> Result<[usize; 4]> {
        self.view().bhnd(arg)
    }

    /// The independent `N × d` problems (batch × heads), in order.
    pub fn heads(&self, arg: &str) -> Result<Vec<MatRef<'_, T>>> {
        self.view().heads(arg)
    }

    /// Each element through `f`, the shape kept.
    pub fn map<U: Copy>(&self, f: impl Fn(T) -> U) -> Tensor<U> {
        Tensor {
            shape: self.shape.clone(),
            data: self.data.iter().map(|&x| f(x)).collect(),
        }
    }
}

impl Tensor<f64> {
    /// Stack per-head outputs back into the leading dims of `like` with last dim `cols`.
    pub fn stack_heads(lead: &[usize], heads: Vec<Mat<f64>>) -> Tensor<f64> {
        let mut shape = lead.to_vec();
        let (rows, cols) = heads.first().map(|m| (m.rows, m.cols)).unwrap_or((0, 0));
        shape.push(rows);
        shape.push(cols);
        let data = heads.into_iter().flat_map(|m| m.data).collect();
        Tensor { shape, data }
    }
}

/// The elements of `a` in row-major order: borrowed when `a` is in standard layout, else
/// copied.
pub fn standard_rows<'a, T: Clone, D: ndarray::Dimension>(
    a: &ndarray::ArrayView<'a, T, D>,
) -> Cow<'a, [T]> {
    match a.clone().to_slice() {
        Some(s) => Cow::Borrowed(s),
        None => Cow::Owned(a.iter().cloned().collect()),
    }
}

/// Check that every entry is finite; the error names `arg` and the first bad index.
///
/// Chunks in parallel, each tested branch-free (an exponent of all ones marks NaN and ±∞;
/// the OR over a chunk vectorises), then the first bad chunk scanned for its index: a pass
/// at memory speed, not one compare and branch per entry.
pub fn check_finite<T: Copy + Into<f64> + Sync>(arg: &str, data: &[T]) -> Result<()> {
    check_finite_max(arg, data).map(|_| ())
}

/// [`check_finite`], returning the largest magnitude of `data` (0 when empty) from the same
/// pass: per entry the exponent test and a plain `>` maximum over 8 lanes (a NaN, caught by
/// the test, never wins a `>`), which the compiler keeps in vector registers.
pub fn check_finite_max<T: Copy + Into<f64> + Sync>(arg: &str, data: &[T]) -> Result<f64> {
    use rayon::prelude::*;
    const CHUNK: usize = 1 << 16;
    let bad = |x: T| {
        let e = (Into::<f64>::into(x).to_bits() >> 52) & 0x7ff;
        e == 0x7ff
    };
    let scan = |c: &[T]| -> (bool, f64) {
        let (mut any, mut top) = (false, [0.0f64; 8]);
        let mut lanes = c.chunks_exact(8);
        for l in &mut lanes {
            for (t, &x) in top.iter_mut().zip(l) {
                let v: f64 = x.into();
                any |= bad(x);
                let a = v.abs();
                *t = if a > *t { a } else { *t };
            }
        }
        for (t, &x) in top.iter_mut().zip(lanes.remainder()) {
            any |= bad(x);
            let a = Into::<f64>::into(x).abs();
            *t = if a > *t { a } else { *t };
        }
        (any, top.iter().fold(0.0, |m, &t| if t > m { t } else { m }))
    };
    let (any, top) = data.par_chunks(CHUNK).map(scan).reduce(
        || (false, 0.0),
        |a, b| (a.0 | b.0, if b.1 > a.1 { b.1 } else { a.1 }),
    );
    if !any {
        return Ok(top);
    }
    let (i, x) = data
        .iter()
        .enumerate()
        .find(|&(_, &x)| bad(x))
        .map(|(i, &x)| (i, x.into()))
        .expect("an entry is not finite");
    Err(RaceError::NonFinite {
        arg: arg.into(),
        index: i,
        value: x,
    })
}

/// Check that no row of `m` is the zero vector (needed wherever an angle is taken).
pub fn check_nonzero_rows<T: Copy + Into<f64>>(arg: &str, m: MatRef<'_, T>) -> Result<()> {
    for i in 0..m.rows {
        if m.row(i).iter().all(|&x| x.into() == 0.0) {
            return Err(RaceError::ZeroVector {
                arg: arg.into(),
                row: i,
            });
        }
    }
    Ok(())
}

/// Validated shapes of one attention problem: Q `[.., N, d]`, K `[.., M, d]`, V `[.., M, dv]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnShape {
    /// `B`, the batch.
    pub batch: usize,
    /// `H`, heads per batch entry.
    pub heads: usize,
    /// `N`, queries per head.
    pub n: usize,
    /// `M`, keys (and values) per head.
    pub m: usize,
    /// `d`, the query and key width.
    pub d: usize,
    /// `dv`, the value width.
    pub dv: usize,
}

/// Check Q, K, V shapes against each other, emptiness and finiteness.
pub fn check_qkv<T: Copy + Into<f64> + Sync>(
    q: &TensorRef<'_, T>,
    k: &TensorRef<'_, T>,
    v: &TensorRef<'_, T>,
    causal: bool,
) -> Result<AttnShape> {
    let shape = qkv_shape(q, k, v, causal)?;
    check_finite("q", q.data)?;
    check_finite("k", k.data)?;
    check_finite("v", v.data)?;
    Ok(shape)
}

/// [`check_qkv`] without the finiteness scan: shapes and emptiness.
pub fn qkv_shape<T: Copy + Into<f64> + Sync>(
    q: &TensorRef<'_, T>,
    k: &TensorRef<'_, T>,
    v: &TensorRef<'_, T>,
    causal: bool,
) -> Result<AttnShape> {
    let [qb, qh, n, d] = q.bhnd("q")?;
    let [kb, kh, m, kd] = k.bhnd("k")?;
    let [vb, vh, vm, dv] = v.bhnd("v")?;
    if q.shape.len() != k.shape.len() || q.shape.len() != v.shape.len() {
        return Err(RaceError::shape(
            "q/k/v",
            format!("ranks differ: q {:?}, k {:?}, v {:?}; give all three as [N,d], [H,N,d] or [B,H,N,d]", q.shape, k.shape, v.shape),
        ));
    }
    if (qb, qh) != (kb, kh) || (qb, qh) != (vb, vh) {
        return Err(RaceError::shape(
            "q/k/v",
            format!(
                "batch/head dims differ: q {:?}, k {:?}, v {:?}",
                q.shape, k.shape, v.shape
            ),
        ));
    }
    if n == 0 || m == 0 {
        return Err(RaceError::empty(
            if n == 0 { "q" } else { "k" },
            "N = 0 tokens; give at least one row",
        ));
    }
    if d == 0 || dv == 0 {
        return Err(RaceError::empty(
            if d == 0 { "q" } else { "v" },
            "feature dimension is 0",
        ));
    }
    if qb * qh == 0 {
        return Err(RaceError::empty("q", "batch or head dimension is 0"));
    }
    if kd != d {
        return Err(RaceError::shape(
            "k",
            format!("k has d = {kd} but q has d = {d}; q and k must share the last dimension"),
        ));
    }
    if vm != m {
        return Err(RaceError::shape(
            "v",
            format!("v has {vm} rows but k has {m}; v needs one row per key"),
        ));
    }
    if causal && n != m {
        return Err(RaceError::shape(
            "q/k",
            format!("causal attention needs as many queries as keys (q has {n}, k has {m})"),
        ));
    }
    Ok(AttnShape {
        batch: qb,
        heads: qh,
        n,
        m,
        d,
        dv,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn first_bad(data: &[f32]) -> Option<(usize, f64)> {
        match check_finite("x", data) {
            Ok(()) => None,
            Err(RaceError::NonFinite { index, value, .. }) => Some((index, value)),
            Err(e) => panic!("unexpected error {e}"),
        }
    }

    #[test]
    fn check_finite_reports_the_first_bad_entry_across_chunks() {
        let mut x = vec![1.5f32; 300_000];
        x[7] = -0.0;
        x[65_535] = f32::MAX;
        x[65_537] = f32::MIN_POSITIVE / 2.0; // subnormal: finite
        assert_eq!(first_bad(&x), None);
        // The same pass returns the largest magnitude, of either sign.
        assert_eq!(check_finite_max("x", &x).unwrap(), f32::MAX as f64);
        assert_eq!(check_finite_max("x", &[-3.0f64, 2.0, -0.0]).unwrap(), 3.0);
        assert_eq!(check_finite_max::<f32>("x", &[]).unwrap(), 0.0);
        x[250_000] = f32::NAN;
        x[131_073] = f32::NEG_INFINITY;
        assert_eq!(first_bad(&x), Some((131_073, f64::NEG_INFINITY)));
        x[3] = f32::INFINITY;
        assert_eq!(first_bad(&x), Some((3, f64::INFINITY)));
        let (i, v) = first_bad(&[0.0f32, f32::NAN]).unwrap();
        assert!(i == 1 && v.is_nan());
        assert_eq!(check_finite::<f64>("x", &[]).ok(), Some(()));
    }
}
