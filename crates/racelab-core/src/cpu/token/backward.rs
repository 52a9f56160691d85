//! Soft-RACE backward pass (`proofs-notes/backward.md`), linear in N like the forward.
//!
//! With `G = ∂ℓ/∂Ô`, `g_i = G_i/Den_i`, `h_i = −G_iᵀÔ_i/Den_i`, and the bank rows
//! `[B_f | A_f]`, the extended vector `ĝ_i = [g_i, h_i]` gives
//!
//! - `∂ℓ/∂φ_f(q_i) = [B_f | A_f] · ĝ_i / L`;
//! - `[dB_f | dA_f] = Σ_i φ_f(q_i) ĝ_i / L` (non-causal: over all i; causal: suffix `i ≥ j`);
//! - `∂ℓ/∂φ_f(k_j) = [dB_f | dA_f] · [v_j, 1]`, `∂ℓ/∂v_j = Σ_f φ_f(k_j) dB_f`.
//!
//! Through one table's softmax `φ_r = softmax_r(beta uᵀv_r)`: `c_p = Σ_r φ_r (gφ_r − ḡ) v_{r,p}`
//! with `ḡ = Σ_r φ_r gφ_r`; then `∂ℓ/∂u_p = beta c_p`, `∂ℓ/∂beta += Σ_p u_p c_p`,
//! `∂ℓ/∂z_p = beta c_p (1 − u_p²)`, `∂ℓ/∂x = Σ_p (∂ℓ/∂z_p) W_p`.
//!
//! Causal: a forward-order pass recomputes the prefix state from the stored segment-boundary
//! banks (for `∂ℓ/∂φ(q_t)`), and a reverse pass accumulates the suffix `[dB | dA]` (for keys
//! and values), each with the same two-level f32/f64 accumulation as the forward.

use crate::backend::{BackwardInputs, GradsMut, Heads, SoftGrads};
use crate::cpu::features::{bit_contrast, BitState, FeatureMap, SoftMap};
use crate::shared::PROJ_F64_BETA;
use crate::cpu::saved::{exclusive_scan, Ctx};
use crate::cpu::simd::{dispatch, Isa, Kernel, Simd, Token};
use crate::cpu::state::{bank_width, ext_buffer, split_out, Bank};
use crate::params::MAX_P;
use rayon::prelude::*;

/// Back-propagate `gphi` (one table, length R) through the factorised softmax into `dx`;
/// returns this table's `∂ℓ/∂beta` contribution. `table` is the map and the table's index `l`.
#[inline(always)]
fn table_backward<S: Simd>(
    simd: S,
    (map, l): (&SoftMap, usize),
    st: &BitState,
    phi: &[f32],
    gphi: &[f32],
    scratch: &mut [f32],
    dx: &mut [f32],
) -> f32 {
    let p = map.planes.p;
    if map.beta >= PROJ_F64_BETA {
        // Large beta: the cancellation-free form (see `bit_contrast`).
        let mut c = [0.0f32; MAX_P];
        bit_contrast(&st.on[..p], &st.off[..p], gphi, scratch, &mut c[..p]);
        let mut dbeta = 0.0f32;
        for (b, &cb) in c[..p].iter().enumerate() {
            let (u, cc) = (st.u[b], 2.0 * st.on[b] * st.off[b] * cb);
            dbeta += u * cc;
            simd.axpy(dx, map.beta * cc * (1.0 - u * u), map.planes.row(l, b));
        }
        return dbeta;
    }
    let gbar: f32 = phi.iter().zip(gphi).map(|(a, b)| a * b).sum();
    let mut dbeta = 0.0f32;
    for b in 0..p {
        let shift = p - 1 - b;
        let mut c = 0.0f32;
        for (r, (&ph, &gp)) in phi.iter().zip(gphi).enumerate() {
            let t = ph * (gp - gbar);
            c += if (r >> shift) & 1 == 1 { t } else { -t };
        }
        let u = st.u[b];
        dbeta += u * c;
        let dz = map.beta * c * (1.0 - u * u);
        simd.axpy(dx, dz, map.planes.row(l, b));
    }
    dbeta
}

