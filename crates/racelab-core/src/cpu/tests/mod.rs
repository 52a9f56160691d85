//! Fast f32 kernels against the f64 reference on the same (f32-rounded) inputs and planes.
//!
//! Tolerances: forward relative error ≤ 1e-5 (max |Δ| / max |O_ref|); gradients ≤ 1e-4
//! relative to the largest reference gradient; f64 analytic gradients vs central finite
//! differences ≤ 1e-6 relative. Both ISA twins (scalar and the detected SIMD) are run.
use crate::analysis::metrics::rel_max_err;
use crate::backend::{BackwardInputs, Heads, PlanesF32, SoftGrads};
use crate::cpu::decode::Decoder;
use crate::cpu::simd::Level;
use crate::cpu::{soft_backward, soft_forward, token, HardMap, Isa, LinearMap, SoftMap};
use crate::reference::backward::soft_race_backward;
use crate::reference::baselines::{linear_attention, performer_attention, performer_omega};
use crate::reference::race::{hard_lsh, soft_race};
use crate::rng::SeededRng;
use crate::{Combine, Mat, MatRef, Planes};

mod forward;
mod large_beta;
mod passes;

const FWD_TOL: f64 = 1e-5;
const GRAD_TOL: f64 = 1e-4;

struct Case {
    p: usize,
    l: usize,
    beta: f64,
    d: usize,
    dv: usize,
    n: usize,
    heads: usize,
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            p: 2,
            l: 2,
            beta: 4.0,
            d: 16,
            dv: 8,
            n: 37,
            heads: 2,
        },
        Case {
            p: 3,
            l: 3,
            beta: 1.0,
            d: 8,
            dv: 5,
            n: 1,
            heads: 1,
        },
        Case {
            p: 1,
            l: 1,
            beta: 2.0,
            d: 1,
            dv: 1,
            n: 19,
            heads: 3,
        },
        Case {
            p: 4,
            l: 4,
            beta: 8.0,
            d: 32,
            dv: 16,
            n: 1000,
            heads: 1,
        }, // several segments, flushes
        // One head over several segments: exercises the segment scans in both directions.
        Case {
            p: 2,
            l: 2,
            beta: 2.0,
            d: 8,
            dv: 4,
            n: 700,
            heads: 1,
        },
        // m = 2^11 > 1024: wider than the 1024-float stack buffers of `gemm_ext`'s row sums
        // and `dbank`'s masses (their column-wise fallbacks).
        Case {
            p: 11,
            l: 1,
            beta: 1.0,
            d: 6,
            dv: 3,
            n: 40,
            heads: 1,
        },
        Case {
            p: 2,
            l: 3,
            beta: 0.5,
            d: 64,
            dv: 64,
            n: 300,
            heads: 5,
        },
        // 16 features with no padding lane and P = 4 (the one-vector-per-token paths' widest
        // butterflies), over two blocks of 128 and a partial one.
        Case {
            p: 4,
            l: 1,
            beta: 3.0,
            d: 12,
            dv: 6,
            n: 300,
            heads: 2,
        },
    ]
}

/// Every SIMD level this CPU has (scalar, AVX2, AVX-512 as far as it goes), each once: the
/// AVX2 path most machines take is tested on AVX-512 machines too.
/// Each level is printed as it is taken, and a level the CPU lacks as skipped, by name.
fn isas() -> Vec<Isa> {
    let mut v: Vec<Isa> = Vec::new();
    for level in [Level::Scalar, Level::Avx2, Level::Avx512] {
        let isa = Isa::at_most(level);
        if isa.level() == level {
            println!("level {level:?}: run");
            v.push(isa);
        } else {
            println!("level {level:?}: skipped, this CPU lacks it");
        }
    }
    v
}

#[test]
fn the_kernels_are_tested_at_every_level_the_cpu_has() {
    let best = crate::cpu::simd::best_supported().level();
    let levels: Vec<Level> = isas().iter().map(|i| i.level()).collect();
    let want: Vec<Level> = [Level::Scalar, Level::Avx2, Level::Avx512]
        .into_iter()
        .filter(|&l| l <= best)
        .collect();
    assert_eq!(levels, want);
}

