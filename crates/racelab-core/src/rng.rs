//! Seeded, version-stable random numbers.
//!
//! Every random draw in racelab comes from `ChaCha8Rng` (a fixed, documented stream) and the
//! normal variates from our own Box–Muller transform on its `u64` output, so the numbers do
//! not change when `rand_distr` changes its sampling algorithms. Never `thread_rng`/`StdRng`.

#![deny(missing_docs)]

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A seeded generator of uniform and standard-normal variates.
pub struct SeededRng {
    inner: ChaCha8Rng,
    spare: Option<f64>,
}

impl SeededRng {
    /// A generator for `seed` on sub-stream `stream` (so independent uses of one seed, such
    /// as planes vs. inputs, do not share numbers).
    pub fn new(seed: u64, stream: u64) -> Self {
        let mut inner = ChaCha8Rng::seed_from_u64(seed);
        inner.set_stream(stream);
        SeededRng { inner, spare: None }
    }

    /// Uniform on [0, 1) with 53 random bits.
    pub fn uniform(&mut self) -> f64 {
        (self.inner.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform on (0, 1]: safe for `ln`.
    fn uniform_open0(&mut self) -> f64 {
        ((self.inner.next_u64() >> 11) + 1) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// One N(0,1) variate (Box–Muller, the pair's second value kept for the next call).
    pub fn normal(&mut self) -> f64 {
        if let Some(z) = self.spare.take() {
            return z;
        }
        let u1 = self.uniform_open0();
        let u2 = self.uniform();
        let r = (-2.0 * u1.ln()).sqrt();
        let t = std::f64::consts::TAU * u2;
        self.spare = Some(r * t.sin());
        r * t.cos()
    }

    /// `n` N(0,1) variates.
    pub fn normals(&mut self, n: usize) -> Vec<f64> {
        (0..n).map(|_| self.normal()).collect()
    }

    /// A uniform index in `0..n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.uniform() * n as f64) as usize % n.max(1)
    }
}

/// Stream ids, so that one user seed drives independent draws.
pub mod stream {
    /// Hash planes.
    pub const PLANES: u64 = 1;
    /// Synthetic Q, K, V.
    pub const INPUTS: u64 = 2;
    /// Performer's random features `ω`.
    pub const PERFORMER: u64 = 3;
    /// An experiment's own draws.
    pub const EXPERIMENT: u64 = 4;
}

/// A counter-based N(0,1) value: a pure function of (seed, index), used where inputs must be
/// regenerated chunk by chunk (streaming benchmarks). SplitMix64 finaliser + Box–Muller.
pub fn counter_normal(seed: u64, index: u64) -> f64 {
    fn mix(mut z: u64) -> u64 {
        z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    let a = mix(seed ^ mix(index.wrapping_mul(2)));
    let b = mix(seed ^ mix(index.wrapping_mul(2).wrapping_add(1)));
    let u1 = ((a >> 11) + 1) as f64 / (1u64 << 53) as f64;
    let u2 = (b >> 11) as f64 / (1u64 << 53) as f64;
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}
