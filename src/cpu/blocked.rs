//! Non-causal soft RACE as blocked matrix products (the production path for `causal =
//! false`). Tokens are processed in blocks of [`block_rows`] (128 for banks of at most 16
//! features, else [`T`] = 64): with `Φ` the block's `T × m` features,
//! `X̂ = [V, 1]` its extended values, `Ĝ = [G/Den, −GᵀÔ/Den]`, and the bank `𝔅 = [B | A]`
//! (`m × w`):
//!
//! - keys: `𝔅 += Φ_Kᵀ X̂` (f32 within a block, added into f64 after every block);
//! - queries: `Den = Φ_Q A`, then `O = (Φ_Q / Den) B` straight into the output rows;
//! - backward, queries: `∂ℓ/∂Φ_Q = Ĝ 𝔅ᵀ / L`, `d𝔅 += Φ_Qᵀ Ĝ / L`;
//! - backward, keys: `∂ℓ/∂Φ_K = X̂ d𝔅ᵀ`, `∂ℓ/∂V = Φ_K dB`;
//! - projections `Z = X Wᵀ` and `∂ℓ/∂X = dZ W`.
//!
//! Every product is one call on the block (the bank is read once per block, not once per
//! token): [`gemm`] register tiles, or [`gemm_nt`] dot products where the output has few
//! columns and a long inner dimension (`Z = X Wᵀ`; `G Bᵀ` for banks of at most
//! `NT_MAX_M` rows). The extension columns are never materialised: `Φᵀ[V, 1] = [ΦᵀV, Φᵀ1]`,
//! and `Ĝ`'s per-row scale `1/(L·Den)` is folded into `Φ` or into the `T × m` result.
//!
//! Memory traffic ([`super::mem`]): the forward saves `u = tanh(Wq)`, `u = tanh(Wk)` in the
//! [`Ctx`], so the backward reads only `G` (queries' pass) and `V` (keys' pass) besides them:
//! no projection again, and `Ô` is not read at all (see [`query_grads`]). The next block's
//! input rows are prefetched a share at a time; outputs of at least 32 MiB are written with
//! streaming stores, for banks of at most 16 features queued behind the computation
//! ([`Out::queued`], [`super::mem::Behind`]); internal operands live in 64-byte-aligned
//! buffers. Banks of at most 16 features (one 512-bit vector per token) also take AVX-512
//! row passes: the read's `Den` and scaling ([`scaled_features`]), the queries' per-row
//! factors, and the features' backward ([`Block::backward`]). rayon runs (head,
//! segment) items in parallel. Same maths, same planes and same [`Ctx`] as
//! [`super::forward`] / [`super::backward`] (either backward accepts either forward's context:
//! without saved `u` the features are recomputed from Q and K); tested against the f64
//! reference like every other path.

use super::bank16::{self, Mass, Read, Update};
use super::features::{FeatureMap, SoftMap};
use super::forward::Ctx;
use super::gemm::{gemm, gemm_nt, transpose_into, Strided, Tri};
use super::mem::{ABuf, Ahead, Out};
use super::simd::{
    add_into_f64, dispatch, exp_f32, in_frame, tanh_f32, Isa, Level, Simd, WithSimd,
};
use super::state::{bank_width, plan_segments, split_out, Heads};
use rayon::prelude::*;

/// Tokens per block (also the f32 accumulation length before an f64 flush) of the causal
/// passes, and of the non-causal ones for banks of more than 16 features.
pub const T: usize = 64;

/// Tokens per block of the non-causal passes for a bank of `m` features: 128 up to 16
/// features, else [`T`]. (`examples/timing.rs`, N = 2^20, two threads: 128
/// rows are 6% faster at `(2, 2)` forward+backward, 1.5–2% slower at `(3, 3)` and `(4, 4)`.)
pub fn block_rows(m: usize) -> usize {
    if m <= 16 {
        128
    } else {
        T
    }
}

/// Multiple of 16 at or above `x` (the row stride of padded `T × LP` and `T × m` buffers).
pub(crate) fn pad16(x: usize) -> usize {
    x.next_multiple_of(16)
}

/// `a` (at most 16 floats) zero-padded to one 16-lane row, as the AVX-512 row passes load it.
pub(crate) fn lanes16(a: &[f32]) -> [f32; 16] {
    let mut out = [0.0f32; 16];
    out[..a.len()].copy_from_slice(a);
    out
}

/// `u = tanh(W x)`, `on = σ(2βu)`, `off = σ(−2βu)` of `rows` rows (`rows × d`) against `lp`
/// planes (`lp × d`), in f64 and rounded once ([`super::features::bit_probs_f64`]): at
/// [`super::features::PROJ_F64_BETA`] and above, `2β` would magnify the f32 roundings of `z`
/// and `u` (absolute errors) into the weights.
#[allow(clippy::too_many_arguments)]
pub(crate) fn probs_f64(
    u: &mut [f32],
    on: &mut [f32],
    off: &mut [f32],
    x: &[f32],
    w: &[f32],
    (rows, d, lp): (usize, usize, usize),
    beta: f32,
) {
    let rows_out = u.chunks_exact_mut(lp).zip(on.chunks_exact_mut(lp));
    for ((ur, (onr, offr)), xr) in rows_out
        .zip(off.chunks_exact_mut(lp))
        .map(|((a, b), c)| (a, (b, c)))
        .zip(x.chunks_exact(d))
        .take(rows)
    {
        for (j, wr) in w.chunks_exact(d).enumerate().take(lp) {
            (ur[j], onr[j], offr[j]) = super::features::bit_probs_f64(wr, xr, beta);
        }
    }
}

/// `u = tanh(z)` (in place; with `TANH = false`, `z` already holds `u`), `on = σ(2·beta·u)`,
/// `off = σ(−2·beta·u)` over a whole block, in the dispatched SIMD frame (the loop is
/// branch-free and vectorises).
struct BitProbs<'a, const TANH: bool> {
    z: &'a mut [f32],
    on: &'a mut [f32],
    off: &'a mut [f32],
    beta: f32,
}

impl<const TANH: bool> WithSimd for BitProbs<'_, TANH> {
    type Output = ();
    #[inline(always)]
    fn run<S: Simd>(self) {
        // Whole 16-lane chunks straight from the slices; the last partial one through a
        // zero-padded copy (a variable-length copy per chunk would be a `memcpy` call).
        let beta = self.beta;
        let n = self.z.len();
        let full = n - n % 16;
        let chunks = self.z[..full]
            .chunks_exact_mut(16)
            .zip(self.on[..full].chunks_exact_mut(16))
            .zip(self.off[..full].chunks_exact_mut(16));
        for (ci, ((z, on), off)) in chunks.enumerate() {
            if ci % 4 == 0 {
                super::mem::drip();
            }
            probs16::<TANH>(
                z.try_into().unwrap(),
                on.try_into().unwrap(),
                off.try_into().unwrap(),
                beta,
            );
        }
        if full < n {
            let len = n - full;
            let (mut z, mut on, mut off) = ([0.0f32; 16], [0.0f32; 16], [0.0f32; 16]);
            z[..len].copy_from_slice(&self.z[full..]);
            probs16::<TANH>(&mut z, &mut on, &mut off, beta);
            self.z[full..].copy_from_slice(&z[..len]);
            self.on[full..].copy_from_slice(&on[..len]);
            self.off[full..].copy_from_slice(&off[..len]);
        }
    }
}

/// [`BitProbs`] on one 16-lane chunk (branch-free, so it compiles to whole vectors).
#[inline(always)]
fn probs16<const TANH: bool>(
    z: &mut [f32; 16],
    on: &mut [f32; 16],
    off: &mut [f32; 16],
    beta: f32,
) {
    for l in 0..16 {
        let u = if TANH { tanh_f32(z[l]) } else { z[l] };
        let t = 2.0 * beta * u;
        z[l] = u;
        // σ(±t) from one e = e^{−|t|} (≤ 1, so never overflows; exp_f32 flushes to 0
        // below −87): σ(|t|) = 1/(1 + e), σ(−|t|) = e/(1 + e), each to f32 accuracy.
        let e = exp_f32(-t.abs());
        let inv = 1.0 / (1.0 + e);
        let (big, small) = (inv, e * inv);
        let pos = t >= 0.0;
        on[l] = if pos { big } else { small };
        off[l] = if pos { small } else { big };
    }
}

