//! Non-causal forward: keys `𝔅 += Φ_Kᵀ X̂` per block (f32 within a block, f64 across
//! blocks), then queries `Den = Φ_Q A`, `O = (Φ_Q / Den) B` straight into the output rows.
//! A row whose `Den` is below the floor is flagged for [`crate::cpu::recompute`].

use crate::backend::Heads;
use crate::cpu::bank16::{self, Read};
use crate::cpu::features::{FeatureMap, SoftMap};
use crate::cpu::gemm::{gemm, Mat, MatMut, Strided};
use crate::cpu::mem::{ABuf, Ahead, Out};
use crate::cpu::saved::{Buffers, Ctx};
use crate::cpu::simd::{add_into_f64, dispatch, in_frame, Isa, Kernel, Token};
use crate::cpu::soft::banks::{assign_bank, mass_columns, rows_of, saved_pieces, to_f32};
use crate::cpu::soft::block::{block_rows, Block};
use crate::cpu::soft::probs::lanes16;
use crate::cpu::state::{bank_width, plan_segments, split_out, KeyTotals};
use crate::cpu::v16;
use pulp::Simd as _;
use rayon::prelude::*;

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
        let (bank, phi) = (
            MatMut::new(&mut b32, m, dv, w),
            Mat::new(&blk.phi, rows, m, blk.mp),
        );
        assign_bank(isa, bank, phi, Mat::new(vb, rows, dv, dv), true);
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
pub fn read_into(
    map: &SoftMap,
    isa: Isa,
    q: Heads,
    keys: KeyTotals,
    out: QueryOut,
) -> (usize, Vec<(usize, usize)>) {
    let (KeyTotals { banks, dv, floor }, QueryOut { o, den, uq }) = (keys, out);
    let (heads, n, m, w) = (q.heads, q.n, map.width(), bank_width(dv));
    let banks32 = to_f32(banks);
    let am = mass_columns(&banks32, m, w, dv);
    let segs = plan_segments(n, heads);
    let tb = block_rows(m);
    let rule = DenRule {
        scale: map.den_scale(),
        floor,
    };
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
                    let phi = Mat::new(&blk.phi, rows, m, mp);
                    empty += scaled_features(isa, phi, &am[h], rule, &mut sphi, dt);
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
                            gemm(
                                isa,
                                MatMut::new(x, rows, dv, dv),
                                sp,
                                Mat::new(&banks32[h], m, dv, w),
                                1.0,
                                false,
                            );
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

/// The denominator rule of a read: `den_i = Den_i·scale` is saved, and a row whose `Den` is
/// below `floor` ([`crate::shared::recompute::den_floor`]) or not finite is flagged.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DenRule {
    pub scale: f32,
    pub floor: f32,
}

/// Where a non-causal read writes: the outputs `o` (`[heads, n, dv]`), the denominators
/// `den` (`[heads, n]`) and the queries' `u = tanh(Wq)` (`[heads, n, L·P]`, or empty: not
/// saved). All are overwritten.
pub struct QueryOut<'a> {
    pub o: &'a mut [f32],
    pub den: &'a mut [f32],
    pub uq: &'a mut [f32],
}

