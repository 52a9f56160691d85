//! The f64 reference behind the backend contract ([`crate::backend::Backend`]): soft RACE in
//! the log domain ([`super::logdomain`]), exact at any β, on the f32 inputs and planes widened
//! exactly to f64; heads in parallel. Its decoder keeps the state `[B_l | A_l]` in f64 and
//! reads it with the f64 features ([`crate::hashing::soft_features`]).

use super::logdomain::{soft_race_backward_log, soft_race_log};
use crate::backend::{Backend, Decode, Device, Forward, Heads, PlanesF32, RaceParams, SoftGrads};
use crate::error::{RaceError, Result};
use crate::hashing::Planes;
use crate::params::Combine;
use crate::tensor::{check_finite, Mat};
use rayon::prelude::*;

/// The f64 reference as a backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReferenceRace;

fn head(x: &Heads, h: usize) -> Mat<f64> {
    let len = x.n * x.cols;
    Mat::from_vec(
        x.n,
        x.cols,
        x.data[h * len..(h + 1) * len]
            .iter()
            .map(|&a| a as f64)
            .collect(),
    )
}

fn f32s(m: &Mat<f64>) -> Vec<f32> {
    m.data.iter().map(|&x| x as f32).collect()
}

impl Backend for ReferenceRace {
    fn device(&self) -> Device {
        Device::Reference
    }

    fn forward(
        &self,
        params: &RaceParams,
        planes: &PlanesF32,
        q: Heads,
        k: Heads,
        v: Heads,
    ) -> Result<Forward> {
        crate::backend::check(params, planes, &q, &k, &v, None)?;
        let w = planes.to_planes();
        let heads: Vec<_> = (0..q.heads)
            .into_par_iter()
            .map(|h| {
                let (qh, kh, vh) = (head(&q, h), head(&k, h), head(&v, h));
                soft_race_log(
                    qh.view(),
                    kh.view(),
                    vh.view(),
                    &w,
                    params.beta,
                    params.causal,
                    params.combine,
                )
            })
            .collect();
        Ok(Forward {
            o: heads.iter().flat_map(|r| f32s(&r.o)).collect(),
            empty_rows: heads.iter().map(|r| r.empty_rows).sum(),
            recomputed: Default::default(),
        })
    }

    fn forward_backward(
        &self,
        params: &RaceParams,
        planes: &PlanesF32,
        q: Heads,
        k: Heads,
        v: Heads,
        g: Heads,
    ) -> Result<(Forward, SoftGrads)> {
        crate::backend::check(params, planes, &q, &k, &v, Some(&g))?;
        if params.combine != Combine::Paper {
            return Err(RaceError::param(
                "combine",
                format!(
                    "gradients exist for the paper's combine rule only; use {}",
                    crate::error::setting("combine", "paper")
                ),
            ));
        }
        let fwd = self.forward(params, planes, q, k, v)?;
        let w = planes.to_planes();
        let grads: Vec<_> = (0..q.heads)
            .into_par_iter()
            .map(|h| {
                let (qh, kh, vh, gh) = (head(&q, h), head(&k, h), head(&v, h), head(&g, h));
                soft_race_backward_log(
                    qh.view(),
                    kh.view(),
                    vh.view(),
                    gh.view(),
                    &w,
                    params.beta,
                    params.causal,
                )
            })
            .collect();
        let gr = SoftGrads {
            dq: grads.iter().flat_map(|g| f32s(&g.dq)).collect(),
            dk: grads.iter().flat_map(|g| f32s(&g.dk)).collect(),
            dv: grads.iter().flat_map(|g| f32s(&g.dv)).collect(),
            dbeta: grads.iter().map(|g| g.dbeta).sum(),
        };
        Ok((fwd, gr))
    }

    fn decoder(
        &self,
        params: &RaceParams,
        planes: &PlanesF32,
        dv: usize,
    ) -> Result<Box<dyn Decode>> {
        params.validate()?;
        if params.combine != Combine::Paper {
            return Err(RaceError::param(
                "combine",
                format!(
                    "the decoder reads the state by the paper's combine rule; use {}",
                    crate::error::setting("combine", "paper")
                ),
            ));
        }
        if dv == 0 {
            return Err(RaceError::empty("dv", "values need at least one column"));
        }
        crate::backend::decoder_fits(params, dv)?;
        let m = planes.l * planes.r();
        Ok(Box::new(ReferenceDecoder {
            planes: planes.to_planes(),
            beta: params.beta,
            dv,
            a: vec![0.0; m],
            b: vec![0.0; m * dv],
            tokens: 0,
        }))
    }
}

/// Algorithm 2 one token at a time with f64 state and features.
pub struct ReferenceDecoder {
    planes: Planes,
    beta: f64,
    dv: usize,
    a: Vec<f64>,
    b: Vec<f64>,
    tokens: usize,
}

impl ReferenceDecoder {
    fn features(&self, x: &[f32]) -> Vec<f64> {
        let (l, r) = (self.planes.l, self.planes.r());
        let x: Vec<f64> = x.iter().map(|&a| a as f64).collect();
        let mut f = vec![0.0; l * r];
        for (t, out) in f.chunks_mut(r).enumerate() {
            crate::hashing::soft_features(&self.planes, t, &x, self.beta, out);
        }
        f
    }
}

impl Decode for ReferenceDecoder {
    fn step(&mut self, q: &[f32], k: &[f32], v: &[f32]) -> Result<Vec<f32>> {
        let d = self.planes.d;
        if q.len() != d || k.len() != d || v.len() != self.dv {
            return Err(RaceError::shape(
                "q/k/v",
                format!(
                    "decoder expects q and k of length d = {d} and v of length {}, got {}, {} and {}",
                    self.dv,
                    q.len(),
                    k.len(),
                    v.len()
                ),
            ));
        }
        for (name, x) in [("q", q), ("k", k), ("v", v)] {
            check_finite(name, x)?;
        }
        let dv = self.dv;
        for (f, &w) in self.features(k).iter().enumerate() {
            self.a[f] += w;
            for (b, &x) in self.b[f * dv..(f + 1) * dv].iter_mut().zip(v) {
                *b += w * x as f64;
            }
        }
        let fq = self.features(q);
        let den: f64 = fq.iter().zip(&self.a).map(|(f, a)| f * a).sum();
        let mut o = vec![0.0f64; dv];
        for (f, &w) in fq.iter().enumerate() {
            for (x, &b) in o.iter_mut().zip(&self.b[f * dv..(f + 1) * dv]) {
                *x += w * b;
            }
        }
        self.tokens += 1;
        Ok(o.iter()
            .map(|&x| if den > 0.0 { (x / den) as f32 } else { 0.0 })
            .collect())
    }
    fn len(&self) -> usize {
        self.tokens
    }
}
