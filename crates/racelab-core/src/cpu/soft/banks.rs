//! Bank helpers shared by the forward and backward passes: the bank `𝔅 = [B | A]` (`m × w`)
//! in f32 views, its transposed value part, the masses `A`, the products with an implicit
//! extension column, and the saved per-token values of the [`crate::cpu::saved::Ctx`].

use crate::backend::Heads;
use crate::cpu::bank16::{self, Mass, Update};
use crate::cpu::gemm::{gemm, transpose_into, Mat, MatMut, Nt, Strided, Tri};
use crate::cpu::mem::ABuf;
use crate::cpu::simd::{in_frame, Isa};
use crate::cpu::soft::probs::pad16;
use crate::cpu::state::split_out;

/// `D[:, :dv] (=|+=) α A V` and `D[:, dv] (=|+=) α A 1` (the extension `X̂ = [V, 1]` without
/// building it): `A` is `rows × k`, `V` is `k × dv`, `D` is `rows × dv` with its column `dv`
/// inside the row stride.
pub(crate) fn gemm_ext(isa: Isa, d: MatMut, a: Strided, v: Mat, alpha: f32, accumulate: bool) {
    let (rows, k, dv, ldd) = (d.rows, v.rows, v.cols, d.ld);
    let d = d.data;
    gemm(isa, MatMut::new(d, rows, dv, ldd), a, v, alpha, accumulate);
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

/// Banks with at most this many feature rows are read by dot products ([`Nt`]); wider
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

/// `out[i][f] = x_i · B_f` (`out`: `rows × m`, stride `mp`) for the rows `x` (`rows × dv`,
/// stride `dv`) and the value part of a bank (`m` rows of stride `w`): through `bt`,
/// [`values_t`] of the same bank, with [`gemm`]'s tiles, or by dot products ([`Nt`]) when `bt`
/// is empty. (The causal passes read a state that changes every sub-block by dot products on
/// its two parts, [`Nt::b2`]: a transposed copy per sub-block costs more than it saves,
/// measured.)
pub(crate) fn bank_dots(isa: Isa, out: MatMut, x: Mat, (bank, w): (&[f32], usize), bt: &[f32]) {
    let MatMut {
        data: out,
        rows,
        cols: m,
        ld: mp,
    } = out;
    let Mat {
        data: x, cols: dv, ..
    } = x;
    if bt.is_empty() {
        Nt {
            tri: Tri::Full,
            d: out,
            ldd: mp,
            rows,
            cols: m,
            k: dv,
            a: x,
            lda: dv,
            b: bank,
            b2: None,
            ldb: w,
        }
        .run(isa);
    } else {
        gemm(
            isa,
            MatMut::new(out, rows, mp, mp),
            Strided::rows(x, dv),
            Mat::new(bt, dv, mp, mp),
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
#[inline]
pub(crate) fn to_f32(banks: &[Vec<f64>]) -> Vec<ABuf> {
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

#[inline]
pub(crate) fn bank_views(isa: Isa, banks: &[Vec<f64>], m: usize, dv: usize, w: usize) -> BankViews {
    let b32 = to_f32(banks);
    let bt = b32.iter().map(|b| values_t(isa, b, m, dv, w)).collect();
    let am = mass_columns(&b32, m, w, dv);
    (b32, bt, am)
}

/// The mass column ([`masses`]) of each f32 bank.
#[inline]
pub(crate) fn mass_columns(b32: &[ABuf], m: usize, w: usize, dv: usize) -> Vec<Vec<f32>> {
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

/// `bank = Φᵀ X` for the feature rows `phi` (`rows × m`, stride `mp`) and the value rows `x`
/// (`rows × dv`, stride `dv`), overwriting the bank's first `dv` columns (`bank`: `m × dv`,
/// stride `w`); with `ones` the mass column `dv` too (`Φᵀ [X | 1]`), else it is left for the
/// caller. [`bank16::assign`] where it applies (`mp` is then 16), else a product with `Φ` read
/// transposed.
#[inline]
pub(crate) fn assign_bank(isa: Isa, bank: MatMut, phi: Mat, x: Mat, ones: bool) {
    let MatMut {
        data: bank,
        rows: m,
        cols: dv,
        ld: w,
    } = bank;
    let (
        Mat {
            data: phi,
            rows,
            ld: mp,
            ..
        },
        x,
    ) = (phi, x.data);
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
    let (d, pt, xm) = (
        MatMut::new(bank, m, dv, w),
        Strided::transposed(phi, mp),
        Mat::new(x, rows, dv, dv),
    );
    if ones {
        gemm_ext(isa, d, pt, xm, 1.0, false);
    } else {
        gemm(isa, d, pt, xm, 1.0, false);
    }
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
