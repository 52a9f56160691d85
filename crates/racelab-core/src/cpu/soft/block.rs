//! The block workspace: a block of [`block_rows`] tokens' projections `Z = X Wᵀ`, features
//! `Φ` (`T × m`) and, in the backward, `∂ℓ/∂Φ → ∂ℓ/∂X = dZ W`, shared by the non-causal and
//! causal passes.

use crate::backend::Heads;
use crate::cpu::features::{FeatureMap, SoftMap};
use crate::cpu::gemm::{gemm, transpose_into, Mat, MatMut, Nt, Strided, Tri};
use crate::cpu::mem::{ABuf, Ahead};
use crate::cpu::simd::{dispatch, in_frame, Isa};
#[cfg(target_arch = "x86_64")]
use crate::cpu::simd::{Kernel, Token};
use crate::cpu::soft::banks::rows_of;
use crate::cpu::soft::probs::{pad16, probs_f64, tree, tree_backward, BitProbs};

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

/// Per-block feature state. The features are computed and read in row layout (one token per
/// row: for `R = 16` a table is one vector). Their backward runs with tokens in lanes (each
/// feature, `∂ℓ/∂φ` and `u` one row of `tp` tokens), where a table's sums over `r` are
/// vertical adds of whole vectors instead of horizontal reductions ([`tree_backward`]);
/// [`transpose_into`] converts (`2m + L·P` floats per token, a quarter of the work it removes
/// at `(4, 4)`).
pub(crate) struct Block {
    pub(crate) isa: Isa,
    pub(crate) lp: usize,
    /// Token capacity, a multiple of 16 (the row length of the token-in-lanes buffers).
    pub(crate) tp: usize,
    pub(crate) z: ABuf,   // tp × LP: projections, then u = tanh(z)
    pub(crate) on: ABuf,  // tp × LP
    pub(crate) off: ABuf, // tp × LP
    /// Features, row stride `mp = pad16(m)` (padding columns stay 0).
    pub(crate) phi: ABuf, // tp × mp
    pub(crate) mp: usize,
    pub(crate) ut: ABuf,   // LP × tp: u, tokens in lanes (backward)
    pub(crate) phit: ABuf, // m × tp: features (backward)
    pub(crate) gt: ABuf,   // m × tp: ∂ℓ/∂φ (backward)
    pub(crate) dzt: ABuf,  // LP × tp: ∂ℓ/∂z
    pub(crate) dz: ABuf,   // tp × LP: ∂ℓ/∂z, tokens in rows (the 16-feature backward)
    /// Whether the last [`Block::backward`] left `∂ℓ/∂z` in `dz` (else in `dzt`).
    pub(crate) dz_rows: bool,
    /// [`tree_backward_rows16`]'s tables, for banks of at most 16 features.
    pub(crate) lanes: Option<Lanes16>,
    pub(crate) rowbuf: ABuf, // 3 × tp: scratch rows of the backward
    /// The planes `W` (`LP × d`), copied to an aligned buffer (full-vector loads).
    pub(crate) w: ABuf,
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
        if map.beta >= crate::shared::PROJ_F64_BETA {
            let (u, on, off) = (&mut self.z, &mut self.on, &mut self.off);
            probs_f64(u, on, off, x, &self.w, (rows, d, lp), map.beta);
            self.tree(map, rows);
            return;
        }
        let z = &mut self.z;
        Nt {
            tri: Tri::Full,
            d: z,
            ldd: lp,
            rows,
            cols: lp,
            k: d,
            a: x,
            lda: d,
            b: &self.w,
            b2: None,
            ldb: d,
        }
        .run(self.isa);
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
            Some(u) if map.beta < crate::shared::PROJ_F64_BETA => {
                self.features_from_u(map, u, rows)
            }
            _ => self.features(map, x, rows),
        }
    }

    /// Start a backward block `a..b` of head `h`: arm the [`Ahead`] drip with the rows
    /// `b..next` of `other` and, unless its `u` is saved, of `x`; then the features of `x`'s
    /// rows (from the saved `u` when given).
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

    #[inline]
    pub(crate) fn probs_and_tree<const TANH: bool>(&mut self, map: &SoftMap, rows: usize) {
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
    #[inline]
    pub(crate) fn tree(&mut self, map: &SoftMap, rows: usize) {
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
        if beta >= crate::shared::PROJ_F64_BETA {
            self.dz_rows = true;
            return self.backward_contrast(map, gphi, rows);
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(lanes) = &self.lanes {
            let (phi, u, dz) = (&self.phi, &self.z, &mut self.dz);
            let task = Rows16 {
                phi,
                gphi,
                u,
                dz,
                rows,
                lanes,
                beta,
            };
            if let Some(db) = dispatch(isa, task) {
                self.dz_rows = true;
                return db;
            }
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

    /// [`Block::backward`] from [`crate::shared::PROJ_F64_BETA`] on, token by token in row
    /// layout: `c_b = 2 on_b off_b Σ_r ±(Π_{q≠b} f_q(r)) g_r`
    /// ([`crate::cpu::features::bit_contrast`]), which keeps the digits that `Σ_r ±φ_r (g_r − ḡ)`
    /// loses to cancellation when a table is saturated. Leaves `∂ℓ/∂z` in `dz`.
    #[inline]
    pub(crate) fn backward_contrast(&mut self, map: &SoftMap, gphi: &[f32], rows: usize) -> f64 {
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
                crate::cpu::features::bit_contrast(on, off, g, &mut scratch, &mut c[..p]);
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
            self.isa,
            MatMut::new(out, rows, d, d),
            dz,
            Mat::new(&self.w, self.lp, d, d),
            1.0,
            false,
        );
    }
}

/// The lane tables of [`tree_backward_rows16`] for one `(P, L)` (built once per [`Block`]):
/// butterfly partners `j ^ 2^s`, bit `b`'s signs (`+1` where bit `b` of the lane's bucket,
/// most significant first, is set), and where `c_b` goes (lane `t·P + b` takes lane `t·R`).
pub(crate) struct Lanes16 {
    pub(crate) p: usize,
    pub(crate) lp: usize,
    pub(crate) xor: [[i32; 16]; 4],
    pub(crate) sign: [[f32; 16]; 4],
    pub(crate) to: [[i32; 16]; 4],
    pub(crate) to_mask: [u16; 4],
}

impl Lanes16 {
    /// The tables for `L` tables of `2^P` buckets, or `None` unless `1 ≤ P ≤ 4`, `L·2^P ≤ 16`.
    pub(crate) fn new(l: usize, p: usize) -> Option<Self> {
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

/// The slices of [`tree_backward_rows16`], as a kernel: `None` below AVX-512 (the caller
/// takes the tokens-in-lanes path).
#[cfg(target_arch = "x86_64")]
struct Rows16<'a> {
    phi: &'a [f32],
    gphi: &'a [f32],
    u: &'a [f32],
    dz: &'a mut [f32],
    rows: usize,
    lanes: &'a Lanes16,
    beta: f32,
}

#[cfg(target_arch = "x86_64")]
impl Kernel for Rows16<'_> {
    type Output = Option<f64>;
    #[inline(always)]
    fn run<T: Token>(self, t: T) -> Option<f64> {
        let v4 = t.v4()?;
        // P a constant of each instance: the butterfly loops unroll and their tables stay in
        // registers.
        Some(match self.lanes.p {
            1 => tree_backward_rows16::<1>(v4, self),
            2 => tree_backward_rows16::<2>(v4, self),
            3 => tree_backward_rows16::<3>(v4, self),
            _ => tree_backward_rows16::<4>(v4, self),
        })
    }
}

/// [`Block::backward`] with one token per 512-bit vector, for banks of at most 16 features
/// (`L·2^P ≤ 16`; row stride 16, padding lanes 0). A table is `R = 2^P` adjacent lanes, so its
/// sums are `P` butterfly steps `x += x[j ^ 2^s]` (each lane ends with its table's sum):
/// `ḡ` from `φ ⊙ g`, then `c_b` from `±(φ ⊙ (g − ḡ))` with bit `b`'s signs, moved by a masked
/// permute to lane `t·P + b` of `∂ℓ/∂z`'s row. `u` (`rows × lp`) in, `∂ℓ/∂z` (`rows × lp`)
/// out; returns Σ `u_b c_b` (f32 per lane over the block, then f64). The intrinsics are
/// methods of the `V4` token; the slices' lengths are checked here: `phi` and `gphi` hold
/// `rows` rows of 16, `u` and `dz` at least `rows·lp` floats, `lp = L·P ≤ 16`, and `P` is
/// the tables' `p`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn tree_backward_rows16<const P: usize>(v4: pulp::x86::V4, slices: Rows16) -> f64 {
    use crate::cpu::extent::assert_holds;
    use std::arch::x86_64::{__m512, __m512i, __mmask16};
    let Rows16 {
        phi,
        gphi,
        u,
        dz,
        rows,
        lanes,
        beta,
    } = slices;
    let f = v4.avx512f;
    let (p, lp) = (P, lanes.lp);
    assert!(
        lp <= 16 && p <= 4 && lanes.p == P,
        "tree_backward_rows16: L·P = {lp} past 16, or P = {} not {P}",
        lanes.p
    );
    assert_holds(phi.len(), rows, 16, 16, 1, "tree_backward_rows16: phi");
    assert_holds(gphi.len(), rows, 16, 16, 1, "tree_backward_rows16: gphi");
    assert_holds(u.len(), rows, lp, lp, 1, "tree_backward_rows16: u");
    assert_holds(dz.len(), rows, lp, lp, 1, "tree_backward_rows16: dz");
    // Each table is 16 lanes: one 512-bit value, by a cast of its array.
    let mut xor: [__m512i; 4] = [pulp::cast([0i32; 16]); 4];
    let mut sign: [__m512; 4] = [f._mm512_setzero_ps(); 4];
    let mut to: [__m512i; 4] = [pulp::cast([0i32; 16]); 4];
    for s in 0..4 {
        xor[s] = pulp::cast(lanes.xor[s]);
        sign[s] = pulp::cast(lanes.sign[s]);
        to[s] = pulp::cast(lanes.to[s]);
    }
    let to_mask = lanes.to_mask;
    let umask: __mmask16 = ((1u32 << lp) - 1) as u16;
    let (bv, one) = (f._mm512_set1_ps(beta), f._mm512_set1_ps(1.0));
    let mut db = f._mm512_setzero_ps();
    for i in 0..rows {
        // SAFETY: row `i < rows` of `phi` and `gphi` is the 16 floats at `16·i`, within the
        // lengths asserted (rows·16 ≤ len).
        let (ph, g) = unsafe {
            (
                f._mm512_loadu_ps(phi.as_ptr().add(i * 16)),
                f._mm512_loadu_ps(gphi.as_ptr().add(i * 16)),
            )
        };
        let mut gbar = f._mm512_mul_ps(ph, g);
        for x in &xor[..p] {
            gbar = f._mm512_add_ps(gbar, f._mm512_permutexvar_ps(*x, gbar));
        }
        let y = f._mm512_mul_ps(ph, f._mm512_sub_ps(g, gbar));
        let mut cv = f._mm512_setzero_ps();
        for b in 0..p {
            let mut cb = f._mm512_mul_ps(y, sign[b]);
            for x in &xor[..p] {
                cb = f._mm512_add_ps(cb, f._mm512_permutexvar_ps(*x, cb));
            }
            cv = f._mm512_mask_permutexvar_ps(cv, to_mask[b], to[b], cb);
        }
        // SAFETY: the `lp ≤ 16` floats at `lp·i` of `u` (masked to them), within the length
        // asserted ((rows − 1)·lp + lp ≤ len).
        let uv = unsafe { f._mm512_maskz_loadu_ps(umask, u.as_ptr().add(i * lp)) };
        let dzv = f._mm512_mul_ps(f._mm512_mul_ps(bv, cv), f._mm512_fnmadd_ps(uv, uv, one));
        // SAFETY: as for `u`, the `lp` floats at `lp·i` of `dz`.
        unsafe { f._mm512_mask_storeu_ps(dz.as_mut_ptr().add(i * lp), umask, dzv) };
        db = f._mm512_fmadd_ps(uv, cv, db);
    }
    let sums: [f32; 16] = pulp::cast(db);
    sums.iter().map(|&x| x as f64).sum()
}
