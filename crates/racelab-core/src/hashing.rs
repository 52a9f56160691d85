//! Hash planes, soft RACE features and hard sign codes.
//!
//! Planes: `W^(l) ∈ R^{P×d}`, i.i.d. N(0,1), stored `[L, P, d]` row-major.
//!
//! Corner order: bucket `r = Σ_p b_p 2^(P-1-p)` with `b_p = 1 ⇔ v_{r,p} = +1` (first
//! coordinate most significant, `itertools.product([-1, 1], repeat=P)` order).
//!
//! Soft features (Algorithm 1): `u = tanh(W x)`, `φ(x)_r = softmax_r(beta · uᵀ v_r)`.
//! Because `exp(beta Σ_p u_p v_p) = Π_p exp(beta u_p v_p)`, the R-way softmax factorises:
//!
//! `φ(x)_r = Π_p a_p^{b_{r,p}} (1 − a_p)^{1 − b_{r,p}}`, `a_p = σ(2 beta u_p)`,
//!
//! so [`soft_features`] needs P sigmoids and a product tree, never an exponential over R, and
//! cannot overflow for any beta (see `proofs-notes/phi-factorisation.md`). As beta → ∞,
//! `a_p → 1[w_pᵀx > 0]`: soft RACE tends to hard LSH.
//!
//! Hard codes: `h(x)` = bucket of `sign(W x)` with `sign(0) = +1`.

#![deny(missing_docs)]

use crate::error::{RaceError, Result};
use crate::params::validate_pl;
use crate::params::{Bits, Seed, Tables};
use crate::rng::{stream, SeededRng};

/// The read-only accessors of a set of planes with values of type `$t`: `L`, `P`, `d` and the
/// values `[L, P, d]` (the fields are the crate's, set only by validating constructors).
macro_rules! plane_shape {
    ($t:ty) => {
        /// `L`, the tables.
        pub fn l(&self) -> usize {
            self.l
        }
        /// `P`, the planes (bits) per table.
        pub fn p(&self) -> usize {
            self.p
        }
        /// `d`, the inputs' dimension.
        pub fn d(&self) -> usize {
            self.d
        }
        /// The `L·P·d` values, `[L, P, d]` row-major.
        pub fn w(&self) -> &[$t] {
            &self.w
        }
    };
}
pub(crate) use plane_shape;

/// `L` tables of `P` hyperplanes in `R^d`, `[L, P, d]` row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct Planes {
    pub(crate) l: usize,
    pub(crate) p: usize,
    pub(crate) d: usize,
    pub(crate) w: Vec<f64>,
}

impl Planes {
    /// `[L, P, d]` Gaussian planes from the seeded, version-stable generator (stream `PLANES`).
    pub fn gaussian(bits: Bits, tables: Tables, d: usize, seed: Seed) -> Result<Self> {
        let (p, l, seed) = (bits.0, tables.0, seed.0);
        validate_pl(p, l)?;
        if d == 0 {
            return Err(RaceError::empty("d", "planes need d ≥ 1"));
        }
        crate::memory::check_alloc(
            &format!("the planes [L, P, d] = [{l}, {p}, {d}]"),
            l.checked_mul(p).and_then(|x| x.checked_mul(d)),
            8,
            "use a smaller l, p or d",
        )?;
        let mut rng = SeededRng::new(seed, stream::PLANES);
        Ok(Planes {
            l,
            p,
            d,
            w: rng.normals(l * p * d),
        })
    }

    /// Planes from raw `[L, P, d]` data (e.g. an imported `.npy`), validated: `L·P·d` finite
    /// values.
    pub fn from_data(bits: Bits, tables: Tables, d: usize, w: Vec<f64>) -> Result<Self> {
        let (p, l) = (bits.0, tables.0);
        validate_pl(p, l)?;
        if d == 0 {
            return Err(RaceError::empty("planes", "planes have d = 0"));
        }
        if l.checked_mul(p).and_then(|x| x.checked_mul(d)) != Some(w.len()) {
            return Err(RaceError::shape(
                "planes",
                format!("{} values for shape [{l}, {p}, {d}]", w.len()),
            ));
        }
        crate::tensor::check_finite("planes", &w)?;
        Ok(Planes { l, p, d, w })
    }