/// `φ_r = Π_b (bit b of r, most significant first ? on_b : off_b)` for `R = 2^P` known at
/// compile time: the `R` products of a table run side by side (one vector for `R = 16`),
/// multiplied in bit order like the general tree, so the values are identical.
#[inline(always)]
fn tree<const R: usize, const P: usize>(
    on: &[f32],
    off: &[f32],
    phi: &mut [f32],
    rows: usize,
    l: usize,
    mp: usize,
) {
    for i in 0..rows {
        if i % 4 == 0 {
            super::mem::drip();
        }
        for t in 0..l {
            let o = (i * l + t) * P;
            let mut v = [1.0f32; R];
            for b in 0..P {
                let (a1, a0) = (on[o + b], off[o + b]);
                for (rr, x) in v.iter_mut().enumerate() {
                    *x *= if (rr >> (P - 1 - b)) & 1 == 1 { a1 } else { a0 };
                }
            }
            phi[i * mp + t * R..i * mp + (t + 1) * R].copy_from_slice(&v);
        }
    }
}

/// `out = f(out, a, b)` elementwise over the first `n` entries of three rows. (Whole flat rows:
/// loops over fixed 16-lane pieces of several rows can be vectorised across the pieces
/// instead, with gathers and scatters, about 5× slower.)
#[inline(always)]
fn rows3(out: &mut [f32], a: &[f32], b: &[f32], n: usize, f: impl Fn(f32, f32, f32) -> f32) {
    let (out, a, b) = (&mut out[..n], &a[..n], &b[..n]);
    out.iter_mut()
        .zip(a.iter().zip(b))
        .for_each(|(o, (&a, &b))| *o = f(*o, a, b));
}

/// The features' backward, tokens in lanes, table by table on whole rows of `n` tokens:
/// `ḡ = Σ_r φ_r g_r`, `y_r = φ_r (g_r − ḡ)` (in place of `g_r` in `gt`), `c_b = Σ_r ±y_r` (sign
/// by bit b of r) by a butterfly (`c_0` is the top half's sum minus the bottom half's; adding
/// the halves leaves bit 1 on top, and so on: `3R/2` row operations per bit level), then
/// `∂ℓ/∂z_b = beta c_b (1 − u_b²)` and `dbeta += u_b c_b`. `scratch`: three rows (`ḡ`, `c_b`,
/// the `dbeta` terms). Returns `∂ℓ/∂beta` summed over the first `rows` tokens.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn tree_backward(
    phit: &[f32],
    gt: &mut [f32],
    ut: &[f32],
    dzt: &mut [f32],
    (tp, rows): (usize, usize),
    (l, r, p): (usize, usize, usize),
    beta: f32,
    scratch: &mut [f32],
) -> f64 {
    let n = pad16(rows);
    let (gbar, rest) = scratch.split_at_mut(tp);
    let (cb, dbr) = rest.split_at_mut(tp);
    dbr[..n].iter_mut().for_each(|x| *x = 0.0);
    for t in 0..l {
        let row = |rr: usize| (t * r + rr) * tp..(t * r + rr + 1) * tp;
        gbar[..n].iter_mut().for_each(|x| *x = 0.0);
        for rr in 0..r {
            rows3(gbar, &phit[row(rr)], &gt[row(rr)], n, |s, x, g| s + x * g);
        }
        for rr in 0..r {
            rows3(&mut gt[row(rr)], &phit[row(rr)], gbar, n, |g, x, gb| {
                x * (g - gb)
            });
        }
        for b in 0..p {
            super::mem::drip();
            let half = r >> (b + 1);
            cb[..n].iter_mut().for_each(|x| *x = 0.0);
            let (lo, hi) = gt[row(0).start..].split_at_mut(half * tp);
            for j in 0..half {
                let (lo, hi) = (&mut lo[j * tp..(j + 1) * tp], &hi[j * tp..(j + 1) * tp]);
                rows3(cb, lo, hi, n, |s, y0, y1| s + (y1 - y0));
                rows3(lo, hi, hi, n, |y0, y1, _| y0 + y1);
            }
            let u = &ut[(t * p + b) * tp..(t * p + b + 1) * tp];
            rows3(&mut dzt[(t * p + b) * tp..], cb, u, n, |_, c, u| {
                beta * c * (1.0 - u * u)
            });
            rows3(dbr, cb, u, n, |s, c, u| s + u * c);
        }
    }
    dbr[..rows].iter().map(|&x| x as f64).sum()
}

/// Per-block feature state. The features are computed and read in row layout (one token per
/// row: for `R = 16` a table is one vector). Their backward runs with tokens in lanes (each
/// feature, `∂ℓ/∂φ` and `u` one row of `tp` tokens), where a table's sums over `r` are
/// vertical adds of whole vectors instead of horizontal reductions ([`tree_backward`]);
/// [`transpose_into`] converts (`2m + L·P` floats per token, a quarter of the work it removes
/// at `(4, 4)`).
pub(crate) struct Block {
    pub(crate) isa: Isa,
    lp: usize,
    /// Token capacity, a multiple of 16 (the row length of the token-in-lanes buffers).
    tp: usize,
    z: ABuf,   // tp × LP: projections, then u = tanh(z)
    on: ABuf,  // tp × LP
    off: ABuf, // tp × LP
    /// Features, row stride `mp = pad16(m)` (padding columns stay 0).
    pub(crate) phi: ABuf, // tp × mp
    pub(crate) mp: usize,
    ut: ABuf,   // LP × tp: u, tokens in lanes (backward)
    phit: ABuf, // m × tp: features (backward)
    gt: ABuf,   // m × tp: ∂ℓ/∂φ (backward)
    dzt: ABuf,  // LP × tp: ∂ℓ/∂z
    dz: ABuf,   // tp × LP: ∂ℓ/∂z, tokens in rows (the 16-feature backward)
    /// Whether the last [`Block::backward`] left `∂ℓ/∂z` in `dz` (else in `dzt`).
    dz_rows: bool,
    /// [`tree_backward_rows16`]'s tables, for banks of at most 16 features.
    lanes: Option<Lanes16>,
    rowbuf: ABuf, // 3 × tp: scratch rows of the backward
    /// The planes `W` (`LP × d`), copied to an aligned buffer (full-vector loads).
    w: ABuf,
}

impl Block {
    /// A block of up to [`block_rows`] rows (at least [`T`]).
    pub(crate) fn new(map: &SoftMap, isa: Isa) -> Self {
        Self::with_rows(map, isa, block_rows(map.width()))
    }

    /// A block of up to `t` rows.
    pub(crate) fn with_rows(map: &SoftMap, isa: Isa, t: usize) -> Self {
        let pl = map.planes;
        let (lp, m, tp) = (pl.l * pl.p, pl.l * pl.r(), pad16(t));
        Block {
            isa,
            lp,
            tp,
            z: ABuf::zeroed(tp * lp),
            on: ABuf::zeroed(tp * lp),
            off: ABuf::zeroed(tp * lp),
            phi: ABuf::zeroed(tp * pad16(m)),
            mp: pad16(m),
            ut: ABuf::zeroed(lp * tp),
            phit: ABuf::zeroed(m * tp),
            gt: ABuf::zeroed(m * tp),
            dzt: ABuf::zeroed(lp * tp),
            dz: ABuf::zeroed(tp * lp),
            dz_rows: false,
            lanes: Lanes16::new(pl.l, pl.p),
            rowbuf: ABuf::zeroed(3 * tp),
            w: ABuf::from_slice(&pl.w),
        }
    }

    /// Features of rows `x` (`rows × d`); `z` keeps `u = tanh(Wx)` for the backward.
    pub(crate) fn features(&mut self, map: &SoftMap, x: &[f32], rows: usize) {
        let (d, lp) = (map.planes.d, self.lp);
        if map.beta >= super::features::PROJ_F64_BETA {
            let (u, on, off) = (&mut self.z, &mut self.on, &mut self.off);
            probs_f64(u, on, off, x, &self.w, (rows, d, lp), map.beta);
            self.tree(map, rows);
            return;
        }
        let z = &mut self.z;
        gemm_nt(self.isa, Tri::Full, z, lp, rows, lp, d, x, d, &self.w, d);
        self.probs_and_tree::<true>(map, rows);
    }

    /// [`Block::features`] from saved `u = tanh(Wx)` (`rows × LP`, see [`Block::u`]): no
    /// projection and no `tanh`, the same values.
    pub(crate) fn features_from_u(&mut self, map: &SoftMap, u: &[f32], rows: usize) {
        let n = rows * self.lp;
        self.z[..n].copy_from_slice(&u[..n]);
        self.probs_and_tree::<false>(map, rows);
    }

