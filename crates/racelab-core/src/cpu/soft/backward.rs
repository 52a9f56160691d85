//! Non-causal backward: queries `∂ℓ/∂Φ_Q = Ĝ 𝔅ᵀ / L` and `d𝔅 += Φ_Qᵀ Ĝ / L` (with
//! `Ĝ = [G/Den, −GᵀÔ/Den]`, `Ô` never read: `GᵀÔ` comes from products this pass forms);
//! keys `∂ℓ/∂Φ_K = X̂ d𝔅ᵀ`, `∂ℓ/∂V = Φ_K dB`; then the features' backward to `dQ`, `dK`, `dβ`.

use crate::backend::{BackwardInputs, GradsMut, Heads};
use crate::cpu::bank16::{self, Read};
use crate::cpu::features::{FeatureMap, SoftMap};
use crate::cpu::gemm::{gemm, Mat, MatMut, Strided};
use crate::cpu::mem::{ABuf, Out};
use crate::cpu::saved::Ctx;
use crate::cpu::simd::{add_into_f64, dispatch, in_frame, Isa, Kernel, Simd, Token};
use crate::cpu::soft::banks::{
    add_rows, assign_bank, bank_dots, bank_views, inv_den, rows_of, saved_rows,
};
use crate::cpu::soft::block::{block_rows, Block};
use crate::cpu::soft::probs::{lanes16, pad16};
use crate::cpu::state::{bank_width, plan_segments, split_out};
use crate::cpu::v16;
use pulp::Simd as _;
use rayon::prelude::*;

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

