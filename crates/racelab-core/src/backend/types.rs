//! The types every backend shares: inputs as `[heads, n, cols]` f32 rows ([`Heads`]), planes
//! rounded to f32 ([`PlanesF32`]), the gradients of a scalar loss ([`SoftGrads`]) and the rows
//! a forward recomputed exactly ([`Recomputed`]), a validated problem ([`Problem`]) and what
//! a forward keeps for its backward ([`Saved`]).

use crate::error::{RaceError, Result};
use crate::hashing::Planes;
use crate::params::RaceParams;
use crate::validate::{Budget, Held};

/// Rows an f32 backend flagged (denominator below its floor) and recomputed exactly after a
/// forward (flat indices `head·n + i`; see [`crate::shared::recompute`]), and the seconds it took.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Recomputed {
    /// The recomputed rows (flat indices `head·n + i`).
    pub rows: Vec<usize>,
    /// Seconds the recompute took.
    pub seconds: f64,
}

/// `[heads, n, cols]` row-major f32 input.
#[derive(Debug, Clone, Copy)]
pub struct Heads<'a> {
    pub(crate) heads: usize,
    pub(crate) n: usize,
    pub(crate) cols: usize,
    pub(crate) data: &'a [f32],
}

impl<'a> Heads<'a> {
    /// `data` as `[heads, n, cols]`, or an error naming `data` when its length is not
    /// `heads · n · cols`.
    pub fn new(heads: usize, n: usize, cols: usize, data: &'a [f32]) -> Result<Self> {
        let want = heads.checked_mul(n).and_then(|x| x.checked_mul(cols));
        if want != Some(data.len()) {
            return Err(RaceError::shape(
                "data",
                format!(
                    "[heads, n, cols] = [{heads}, {n}, {cols}] needs heads·n·cols floats, got {}",
                    data.len()
                ),
            ));
        }
        Ok(Heads {
            heads,
            n,
            cols,
            data,
        })
    }

    /// No rows: `[0, 0, 0]` (a stand-in for a slice that has none, e.g. a rank whose own
    /// inputs were refused while the others agree on theirs).
    pub fn empty() -> Heads<'static> {
        Heads {
            heads: 0,
            n: 0,
            cols: 0,
            data: &[],
        }
    }

    /// The heads (the product of the leading axes).
    pub fn heads(&self) -> usize {
        self.heads
    }
    /// Rows per head.
    pub fn n(&self) -> usize {
        self.n
    }
    /// Columns per row.
    pub fn cols(&self) -> usize {
        self.cols
    }
    /// The `heads · n · cols` values, row-major.
    pub fn data(&self) -> &'a [f32] {
        self.data
    }

    /// [`Heads::new`] for the crate's own buffers, whose lengths it made.
    pub(crate) fn of(heads: usize, n: usize, cols: usize, data: &'a [f32]) -> Self {
        debug_assert_eq!(data.len(), heads * n * cols, "Heads: len != heads*n*cols");
        Heads {
            heads,
            n,
            cols,
            data,
        }
    }
    /// Row `i` of head `h` (`cols` values).
    #[inline(always)]
    pub fn row(&self, h: usize, i: usize) -> &'a [f32] {
        let o = (h * self.n + i) * self.cols;
        &self.data[o..o + self.cols]
    }
}

/// Planes rounded to f32, `[L, P, d]`.
#[derive(Debug, Clone)]
pub struct PlanesF32 {
    pub(crate) l: usize,
    pub(crate) p: usize,
    pub(crate) d: usize,
    pub(crate) w: Vec<f32>,
}

impl PlanesF32 {
    /// No planes (`L = P = d = 0`): a stand-in that every check and every soft map refuses
    /// (a rank whose planes could not be read still takes part in the agreement).
    pub fn none() -> Self {
        PlanesF32 {
            l: 0,
            p: 0,
            d: 0,
            w: Vec::new(),
        }
    }

    /// The planes rounded to f32 (to nearest).
    pub fn from_planes(p: &Planes) -> Self {
        PlanesF32 {
            l: p.l,
            p: p.p,
            d: p.d,
            w: p.w.iter().map(|&x| x as f32).collect(),
        }
    }
    crate::hashing::plane_shape!(f32);
    /// The f64 planes holding exactly these f32 values (for references on the same planes).
    pub fn to_planes(&self) -> Planes {
        Planes {
            l: self.l,
            p: self.p,
            d: self.d,
            w: self.w.iter().map(|&x| x as f64).collect(),
        }
    }
    /// Plane `p` of table `l` (`d` values).
    #[inline(always)]
    pub fn row(&self, l: usize, p: usize) -> &[f32] {
        let o = (l * self.p + p) * self.d;
        &self.w[o..o + self.d]
    }
    /// `R = 2^P` buckets per table.
    pub fn r(&self) -> usize {
        1 << self.p
    }
}