    /// [`Block::features`] of rows `x`, or [`Block::features_from_u`] when `saved` (the
    /// forward's `u` of the same rows) is `Some`.
    pub(crate) fn features_of(
        &mut self,
        map: &SoftMap,
        x: &[f32],
        saved: Option<&[f32]>,
        rows: usize,
    ) {
        match saved {
            // At large beta the probabilities come from x in f64, not from an f32 u.
            Some(u) if map.beta < super::features::PROJ_F64_BETA => {
                self.features_from_u(map, u, rows)
            }
            _ => self.features(map, x, rows),
        }
    }

    /// Start a backward block `a..b` of head `h`: arm the [`Ahead`] drip with the rows
    /// `b..next` of `other` and, unless its `u` is saved, of `x`; then the features of `x`'s
    /// rows (from the saved `u` when given).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn start<'a>(
        &mut self,
        map: &SoftMap,
        (x, saved): (&Heads<'a>, Option<&[f32]>),
        other: &Heads<'a>,
        h: usize,
        (a, b): (usize, usize),
        next: usize,
    ) -> Ahead<'a> {
        let mut ahead = match saved {
            Some(_) => Ahead::new(&[rows_of(other, h, b, next)]),
            None => Ahead::new(&[rows_of(x, h, b, next), rows_of(other, h, b, next)]),
        };
        ahead.step();
        self.features_of(map, rows_of(x, h, a, b), saved, b - a);
        ahead.step();
        ahead
    }

    /// Transpose the features of the block's first `rows` tokens into [`Block::phit`].
    pub(crate) fn features_t(&mut self, m: usize, rows: usize) {
        transpose_into(
            self.isa,
            &self.phi,
            rows,
            m,
            self.mp,
            &mut self.phit,
            self.tp,
        );
    }

    /// The transposed features (`m × tp`, row stride [`Block::tp`]: feature `f` of token `i`
    /// at `f·tp + i`), as [`Block::features_t`] or (tokens-in-lanes path only)
    /// [`Block::backward`] last left them.
    pub(crate) fn phit(&self) -> &[f32] {
        &self.phit
    }

    /// The token capacity (row stride of the token-in-lanes buffers).
    pub(crate) fn tp(&self) -> usize {
        self.tp
    }

    /// `u = tanh(Wx)` of the last block's rows (`rows × LP`), as the forward saves it (after
    /// [`Block::features`]).
    pub(crate) fn u(&self, rows: usize) -> &[f32] {
        &self.z[..rows * self.lp]
    }

    fn probs_and_tree<const TANH: bool>(&mut self, map: &SoftMap, rows: usize) {
        let n = rows * self.lp;
        dispatch(
            self.isa,
            BitProbs::<TANH> {
                z: &mut self.z[..n],
                on: &mut self.on[..n],
                off: &mut self.off[..n],
                beta: map.beta,
            },
        );
        self.tree(map, rows);
    }

    /// The features `φ` from the bit probabilities `on`, `off` of `rows` rows.
    fn tree(&mut self, map: &SoftMap, rows: usize) {
        let pl = map.planes;
        let (p, l, r) = (pl.p, pl.l, pl.r());
        let (lp, mp) = (self.lp, self.mp);
        let n = rows * lp;
        let (on, off, phi) = (&self.on[..n], &self.off[..n], &mut self.phi);
        // In the SIMD frame: outside it the R-wide products compile for SSE2.
        let isa = self.isa;
        match p {
            2 => {
                return in_frame(
                    isa,
                    #[inline(always)]
                    || tree::<4, 2>(on, off, phi, rows, l, mp),
                )
            }
            3 => {
                return in_frame(
                    isa,
                    #[inline(always)]
                    || tree::<8, 3>(on, off, phi, rows, l, mp),
                )
            }
            4 => {
                return in_frame(
                    isa,
                    #[inline(always)]
                    || tree::<16, 4>(on, off, phi, rows, l, mp),
                )
            }
            _ => {}
        }
        for i in 0..rows {
            for t in 0..l {
                let out = &mut self.phi[i * mp + t * r..i * mp + (t + 1) * r];
                out[0] = 1.0;
                let mut len = 1;
                for b in 0..p {
                    let (on, off) = (self.on[i * lp + t * p + b], self.off[i * lp + t * p + b]);
                    for j in (0..len).rev() {
                        let parent = out[j];
                        out[2 * j] = parent * off;
                        out[2 * j + 1] = parent * on;
                    }
                    len *= 2;
                }
            }
        }
    }

    /// From `∂ℓ/∂φ` (`rows × m`, the features' row stride `mp`) to `∂ℓ/∂z` (kept for
    /// [`Block::input_grads`]); returns Σ ∂ℓ/∂beta. Per table: `ḡ = Σ_r φ_r g_r`,
    /// `c_b = Σ_r ±φ_r (g_r − ḡ)` (sign by bit b of r), `∂ℓ/∂z_b = beta c_b (1 − u_b²)`,
    /// `∂ℓ/∂beta += u_b c_b`. Banks of at most 16 features with AVX-512: one token per vector,
    /// the sums over a table's lanes by permutes ([`tree_backward_rows16`]); otherwise tokens
    /// in lanes ([`tree_backward`], after transposing `u`, `Φ` into [`Block::phit`] and `∂ℓ/∂φ`).
    pub(crate) fn backward(&mut self, map: &SoftMap, gphi: &[f32], rows: usize) -> f64 {
        let pl = map.planes;
        let (p, l, m) = (pl.p, pl.l, pl.l * pl.r());
        let (tp, isa, beta) = (self.tp, self.isa, map.beta);
        if beta >= super::features::PROJ_F64_BETA {
            self.dz_rows = true;
            return self.backward_contrast(map, gphi, rows);
        }
        #[cfg(target_arch = "x86_64")]
        if let (Level::Avx512, Some(lanes)) = (isa.level(), &self.lanes) {
            let n = rows * self.lp;
            assert!(self.phi.len() >= rows * 16 && gphi.len() >= rows * 16);
            assert!(self.z.len() >= n && self.dz.len() >= n);
            self.dz_rows = true;
            // SAFETY: an `Isa` at Avx512 exists only where the CPU has AVX-512F; every row
            // read or written is in bounds (asserted above; masked lanes past `lp` are not
            // accessed).
            return unsafe {
                tree_backward_rows16(&self.phi, gphi, &self.z, &mut self.dz, rows, lanes, beta)
            };
        }
        self.dz_rows = false;
        transpose_into(isa, &self.z, rows, self.lp, self.lp, &mut self.ut, tp);
        transpose_into(isa, &self.phi, rows, m, self.mp, &mut self.phit, tp);
        transpose_into(isa, gphi, rows, m, self.mp, &mut self.gt, tp);
        let (phit, gt, ut, dzt) = (&self.phit, &mut self.gt, &self.ut, &mut self.dzt);
        let scratch = &mut self.rowbuf;
        let r = pl.r();
        in_frame(
            isa,
            #[inline(always)]
            || tree_backward(phit, gt, ut, dzt, (tp, rows), (l, r, p), beta, scratch),
        )
    }

    /// [`Block::backward`] from [`super::features::PROJ_F64_BETA`] on, token by token in row
    /// layout: `c_b = 2 on_b off_b Σ_r ±(Π_{q≠b} f_q(r)) g_r`
    /// ([`super::features::bit_contrast`]), which keeps the digits that `Σ_r ±φ_r (g_r − ḡ)`
    /// loses to cancellation when a table is saturated. Leaves `∂ℓ/∂z` in `dz`.
    fn backward_contrast(&mut self, map: &SoftMap, gphi: &[f32], rows: usize) -> f64 {
        let pl = map.planes;
        let (p, l, r, lp, mp) = (pl.p, pl.l, pl.r(), self.lp, self.mp);
        let mut scratch = vec![0.0f32; r];
        let mut c = [0.0f32; crate::params::MAX_P];
        let mut dbeta = 0.0f64;
        for i in 0..rows {
            let mut db = 0.0f32;
            for t in 0..l {
                let o = i * lp + t * p;
                let g = &gphi[i * mp + t * r..i * mp + (t + 1) * r];
                let (on, off) = (&self.on[o..o + p], &self.off[o..o + p]);
                super::features::bit_contrast(on, off, g, &mut scratch, &mut c[..p]);
                for b in 0..p {
                    let (u, cc) = (self.z[o + b], 2.0 * on[b] * off[b] * c[b]);
                    self.dz[o + b] = map.beta * cc * (1.0 - u * u);
                    db += u * cc;
                }
            }
            dbeta += db as f64;
        }
        dbeta
    }

    /// `∂ℓ/∂X = dZ W` for the block's `rows` into `out` (`rows × d`).
    pub(crate) fn input_grads(&self, map: &SoftMap, rows: usize, out: &mut [f32]) {
        let d = map.planes.d;
        let dz = if self.dz_rows {
            Strided::rows(&self.dz, self.lp)
        } else {
            Strided {
                data: &self.dzt,
                rs: 1,
                cs: self.tp,
            }
        };
        gemm(
            self.isa, out, d, rows, d, self.lp, dz, &self.w, d, 1.0, false,
        );
    }
}