impl Kernel for RowDots<'_> {
    type Output = ();
    #[inline(always)]
    fn run<T: Token>(self, t: T) {
        let simd = t.rows();
        for (i, o) in self.out.iter_mut().enumerate() {
            let (a, b) = (&self.a[i * self.ld..], &self.b[i * self.ld..]);
            let dot = simd.dot(&a[..self.len], &b[..self.len]);
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

    /// `d𝔅 (=|+=) Φᵀ Ĝ`: `dB_f = Σ_i c_i φ_if g_i`, `dA_f = −Σ_i c_i φ_if s_i`, for the
    /// feature rows `phi` (`rows × m`), into `d32` (`m` rows of stride `w`), through the
    /// scratch `sphi` (`rows × m`, receives `c ⊙ Φ`).
    pub(crate) fn dbank(
        &self,
        isa: Isa,
        phi: Mat,
        sphi: &mut [f32],
        (d32, w): (&mut [f32], usize),
        accumulate: bool,
    ) {
        let (
            Mat {
                data: phi,
                rows,
                cols: m,
                ld: mp,
            },
            dv,
        ) = (phi, self.dv);
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
        gemm(
            isa,
            MatMut::new(d32, m, dv, w),
            sp,
            Mat::new(self.g, rows, dv, dv),
            1.0,
            accumulate,
        );
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

/// [`QueryRows16`] when it applies (feature rows of 16 floats: `mp = 16`),
/// with the mass column `a` (`m ≤ 16` long) zero-padded; `None` otherwise, for the
/// general sequence ([`RowDots`], [`GFactors`]).
fn query_rows16(
    isa: Isa,
    (phi, gphi, sphi, mp): (&[f32], &mut [f32], &mut [f32], usize),
    rows: usize,
    (c, s): (&[f32], &mut [f32]),
    a: &[f32],
) -> Option<[f32; 16]> {
    if mp == 16 {
        assert!(phi.len() >= rows * 16 && gphi.len() >= rows * 16 && sphi.len() >= rows * 16);
        assert!(c.len() >= rows && s.len() >= rows && a.len() <= 16);
        let task = QueryRows16 {
            rows: (phi, gphi, sphi),
            n: rows,
            cs: (c, s),
            a: lanes16(a),
        };
        return Some(dispatch(isa, task));
    }
    None
}

/// The queries' per-row factors in one pass, for rows of 16 floats (banks of at most 16
/// features): with `gphi_i = (g_i·B_f)_f` in, `s_i = c_i Σ_f φ_if gphi_if` into
/// `s`, `∂ℓ/∂φ_if = c_i (gphi_if − s_i A_f)` over `gphi`, `sphi_i = c_i φ_i` (stride 16, for
/// `dB = sphiᵀ G`); returns the masses `dA_f = −Σ_i sphi_if s_i`. The same sums as
/// [`RowDots`], [`GFactors::scale_phi_grads`] and [`GFactors::dbank`]'s scaling and masses,
/// which take four passes over the rows.
///
/// `phi`, `gphi`, `sphi` hold `n` rows of 16, `c` and `s` at least `n` entries. One source
/// for every ISA ([`v16`]).
struct QueryRows16<'a> {
    rows: (&'a [f32], &'a mut [f32], &'a mut [f32]),
    n: usize,
    cs: (&'a [f32], &'a mut [f32]),
    a: [f32; 16],
}

impl Kernel for QueryRows16<'_> {
    type Output = [f32; 16];
    #[inline(always)]
    fn run<T: Token>(self, t: T) -> [f32; 16] {
        let simd = t.w16();
        let QueryRows16 {
            rows: (phi, gphi, sphi),
            n,
            cs: (c, s),
            a,
        } = self;
        let av = v16::load(simd, &a, 0);
        let mut mass = simd.splat_f32s(0.0);
        for i in 0..n {
            let ph = v16::load(simd, phi, i * 16);
            let g = v16::load(simd, gphi, i * 16);
            let ci = c[i];
            let si = ci * simd.reduce_sum_f32s(simd.mul_f32s(ph, g));
            s[i] = si;
            let (cv, sv) = (simd.splat_f32s(ci), simd.splat_f32s(si));
            let gout = simd.mul_f32s(cv, simd.negate_mul_add_e_f32s(sv, av, g));
            v16::store(simd, gphi, i * 16, gout);
            let sp = simd.mul_f32s(ph, cv);
            v16::store(simd, sphi, i * 16, sp);
            mass = simd.negate_mul_add_e_f32s(sp, sv, mass);
        }
        v16::lanes(mass)
    }
}

/// What the queries' backward reads from the forward: the per-head key totals `banks` (f64),
/// the query segments `segs`, the denominators `den` (`[heads, n]`) and the queries' saved
/// `u = tanh(Wq)` (`uq`, `[heads, n, L·P]`, or empty: recomputed from Q).
#[derive(Clone, Copy)]
pub struct QuerySaved<'a> {
    pub banks: &'a [Vec<f64>],
    pub segs: &'a [(usize, usize)],
    pub den: &'a [f32],
    pub uq: &'a [f32],
}

impl<'a> QuerySaved<'a> {
    /// A non-causal context's part for the queries (`uq` empty unless it fits `q`).
    pub fn of(ctx: &'a Ctx, uq: &'a [f32]) -> Self {
        QuerySaved {
            banks: &ctx.banks,
            segs: &ctx.segs,
            den: &ctx.den,
            uq,
        }
    }
}

/// Backward, queries' side (blocked): `∂ℓ/∂q` into `dq` and the per-head `d𝔅 = Σ_i φ(q_i) ĝ_iᵀ/L`
/// (f64); returns `(d𝔅 per head, the queries' share of ∂ℓ/∂beta)`.
///
/// With `c_i = 1/(L·Den_i)` and `s_i = g_i·ô_i`: `∂ℓ/∂φ_if = c_i (g_i·B_f − s_i A_f)`,
/// `dB_f += Σ_i c_i φ_if g_i`, `dA_f −= Σ_i c_i φ_if s_i`. `Ô` is not read: `ô_i = Num_i/Den_i`
/// with `Num_i = Σ_f φ_if B_f`, so `s_i = c_i Σ_f φ_if (g_i·B_f)` from the products
/// `g_i·B_f` that `∂ℓ/∂φ` needs anyway (the same f32 bank as the forward's read). `uq` is
/// the forward's saved `u = tanh(Wq)` (`[heads, n, L·P]`); empty: recomputed from `q`.
pub fn query_grads(
    map: &SoftMap,
    isa: Isa,
    saved: QuerySaved,
    q: Heads,
    g: Heads,
    dq: &mut [f32],
) -> (Vec<Vec<f64>>, f64) {
    let QuerySaved {
        banks,
        segs,
        den,
        uq,
    } = saved;
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
                    let (gm, x) = (
                        MatMut::new(&mut gphi, rows, m, mp),
                        Mat::new(gb, rows, dv, dv),
                    );
                    bank_dots(isa, gm, x, (bank, w), &bt[h]);
                    let rows16 = query_rows16(
                        isa,
                        (&blk.phi, &mut gphi, &mut sphi, mp),
                        rows,
                        (&c, &mut sv),
                        &am[h],
                    );
                    if let Some(mass) = rows16 {
                        ahead.step();
                        let (db, sp) = (
                            MatMut::new(&mut d32, m, dv, w),
                            Mat::new(&sphi, rows, m, 16),
                        );
                        assign_bank(isa, db, sp, Mat::new(gb, rows, dv, dv), false);
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
                        f.dbank(
                            isa,
                            Mat::new(&blk.phi, rows, m, mp),
                            &mut sphi,
                            (&mut d32, w),
                            false,
                        );
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

/// Backward, keys' side (blocked): `∂ℓ/∂k`, `∂ℓ/∂v` into `dk`, `dvv` from the per-head `d𝔅`
/// (`dbanks`) over the key segments `segs`; `uk` is the keys' saved `u = tanh(Wk)` (`[heads,
/// n, L·P]`, or empty: recomputed from `k`). Returns the keys' share of `∂ℓ/∂beta`.
/// `∂ℓ/∂φ_jf = v_j·dB_f + dA_f`, `∂ℓ/∂v_j = Σ_f φ_jf dB_f`.
pub fn key_grads(
    map: &SoftMap,
    isa: Isa,
    (dbanks, segs): (&[Vec<f64>], &[(usize, usize)]),
    (k, uk): (Heads, &[f32]),
    v: Heads,
    (dk, dvv): (&mut [f32], &mut [f32]),
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
                        let (gm, x) = (
                            MatMut::new(&mut gphi, rows, m, mp),
                            Mat::new(vb, rows, dv, dv),
                        );
                        bank_dots(isa, gm, x, (db, w), &dbt[h]);
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
                                gemm(
                                    isa,
                                    MatMut::new(x, rows, dv, dv),
                                    phi,
                                    Mat::new(db, m, dv, w),
                                    1.0,
                                    false,
                                )
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
/// `∂ℓ/∂beta`. Same contract as [`crate::cpu::soft_backward_into`] for a non-causal context.
pub fn backward_into(map: &SoftMap, isa: Isa, ctx: &Ctx, x: BackwardInputs, out: GradsMut) -> f64 {
    let BackwardInputs { q, k, v, o, g } = x;
    let GradsMut { dq, dk, dv: dvv } = out;
    assert!(!ctx.causal, "blocked backward is the non-causal path");
    let _ = o; // not read: see `query_grads`
    let (uq, uk) = ctx.saved_u(&q, &k, map.planes.l * map.planes.p);
    let (dbanks, dbeta_q) = query_grads(map, isa, QuerySaved::of(ctx, uq), q, g, dq);
    // The keys' own segments: `ctx.segs` are the queries', and keys may be more or fewer.
    let kseg = plan_segments(k.n, k.heads);
    dbeta_q + key_grads(map, isa, (&dbanks, &kseg), (k, uk), v, (dk, dvv))
}
