//! The partial kernel: soft RACE on one slice of the token axis whose neighbours hold the rest
//! of the sequence (other ranks, or chunks streamed before and after it). A caller combines
//! the slices' banks with collectives or a running sum; the kernel never sees the whole.
//!
//! With `φ` the soft features of the map (`m = L·2^P` per token) and `w = bank_width(dv)`, a
//! bank is, per head, the `m × w` f64 matrix `[B | A] = Σ_j φ(k_j)[v_j, 1]ᵀ` (values' sums and
//! masses) or, backward, `[dB | dA] = Σ_i φ(q_i) ĝ_iᵀ`:
//!
//! - non-causal: every slice's [`Partial::key_banks`] summed over the sequence, then each slice
//!   [`Partial::read`]s its queries against the total; backward, [`Partial::query_grads`] gives
//!   `dq` and the slice's `[dB | dA]`, summed over the sequence, and [`Partial::key_grads`]
//!   gives `dk`, `dv` from that total;
//! - causal: a slice starts from the banks of the keys before it ([`Partial::causal_forward`]);
//!   backward, from the `[dB | dA]` of the queries after it ([`Partial::query_totals`] of
//!   every later slice, [`Partial::causal_backward`]).
//!
//! Every method checks its shapes against each other and against the forward that made its
//! `saved` value, and refuses a mismatch with an error naming the argument.

use crate::backend::{BackwardInputs, ForwardInputs, GradsMut, Heads};
use crate::error::Result;
use crate::shared::SoftMap;

/// Per head, one `m × bank_width(dv)` f64 bank, row-major.
pub type Banks = Vec<Vec<f64>>;

/// Zero banks of `map` (`m = L·2^P` features) for `heads` heads and values of width `dv`:
/// the total of an empty slice. Refused where `heads · m · bank_width(dv)` values pass `usize`
/// or the memory this machine has.
pub fn zero_banks(map: &SoftMap, heads: usize, dv: usize) -> Result<Banks> {
    let m = map.planes.l << map.planes.p;
    let w = crate::shared::layout::bank_len(m, dv);
    crate::memory::check_alloc(
        &format!("{heads} zero banks of {m} rows for values of width {dv}"),
        w.and_then(|w| w.checked_mul(heads)),
        std::mem::size_of::<f64>(),
        "lower dv, P or L",
    )?;
    Ok(vec![vec![0.0f64; w.unwrap_or(0)]; heads])
}

/// The soft-RACE kernels on one slice of the token axis (see the module docs).
pub trait Partial: Send + Sync {
    /// What a slice's forward keeps for its backward; `Default` is "nothing kept" (a fresh
    /// value, or one whose buffers a forward may recycle).
    type Saved: Default + Send + Sync + 'static;

    /// Per head, `Σ_{j ∈ slice} φ(k_j)[v_j, 1]ᵀ` of the slice's keys `k` (`[heads, n, d]`) and
    /// values `v` (`[heads, n, dv]`).
    fn key_banks(&self, map: &SoftMap, k: Heads, v: Heads) -> Result<Banks>;

    /// Non-causal forward of the slice's queries `q` against `banks = (totals, dv)`, the
    /// totals over every key of the sequence (`keys` of them) for values of width `dv`: `Ô = φ(q)ᵀB / φ(q)ᵀA`
    /// into `o` (`[heads, n, dv]`, overwritten). Returns the rows whose denominator fell
    /// below the floor (left 0: the caller decides) and what the backward needs; `reuse`'s
    /// buffers are recycled.
    fn read(
        &self,
        map: &SoftMap,
        q: Heads,
        banks: (&[Vec<f64>], usize),
        keys: usize,
        o: &mut [f32],
        reuse: Self::Saved,
    ) -> Result<(usize, Self::Saved)>;

    /// Non-causal backward, the queries' half, from the [`Partial::read`] that made `saved`
    /// and the upstream gradient `g` (`[heads, n, dv]`): `∂ℓ/∂q` into `dq` (overwritten);
    /// returns the slice's `[dB | dA]` per head and its share of `∂ℓ/∂β`.
    fn query_grads(
        &self,
        map: &SoftMap,
        saved: &Self::Saved,
        q: Heads,
        g: Heads,
        dq: &mut [f32],
    ) -> Result<(Banks, f64)>;

    /// Non-causal backward, the keys' half, from `dbanks` (the `[dB | dA]` summed over every
    /// query of the sequence): `∂ℓ/∂k`, `∂ℓ/∂v` into `dk`, `dv` (overwritten); returns the
    /// keys' share of `∂ℓ/∂β`, for `keys = (k, v)` and `grads = (dk, dv)` (the keys'
    /// features are projected again: a slice's keys need not be the ones its queries read).
    fn key_grads(
        &self,
        map: &SoftMap,
        dbanks: &[Vec<f64>],
        keys: (Heads, Heads),
        grads: (&mut [f32], &mut [f32]),
    ) -> Result<f64>;

    /// Causal forward of the slice (`x`: its queries, keys and values, one token each),
    /// entering with `before = (banks, keys)`: the banks of the keys before the slice, and the
    /// count of keys in the whole sequence (for the floor). `Ô` into `o` (overwritten); returns the flagged
    /// rows and what the backward needs.
    fn causal_forward(
        &self,
        map: &SoftMap,
        x: ForwardInputs,
        before: (&[Vec<f64>], usize),
        o: &mut [f32],
        reuse: Self::Saved,
    ) -> Result<(usize, Self::Saved)>;

    /// Per head, `Σ_{i ∈ slice} φ(q_i) ĝ_iᵀ` of the slice's queries, from its causal forward
    /// (`saved`, output `o`) and the upstream gradient `g`: what the slices before it start
    /// their backward from.
    fn query_totals(
        &self,
        map: &SoftMap,
        saved: &Self::Saved,
        q: Heads,
        g: Heads,
        o: Heads,
    ) -> Result<Banks>;

    /// Causal backward of the slice from its forward (`saved`) and `after`, the
    /// [`Partial::query_totals`] of every query after the slice: the gradients into `out`
    /// (overwritten); returns the slice's share of `∂ℓ/∂β`.
    fn causal_backward(
        &self,
        map: &SoftMap,
        saved: &Self::Saved,
        x: BackwardInputs,
        after: &[Vec<f64>],
        out: GradsMut,
    ) -> Result<f64>;
}