/// `ĝ_i = [G_i/Den_i, −G_iᵀÔ_i/Den_i]`.
#[inline(always)]
fn g_ext<S: Simd>(simd: S, g: &[f32], o: &[f32], den: f32, out: &mut [f32]) {
    let dv = g.len();
    if den == 0.0 {
        out.iter_mut().for_each(|x| *x = 0.0);
        return;
    }
    let inv = 1.0 / den;
    for (x, &gi) in out[..dv].iter_mut().zip(g) {
        *x = gi * inv;
    }
    out[dv] = -simd.dot(g, o) * inv;
}

/// Queries' side: `∂ℓ/∂q` from a state (fixed bank or prefix), and optionally the query
/// contributions to `[dB | dA]`.
struct QueryGradTask<'a> {
    map: &'a SoftMap<'a>,
    q: Heads<'a>,
    k: Heads<'a>,
    v: Heads<'a>,
    o: Heads<'a>,
    g: Heads<'a>,
    den: &'a [f32],
    h: usize,
    range: (usize, usize),
    /// Non-causal: the fixed total bank (f64); causal: the bank entering the segment.
    base: &'a [f64],
    causal: bool,
    dq: &'a mut [f32],
}

impl Kernel for QueryGradTask<'_> {
    type Output = (Vec<f64>, f64);
    #[inline(always)]
    fn run<T: Token>(self, t: T) -> (Vec<f64>, f64) {
        let simd = t.rows();
        let map = self.map;
        let (r, tables, dv, d) = (map.planes.r(), map.planes.l, self.v.cols, map.planes.d);
        let inv_l = 1.0 / tables as f32;
        let m = map.width();
        let w = bank_width(dv);
        let mut state = Bank::new(m, w, Some(self.base));
        let mut dbank = Bank::new(m, w, None);
        let mut phi_k = vec![0.0f32; m];
        let mut phi = vec![0.0f32; r];
        let mut gphi = vec![0.0f32; r];
        let mut scratch = vec![0.0f32; r];
        let mut ext = ext_buffer(dv);
        let mut gx = vec![0.0f32; bank_width(dv)];
        let mut dbeta = 0.0f64;
        for (t, i) in (self.range.0..self.range.1).enumerate() {
            if self.causal {
                map.features(simd, self.k.row(self.h, i), true, &mut phi_k);
                ext[..dv].copy_from_slice(self.v.row(self.h, i));
                state.add(simd, &phi_k, 1.0, &ext);
            }
            let gi = (self.h * self.q.n) + i;
            g_ext(
                simd,
                self.g.row(self.h, i),
                self.o.row(self.h, i),
                self.den[gi],
                &mut gx,
            );
            let dx = &mut self.dq[t * d..(t + 1) * d];
            let mut db = 0.0f32;
            for l in 0..tables {
                let st = map.table(simd, l, self.q.row(self.h, i), &mut phi);
                for (rr, g) in gphi[..r].iter_mut().enumerate() {
                    *g = state.dot_row(simd, l * r + rr, &gx) * inv_l;
                }
                if !self.causal {
                    for (rr, &p) in phi.iter().enumerate() {
                        if p != 0.0 {
                            let f = l * r + rr;
                            simd.axpy(&mut dbank.local[f * w..(f + 1) * w], p * inv_l, &gx);
                        }
                    }
                }
                db += table_backward(simd, (map, l), &st, &phi, &gphi, &mut scratch, dx);
            }
            dbeta += db as f64;
            if self.causal {
                state.tick();
            } else {
                dbank.tick();
            }
        }
        (
            if self.causal {
                Vec::new()
            } else {
                dbank.total()
            },
            dbeta,
        )
    }
}

/// Keys' side: `∂ℓ/∂k`, `∂ℓ/∂v` from `[dB | dA]` (fixed, or a suffix scanned in reverse).
struct KeyGradTask<'a> {
    map: &'a SoftMap<'a>,
    q: Heads<'a>,
    k: Heads<'a>,
    v: Heads<'a>,
    o: Heads<'a>,
    g: Heads<'a>,
    den: &'a [f32],
    h: usize,
    range: (usize, usize),
    base: &'a [f64],
    causal: bool,
    dk: &'a mut [f32],
    dv: &'a mut [f32],
}