/// The lane tables of [`tree_backward_rows16`] for one `(P, L)` (built once per [`Block`]):
/// butterfly partners `j ^ 2^s`, bit `b`'s signs (`+1` where bit `b` of the lane's bucket,
/// most significant first, is set), and where `c_b` goes (lane `t·P + b` takes lane `t·R`).
pub(crate) struct Lanes16 {
    p: usize,
    lp: usize,
    xor: [[i32; 16]; 4],
    sign: [[f32; 16]; 4],
    to: [[i32; 16]; 4],
    to_mask: [u16; 4],
}

impl Lanes16 {
    /// The tables for `L` tables of `2^P` buckets, or `None` unless `1 ≤ P ≤ 4`, `L·2^P ≤ 16`.
    fn new(l: usize, p: usize) -> Option<Self> {
        if p == 0 || p > 4 || l << p > 16 {
            return None;
        }
        let (r, lp) = (1usize << p, l * p);
        Some(Lanes16 {
            p,
            lp,
            xor: std::array::from_fn(|s| std::array::from_fn(|j| (j ^ (1 << s)) as i32)),
            sign: std::array::from_fn(|b| {
                std::array::from_fn(|j| {
                    if b < p && ((j % r) >> (p - 1 - b)) & 1 == 1 {
                        1.0
                    } else {
                        -1.0
                    }
                })
            }),
            to: std::array::from_fn(|b| {
                std::array::from_fn(|j| {
                    if j < lp && j % p == b {
                        ((j / p) * r) as i32
                    } else {
                        0
                    }
                })
            }),
            to_mask: std::array::from_fn(|b| (0..l).fold(0u16, |k, t| k | (1 << (t * p + b)))),
        })
    }
}

/// [`Block::backward`] with one token per 512-bit vector, for banks of at most 16 features
/// (`L·2^P ≤ 16`; row stride 16, padding lanes 0). A table is `R = 2^P` adjacent lanes, so its
/// sums are `P` butterfly steps `x += x[j ^ 2^s]` (each lane ends with its table's sum):
/// `ḡ` from `φ ⊙ g`, then `c_b` from `±(φ ⊙ (g − ḡ))` with bit `b`'s signs, moved by a masked
/// permute to lane `t·P + b` of `∂ℓ/∂z`'s row. `u` (`rows × lp`) in, `∂ℓ/∂z` (`rows × lp`)
/// out; returns Σ `u_b c_b` (f32 per lane over the block, then f64).
///
/// # Safety
/// The CPU must support AVX-512F; `phi` and `gphi` hold `rows` rows of 16, `u` and `dz` at
/// least `rows·lp` floats, `lp = L·P ≤ 16`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn tree_backward_rows16(
    phi: &[f32],
    gphi: &[f32],
    u: &[f32],
    dz: &mut [f32],
    rows: usize,
    lanes: &Lanes16,
    beta: f32,
) -> f64 {
    use std::arch::x86_64::*;
    let (p, lp) = (lanes.p, lanes.lp);
    // Each table is 16 lanes: one unaligned 512-bit load.
    let xor: [__m512i; 4] =
        std::array::from_fn(|s| _mm512_loadu_si512(lanes.xor[s].as_ptr() as *const _));
    let sign: [__m512; 4] = std::array::from_fn(|b| _mm512_loadu_ps(lanes.sign[b].as_ptr()));
    let to: [__m512i; 4] =
        std::array::from_fn(|b| _mm512_loadu_si512(lanes.to[b].as_ptr() as *const _));
    let to_mask = lanes.to_mask;
    let umask: __mmask16 = ((1u32 << lp) - 1) as u16;
    let (bv, one) = (_mm512_set1_ps(beta), _mm512_set1_ps(1.0));
    let mut db = _mm512_setzero_ps();
    for i in 0..rows {
        let ph = _mm512_loadu_ps(phi.as_ptr().add(i * 16));
        let g = _mm512_loadu_ps(gphi.as_ptr().add(i * 16));
        let mut gbar = _mm512_mul_ps(ph, g);
        for x in &xor[..p] {
            gbar = _mm512_add_ps(gbar, _mm512_permutexvar_ps(*x, gbar));
        }
        let y = _mm512_mul_ps(ph, _mm512_sub_ps(g, gbar));
        let mut cv = _mm512_setzero_ps();
        for b in 0..p {
            let mut cb = _mm512_mul_ps(y, sign[b]);
            for x in &xor[..p] {
                cb = _mm512_add_ps(cb, _mm512_permutexvar_ps(*x, cb));
            }
            cv = _mm512_mask_permutexvar_ps(cv, to_mask[b], to[b], cb);
        }
        let uv = _mm512_maskz_loadu_ps(umask, u.as_ptr().add(i * lp));
        let dzv = _mm512_mul_ps(_mm512_mul_ps(bv, cv), _mm512_fnmadd_ps(uv, uv, one));
        _mm512_mask_storeu_ps(dz.as_mut_ptr().add(i * lp), umask, dzv);
        db = _mm512_fmadd_ps(uv, cv, db);
    }
    let mut sums = [0.0f32; 16];
    _mm512_storeu_ps(sums.as_mut_ptr(), db);
    sums.iter().map(|&x| x as f64).sum()
}

/// `D[:, :dv] (=|+=) α A V` and `D[:, dv] (=|+=) α A 1` (the extension `X̂ = [V, 1]` without
/// building it): `A` is `rows × k`, `V` is `k × dv` (row stride `dv`), `D` has stride `ldd`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_ext(
    isa: Isa,
    d: &mut [f32],
    ldd: usize,
    rows: usize,
    k: usize,
    a: Strided,
    v: &[f32],
    dv: usize,
    alpha: f32,
    accumulate: bool,
) {
    gemm(isa, d, ldd, rows, dv, k, a, v, dv, alpha, accumulate);
    // Row sums of A into column `dv` of D: k outer when A is a transpose (its rows are
    // contiguous columns of the original), summed contiguously in the SIMD frame first for
    // up to 1024 rows; else one row at a time.
    if !accumulate {
        (0..rows).for_each(|i| d[i * ldd + dv] = 0.0);
    }
    if a.rs == 1 && rows <= 1024 {
        let mut sums = [0.0f32; 1024];
        let sums = &mut sums[..rows];
        in_frame(
            isa,
            #[inline(always)]
            || {
                for kk in 0..k {
                    let col = &a.data[kk * a.cs..kk * a.cs + rows];
                    sums.iter_mut().zip(col).for_each(|(s, &y)| *s += y);
                }
            },
        );
        sums.iter()
            .enumerate()
            .for_each(|(i, &s)| d[i * ldd + dv] += alpha * s);
    } else {
        for i in 0..rows {
            let s: f32 = (0..k).map(|kk| a.data[i * a.rs + kk * a.cs]).sum();
            d[i * ldd + dv] += alpha * s;
        }
    }
}

/// Banks with at most this many feature rows are read by dot products ([`gemm_nt`]); wider
/// ones through a transposed copy of their values ([`values_t`]) and [`gemm`]'s tiles.
pub(crate) const NT_MAX_M: usize = 32;

/// `Bᵀ` of the value columns of an f32 bank (`m × w`): `dv × mp`, zero-padded to `mp = pad16(m)`;
/// empty when [`bank_dots`] does not need it (`m ≤` [`NT_MAX_M`]).
pub(crate) fn values_t(isa: Isa, bank: &[f32], m: usize, dv: usize, w: usize) -> ABuf {
    if m <= NT_MAX_M {
        return ABuf::zeroed(0);
    }
    let mut out = ABuf::zeroed(dv * pad16(m));
    transpose_into(isa, bank, m, dv, w, &mut out, pad16(m));
    out
}