    plane_shape!(f64);

    /// Number of buckets per table.
    pub fn r(&self) -> usize {
        1 << self.p
    }

    /// The `P × d` block of table `l`.
    pub fn table(&self, l: usize) -> &[f64] {
        &self.w[l * self.p * self.d..(l + 1) * self.p * self.d]
    }

    /// Check that these planes hold `L·P·d` finite values (as every constructor makes them;
    /// checked again because the crate's own code can set the fields) and fit inputs of
    /// dimension `d` and the requested (P, L).
    pub fn check(&self, d: usize, p: usize, l: usize) -> Result<()> {
        let want = self
            .l
            .checked_mul(self.p)
            .and_then(|x| x.checked_mul(self.d));
        if want != Some(self.w.len()) {
            return Err(RaceError::shape(
                "planes",
                format!(
                    "{} values for shape [L, P, d] = [{}, {}, {}]; build planes with \
                     Planes::from_data or Planes::gaussian",
                    self.w.len(),
                    self.l,
                    self.p,
                    self.d
                ),
            ));
        }
        crate::tensor::check_finite("planes", &self.w)?;
        if self.d != d {
            return Err(RaceError::shape(
                "planes",
                format!("planes have d = {} but the inputs have d = {d}", self.d),
            ));
        }
        if self.p != p || self.l != l {
            return Err(RaceError::shape(
                "planes",
                format!(
                    "planes are [L={}, P={}] but {} {} was asked; drop {}/{} or match them",
                    self.l,
                    self.p,
                    crate::error::setting("l", l),
                    crate::error::setting("p", p),
                    crate::error::arg("p"),
                    crate::error::arg("l"),
                ),
            ));
        }
        Ok(())
    }

    /// `z = W^(l) x ∈ R^P`.
    pub fn project(&self, l: usize, x: &[f64], z: &mut [f64]) {
        let w = self.table(l);
        for (p, zp) in z.iter_mut().enumerate() {
            *zp = dot(&w[p * self.d..(p + 1) * self.d], x);
        }
    }
}

/// `aᵀb` (the shorter length).
#[inline]
pub fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Logistic function `σ(t) = 1/(1+e^{-t})`, finite for every finite or infinite t.
#[inline]
pub fn sigmoid(t: f64) -> f64 {
    if t >= 0.0 {
        1.0 / (1.0 + (-t).exp())
    } else {
        let e = t.exp();
        e / (1.0 + e)
    }
}

/// Per-bit probabilities `a_p = σ(2 beta tanh(z_p))` and `1 − a_p = σ(−2 beta tanh(z_p))`,
/// each computed directly so neither loses precision to cancellation.
#[inline]
pub fn bit_probs(z: f64, beta: f64) -> (f64, f64) {
    let t = 2.0 * beta * z.tanh();
    (sigmoid(t), sigmoid(-t))
}

/// Expand per-bit probabilities into the R = 2^P corner probabilities (product tree, first
/// bit most significant). `out.len()` must be `2^a.len()`.
pub fn product_tree(a: &[(f64, f64)], out: &mut [f64]) {
    out[0] = 1.0;
    let mut len = 1;
    for &(on, off) in a {
        // Walk backwards so each parent is read before its children overwrite it.
        for i in (0..len).rev() {
            let parent = out[i];
            out[2 * i] = parent * off;
            out[2 * i + 1] = parent * on;
        }
        len *= 2;
    }
}

/// Soft features `φ_l(x) ∈ Δ^{R−1}` of one vector for table `l`, by the factorised form.
pub fn soft_features(planes: &Planes, l: usize, x: &[f64], beta: f64, out: &mut [f64]) {
    let mut z = vec![0.0; planes.p];
    planes.project(l, x, &mut z);
    let probs: Vec<(f64, f64)> = z.iter().map(|&zp| bit_probs(zp, beta)).collect();
    product_tree(&probs, out);
}

