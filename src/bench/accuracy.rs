//! Long-sequence accuracy of the production causal f32 kernel (`proofs-notes/long-sums.md`): relative error
//! of the two-level (f32 block, f64 carry) scan against an f64 recurrence at N up to 10^8, beside
//! a naive serial f32 prefix sum (the authors' serial-scan analogue) on the same inputs.
//!
//! Relative error = `max_t |o_t − o_t^{f64}| / max_t |o_t^{f64}|`.

use super::machine::fill;
use crate::backend::Backend;
use crate::backend::{Heads, PlanesF32};
use crate::cpu::CpuRace;
use crate::hashing::{soft_features, Planes};
use crate::params::{Bits, Seed, Tables};
use serde::Serialize;
use std::time::Instant;

/// One accuracy measurement.
#[derive(Debug, Clone, Serialize)]
pub struct AccuracyRow {
    pub n: usize,
    pub d: usize,
    pub dv: usize,
    pub p: usize,
    pub l: usize,
    pub kernel_rel_err: f64,
    pub naive_f32_rel_err: f64,
    pub kernel_seconds: f64,
    pub check_seconds: f64,
}

/// Measure at each N (one head of width `d`, values of width `dv`) with `params` (P, L, β) on
/// planes drawn from `seed`.
pub fn run(
    ns: &[usize],
    [d, dv]: [usize; 2],
    params: &crate::params::RaceParams,
    seed: u64,
    progress: &dyn Fn(&str),
) -> crate::Result<Vec<AccuracyRow>> {
    params.validate()?;
    let (p, l, beta) = (params.p(), params.l(), params.beta());
    let planes32 = PlanesF32::from_planes(&Planes::gaussian(Bits(p), Tables(l), d, Seed(seed))?);
    let planes64 = planes32.to_planes();
    let (r, w) = (1usize << p, dv + 1);
    let m = l * r;
    let mut out = Vec::new();
    for &n in ns {
        progress(&format!("accuracy N = {n}"));
        let mut q = vec![0.0f32; n * d];
        let mut k = vec![0.0f32; n * d];
        let mut v = vec![0.0f32; n * dv];
        fill(&mut q, seed, 0);
        fill(&mut k, seed + 1, 0);
        fill(&mut v, seed + 2, 0);
        let t = Instant::now();
        let fwd = CpuRace::detected().forward(
            &params.with_causal(true),
            &planes32,
            Heads::new(1, n, d, &q)?,
            Heads::new(1, n, d, &k)?,
            Heads::new(1, n, dv, &v)?,
        )?;
        let kernel_seconds = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let mut s64 = vec![0.0f64; m * w];
        let mut s32 = vec![0.0f32; m * w];
        let (mut fq, mut fk) = (vec![0.0f64; m], vec![0.0f64; m]);
        let (mut xq, mut xk) = (vec![0.0f64; d], vec![0.0f64; d]);
        let (mut worst_k, mut worst_n, mut scale) = (0.0f64, 0.0f64, 0.0f64);
        for t_ in 0..n {
            xq.iter_mut()
                .zip(&q[t_ * d..(t_ + 1) * d])
                .for_each(|(a, &b)| *a = b as f64);
            xk.iter_mut()
                .zip(&k[t_ * d..(t_ + 1) * d])
                .for_each(|(a, &b)| *a = b as f64);
            for tb in 0..l {
                soft_features(&planes64, tb, &xq, beta, &mut fq[tb * r..(tb + 1) * r]);
                soft_features(&planes64, tb, &xk, beta, &mut fk[tb * r..(tb + 1) * r]);
            }
            let vt = &v[t_ * dv..(t_ + 1) * dv];
            for f in 0..m {
                let (p64, p32) = (fk[f], fk[f] as f32);
                for c in 0..dv {
                    s64[f * w + c] += p64 * vt[c] as f64;
                    s32[f * w + c] += p32 * vt[c];
                }
                s64[f * w + dv] += p64;
                s32[f * w + dv] += p32;
            }
            let (mut a64, mut a32) = (vec![0.0f64; w], vec![0.0f32; w]);
            for f in 0..m {
                for c in 0..w {
                    a64[c] += fq[f] * s64[f * w + c];
                    a32[c] += fq[f] as f32 * s32[f * w + c];
                }
            }
            for c in 0..dv {
                let o64 = a64[c] / a64[dv];
                let o32 = a32[c] / a32[dv];
                scale = scale.max(o64.abs());
                worst_k = worst_k.max((fwd.o[t_ * dv + c] as f64 - o64).abs());
                worst_n = worst_n.max((o32 as f64 - o64).abs());
            }
        }
        out.push(AccuracyRow {
            n,
            d,
            dv,
            p,
            l,
            kernel_rel_err: worst_k / scale,
            naive_f32_rel_err: worst_n / scale,
            kernel_seconds,
            check_seconds: t.elapsed().as_secs_f64(),
        });
    }
    Ok(out)
}