/// `out[i·mp + f] = x_i · B_f` for `rows` rows `x` (stride `dv`) and the value part of a bank
/// (`m × w`): through `bt`, [`values_t`] of the same bank, with [`gemm`]'s tiles, or by dot
/// products ([`gemm_nt`]) when `bt` is empty. (The causal passes read a state that changes
/// every sub-block by dot products on its two parts, `gemm_nt2`: a transposed copy per
/// sub-block costs more than it saves, measured.)
#[allow(clippy::too_many_arguments)]
pub(crate) fn bank_dots(
    isa: Isa,
    out: &mut [f32],
    mp: usize,
    rows: usize,
    m: usize,
    x: &[f32],
    dv: usize,
    bank: &[f32],
    w: usize,
    bt: &[f32],
) {
    if bt.is_empty() {
        gemm_nt(isa, Tri::Full, out, mp, rows, m, dv, x, dv, bank, w);
    } else {
        gemm(
            isa,
            out,
            mp,
            rows,
            mp,
            dv,
            Strided::rows(x, dv),
            bt,
            mp,
            1.0,
            false,
        );
    }
}

/// One `Some(piece)` of `u` (`[heads, n, lp]`) per (head, segment), in [`split_out`]'s order;
/// all `None` when `u` is empty (nothing to save).
pub(crate) fn saved_pieces<'a>(
    u: &'a mut [f32],
    n: usize,
    lp: usize,
    segs: &[(usize, usize)],
    heads: usize,
) -> Vec<Option<&'a mut [f32]>> {
    if u.is_empty() {
        return (0..heads * segs.len()).map(|_| None).collect();
    }
    split_out(u, n, lp, segs)
        .into_iter()
        .map(|(_, _, p)| Some(p))
        .collect()
}

/// The saved `u` rows `a..b` of head `h` (`[heads, n, lp]`), or `None` when nothing was saved.
pub(crate) fn saved_rows(
    u: &[f32],
    n: usize,
    lp: usize,
    h: usize,
    a: usize,
    b: usize,
) -> Option<&[f32]> {
    (!u.is_empty()).then(|| &u[(h * n + a) * lp..(h * n + b) * lp])
}

/// f32 copies of f64 banks, in aligned buffers (they are read by full-vector loads).
fn to_f32(banks: &[Vec<f64>]) -> Vec<ABuf> {
    banks
        .iter()
        .map(|b| {
            let mut out = ABuf::zeroed(b.len());
            out.iter_mut().zip(b).for_each(|(y, &x)| *y = x as f32);
            out
        })
        .collect()
}

/// What the backward passes read of the per-head f64 banks (`m × w`): their f32 copies, the
/// transposed values ([`values_t`]) and the mass columns ([`masses`]).
type BankViews = (Vec<ABuf>, Vec<ABuf>, Vec<Vec<f32>>);

fn bank_views(isa: Isa, banks: &[Vec<f64>], m: usize, dv: usize, w: usize) -> BankViews {
    let b32 = to_f32(banks);
    let bt = b32.iter().map(|b| values_t(isa, b, m, dv, w)).collect();
    let am = mass_columns(&b32, m, w, dv);
    (b32, bt, am)
}

/// The mass column ([`masses`]) of each f32 bank.
fn mass_columns(b32: &[ABuf], m: usize, w: usize, dv: usize) -> Vec<Vec<f32>> {
    b32.iter()
        .map(|b| {
            let mut a = Vec::new();
            masses(b, m, w, dv, &mut a);
            a
        })
        .collect()
}

pub(crate) fn rows_of<'a>(x: &Heads<'a>, h: usize, a: usize, b: usize) -> &'a [f32] {
    &x.data[(h * x.n + a) * x.cols..(h * x.n + b) * x.cols]
}

/// `Σ_j φ(k_j)[v_j, 1]` over `range` of head `h` (f64); with `save`, also the keys'
/// `u = tanh(W k_j)` into it (`len × LP` for the range).
pub(crate) fn key_bank(
    map: &SoftMap,
    isa: Isa,
    k: Heads,
    v: Heads,
    h: usize,
    range: (usize, usize),
    mut save: Option<&mut [f32]>,
) -> Vec<f64> {
    let (m, dv, w) = (map.width(), v.cols, bank_width(v.cols));
    let tb = block_rows(m);
    let mut blk = Block::new(map, isa);
    let (mut b32, mut b64) = (ABuf::zeroed(m * w), vec![0.0f64; m * w]);
    let mut a = range.0;
    while a < range.1 {
        let b = (a + tb).min(range.1);
        let rows = b - a;
        let next = (b + tb).min(range.1);
        let mut ahead = Ahead::new(&[rows_of(&k, h, b, next), rows_of(&v, h, b, next)]);
        ahead.step();
        blk.features(map, rows_of(&k, h, a, b), rows);
        if let Some(u) = save.as_deref_mut() {
            let o = (a - range.0) * blk.lp;
            u[o..o + rows * blk.lp].copy_from_slice(blk.u(rows));
        }
        ahead.step();
        let vb = rows_of(&v, h, a, b);
        assign_bank(
            isa,
            m,
            dv,
            (&mut b32, w),
            (&blk.phi, blk.mp),
            rows,
            vb,
            true,
        );
        ahead.step();
        add_into_f64(isa, &mut b64, &b32);
        a = b;
    }
    b64
}

/// Non-causal pass 1, blocked: `[B | A] = Σ_j φ(k_j)[v_j, 1]` per head (f64); the keys'
/// `u = tanh(Wk)` into `uk` (`[heads, n, L·P]`) unless it is empty.
pub fn key_banks(map: &SoftMap, isa: Isa, k: Heads, v: Heads, uk: &mut [f32]) -> Vec<Vec<f64>> {
    let (heads, m, w) = (k.heads, map.width(), bank_width(v.cols));
    let kseg = plan_segments(k.n, heads);
    let parts: Vec<Vec<f64>> = saved_pieces(uk, k.n, map.planes.l * map.planes.p, &kseg, heads)
        .into_par_iter()
        .enumerate()
        .map(|(i, u)| key_bank(map, isa, k, v, i / kseg.len(), kseg[i % kseg.len()], u))
        .collect();
    parts
        .chunks(kseg.len())
        .map(|c| {
            c.iter().fold(vec![0.0f64; m * w], |mut acc, p| {
                acc.iter_mut().zip(p).for_each(|(a, b)| *a += b);
                acc
            })
        })
        .collect()
}

/// Non-causal pass 2, blocked: `o = Num/Den` from the per-head banks into `o` and `den`
/// (`[heads, n]`, the Algorithm-1 denominator), and the queries' `u = tanh(Wq)` into `uq`
/// (`[heads, n, L·P]`) unless it is empty; returns (empty rows, segments used).
///
/// The division is folded into the features: `Den_i = φ_i·A` first ([`scaled_features`]),
/// then `o = (c ⊙ Φ) B` with `c_i = 1/Den_i` straight into the output rows, so no
/// `T × (dv + 1)` accumulator is stored and read back.
#[allow(clippy::too_many_arguments)]
pub fn read_into(
    map: &SoftMap,
    isa: Isa,
    q: Heads,
    banks: &[Vec<f64>],
    dv: usize,
    o: &mut [f32],
    den: &mut [f32],
    uq: &mut [f32],
    floor: f32,
) -> (usize, Vec<(usize, usize)>) {
    let (heads, n, m, w) = (q.heads, q.n, map.width(), bank_width(dv));
    let banks32 = to_f32(banks);
    let am = mass_columns(&banks32, m, w, dv);
    let segs = plan_segments(n, heads);
    let tb = block_rows(m);
    let inv_l = map.den_scale();
    let lp = map.planes.l * map.planes.p;
    let out = Out::for_len(isa, o.len()).queued(m <= 16);
    let empty: usize = split_out(o, n, dv, &segs)
        .into_par_iter()
        .zip(split_out(den, n, 1, &segs).into_par_iter())
        .zip(saved_pieces(uq, n, lp, &segs, heads).into_par_iter())
        .map(|(((h, s, op), (_, _, dp)), mut save)| {
            let mut blk = Block::new(map, isa);
            let mut sphi = ABuf::zeroed(tb * blk.mp);
            let (mut a, end, mut empty) = (segs[s].0, segs[s].1, 0usize);
            out.behind(op, tb * dv, |ob| {
                while a < end {
                    let b = (a + tb).min(end);
                    let rows = b - a;
                    let next = (b + tb).min(end);
                    let mut ahead = Ahead::new(&[rows_of(&q, h, b, next)]);
                    ahead.step();
                    blk.features(map, rows_of(&q, h, a, b), rows);
                    let t0 = a - segs[s].0;
                    if let Some(u) = save.as_deref_mut() {
                        u[t0 * lp..(t0 + rows) * lp].copy_from_slice(blk.u(rows));
                    }
                    ahead.step();
                    let dt = &mut dp[t0..t0 + rows];
                    let mp = blk.mp;
                    empty += scaled_features(
                        isa, &blk.phi, mp, m, rows, &am[h], inv_l, &mut sphi, dt, floor,
                    );
                    ahead.step();
                    ob.produce(t0 * dv, rows * dv, |x| {
                        if bank16::applies(isa, m) {
                            let r = Read {
                                a: &sphi,
                                rows,
                                d: &mut *x,
                                ldd: dv,
                            };
                            bank16::read(isa, m, dv, (&banks32[h], w), r);
                        } else {
                            let sp = Strided::rows(&sphi, mp);
                            gemm(isa, x, dv, rows, dv, m, sp, &banks32[h], w, 1.0, false);
                        }
                    });
                    a = b;
                }
            });
            empty
        })
        .sum();
    (empty, segs)
}