impl Kernel for KeyGradTask<'_> {
    type Output = f64;
    #[inline(always)]
    fn run<T: Token>(self, t: T) -> f64 {
        let simd = t.rows();
        let map = self.map;
        let (r, tables, dv, d) = (map.planes.r(), map.planes.l, self.v.cols, map.planes.d);
        let inv_l = 1.0 / tables as f32;
        let m = map.width();
        let mut dbank = Bank::new(m, bank_width(dv), Some(self.base));
        let mut phi_q = vec![0.0f32; m];
        let mut phi = vec![0.0f32; r];
        let mut gphi = vec![0.0f32; r];
        let mut scratch = vec![0.0f32; r];
        let mut ext = ext_buffer(dv);
        let mut gx = vec![0.0f32; bank_width(dv)];
        let mut dbeta = 0.0f64;
        let (a, b) = self.range;
        // Causal keys see the suffix i ≥ j: walk backwards, adding query j before reading.
        let order: Box<dyn Iterator<Item = usize>> = if self.causal {
            Box::new((a..b).rev())
        } else {
            Box::new(a..b)
        };
        for j in order {
            let t = j - a;
            if self.causal {
                let gi = self.h * self.q.n + j;
                g_ext(
                    simd,
                    self.g.row(self.h, j),
                    self.o.row(self.h, j),
                    self.den[gi],
                    &mut gx,
                );
                map.features(simd, self.q.row(self.h, j), false, &mut phi_q);
                dbank.add(simd, &phi_q, inv_l, &gx);
            }
            ext[..dv].copy_from_slice(self.v.row(self.h, j));
            let dxk = &mut self.dk[t * d..(t + 1) * d];
            let dvj = &mut self.dv[t * dv..(t + 1) * dv];
            let mut db = 0.0f32;
            for l in 0..tables {
                let st = map.table(simd, l, self.k.row(self.h, j), &mut phi);
                for rr in 0..r {
                    let f = l * r + rr;
                    gphi[rr] = dbank.dot_row(simd, f, &ext);
                    if phi[rr] != 0.0 {
                        dbank.axpy_row(simd, dvj, phi[rr], f);
                    }
                }
                db += table_backward(simd, (map, l), &st, &phi, &gphi, &mut scratch, dxk);
            }
            dbeta += db as f64;
            dbank.tick();
        }
        dbeta
    }
}

/// Gradients of soft RACE given the forward context, inputs, output `o` and `g = ∂ℓ/∂o`.
pub fn soft_backward(map: &SoftMap, ctx: &Ctx, x: BackwardInputs, isa: Isa) -> SoftGrads {
    let mut gr = SoftGrads::zeros(x.q, x.k, x.v);
    gr.dbeta = soft_backward_into(map, ctx, x, isa, gr.as_mut());
    gr
}

/// [`soft_backward`] writing into caller buffers (every entry is overwritten); returns `∂ℓ/∂beta`.
pub fn soft_backward_into(
    map: &SoftMap,
    ctx: &Ctx,
    x: BackwardInputs,
    isa: Isa,
    out: GradsMut,
) -> f64 {
    let BackwardInputs { q, v, o, g, .. } = x;
    let GradsMut { dq, dk, dv } = out;
    let (heads, ns, m, w) = (q.heads, ctx.segs.len(), map.width(), bank_width(v.cols));
    let (dbanks, dbeta_q) = query_side(map, ctx, x, isa, dq);
    let dbases: Vec<Vec<f64>> = if ctx.causal {
        let totals: Vec<Vec<f64>> = if ns > 1 {
            (0..heads * ns)
                .into_par_iter()
                .map(|i| {
                    dispatch(
                        isa,
                        SuffixTotalTask {
                            map,
                            q,
                            o,
                            g,
                            den: &ctx.den,
                            h: i / ns,
                            range: ctx.segs[i % ns],
                        },
                    )
                })
                .collect()
        } else {
            vec![vec![0.0; m * w]; heads]
        };
        exclusive_scan(&totals, heads, ns, true)
    } else {
        (0..heads * ns).map(|i| dbanks[i / ns].clone()).collect()
    };
    let dbeta_k = key_side(map, ctx, &dbases, x, isa, (dk, dv));
    dbeta_q + dbeta_k + crate::cpu::recompute::finish_backward(map, ctx, x, GradsMut { dq, dk, dv })
}

