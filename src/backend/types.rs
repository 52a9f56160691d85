//! The types every backend shares: inputs as `[heads, n, cols]` f32 rows ([`Heads`]), planes
//! rounded to f32 ([`PlanesF32`]), the gradients of a scalar loss ([`SoftGrads`]) and the rows
//! a forward recomputed exactly ([`Recomputed`]).

use crate::hashing::Planes;

/// Rows an f32 backend flagged (denominator below its floor) and recomputed exactly after a
/// forward (flat indices `head·n + i`; see [`crate::cpu::recompute`]), and the seconds it took.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Recomputed {
    pub rows: Vec<usize>,
    pub seconds: f64,
}

/// `[heads, n, cols]` row-major f32 input.
#[derive(Debug, Clone, Copy)]
pub struct Heads<'a> {
    pub heads: usize,
    pub n: usize,
    pub cols: usize,
    pub data: &'a [f32],
}

impl<'a> Heads<'a> {
    pub fn new(heads: usize, n: usize, cols: usize, data: &'a [f32]) -> Self {
        assert_eq!(data.len(), heads * n * cols, "Heads: len != heads*n*cols");
        Heads {
            heads,
            n,
            cols,
            data,
        }
    }
    #[inline(always)]
    pub fn row(&self, h: usize, i: usize) -> &'a [f32] {
        let o = (h * self.n + i) * self.cols;
        &self.data[o..o + self.cols]
    }
}

/// Planes rounded to f32, `[L, P, d]`.
#[derive(Debug, Clone)]
pub struct PlanesF32 {
    pub l: usize,
    pub p: usize,
    pub d: usize,
    pub w: Vec<f32>,
}

impl PlanesF32 {
    pub fn from_planes(p: &Planes) -> Self {
        PlanesF32 {
            l: p.l,
            p: p.p,
            d: p.d,
            w: p.w.iter().map(|&x| x as f32).collect(),
        }
    }
    /// The f64 planes holding exactly these f32 values (for references on the same planes).
    pub fn to_planes(&self) -> Planes {
        Planes {
            l: self.l,
            p: self.p,
            d: self.d,
            w: self.w.iter().map(|&x| x as f64).collect(),
        }
    }
    #[inline(always)]
    pub fn row(&self, l: usize, p: usize) -> &[f32] {
        let o = (l * self.p + p) * self.d;
        &self.w[o..o + self.d]
    }
    pub fn r(&self) -> usize {
        1 << self.p
    }
}

/// Gradients of a scalar loss with respect to the soft-RACE inputs.
#[derive(Debug, Clone)]
pub struct SoftGrads {
    pub dq: Vec<f32>,
    pub dk: Vec<f32>,
    pub dv: Vec<f32>,
    pub dbeta: f64,
}

impl SoftGrads {
    /// Zeroed gradient buffers shaped like `q`, `k`, `v`.
    pub fn zeros(q: Heads, k: Heads, v: Heads) -> Self {
        SoftGrads {
            dq: vec![0.0; q.data.len()],
            dk: vec![0.0; k.data.len()],
            dv: vec![0.0; v.data.len()],
            dbeta: 0.0,
        }
    }
}

/// What a forward reads: the queries, keys and values (`[heads, n, cols]` each).
#[derive(Debug, Clone, Copy)]
pub struct ForwardInputs<'a> {
    pub q: Heads<'a>,
    pub k: Heads<'a>,
    pub v: Heads<'a>,
}

impl<'a> ForwardInputs<'a> {
    pub fn new(q: Heads<'a>, k: Heads<'a>, v: Heads<'a>) -> Self {
        ForwardInputs { q, k, v }
    }
}

/// What a backward reads: the inputs `q`, `k`, `v`, the forward's output `o` and the upstream
/// gradient `g = ∂ℓ/∂Ô` (`[heads, n, dv]`).
#[derive(Debug, Clone, Copy)]
pub struct BackwardInputs<'a> {
    pub q: Heads<'a>,
    pub k: Heads<'a>,
    pub v: Heads<'a>,
    pub o: Heads<'a>,
    pub g: Heads<'a>,
}

impl<'a> BackwardInputs<'a> {
    pub fn new(q: Heads<'a>, k: Heads<'a>, v: Heads<'a>, o: Heads<'a>, g: Heads<'a>) -> Self {
        BackwardInputs { q, k, v, o, g }
    }
    /// The forward's part of these inputs.
    pub fn forward(&self) -> ForwardInputs<'a> {
        ForwardInputs::new(self.q, self.k, self.v)
    }
}

/// The gradient buffers a backward writes, shaped like `q`, `k`, `v` (overwritten).
#[derive(Debug)]
pub struct GradsMut<'a> {
    pub dq: &'a mut [f32],
    pub dk: &'a mut [f32],
    pub dv: &'a mut [f32],
}

impl GradsMut<'_> {
    /// The same buffers, borrowed again (to hand to one pass and keep for the next).
    pub fn reborrow(&mut self) -> GradsMut<'_> {
        GradsMut {
            dq: &mut *self.dq,
            dk: &mut *self.dk,
            dv: &mut *self.dv,
        }
    }
}

impl SoftGrads {
    /// These gradients' buffers, to be written by a backward.
    pub fn as_mut(&mut self) -> GradsMut<'_> {
        GradsMut {
            dq: &mut self.dq,
            dk: &mut self.dk,
            dv: &mut self.dv,
        }
    }
}