/// `bank = Φᵀ X` for `rows` feature rows `phi` (row stride `mp`) and value rows `x` (stride
/// `dv`), overwriting the bank's first `dv` columns (`m` rows of stride `w`); with `ones` the
/// mass column too (`Φᵀ [X | 1]`), else it is left for the caller. [`bank16::assign`] where
/// it applies (`mp` is then 16), else a product with `Φ` read transposed.
#[allow(clippy::too_many_arguments)]
fn assign_bank(
    isa: Isa,
    m: usize,
    dv: usize,
    (bank, w): (&mut [f32], usize),
    (phi, mp): (&[f32], usize),
    rows: usize,
    x: &[f32],
    ones: bool,
) {
    if bank16::applies(isa, m) {
        let mass = if ones { Mass::Ones } else { Mass::Skip };
        let u = Update {
            b: phi,
            rows,
            x,
            ldx: dv,
            mass,
        };
        return bank16::assign(isa, m, dv, (bank, w), u);
    }
    let pt = Strided::transposed(phi, mp);
    if ones {
        gemm_ext(isa, bank, w, m, rows, pt, x, dv, 1.0, false);
    } else {
        gemm(isa, bank, w, m, dv, rows, pt, x, dv, 1.0, false);
    }
}

/// `Den_i = φ_i·A` for the rows of `phi` (`rows × m`, stride `mp`) and the bank's mass
/// column `a`; `den_i = Den_i·scale`, and `sphi_i = φ_i / Den_i` (stride `mp`). A row with
/// `Den` below `floor` ([`super::recompute::den_floor`]) or not finite is flagged: `den_i = 0`
/// and `sphi_i = 0`, so its output is 0. Returns the number of flagged rows.
#[allow(clippy::too_many_arguments)]
pub(crate) fn scaled_features(
    isa: Isa,
    phi: &[f32],
    mp: usize,
    m: usize,
    rows: usize,
    a: &[f32],
    scale: f32,
    sphi: &mut [f32],
    den: &mut [f32],
    floor: f32,
) -> usize {
    #[cfg(target_arch = "x86_64")]
    if mp == 16 && isa.level() == Level::Avx512 {
        let a16 = lanes16(&a[..m]);
        assert!(phi.len() >= rows * 16 && sphi.len() >= rows * 16 && den.len() >= rows);
        // SAFETY: an `Isa` at Avx512 exists only where the CPU has AVX-512F; the rows read and
        // written are in bounds (asserted).
        return unsafe { scaled_rows16_avx512(phi, rows, &a16, scale, sphi, den, floor) };
    }
    let mut empty = 0;
    in_frame(
        isa,
        #[inline(always)]
        || {
            for i in 0..rows {
                let row = &phi[i * mp..i * mp + m];
                let d = row.iter().zip(a).fold(0.0f32, |s, (&x, &y)| s + x * y);
                let c = den_factor(d, scale, &mut den[i], &mut empty, floor);
                let out = &mut sphi[i * mp..i * mp + m];
                out.iter_mut().zip(row).for_each(|(y, &x)| *y = x * c);
            }
        },
    );
    empty
}

/// `1/d` for a row of [`scaled_features`] with `den = d·scale`; or 0 for a flagged row
/// (`d` below `floor` or not finite: `den = 0`, counted in `flagged`).
#[inline(always)]
fn den_factor(d: f32, scale: f32, den: &mut f32, flagged: &mut usize, floor: f32) -> f32 {
    if !(d >= floor && d.is_finite()) {
        *flagged += 1;
        *den = 0.0;
        return 0.0;
    }
    *den = d * scale;
    1.0 / d
}

/// [`scaled_features`] for rows of 16 floats with AVX-512: per row one vector product, a
/// horizontal sum, one division and one scaled store (as a plain loop the compiler made it
/// scalar code, 4× slower).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn scaled_rows16_avx512(
    phi: &[f32],
    rows: usize,
    a: &[f32; 16],
    scale: f32,
    sphi: &mut [f32],
    den: &mut [f32],
    floor: f32,
) -> usize {
    use std::arch::x86_64::*;
    let av = _mm512_loadu_ps(a.as_ptr());
    let mut empty = 0;
    for (i, de) in den[..rows].iter_mut().enumerate() {
        let row = _mm512_loadu_ps(phi.as_ptr().add(i * 16));
        let d = _mm512_reduce_add_ps(_mm512_mul_ps(row, av));
        let c = den_factor(d, scale, de, &mut empty, floor);
        _mm512_storeu_ps(
            sphi.as_mut_ptr().add(i * 16),
            _mm512_mul_ps(row, _mm512_set1_ps(c)),
        );
    }
    empty
}

/// `o_i = Num_i / Den_i` from `[Num | Den]` rows (stride `w`) and `den_i = Den_i·scale`; a
/// flagged row (`Den` below `floor` or not finite, see [`super::forward::finish_row`]) is
/// written as 0 and counted.
#[allow(clippy::too_many_arguments)]
pub(crate) fn normalise(
    isa: Isa,
    acc: &[f32],
    w: usize,
    rows: usize,
    dv: usize,
    scale: f32,
    o: &mut [f32],
    den: &mut [f32],
    floor: f32,
) -> usize {
    in_frame(
        isa,
        #[inline(always)]
        || {
            // A plain loop: as `(0..rows).filter(..).count()` the body was compiled outside the
            // frame, as SSE code in an uninlined `Filter::count` (9% of the causal (2, 2)
            // time in cache).
            let mut empty = 0;
            for (i, de) in den[..rows].iter_mut().enumerate() {
                super::mem::drip();
                let out = &mut o[i * dv..(i + 1) * dv];
                let acc = &acc[i * w..i * w + dv + 1];
                empty += super::forward::finish_row(acc, out, de, scale, floor) as usize;
            }
            empty
        },
    )
}

/// Non-causal soft-RACE forward, blocked. Same contract as [`super::soft_forward_into`]
/// (`reuse`: a previous context whose buffers are recycled).
pub fn forward_into(
    map: &SoftMap,
    isa: Isa,
    q: Heads,
    k: Heads,
    v: Heads,
    o: &mut [f32],
    reuse: Ctx,
) -> (usize, Ctx) {
    let (mut den, mut uq, mut uk) = reuse.recycle(map, &q, &k);
    let banks = key_banks(map, isa, k, v, &mut uk);
    let floor = super::recompute::den_floor(map.width(), k.n);
    let (empty, segs) = read_into(map, isa, q, &banks, v.cols, o, &mut den, &mut uq, floor);
    (
        empty,
        Ctx {
            causal: false,
            segs,
            banks,
            den,
            uq,
            uk,
            states: Vec::new(),
            recomputed: Default::default(),
        },
    )
}

/// The mass column `A_f = 𝔅[f][dv]` of a bank (`m × w`), contiguous (the elementwise loops
/// over `f` then vectorise instead of gathering with stride `w`).
pub(crate) fn masses(bank: &[f32], m: usize, w: usize, dv: usize, out: &mut Vec<f32>) {
    out.clear();
    out.extend((0..m).map(|f| bank[f * w + dv]));
}

/// `x_i += a` for every row `i` of `x` (`rows × m`, row stride `ld`), in the dispatched frame.
pub(crate) fn add_rows(isa: Isa, x: &mut [f32], ld: usize, rows: usize, a: &[f32]) {
    in_frame(
        isa,
        #[inline(always)]
        || {
            for i in 0..rows {
                let row = &mut x[i * ld..i * ld + a.len()];
                row.iter_mut().zip(a).for_each(|(x, &y)| *x += y);
            }
        },
    )
}

/// `c_i = 1/(L·den_i)`, or 0 for an empty row (`den_i = 0`).
pub(crate) fn inv_den(den: &[f32], inv_l: f32, c: &mut [f32]) {
    for (ci, &di) in c.iter_mut().zip(den) {
        *ci = if di != 0.0 { inv_l / di } else { 0.0 };
    }
}

