//! Shared test helpers: seeded inputs and labelled closeness checks (the lab's tests use them
//! too, beside their command-line helpers).
#![allow(dead_code)]

use racelab_core::rng::SeededRng;
use racelab_core::{Mat, Tensor};

/// A seeded N(0,1) matrix.
pub fn randn(rows: usize, cols: usize, seed: u64) -> Mat<f64> {
    let mut rng = SeededRng::new(seed, 99);
    Mat::from_vec(rows, cols, rng.normals(rows * cols))
}

/// Seeded `q`, `k` `[n, d]` and `v` `[n, 3]` (seeds 1, 2, 3).
pub fn qkv(n: usize, d: usize) -> (Tensor<f64>, Tensor<f64>, Tensor<f64>) {
    (
        randn_t(&[n, d], 1),
        randn_t(&[n, d], 2),
        randn_t(&[n, 3], 3),
    )
}

/// A new scratch folder `racelab-test-{tag}-{pid}` under the system's temporary folder.
pub fn tmpdir(tag: &str) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("racelab-test-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&p).unwrap();
    p
}

pub fn randn_t(shape: &[usize], seed: u64) -> Tensor<f64> {
    let n = shape.iter().product();
    let mut rng = SeededRng::new(seed, 98);
    Tensor {
        shape: shape.to_vec(),
        data: rng.normals(n),
    }
}

/// Assert finiteness first, then `max|a − b| ≤ tol`, printing the label and the worst entry.
pub fn assert_close(label: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(
        got.len(),
        want.len(),
        "{label}: length {} vs {}",
        got.len(),
        want.len()
    );
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

/// Largest |a − b| over the largest |b| (f32 results; panics on a non-finite entry of `a`).
pub fn rel(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    assert!(a.iter().all(|x| x.is_finite()), "non-finite output");
    let scale = b
        .iter()
        .fold(0.0f64, |m, &x| m.max(x.abs() as f64))
        .max(1e-300);
    let err = a
        .iter()
        .zip(b)
        .fold(0.0f64, |m, (&x, &y)| m.max((x as f64 - y as f64).abs()));
    err / scale
}

/// A proptest configuration with `cases` cases drawn from a fixed seed, so that a run (CI's
/// included) draws the same cases on every machine and a failure reproduces; set
/// `PROPTEST_RNG_SEED` to explore other draws.
pub fn fixed_cases(cases: u32) -> proptest::test_runner::Config {
    use proptest::test_runner::{Config, RngSeed};
    let mut c = Config::with_cases(cases);
    if matches!(c.rng_seed, RngSeed::Random) {
        c.rng_seed = RngSeed::Fixed(0x0005_eed0_7ace);
    }
    c
}