/// Queries' side of the backward: `∂ℓ/∂q` (into `dq`), the non-causal per-head `[dB | dA]` totals (empty
/// when causal), and the queries' share of `∂ℓ/∂beta`.
pub fn query_side(
    map: &SoftMap,
    ctx: &Ctx,
    x: BackwardInputs,
    isa: Isa,
    dq: &mut [f32],
) -> (Vec<Vec<f64>>, f64) {
    let BackwardInputs { q, k, v, o, g } = x;
    let (heads, n, d, m, w) = (q.heads, q.n, q.cols, map.width(), bank_width(v.cols));
    let (segs, ns, den) = (&ctx.segs, ctx.segs.len(), &ctx.den);
    dq.iter_mut().for_each(|x| *x = 0.0);
    let pieces = split_out(dq, n, d, segs);
    let res: Vec<(usize, Vec<f64>, f64)> = pieces
        .into_par_iter()
        .map(|(h, s, piece)| {
            let base = if ctx.causal {
                &ctx.banks[h * ns + s]
            } else {
                &ctx.banks[h]
            };
            let (bank, db) = dispatch(
                isa,
                QueryGradTask {
                    map,
                    q,
                    k,
                    v,
                    o,
                    g,
                    den,
                    h,
                    range: segs[s],
                    base,
                    causal: ctx.causal,
                    dq: piece,
                },
            );
            (h, bank, db)
        })
        .collect();
    let mut per_head = vec![vec![0.0f64; if ctx.causal { 0 } else { m * w }]; heads];
    for (h, bank, _) in &res {
        per_head[*h].iter_mut().zip(bank).for_each(|(a, b)| *a += b);
    }
    (per_head, res.iter().map(|x| x.2).sum())
}

/// Keys' side of the backward from the `[dB | dA]` each (head, segment) of `ctx` starts with
/// (`dbases`): `∂ℓ/∂k`, `∂ℓ/∂v` into `dk`, `dvv`; returns the keys' share of `∂ℓ/∂beta`.
/// Non-causal runs never read q, o, g or the context's `den`.
pub fn key_side(
    map: &SoftMap,
    ctx: &Ctx,
    dbases: &[Vec<f64>],
    x: BackwardInputs,
    isa: Isa,
    (dk, dvv): (&mut [f32], &mut [f32]),
) -> f64 {
    let BackwardInputs { q, k, v, o, g } = x;
    let (segs, causal, den) = (&ctx.segs, ctx.causal, &ctx.den[..]);
    let (d, dv, ns) = (k.cols, v.cols, segs.len());
    dk.iter_mut().for_each(|x| *x = 0.0);
    dvv.iter_mut().for_each(|x| *x = 0.0);
    let kp = split_out(dk, k.n, d, segs);
    let vp = split_out(dvv, k.n, dv, segs);
    kp.into_par_iter()
        .zip(vp.into_par_iter())
        .map(|((h, s, dkp), (_, _, dvp))| {
            dispatch(
                isa,
                KeyGradTask {
                    map,
                    q,
                    k,
                    v,
                    o,
                    g,
                    den,
                    h,
                    range: segs[s],
                    base: &dbases[h * ns + s],
                    causal,
                    dk: dkp,
                    dv: dvp,
                },
            )
        })
        .sum::<f64>()
}

/// `Σ_{i in range} φ(q_i) ĝ_i / L` for one head, in f64 (ĝ formed token by token).
struct SuffixTotalTask<'a> {
    map: &'a SoftMap<'a>,
    q: Heads<'a>,
    o: Heads<'a>,
    g: Heads<'a>,
    den: &'a [f32],
    h: usize,
    range: (usize, usize),
}

impl Kernel for SuffixTotalTask<'_> {
    type Output = Vec<f64>;
    #[inline(always)]
    fn run<T: Token>(self, t: T) -> Vec<f64> {
        let simd = t.rows();
        let (m, dv) = (self.map.width(), self.o.cols);
        let inv_l = 1.0 / self.map.planes.l as f32;
        let mut bank = Bank::new(m, bank_width(dv), None);
        let mut phi = vec![0.0f32; m];
        let mut gx = vec![0.0f32; bank_width(dv)];
        for i in self.range.0..self.range.1 {
            g_ext(
                simd,
                self.g.row(self.h, i),
                self.o.row(self.h, i),
                self.den[self.h * self.q.n + i],
                &mut gx,
            );
            self.map
                .features(simd, self.q.row(self.h, i), false, &mut phi);
            bank.add(simd, &phi, inv_l, &gx);
            bank.tick();
        }
        bank.total()
    }
}