/// `out_i = c_i (a_i · b_i)` (`c_i = 1` without `c`) for the rows of two matrices with row
/// stride `ld`, over their first `len` columns: one 16-lane [`Simd::dot`] per row (a plain
/// `f32` sum is one serial chain of `len` adds per row, 5× slower at `len = 64`).
pub(crate) struct RowDots<'a> {
    pub(crate) a: &'a [f32],
    pub(crate) b: &'a [f32],
    pub(crate) ld: usize,
    pub(crate) len: usize,
    pub(crate) c: Option<&'a [f32]>,
    pub(crate) out: &'a mut [f32],
}

impl WithSimd for RowDots<'_> {
    type Output = ();
    #[inline(always)]
    fn run<S: Simd>(self) {
        for (i, o) in self.out.iter_mut().enumerate() {
            let (a, b) = (&self.a[i * self.ld..], &self.b[i * self.ld..]);
            let dot = S::dot(&a[..self.len], &b[..self.len]);
            *o = self.c.map_or(dot, |c| c[i] * dot);
        }
    }
}

/// The per-row factors of `Ĝ = [G/Den, −s/Den]/L` for a block: `c_i = 1/(L·den_i)` (0 for an
/// empty row), `s_i = g_i·ô_i`, and the block's `G` rows (stride `dv`).
pub(crate) struct GFactors<'a> {
    pub c: &'a [f32],
    pub s: &'a [f32],
    pub g: &'a [f32],
    pub dv: usize,
}

impl<'a> GFactors<'a> {
    /// Factors already in `c`, `s` for the rows `g` (stride `dv`).
    pub(crate) fn of(c: &'a [f32], s: &'a [f32], g: &'a [f32], dv: usize) -> Self {
        GFactors { c, s, g, dv }
    }

    /// `∂ℓ/∂φ_if = ĝ_i·𝔅_f = c_i (g_i·B_f − s_i A_f)` in place: `gphi_if = g_i·B_f` in (from
    /// [`bank_dots`] of the bank `𝔅`), `∂ℓ/∂φ_if` out (row stride `mp`); `a` is the bank's
    /// mass column ([`masses`], `m` long).
    pub(crate) fn scale_phi_grads(
        &self,
        isa: Isa,
        gphi: &mut [f32],
        mp: usize,
        rows: usize,
        a: &[f32],
    ) {
        in_frame(
            isa,
            #[inline(always)]
            || {
                for i in 0..rows {
                    let (ci, si) = (self.c[i], self.s[i]);
                    let row = &mut gphi[i * mp..i * mp + a.len()];
                    row.iter_mut()
                        .zip(a)
                        .for_each(|(x, &af)| *x = ci * (*x - si * af));
                }
            },
        )
    }

    /// `d𝔅 (=|+=) Φᵀ Ĝ`: `dB_f = Σ_i c_i φ_if g_i`, `dA_f = −Σ_i c_i φ_if s_i`, into `d32`
    /// (`m × w`), through the scratch `sphi` (`rows × m`, receives `c ⊙ Φ`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn dbank(
        &self,
        isa: Isa,
        phi: &[f32],
        mp: usize,
        m: usize,
        rows: usize,
        sphi: &mut [f32],
        d32: &mut [f32],
        w: usize,
        accumulate: bool,
    ) {
        let dv = self.dv;
        in_frame(
            isa,
            #[inline(always)]
            || {
                for i in 0..rows {
                    let (ph, sp) = (&phi[i * mp..i * mp + m], &mut sphi[i * m..(i + 1) * m]);
                    sp.iter_mut().zip(ph).for_each(|(y, &x)| *y = x * self.c[i]);
                }
            },
        );
        let sp = Strided::transposed(sphi, m);
        gemm(isa, d32, w, m, dv, rows, sp, self.g, dv, 1.0, accumulate);
        // Masses: mass_f −= Σ_i (c ⊙ Φ)_if s_i, summed contiguously, then into column `dv`.
        let mut mass = [0.0f32; 1024];
        let mass = &mut mass[..m.min(1024)];
        in_frame(
            isa,
            #[inline(always)]
            || {
                for i in 0..rows {
                    let si = self.s[i];
                    let sp = &sphi[i * m..i * m + mass.len()];
                    mass.iter_mut().zip(sp).for_each(|(x, &y)| *x -= y * si);
                }
            },
        );
        for (f, &x) in mass.iter().enumerate() {
            let t = &mut d32[f * w + dv];
            *t = if accumulate { *t + x } else { x };
        }
        // Banks wider than the stack buffer (m > 1024): the rest column-wise.
        for f in mass.len()..m {
            let x: f32 = (0..rows).map(|i| -sphi[i * m + f] * self.s[i]).sum();
            let t = &mut d32[f * w + dv];
            *t = if accumulate { *t + x } else { x };
        }
    }
}

/// [`query_rows16_avx512`] when it applies (AVX-512, feature rows of 16 floats: `mp = 16`),
/// with the mass column `a` (`m ≤ 16` long) zero-padded; `None` otherwise, for the
/// general sequence ([`RowDots`], [`GFactors`]).
fn query_rows16(
    isa: Isa,
    (phi, gphi, sphi, mp): (&[f32], &mut [f32], &mut [f32], usize),
    rows: usize,
    (c, s): (&[f32], &mut [f32]),
    a: &[f32],
) -> Option<[f32; 16]> {
    #[cfg(target_arch = "x86_64")]
    if isa.level() == Level::Avx512 && mp == 16 {
        assert!(phi.len() >= rows * 16 && gphi.len() >= rows * 16 && sphi.len() >= rows * 16);
        assert!(c.len() >= rows && s.len() >= rows && a.len() <= 16);
        let a16 = lanes16(a);
        // SAFETY: an `Isa` at Avx512 exists only where the CPU has AVX-512F; the rows are in
        // bounds (asserted).
        return Some(unsafe { query_rows16_avx512((phi, gphi, sphi), rows, (c, s), &a16) });
    }
    let _ = (isa, phi, gphi, sphi, mp, rows, c, s, a);
    None
}

/// The queries' per-row factors in one pass, for rows of 16 floats with AVX-512 (banks of
/// at most 16 features): with `gphi_i = (g_i·B_f)_f` in, `s_i = c_i Σ_f φ_if gphi_if` into
/// `s`, `∂ℓ/∂φ_if = c_i (gphi_if − s_i A_f)` over `gphi`, `sphi_i = c_i φ_i` (stride 16, for
/// `dB = sphiᵀ G`); returns the masses `dA_f = −Σ_i sphi_if s_i`. The same sums as
/// [`RowDots`], [`GFactors::scale_phi_grads`] and [`GFactors::dbank`]'s scaling and masses,
/// which take four passes over the rows.
///
/// # Safety
/// The CPU must support AVX-512F; `phi`, `gphi`, `sphi` hold `rows` rows of 16, `c` and `s`
/// at least `rows` entries.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn query_rows16_avx512(
    (phi, gphi, sphi): (&[f32], &mut [f32], &mut [f32]),
    rows: usize,
    (c, s): (&[f32], &mut [f32]),
    a: &[f32; 16],
) -> [f32; 16] {
    use std::arch::x86_64::*;
    let av = _mm512_loadu_ps(a.as_ptr());
    let mut mass = _mm512_setzero_ps();
    for i in 0..rows {
        let ph = _mm512_loadu_ps(phi.as_ptr().add(i * 16));
        let g = _mm512_loadu_ps(gphi.as_ptr().add(i * 16));
        let ci = c[i];
        let si = ci * _mm512_reduce_add_ps(_mm512_mul_ps(ph, g));
        s[i] = si;
        let (cv, sv) = (_mm512_set1_ps(ci), _mm512_set1_ps(si));
        let gout = _mm512_mul_ps(cv, _mm512_fnmadd_ps(sv, av, g));
        _mm512_storeu_ps(gphi.as_mut_ptr().add(i * 16), gout);
        let sp = _mm512_mul_ps(ph, cv);
        _mm512_storeu_ps(sphi.as_mut_ptr().add(i * 16), sp);
        mass = _mm512_fnmadd_ps(sp, sv, mass);
    }
    let mut out = [0.0f32; 16];
    _mm512_storeu_ps(out.as_mut_ptr(), mass);
    out
}

