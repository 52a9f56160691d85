//! f32 feature maps for the fast path: every estimator here is "features, then sums over
//! keys", `O_i = φ(q_i)ᵀ B / φ(q_i)ᵀ A` with `A = Σ_j φ(k_j)`, `B = Σ_j φ(k_j) v_jᵀ`.
//!
//! - [`SoftMap`]: soft RACE, all L tables concatenated (width `L·R`); the `1/L` of Algorithm 1
//!   cancels in the ratio and is applied to the stored denominator only. Features by the
//!   factorised form `φ_r = Π_p a_p^{b_{r,p}} (1 − a_p)^{1 − b_{r,p}}`, `a_p = σ(2 beta tanh z_p)`.
//! - [`HardMap`]: one-hot `e_{h_l(x)}` per table (zeros are skipped by the engine).
//! - [`LinearMap`]: `elu(x) + 1`.
//! - [`PerformerMap`]: `exp(ωx' − |x'|²/2 − c)/sqrt(m)`, `x' = sqrt(s)·x`; queries take `c` per
//!   row, keys one global `c` (measured by a pre-pass), both cancel in the ratio.

use super::simd::{exp_f32, tanh_f32, Kernel, Simd, Token};
use crate::backend::{Heads, PlanesF32};
use crate::params::MAX_P;
pub(crate) use crate::shared::SoftMap;
use crate::shared::PROJ_F64_BETA;

/// A feature map usable by the fast forward engine.
pub trait FeatureMap: Sync {
    /// Feature width m.
    fn width(&self) -> usize;
    /// Factor applied to the stored denominator (`1/L` for RACE, else 1).
    fn den_scale(&self) -> f32 {
        1.0
    }
    /// `out = φ(x)` (`out.len() == width()`); `key` selects the key-side variant.
    fn features<S: Simd>(&self, simd: S, x: &[f32], key: bool, out: &mut [f32]);
    /// The soft-RACE map, whose flagged rows [`super::recompute`] can finish exactly; other
    /// maps leave them flagged (zero and counted as empty).
    fn as_soft(&self) -> Option<&SoftMap<'_>> {
        None
    }
}

#[inline(always)]
pub fn sigmoid32(t: f32) -> f32 {
    if t >= 0.0 {
        1.0 / (1.0 + exp_f32(-t))
    } else {
        let e = exp_f32(t);
        e / (1.0 + e)
    }
}

/// Per-table soft-feature scratch: projections, tanh values, bit probabilities.
#[derive(Clone, Copy)]
pub struct BitState {
    pub u: [f32; MAX_P],
    pub on: [f32; MAX_P],
    pub off: [f32; MAX_P],
}

/// `(u, σ(2βu), σ(−2βu))` for `u = tanh(w·x)`, all in f64, each rounded once to f32.
#[inline]
pub(crate) fn bit_probs_f64(w: &[f32], x: &[f32], beta: f32) -> (f32, f32, f32) {
    let z: f64 = w.iter().zip(x).map(|(&a, &c)| a as f64 * c as f64).sum();
    let u = z.tanh();
    let t = 2.0 * beta as f64 * u;
    let sig = crate::hashing::sigmoid;
    (u as f32, sig(t) as f32, sig(-t) as f32)
}

/// One table's bit contrasts for the features' backward at large beta:
/// `out[b] = Σ_r ±(Π_{q≠b} f_q(r)) g_r`, where `φ_r = Π_q f_q(r)` (`f_q(r)` is `on[q]` where
/// bit `q` of `r`, most significant first, is set, else `off[q]`) and the sign is `+` where
/// bit `b` is set. Then `∂ℓ/∂t_b = on_b off_b out[b]` for `t_b = 2β u_b`, and the `c_b` of the
/// backward is `Σ_r ±φ_r (g_r − ḡ) = 2 on_b off_b out[b]` exactly. The right side keeps every
/// digit where the left cannot: when a table is saturated (`φ` one-hot to within
/// `e^{−2β|u|}`), the f32 `g_r − ḡ` of the dominant bucket holds only the rounding of `ḡ`,
/// which `β` then magnifies. Each bit contracts the other axes with `(off_q, on_q)`: fewer
/// than `2R` products. `scratch` holds at least `R` floats.
pub(crate) fn bit_contrast(
    on: &[f32],
    off: &[f32],
    g: &[f32],
    scratch: &mut [f32],
    out: &mut [f32],
) {
    let p = on.len();
    for (b, o) in out.iter_mut().enumerate().take(p) {
        let x = &mut scratch[..g.len()];
        x.copy_from_slice(g);
        let mut len = g.len();
        // Axes from the least significant (q = P−1) up; once bit b is skipped it sits below
        // the axis being contracted, so that axis's stride is 2, else 1.
        for q in (0..p).rev().filter(|&q| q != b) {
            let s = if b > q { 2 } else { 1 };
            for k in 0..len / 2 {
                let (hi, lo) = (k / s, k % s);
                x[k] = off[q] * x[hi * 2 * s + lo] + on[q] * x[hi * 2 * s + s + lo];
            }
            len /= 2;
        }
        *o = x[1] - x[0];
    }
}

