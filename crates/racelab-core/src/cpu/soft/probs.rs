//! Bit probabilities and the product tree for a block of tokens: `a_p = σ(2β u_p)`,
//! `u = tanh(z)`, as f32 SIMD passes (f64 from β ≥ [`crate::shared::PROJ_F64_BETA`]),
//! then the `R = 2^P` products `φ_r = Π_p a_p^{b_{r,p}}(1−a_p)^{1−b_{r,p}}` and their backward.

use crate::cpu::simd::{exp_f32, tanh_f32, Kernel, Token};

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
/// planes (`lp × d`), in f64 and rounded once ([`crate::cpu::features::bit_probs_f64`]): at
/// [`crate::shared::PROJ_F64_BETA`] and above, `2β` would magnify the f32 roundings of `z`
/// and `u` (absolute errors) into the weights.
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
            (ur[j], onr[j], offr[j]) = crate::cpu::features::bit_probs_f64(wr, xr, beta);
        }
    }
}

/// `u = tanh(z)` (in place; with `TANH = false`, `z` already holds `u`), `on = σ(2·beta·u)`,
/// `off = σ(−2·beta·u)` over a whole block, in the dispatched SIMD frame (the loop is
/// branch-free and vectorises).
pub(crate) struct BitProbs<'a, const TANH: bool> {
    pub(crate) z: &'a mut [f32],
    pub(crate) on: &'a mut [f32],
    pub(crate) off: &'a mut [f32],
    pub(crate) beta: f32,
}

impl<const TANH: bool> Kernel for BitProbs<'_, TANH> {
    type Output = ();
    #[inline(always)]
    fn run<T: Token>(self, _t: T) {
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
                crate::cpu::mem::drip();
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
pub(crate) fn tree<const R: usize, const P: usize>(
    on: &[f32],
    off: &[f32],
    phi: &mut [f32],
    rows: usize,
    l: usize,
    mp: usize,
) {
    for i in 0..rows {
        if i % 4 == 0 {
            crate::cpu::mem::drip();
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
pub(crate) fn tree_backward(
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
            crate::cpu::mem::drip();
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