/// Backward, queries' side (blocked): `∂ℓ/∂q` into `dq` and the per-head `d𝔅 = Σ_i φ(q_i) ĝ_iᵀ/L`
/// (f64); returns `(d𝔅 per head, the queries' share of ∂ℓ/∂beta)`.
///
/// With `c_i = 1/(L·Den_i)` and `s_i = g_i·ô_i`: `∂ℓ/∂φ_if = c_i (g_i·B_f − s_i A_f)`,
/// `dB_f += Σ_i c_i φ_if g_i`, `dA_f −= Σ_i c_i φ_if s_i`. `Ô` is not read: `ô_i = Num_i/Den_i`
/// with `Num_i = Σ_f φ_if B_f`, so `s_i = c_i Σ_f φ_if (g_i·B_f)` from the products
/// `g_i·B_f` that `∂ℓ/∂φ` needs anyway (the same f32 bank as the forward's read). `uq` is
/// the forward's saved `u = tanh(Wq)` (`[heads, n, L·P]`); empty: recomputed from `q`.
#[allow(clippy::too_many_arguments)]
pub fn query_grads(
    map: &SoftMap,
    isa: Isa,
    banks: &[Vec<f64>],
    segs: &[(usize, usize)],
    den: &[f32],
    q: Heads,
    uq: &[f32],
    g: Heads,
    dq: &mut [f32],
) -> (Vec<Vec<f64>>, f64) {
    let (heads, n, d, dv, m, w) = (
        q.heads,
        q.n,
        q.cols,
        g.cols,
        map.width(),
        bank_width(g.cols),
    );
    let lp = map.planes.l * map.planes.p;
    let (mp, tb) = (pad16(m), block_rows(m));
    let inv_l = 1.0 / map.planes.l as f32;
    let (banks32, bt, am) = bank_views(isa, banks, m, dv, w);
    let out = Out::for_len(isa, dq.len()).queued(m <= 16);
    let qres: Vec<(usize, Vec<f64>, f64)> = split_out(dq, n, d, segs)
        .into_par_iter()
        .map(|(h, s, dqp)| {
            let mut blk = Block::new(map, isa);
            let (mut gphi, mut sphi) = (ABuf::zeroed(tb * mp), ABuf::zeroed(tb * mp));
            let (mut c, mut sv) = (vec![0.0f32; tb], vec![0.0f32; tb]);
            let (mut d32, mut d64) = (ABuf::zeroed(m * w), vec![0.0f64; m * w]);
            let bank = &banks32[h];
            let (mut a, end, mut dbeta) = (segs[s].0, segs[s].1, 0.0f64);
            out.behind(dqp, tb * d, |bq| {
                while a < end {
                    let b = (a + tb).min(end);
                    let rows = b - a;
                    let gb = rows_of(&g, h, a, b);
                    let next = (b + tb).min(end);
                    let uqb = saved_rows(uq, n, lp, h, a, b);
                    let mut ahead = blk.start(map, (&q, uqb), &g, h, (a, b), next);
                    inv_den(&den[h * n + a..h * n + b], inv_l, &mut c);
                    bank_dots(isa, &mut gphi, mp, rows, m, gb, dv, bank, w, &bt[h]);
                    let rows16 = query_rows16(
                        isa,
                        (&blk.phi, &mut gphi, &mut sphi, mp),
                        rows,
                        (&c, &mut sv),
                        &am[h],
                    );
                    if let Some(mass) = rows16 {
                        ahead.step();
                        assign_bank(isa, m, dv, (&mut d32, w), (&sphi, 16), rows, gb, false);
                        (0..m).for_each(|f| d32[f * w + dv] = mass[f]);
                    } else {
                        let s_rows = RowDots {
                            a: &blk.phi,
                            b: &gphi,
                            ld: mp,
                            len: m,
                            c: Some(&c),
                            out: &mut sv[..rows],
                        };
                        dispatch(isa, s_rows);
                        let f = GFactors::of(&c, &sv, gb, dv);
                        ahead.step();
                        f.scale_phi_grads(isa, &mut gphi, mp, rows, &am[h]);
                        f.dbank(isa, &blk.phi, mp, m, rows, &mut sphi, &mut d32, w, false);
                    }
                    ahead.step();
                    add_into_f64(isa, &mut d64, &d32);
                    ahead.step();
                    dbeta += blk.backward(map, &gphi, rows);
                    ahead.step();
                    let t0 = a - segs[s].0;
                    bq.produce(t0 * d, rows * d, |x| blk.input_grads(map, rows, x));
                    a = b;
                }
            });
            (h, d64, dbeta)
        })
        .collect();
    let mut dbanks = vec![vec![0.0f64; m * w]; heads];
    for (h, bank, _) in &qres {
        dbanks[*h].iter_mut().zip(bank).for_each(|(a, b)| *a += b);
    }
    (dbanks, qres.iter().map(|x| x.2).sum())
}

/// Backward, keys' side (blocked): `∂ℓ/∂k`, `∂ℓ/∂v` into `dk`, `dvv` from the per-head `d𝔅`;
/// returns the keys' share of `∂ℓ/∂beta`. `∂ℓ/∂φ_jf = v_j·dB_f + dA_f`, `∂ℓ/∂v_j = Σ_f φ_jf dB_f`.
#[allow(clippy::too_many_arguments)]
pub fn key_grads(
    map: &SoftMap,
    isa: Isa,
    dbanks: &[Vec<f64>],
    segs: &[(usize, usize)],
    k: Heads,
    uk: &[f32],
    v: Heads,
    dk: &mut [f32],
    dvv: &mut [f32],
) -> f64 {
    let (d, dv, m, w) = (k.cols, v.cols, map.width(), bank_width(v.cols));
    let lp = map.planes.l * map.planes.p;
    let (mp, tb) = (pad16(m), block_rows(m));
    let (dbanks32, dbt, dam) = bank_views(isa, dbanks, m, dv, w);
    let queue = m <= 16;
    let out_k = Out::for_len(isa, dk.len()).queued(queue);
    let out_v = Out::for_len(isa, dvv.len()).queued(queue);
    split_out(dk, k.n, d, segs)
        .into_par_iter()
        .zip(split_out(dvv, k.n, dv, segs).into_par_iter())
        .map(|((h, s, dkp), (_, _, dvp))| {
            let mut blk = Block::new(map, isa);
            let mut gphi = ABuf::zeroed(tb * mp);
            let db = &dbanks32[h];
            let (mut a, end, mut dbeta) = (segs[s].0, segs[s].1, 0.0f64);
            out_k.behind(dkp, tb * d, |bk| {
                out_v.behind(dvp, tb * dv, |bv| {
                    while a < end {
                        let b = (a + tb).min(end);
                        let rows = b - a;
                        let vb = rows_of(&v, h, a, b);
                        let next = (b + tb).min(end);
                        let ukb = saved_rows(uk, k.n, lp, h, a, b);
                        let mut ahead = blk.start(map, (&k, ukb), &v, h, (a, b), next);
                        bank_dots(isa, &mut gphi, mp, rows, m, vb, dv, db, w, &dbt[h]);
                        add_rows(isa, &mut gphi, mp, rows, &dam[h]);
                        ahead.step();
                        let t0 = a - segs[s].0;
                        bv.produce(t0 * dv, rows * dv, |x| {
                            if bank16::applies(isa, m) {
                                let r = Read {
                                    a: &blk.phi,
                                    rows,
                                    d: x,
                                    ldd: dv,
                                };
                                bank16::read(isa, m, dv, (db, w), r);
                            } else {
                                let phi = Strided::rows(&blk.phi, mp);
                                gemm(isa, x, dv, rows, dv, m, phi, db, w, 1.0, false)
                            }
                        });
                        ahead.step();
                        dbeta += blk.backward(map, &gphi, rows);
                        ahead.step();
                        bk.produce(t0 * d, rows * d, |x| blk.input_grads(map, rows, x));
                        a = b;
                    }
                })
            });
            dbeta
        })
        .sum()
}

/// Non-causal soft-RACE backward, blocked; writes every entry of `dq`, `dk`, `dv`; returns
/// `∂ℓ/∂beta`. Same contract as [`super::soft_backward_into`] for a non-causal context.
#[allow(clippy::too_many_arguments)]
pub fn backward_into(
    map: &SoftMap,
    isa: Isa,
    ctx: &Ctx,
    q: Heads,
    k: Heads,
    v: Heads,
    o: Heads,
    g: Heads,
    dq: &mut [f32],
    dk: &mut [f32],
    dvv: &mut [f32],
) -> f64 {
    assert!(!ctx.causal, "blocked backward is the non-causal path");
    let _ = o; // not read: see `query_grads`
    let (banks, segs, den) = (&ctx.banks, &ctx.segs, &ctx.den);
    let (uq, uk) = ctx.saved_u(&q, &k, map.planes.l * map.planes.p);
    let (dbanks, dbeta_q) = query_grads(map, isa, banks, segs, den, q, uq, g, dq);
    dbeta_q + key_grads(map, isa, &dbanks, segs, k, uk, v, dk, dvv)
}