/// `Den_i = φ_i·A` for the rows of `phi` (`rows × m`, stride `ld`) and the bank's mass
/// column `a`; `den_i = Den_i·scale`, and `sphi_i = φ_i / Den_i` (the stride of `phi`). A row
/// flagged by `rule` gets `den_i = 0` and `sphi_i = 0`, so its output is 0. Returns the number
/// of flagged rows.
pub(crate) fn scaled_features(
    isa: Isa,
    phi: Mat,
    a: &[f32],
    rule: DenRule,
    sphi: &mut [f32],
    den: &mut [f32],
) -> usize {
    let (
        Mat {
            data: phi,
            rows,
            cols: m,
            ld: mp,
        },
        DenRule { scale, floor },
    ) = (phi, rule);
    if mp == 16 {
        assert!(phi.len() >= rows * 16 && sphi.len() >= rows * 16 && den.len() >= rows);
        let task = ScaledRows16 {
            phi,
            a: lanes16(&a[..m]),
            scale,
            sphi,
            den: &mut den[..rows],
            floor,
        };
        return dispatch(isa, task);
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

/// [`scaled_features`] for rows of 16 floats, one source for every ISA ([`v16`]): per row
/// one vector product, a horizontal sum, one division and one scaled store (as a plain loop
/// the compiler made it scalar code, 4× slower).
struct ScaledRows16<'a> {
    phi: &'a [f32],
    a: [f32; 16],
    scale: f32,
    sphi: &'a mut [f32],
    /// One entry per row.
    den: &'a mut [f32],
    floor: f32,
}

impl Kernel for ScaledRows16<'_> {
    type Output = usize;
    #[inline(always)]
    fn run<T: Token>(self, t: T) -> usize {
        let simd = t.w16();
        let av = v16::load(simd, &self.a, 0);
        let mut empty = 0;
        for (i, de) in self.den.iter_mut().enumerate() {
            let row = v16::load(simd, self.phi, i * 16);
            let d = simd.reduce_sum_f32s(simd.mul_f32s(row, av));
            let c = den_factor(d, self.scale, de, &mut empty, self.floor);
            let out = simd.mul_f32s(row, simd.splat_f32s(c));
            v16::store(simd, self.sphi, i * 16, out);
        }
        empty
    }
}

/// `o_i = Num_i / Den_i` from the `[Num | Den]` rows of `acc` (`dv + 1` columns) into `o`
/// (stride `dv`), and `den_i = Den_i·scale`; a row flagged by `rule` (see
/// [`crate::cpu::saved::finish_row`]) is written as 0 and counted.
pub(crate) fn normalise(
    isa: Isa,
    acc: Mat,
    rule: DenRule,
    o: &mut [f32],
    den: &mut [f32],
) -> usize {
    let (
        Mat {
            data: acc,
            rows,
            cols,
            ld: w,
        },
        DenRule { scale, floor },
    ) = (acc, rule);
    let dv = cols - 1;
    in_frame(
        isa,
        #[inline(always)]
        || {
            // A plain loop: as `(0..rows).filter(..).count()` the body was compiled outside the
            // frame, as SSE code in an uninlined `Filter::count` (9% of the causal (2, 2)
            // time in cache).
            let mut empty = 0;
            for (i, de) in den[..rows].iter_mut().enumerate() {
                crate::cpu::mem::drip();
                let out = &mut o[i * dv..(i + 1) * dv];
                let acc = &acc[i * w..i * w + dv + 1];
                empty += crate::cpu::saved::finish_row(acc, out, de, scale, floor) as usize;
            }
            empty
        },
    )
}

/// Non-causal soft-RACE forward, blocked. Same contract as [`crate::cpu::soft_forward_into`]
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
    let mut bufs = reuse.recycle(map, &q, &k);
    let banks = key_banks(map, isa, k, v, &mut bufs.uk);
    let floor = crate::shared::recompute::den_floor(map.width(), k.n);
    read_ctx(map, isa, q, (banks, v.cols), o, bufs, floor)
}

/// [`read_into`] with the `banks` of every key (and the value width `dv`), and the non-causal
/// context it leaves for the backward (`bufs`: `den`, `uq` overwritten; `uk` the keys' saved
/// `u`, or empty): `(flagged rows, context)`.
pub fn read_ctx(
    map: &SoftMap,
    isa: Isa,
    q: Heads,
    (banks, dv): (Vec<Vec<f64>>, usize),
    o: &mut [f32],
    bufs: Buffers,
    floor: f32,
) -> (usize, Ctx) {
    let Buffers {
        mut den,
        mut uq,
        uk,
    } = bufs;
    let keys = KeyTotals {
        banks: &banks,
        dv,
        floor,
    };
    let out = QueryOut {
        o,
        den: &mut den,
        uq: &mut uq,
    };
    let (flagged, segs) = read_into(map, isa, q, keys, out);
    let ctx = Ctx {
        causal: false,
        segs,
        banks,
        den,
        uq,
        uk,
        states: Vec::new(),
        recomputed: Default::default(),
    };
    (flagged, ctx)
}