/// Soft features by the literal R-way softmax of `beta · uᵀ v_r` (max-subtracted). Kept only
/// to test the factorised form against; costs `R·P` and exponentials over R.
pub fn soft_features_direct(planes: &Planes, l: usize, x: &[f64], beta: f64, out: &mut [f64]) {
    let p = planes.p;
    let mut z = vec![0.0; p];
    planes.project(l, x, &mut z);
    let u: Vec<f64> = z.iter().map(|v| v.tanh()).collect();
    for (r, o) in out.iter_mut().enumerate() {
        let s: f64 = (0..p)
            .map(|bit| {
                if (r >> (p - 1 - bit)) & 1 == 1 {
                    u[bit]
                } else {
                    -u[bit]
                }
            })
            .sum();
        *o = beta * s;
    }
    let m = out.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let mut total = 0.0;
    for o in out.iter_mut() {
        *o = (*o - m).exp();
        total += *o;
    }
    for o in out.iter_mut() {
        *o /= total;
    }
}

/// Bucket index from projections: `b_p = 1 ⇔ z_p ≥ 0` (sign(0) = +1), first bit MSB.
#[inline]
pub fn bucket_of(z: &[f64]) -> usize {
    z.iter()
        .fold(0usize, |acc, &zp| (acc << 1) | (zp >= 0.0) as usize)
}

/// Hard code `h_l(x)`.
pub fn hard_code(planes: &Planes, l: usize, x: &[f64]) -> usize {
    let mut z = vec![0.0; planes.p];
    planes.project(l, x, &mut z);
    bucket_of(&z)
}

/// Soft features of every row of an `n × d` matrix for every table: `[L, n, R]` row-major.
pub fn soft_feature_bank(planes: &Planes, x: &[f64], n: usize, beta: f64) -> Vec<f64> {
    let r = planes.r();
    let d = planes.d;
    let mut out = vec![0.0; planes.l * n * r];
    for l in 0..planes.l {
        for i in 0..n {
            let o = &mut out[(l * n + i) * r..(l * n + i + 1) * r];
            soft_features(planes, l, &x[i * d..(i + 1) * d], beta, o);
        }
    }
    out
}

/// Hard codes of every row for every table: `[L, n]`.
pub fn hard_code_bank(planes: &Planes, x: &[f64], n: usize) -> Vec<usize> {
    let d = planes.d;
    let mut out = Vec::with_capacity(planes.l * n);
    for l in 0..planes.l {
        for i in 0..n {
            out.push(hard_code(planes, l, &x[i * d..(i + 1) * d]));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Planes whose data is not `L·P·d` long (only the crate can set the fields) are refused by
    /// the check every entry point makes, naming the planes; the same planes made properly
    /// pass, and `from_data` refuses such data, its shape's product wrapping included.
    #[test]
    fn planes_whose_data_is_not_their_shape_are_refused() {
        let good = Planes::gaussian(Bits(2), Tables(3), 4, Seed(1)).unwrap();
        assert!(good.check(4, 2, 3).is_ok());
        for len in [0, 23, 25] {
            let mut bad = good.clone();
            bad.w.truncate(len.min(24));
            bad.w.resize(len, 0.5);
            let e = bad.check(4, 2, 3).unwrap_err();
            assert_eq!(e.arg(), Some("planes"), "{e}");
        }
        // A shape whose product wraps is refused, not compared after wrapping.
        let wrap = Planes {
            l: 1 << 62,
            p: 4,
            d: 1,
            w: vec![],
        };
        assert!(wrap.check(1, 4, 1 << 62).is_err());
        assert!(Planes::from_data(Bits(4), Tables(1 << 62), 1, vec![]).is_err());
        assert!(Planes::from_data(Bits(2), Tables(3), 4, vec![0.5; 23]).is_err());
    }
}
