//! Recurrent decoding: the causal soft-RACE state `[B_l | A_l]` per table, one token at a
//! time. `step(q_t, k_t, v_t)` adds `φ(k_t)[v_t, 1]` to the state and reads it with `φ(q_t)`,
//! exactly Algorithm 2's row t (update before read). The state is kept in f64, so a decoder
//! never drifts however long it runs; features are the fast path's f32 features.

use super::features::{FeatureMap, SoftMap};
use super::simd::{detected_isa, dispatch, Isa, Kernel, Token};
use crate::backend::PlanesF32;
use crate::error::{RaceError, Result};
use crate::params::validate_beta;

/// Soft-RACE decoding state for one head.
pub struct Decoder {
    planes: PlanesF32,
    beta: f32,
    dv: usize,
    state: Vec<f64>,
    isa: Isa,
    tokens: usize,
}

struct FeatTask<'a> {
    map: &'a SoftMap<'a>,
    x: &'a [f32],
    out: &'a mut [f32],
}

impl Kernel for FeatTask<'_> {
    type Output = ();
    #[inline(always)]
    fn run<T: Token>(self, t: T) {
        let simd = t.rows();
        self.map.features(simd, self.x, false, self.out)
    }
}

impl Decoder {
    /// A decoder with empty state for values of width `dv`.
    pub fn new(planes: PlanesF32, beta: f32, dv: usize) -> Result<Self> {
        validate_beta(beta as f64)?;
        if dv == 0 {
            return Err(RaceError::empty("dv", "values need at least one column"));
        }
        let m = planes.l * planes.r();
        Ok(Decoder {
            planes,
            beta,
            dv,
            state: vec![0.0; m * (dv + 1)],
            isa: detected_isa(),
            tokens: 0,
        })
    }

    /// Tokens consumed so far.
    pub fn len(&self) -> usize {
        self.tokens
    }

    /// Consume `(q_t, k_t, v_t)` and return `Ô_t`.
    pub fn step(&mut self, q: &[f32], k: &[f32], v: &[f32]) -> Result<Vec<f32>> {
        let d = self.planes.d;
        if q.len() != d || k.len() != d {
            return Err(RaceError::shape(
                "q/k",
                format!(
                    "decoder expects rows of length d = {d}, got q {} and k {}",
                    q.len(),
                    k.len()
                ),
            ));
        }
        if v.len() != self.dv {
            return Err(RaceError::shape(
                "v",
                format!("decoder expects v of length {}, got {}", self.dv, v.len()),
            ));
        }
        crate::tensor::check_finite("q", q)?;
        crate::tensor::check_finite("k", k)?;
        crate::tensor::check_finite("v", v)?;
        let map = SoftMap::new(&self.planes, self.beta)?;
        let m = map.width();
        let w = self.dv + 1;
        let mut phi = vec![0.0f32; m];
        dispatch(
            self.isa,
            FeatTask {
                map: &map,
                x: k,
                out: &mut phi,
            },
        );
        for (f, &p) in phi.iter().enumerate() {
            let row = &mut self.state[f * w..(f + 1) * w];
            for (s, &x) in row.iter_mut().zip(v) {
                *s += p as f64 * x as f64;
            }
            row[self.dv] += p as f64;
        }
        dispatch(
            self.isa,
            FeatTask {
                map: &map,
                x: q,
                out: &mut phi,
            },
        );
        let mut acc = vec![0.0f64; w];
        for (f, &p) in phi.iter().enumerate() {
            for (a, &s) in acc.iter_mut().zip(&self.state[f * w..(f + 1) * w]) {
                *a += p as f64 * s;
            }
        }
        self.tokens += 1;
        let den = acc[self.dv];
        // The features are f32: below the floor the sums are quantised subnormals (see
        // `recompute`), and a recurrent state keeps no keys to recompute the row from.
        if den.is_nan() || den < crate::shared::recompute::den_floor(m, self.tokens) as f64 {
            return Err(RaceError::param(
                "beta",
                format!(
                    "token {}'s denominator ({den:.1e}) is below what f32 features represent \
                     at beta = {}; the decoder keeps no keys to recompute it exactly (the token \
                     was still added to the state): use a smaller beta, or the full forward",
                    self.tokens - 1,
                    self.beta
                ),
            ));
        }
        Ok(acc[..self.dv].iter().map(|a| (a / den) as f32).collect())
    }
}

impl crate::backend::Decode for Decoder {
    fn step(&mut self, q: &[f32], k: &[f32], v: &[f32]) -> Result<Vec<f32>> {
        Decoder::step(self, q, k, v)
    }
    fn len(&self) -> usize {
        Decoder::len(self)
    }
}