/// Gradients of a scalar loss with respect to the soft-RACE inputs.
#[derive(Debug, Clone)]
pub struct SoftGrads {
    /// `∂ℓ/∂q`, shaped like `q`.
    pub dq: Vec<f32>,
    /// `∂ℓ/∂k`, shaped like `k`.
    pub dk: Vec<f32>,
    /// `∂ℓ/∂v`, shaped like `v`.
    pub dv: Vec<f32>,
    /// `∂ℓ/∂β`.
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
    /// Queries `[heads, n, d]`.
    pub q: Heads<'a>,
    /// Keys `[heads, m, d]`.
    pub k: Heads<'a>,
    /// Values `[heads, m, dv]`.
    pub v: Heads<'a>,
}

impl<'a> ForwardInputs<'a> {
    /// The three inputs.
    pub fn new(q: Heads<'a>, k: Heads<'a>, v: Heads<'a>) -> Self {
        ForwardInputs { q, k, v }
    }
}

/// What a backward reads: the inputs `q`, `k`, `v`, the forward's output `o` and the upstream
/// gradient `g = ∂ℓ/∂Ô` (`[heads, n, dv]`).
#[derive(Debug, Clone, Copy)]
pub struct BackwardInputs<'a> {
    /// Queries `[heads, n, d]`.
    pub q: Heads<'a>,
    /// Keys `[heads, m, d]`.
    pub k: Heads<'a>,
    /// Values `[heads, m, dv]`.
    pub v: Heads<'a>,
    /// The forward's output `Ô` `[heads, n, dv]`.
    pub o: Heads<'a>,
    /// The upstream gradient `∂ℓ/∂Ô` `[heads, n, dv]`.
    pub g: Heads<'a>,
}

impl<'a> BackwardInputs<'a> {
    /// The five inputs.
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
    /// `∂ℓ/∂q`, shaped like `q`.
    pub dq: &'a mut [f32],
    /// `∂ℓ/∂k`, shaped like `k`.
    pub dk: &'a mut [f32],
    /// `∂ℓ/∂v`, shaped like `v`.
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

/// A soft-RACE problem that passed the one validation ([`crate::backend::check`]): the
/// parameters, the planes, `q`, `k`, `v` and, for a backward, the upstream gradient `g`.
/// Only [`Problem::new`] and [`Problem::with_grad`] make one, so the into-buffer forms of the
/// contract ([`crate::backend::Backend::forward_into`], `backward_into`) never see unchecked
/// input, and a caller that runs the same problem many times (a benchmark, a training step's
/// forward and backward) validates it once.
#[derive(Debug, Clone, Copy)]
pub struct Problem<'a> {
    params: RaceParams,
    planes: &'a PlanesF32,
    x: ForwardInputs<'a>,
    g: Option<Heads<'a>>,
}

impl<'a> Problem<'a> {
    /// A forward's problem, validated (memory counted for the forward, the inputs held).
    pub fn new(
        params: &RaceParams,
        planes: &'a PlanesF32,
        q: Heads<'a>,
        k: Heads<'a>,
        v: Heads<'a>,
    ) -> Result<Self> {
        Self::within(
            params,
            planes,
            [q, k, v],
            None,
            Budget::holding(Held::Inputs),
        )
    }

    /// A forward and backward's problem with upstream gradient `g` (`[heads, n, dv]`),
    /// validated (memory counted for both passes, the inputs held).
    pub fn with_grad(
        params: &RaceParams,
        planes: &'a PlanesF32,
        q: Heads<'a>,
        k: Heads<'a>,
        v: Heads<'a>,
        g: Heads<'a>,
    ) -> Result<Self> {
        Self::within(
            params,
            planes,
            [q, k, v],
            Some(g),
            Budget::holding(Held::Inputs),
        )
    }

