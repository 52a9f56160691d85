//! The machine's limits, measured in the same run as the kernels: memory bandwidth (a
//! parallel STREAM-style triad) and f32 FMA throughput (independent FMA chains in the
//! dispatched SIMD frame). Also a fast counter-based input filler.

use crate::cpu::simd::Isa;
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
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
fn fma_chains(isa: Isa, iters: usize) -> (f64, f32) {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::cpu::simd::Level;
        use std::arch::x86_64::*;
        #[target_feature(enable = "avx512f")]
        unsafe fn z(iters: usize) -> f32 {
            let (x, y) = (_mm512_set1_ps(0.999_999), _mm512_set1_ps(1e-7));
            let mut a = [_mm512_set1_ps(1.0); CHAINS_512];
            for _ in 0..iters {
                for v in a.iter_mut() {
                    *v = _mm512_fmadd_ps(*v, x, y);
                }
            }
            a.iter().map(|v| _mm512_reduce_add_ps(*v)).sum()
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn y8(iters: usize) -> f32 {
            let (x, y) = (_mm256_set1_ps(0.999_999), _mm256_set1_ps(1e-7));
            let mut a = [_mm256_set1_ps(1.0); CHAINS_256];
            for _ in 0..iters {
                for v in a.iter_mut() {
                    *v = _mm256_fmadd_ps(*v, x, y);
                }
            }
            let mut out = [0.0f32; 8];
            let s = a
                .iter()
                .fold(_mm256_setzero_ps(), |acc, v| _mm256_add_ps(acc, *v));
            // SAFETY: `out` holds the 8 floats one 256-bit store writes.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr(), s) };
            out.iter().sum()
        }
        match isa.level() {
            // SAFETY: each branch runs only for an `Isa` at its level, which only detection
            // creates, after CPUID (`is_x86_feature_detected!`) reported the features the
            // function is compiled for.
            Level::Avx512 => return ((iters * CHAINS_512 * 16 * 2) as f64, unsafe { z(iters) }),
            // SAFETY: as above, an `Isa` at the AVX2 level exists only after detection.
            Level::Avx2 => return ((iters * CHAINS_256 * 8 * 2) as f64, unsafe { y8(iters) }),
            _ => {}
        }
    }
    let mut a = [1.0f32; 10];
    for _ in 0..iters {
        for v in a.iter_mut() {
            *v = *v * 0.999_999 + 1e-7;
        }
    }
    ((iters * 10 * 2) as f64, a.iter().sum())
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

impl crate::cpu::simd::WithSimd for FillTask<'_> {
    type Output = ();
    #[inline(always)]
    fn run<S: crate::cpu::simd::Simd>(self, _simd: S) {
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
