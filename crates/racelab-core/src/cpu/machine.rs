//! The machine's limits, measured in the same run as the kernels: memory bandwidth (a
//! parallel STREAM-style triad) and f32 FMA throughput (independent FMA chains in the
//! dispatched SIMD frame). Also a fast counter-based input filler.

use crate::cpu::simd::{Isa, Kernel, Token};
use rayon::prelude::*;
use std::time::Instant;

/// Triad `a = b + s·c` over three 256 MiB f32 arrays on all threads, in GB/s counting 12 bytes
/// per element (two reads and one write); best of 5 runs each with plain stores (STREAM's
/// convention: the write's read-for-ownership is not counted) and with non-temporal stores
/// (which move exactly those 12 bytes), so the floor uses the most the memory system
/// sustained, whichever way the kernels store.
pub fn bandwidth_gbs() -> f64 {
    let n = 64 << 20;
    let mut a = vec![0.0f32; n];
    let b: Vec<f32> = (0..n).into_par_iter().map(|i| i as f32).collect();
    let c: Vec<f32> = (0..n).into_par_iter().map(|i| (n - i) as f32).collect();
    let chunk = 1 << 16;
    let stream = crate::cpu::mem::Out::for_len(crate::cpu::simd::best_supported(), n);
    let mut best = 0.0f64;
    for nt in [false, true] {
        for _ in 0..5 {
            let t = Instant::now();
            a.par_chunks_mut(chunk)
                .zip(b.par_chunks(chunk))
                .zip(c.par_chunks(chunk))
                .for_each_init(
                    || vec![0.0f32; if nt { 4096 } else { 0 }],
                    |tmp, ((a, b), c)| {
                        if !nt {
                            for i in 0..a.len() {
                                a[i] = b[i] + 0.5 * c[i];
                            }
                            return;
                        }
                        // 16 KiB at a time through L1, then streamed out.
                        for ((a, b), c) in
                            a.chunks_mut(4096).zip(b.chunks(4096)).zip(c.chunks(4096))
                        {
                            let t = &mut tmp[..a.len()];
                            for i in 0..t.len() {
                                t[i] = b[i] + 0.5 * c[i];
                            }
                            stream.write(a, t);
                        }
                        stream.fence();
                    },
                );
            let s = t.elapsed().as_secs_f64();
            best = best.max(12.0 * n as f64 / s / 1e9);
        }
    }
    std::hint::black_box(&a);
    best
}

/// FMA chains of the AVX2 and AVX-512 probes (see [`fma_chains`]).
#[cfg(target_arch = "x86_64")]
const CHAINS_256: usize = 14;
#[cfg(target_arch = "x86_64")]
const CHAINS_512: usize = 24;

/// Independent FMA chains per thread, `iters` rounds; returns (flops, a value to keep the work
/// alive). A core needs latency × pipes FMAs in flight (4–5 cycles × 2 pipes: 8–10); the
/// probe keeps more than that, so that it measures throughput on any current core: 14 on
/// AVX2 (with the two constants, all 16 `ymm` registers) and 24 on AVX-512 (of 32 `zmm`).
/// The intrinsics are methods of the token [`crate::cpu::simd::dispatch`] makes for `isa`.
fn fma_chains(isa: Isa, iters: usize) -> (f64, f32) {
    crate::cpu::simd::dispatch(isa, FmaChains { iters })
}

struct FmaChains {
    iters: usize,
}

impl Kernel for FmaChains {
    type Output = (f64, f32);
    #[inline(always)]
    fn run<T: Token>(self, t: T) -> (f64, f32) {
        let iters = self.iters;
        #[cfg(target_arch = "x86_64")]
        {
            if let Some(v4) = t.v4() {
                let f = v4.avx512f;
                let (x, y) = (f._mm512_set1_ps(0.999_999), f._mm512_set1_ps(1e-7));
                let mut a = [f._mm512_set1_ps(1.0); CHAINS_512];
                for _ in 0..iters {
                    for v in a.iter_mut() {
                        *v = f._mm512_fmadd_ps(*v, x, y);
                    }
                }
                let mut s = 0.0f32;
                for v in a {
                    s += f._mm512_reduce_add_ps(v);
                }
                return ((iters * CHAINS_512 * 16 * 2) as f64, s);
            }
            if let Some(v3) = t.v3() {
                let (avx, fma) = (v3.avx, v3.fma);
                let (x, y) = (avx._mm256_set1_ps(0.999_999), avx._mm256_set1_ps(1e-7));
                let mut a = [avx._mm256_set1_ps(1.0); CHAINS_256];
                for _ in 0..iters {
                    for v in a.iter_mut() {
                        *v = fma._mm256_fmadd_ps(*v, x, y);
                    }
                }
                let mut s = avx._mm256_setzero_ps();
                for v in a {
                    s = avx._mm256_add_ps(s, v);
                }
                let out: [f32; 8] = pulp::cast(s);
                return ((iters * CHAINS_256 * 8 * 2) as f64, out.iter().sum());
            }
        }
        let _ = t;
        let mut a = [1.0f32; 10];
        for _ in 0..iters {
            for v in a.iter_mut() {
                *v = *v * 0.999_999 + 1e-7;
            }
        }
        ((iters * 10 * 2) as f64, a.iter().sum())
    }
}

/// Peak f32 FMA throughput of `isa` on all threads, GFLOP/s (2 flops per lane per FMA), best
/// of 3.
pub fn fma_peak_gflops(isa: Isa) -> f64 {
    let threads = rayon::current_num_threads();
    let iters = 20_000_000;
    let mut best = 0.0f64;
    for _ in 0..3 {
        let t = Instant::now();
        let (flops, s): (f64, f32) = (0..threads)
            .into_par_iter()
            .map(|_| fma_chains(isa, iters))
            .reduce(|| (0.0, 0.0), |a, b| (a.0 + b.0, a.1 + b.1));
        std::hint::black_box(s);
        best = best.max(flops / t.elapsed().as_secs_f64() / 1e9);
    }
    best
}

/// A counter-based value in [−1, 1): a pure function of (seed, index), so any chunk of an
/// input can be regenerated (streaming mode).
#[inline(always)]
pub fn counter_uniform(seed: u64, index: u64) -> f32 {
    let mut z = index.wrapping_add(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    ((z >> 40) as f32) * (2.0 / (1u64 << 24) as f32) - 1.0
}

struct FillTask<'a> {
    out: &'a mut [f32],
    seed: u64,
    base: u64,
}

impl Kernel for FillTask<'_> {
    type Output = ();
    #[inline(always)]
    fn run<T: Token>(self, _t: T) {
        for (i, x) in self.out.iter_mut().enumerate() {
            *x = counter_uniform(self.seed, self.base + i as u64);
        }
    }
}

/// `out[i] = counter_uniform(seed, base + i)`, vectorised in the dispatched SIMD frame.
pub fn fill_run(out: &mut [f32], seed: u64, base: u64) {
    crate::cpu::simd::dispatch(crate::cpu::detected_isa(), FillTask { out, seed, base });
}

/// Fill `buf` with `counter_uniform(seed, offset + i)`, in parallel.
pub fn fill(buf: &mut [f32], seed: u64, offset: u64) {
    buf.par_chunks_mut(1 << 16)
        .enumerate()
        .for_each(|(c, ch)| fill_run(ch, seed, offset + (c << 16) as u64));
}