    /// The problem validated against `budget` (e.g. a backward whose forward's output and
    /// saved values are already held: [`Held::Forward`]).
    pub fn within(
        params: &RaceParams,
        planes: &'a PlanesF32,
        [q, k, v]: [Heads<'a>; 3],
        g: Option<Heads<'a>>,
        budget: Budget,
    ) -> Result<Self> {
        crate::backend::check_within(params, planes, [&q, &k, &v], g.as_ref(), budget)?;
        Ok(Problem {
            params: *params,
            planes,
            x: ForwardInputs::new(q, k, v),
            g,
        })
    }

    /// A forward's problem whose inputs the caller has already put through the one
    /// validation ([`crate::validate::check`], as `attend` does): not checked again.
    pub(crate) fn validated(
        params: &RaceParams,
        planes: &'a PlanesF32,
        [q, k, v]: [Heads<'a>; 3],
    ) -> Self {
        Problem {
            params: *params,
            planes,
            x: ForwardInputs::new(q, k, v),
            g: None,
        }
    }

    /// The parameters.
    pub fn params(&self) -> &RaceParams {
        &self.params
    }
    /// The planes.
    pub fn planes(&self) -> &'a PlanesF32 {
        self.planes
    }
    /// `q`, `k`, `v`.
    pub fn inputs(&self) -> ForwardInputs<'a> {
        self.x
    }
    /// The upstream gradient, for a problem made by [`Problem::with_grad`].
    pub fn grad(&self) -> Result<Heads<'a>> {
        self.g.ok_or_else(|| {
            RaceError::param(
                "g",
                "this problem has no upstream gradient; build it with Problem::with_grad",
            )
        })
    }
    /// Floats of the output `Ô` (`heads · n · dv`).
    pub fn output_len(&self) -> usize {
        self.x.q.heads * self.x.q.n * self.x.v.cols
    }

    /// `o` is an output of this problem's shape.
    pub fn check_output(&self, arg: &str, o: &[f32]) -> Result<()> {
        if o.len() != self.output_len() {
            return Err(RaceError::shape(
                arg,
                format!(
                    "{arg} has {} floats but the output [heads, n, dv] = [{}, {}, {}] has {}",
                    o.len(),
                    self.x.q.heads,
                    self.x.q.n,
                    self.x.v.cols,
                    self.output_len()
                ),
            ));
        }
        Ok(())
    }

    /// A backward's inputs, with the forward's output `o`, and gradient buffers shaped like
    /// `q`, `k`, `v`.
    pub fn backward_inputs(&self, o: &'a [f32], grads: &GradsMut) -> Result<BackwardInputs<'a>> {
        self.check_output("o", o)?;
        let ForwardInputs { q, k, v } = self.x;
        for (name, buf, x) in [
            ("dq", &grads.dq, q),
            ("dk", &grads.dk, k),
            ("dv", &grads.dv, v),
        ] {
            if buf.len() != x.data.len() {
                return Err(RaceError::shape(
                    name,
                    format!(
                        "{name} has {} floats but its input has {}",
                        buf.len(),
                        x.data.len()
                    ),
                ));
            }
        }
        let o = Heads::of(q.heads, q.n, v.cols, o);
        Ok(BackwardInputs::new(q, k, v, o, self.grad()?))
    }
}

/// What a forward keeps for its backward ([`crate::backend::Backend::forward_into`]): the rows
/// with no key, the rows recomputed exactly, and the backend's own state, opaque to everyone
/// else (each backend reads only its own; `Saved::default()` holds none).
#[derive(Default)]
pub struct Saved {
    /// Rows with no key (left 0).
    pub empty_rows: usize,
    /// Rows recomputed exactly, and the seconds it took.
    pub recomputed: Recomputed,
    state: Option<Box<dyn std::any::Any + Send + Sync>>,
}

impl std::fmt::Debug for Saved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Saved")
            .field("empty_rows", &self.empty_rows)
            .field("recomputed", &self.recomputed)
            .field("state", &self.state.is_some())
            .finish()
    }
}

impl Saved {
    /// A forward's record with a backend's `state`.
    pub fn new<S: std::any::Any + Send + Sync>(
        empty_rows: usize,
        recomputed: Recomputed,
        state: S,
    ) -> Self {
        Saved {
            empty_rows,
            recomputed,
            state: Some(Box::new(state)),
        }
    }
    /// A forward's record with no state (a backend whose backward recomputes).
    pub fn stateless(empty_rows: usize, recomputed: Recomputed) -> Self {
        Saved {
            empty_rows,
            recomputed,
            state: None,
        }
    }
    /// The state, when it is an `S`.
    pub fn state<S: std::any::Any>(&self) -> Option<&S> {
        self.state.as_ref().and_then(|s| s.downcast_ref())
    }
    /// The state, when it is an `S`, taken out (to recycle its buffers).
    pub fn into_state<S: std::any::Any>(self) -> Option<S> {
        self.state.and_then(|s| s.downcast::<S>().ok()).map(|b| *b)
    }
}