impl SoftMap<'_> {
    /// Features of table `l` into `out` (length R); returns the per-bit state for backward.
    #[inline(always)]
    pub fn table<S: Simd>(&self, simd: S, l: usize, x: &[f32], out: &mut [f32]) -> BitState {
        let p = self.planes.p;
        let mut st = BitState {
            u: [0.0; MAX_P],
            on: [0.0; MAX_P],
            off: [0.0; MAX_P],
        };
        for b in 0..p {
            let w = self.planes.row(l, b);
            if self.beta >= PROJ_F64_BETA {
                (st.u[b], st.on[b], st.off[b]) = bit_probs_f64(w, x, self.beta);
                continue;
            }
            let u = tanh_f32(simd.dot(w, x));
            let t = 2.0 * self.beta * u;
            st.u[b] = u;
            st.on[b] = sigmoid32(t);
            st.off[b] = sigmoid32(-t);
        }
        out[0] = 1.0;
        let mut len = 1;
        for b in 0..p {
            for i in (0..len).rev() {
                let parent = out[i];
                out[2 * i] = parent * st.off[b];
                out[2 * i + 1] = parent * st.on[b];
            }
            len *= 2;
        }
        st
    }
}

impl FeatureMap for SoftMap<'_> {
    fn as_soft(&self) -> Option<&SoftMap<'_>> {
        Some(self)
    }
    fn width(&self) -> usize {
        self.planes.l * self.planes.r()
    }
    fn den_scale(&self) -> f32 {
        1.0 / self.planes.l as f32
    }
    #[inline(always)]
    fn features<S: Simd>(&self, simd: S, x: &[f32], _key: bool, out: &mut [f32]) {
        let r = self.planes.r();
        for l in 0..self.planes.l {
            self.table(simd, l, x, &mut out[l * r..(l + 1) * r]);
        }
    }
}

/// Hard-LSH one-hot features.
pub struct HardMap<'a> {
    pub planes: &'a PlanesF32,
}

impl FeatureMap for HardMap<'_> {
    fn width(&self) -> usize {
        self.planes.l * self.planes.r()
    }
    fn den_scale(&self) -> f32 {
        1.0 / self.planes.l as f32
    }
    #[inline(always)]
    fn features<S: Simd>(&self, simd: S, x: &[f32], _key: bool, out: &mut [f32]) {
        let r = self.planes.r();
        out.iter_mut().for_each(|o| *o = 0.0);
        for l in 0..self.planes.l {
            let mut code = 0usize;
            for b in 0..self.planes.p {
                code = (code << 1) | (simd.dot(self.planes.row(l, b), x) >= 0.0) as usize;
            }
            out[l * r + code] = 1.0;
        }
    }
}

/// Linear attention, `φ = elu + 1`.
pub struct LinearMap {
    pub d: usize,
}

impl FeatureMap for LinearMap {
    fn width(&self) -> usize {
        self.d
    }
    #[inline(always)]
    fn features<S: Simd>(&self, _simd: S, x: &[f32], _key: bool, out: &mut [f32]) {
        for (o, &t) in out.iter_mut().zip(x) {
            *o = if t > 0.0 { t + 1.0 } else { t.exp() };
        }
    }
}

/// Performer FAVOR+ positive random features.
pub struct PerformerMap {
    pub omega: Vec<f32>,
    pub m: usize,
    pub d: usize,
    /// `sqrt(scale)`, applied to inputs.
    pub root_scale: f32,
    /// The global exponent shift for keys (max over keys of the log-features).
    pub key_shift: f32,
}

impl PerformerMap {
    /// Log-features `ωx' − |x'|²/2` into `out`.
    #[inline(always)]
    pub fn logits<S: Simd>(&self, simd: S, x: &[f32], out: &mut [f32]) {
        let sq = simd.dot(x, x) * self.root_scale * self.root_scale * 0.5;
        for (f, o) in out.iter_mut().enumerate() {
            *o = simd.dot(&self.omega[f * self.d..(f + 1) * self.d], x) * self.root_scale - sq;
        }
    }
}

impl FeatureMap for PerformerMap {
    fn width(&self) -> usize {
        self.m
    }
    #[inline(always)]
    fn features<S: Simd>(&self, simd: S, x: &[f32], key: bool, out: &mut [f32]) {
        self.logits(simd, x, out);
        let shift = if key {
            self.key_shift
        } else {
            out.iter().cloned().fold(f32::NEG_INFINITY, f32::max)
        };
        let norm = 1.0 / (self.m as f32).sqrt();
        out.iter_mut().for_each(|o| *o = (*o - shift).exp() * norm);
    }
}

struct KeyShiftTask<'a> {
    map: &'a PerformerMap,
    k: Heads<'a>,
}

impl Kernel for KeyShiftTask<'_> {
    type Output = f32;
    #[inline(always)]
    fn run<T: Token>(self, t: T) -> f32 {
        let simd = t.rows();
        let mut buf = vec![0.0f32; self.map.m];
        let mut mx = f32::NEG_INFINITY;
        for h in 0..self.k.heads {
            for j in 0..self.k.n {
                self.map.logits(simd, self.k.row(h, j), &mut buf);
                mx = buf.iter().cloned().fold(mx, f32::max);
            }
        }
        mx
    }
}

/// A Performer map whose key shift is the maximum key log-feature (one pre-pass over keys).
pub fn performer_map(
    omega: Vec<f32>,
    m: usize,
    d: usize,
    scale: f32,
    keys: Heads,
    isa: super::simd::Isa,
) -> PerformerMap {
    let mut map = PerformerMap {
        omega,
        m,
        d,
        root_scale: scale.sqrt(),
        key_shift: 0.0,
    };
    map.key_shift = super::simd::dispatch(isa, KeyShiftTask { map: &map, k: keys });
    map
}