/// f32 data and its exact f64 image.
fn data(len: usize, seed: u64, scale: f64) -> (Vec<f32>, Vec<f64>) {
    let mut rng = SeededRng::new(seed, 7);
    let f: Vec<f32> = (0..len).map(|_| (rng.normal() * scale) as f32).collect();
    let d = f.iter().map(|&x| x as f64).collect();
    (f, d)
}

fn maxabs(x: &[f64]) -> f64 {
    x.iter().map(|v| v.abs()).fold(0.0, f64::max)
}

/// Concatenate a per-head f64 reference over `heads`.
fn per_head(heads: usize, f: impl Fn(usize) -> Vec<f64>) -> Vec<f64> {
    (0..heads).flat_map(f).collect()
}

/// Assert `got` (f32) is within the forward tolerance of `want`, relative to max |want|.
fn assert_fwd(label: &str, got: &[f32], want: &[f64]) {
    let got: Vec<f64> = got.iter().map(|&x| x as f64).collect();
    let err = rel_max_err(&got, want);
    assert!(err <= FWD_TOL, "{label}: rel err {err:.2e}");
}

fn head<'a>(x: &'a [f64], h: usize, n: usize, c: usize) -> MatRef<'a, f64> {
    MatRef::new(n, c, &x[h * n * c..(h + 1) * n * c]).unwrap()
}

/// Random Q, K (scale 0.5), V, G (scale 1) in f32, `[heads, n, ·]`, from seeds `seed..seed+4`.
struct Qkvg {
    dims: (usize, usize, usize, usize),
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
}

impl Qkvg {
    fn new(heads: usize, n: usize, d: usize, dv: usize, seed: u64) -> Self {
        Qkvg {
            dims: (heads, n, d, dv),
            q: data(heads * n * d, seed, 0.5).0,
            k: data(heads * n * d, seed + 1, 0.5).0,
            v: data(heads * n * dv, seed + 2, 1.0).0,
            g: data(heads * n * dv, seed + 3, 1.0).0,
        }
    }
    fn heads(&self) -> (Heads<'_>, Heads<'_>, Heads<'_>, Heads<'_>) {
        let (h, n, d, dv) = self.dims;
        (
            Heads::new(h, n, d, &self.q).unwrap(),
            Heads::new(h, n, d, &self.k).unwrap(),
            Heads::new(h, n, dv, &self.v).unwrap(),
            Heads::new(h, n, dv, &self.g).unwrap(),
        )
    }
}

/// `dq`, `dk`, `dv` of `got` within `tol` of `want`, relative to the largest entry of `want`.
fn assert_grads_close(tag: &str, got: &SoftGrads, want: &SoftGrads, tol: f64) {
    let f64s = |x: &[f32]| x.iter().map(|&v| v as f64).collect::<Vec<f64>>();
    for (name, a, b) in [
        ("dq", &got.dq, &want.dq),
        ("dk", &got.dk, &want.dk),
        ("dv", &got.dv, &want.dv),
    ] {
        let err = rel_max_err(&f64s(a), &f64s(b));
        assert!(err <= tol, "{tag} {name}: rel err {err:.2e}");
    }
}

/// Assert finiteness first, then `max|a − b| ≤ tol`, printing the label and the worst entry.
fn assert_close(label: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{label}: lengths differ");
    if let Some(i) = got.iter().position(|x| !x.is_finite()) {
        panic!("{label}: non-finite output {} at {i}", got[i]);
    }
    let (mut worst, mut at) = (0.0f64, 0);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let d = (g - w).abs();
        if d > worst {
            worst = d;
            at = i;
        }
    }
    assert!(
        worst <= tol,
        "{label}: max |diff| = {worst:.3e} > tol {tol:.1e} at index {at} (got {}, want {})",
        got[at],
        want[at]
    );
}
