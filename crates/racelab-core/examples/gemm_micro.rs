//! Throughput of `cpu::gemm` on the blocked kernels' shapes (developer tool).
use racelab_core::cpu::gemm::{gemm, Mat, MatMut, Nt, Strided, Tri};
use racelab_core::cpu::simd::{best_supported, Isa};
use std::time::Instant;

fn main() {
    let isa = best_supported();
    // (label, rows, cols, k, transposed A)
    let shapes = [
        ("read m=8", 64, 144, 8, false),
        ("read m=64", 64, 144, 64, false),
        ("bank m=8", 8, 128, 64, true),
        ("bank m=64", 64, 128, 64, true),
        ("proj LP=4->16", 64, 16, 128, false),
        ("gphi m=64", 64, 64, 128, false),
        ("dq LP=4", 64, 128, 4, false),
        ("dq LP=16", 64, 128, 16, false),
    ];
    for (label, rows, cols, k, tr) in shapes {
        let shift: usize = std::env::var("SHIFT")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        // 64-byte aligned storage, then shifted by SHIFT floats.
        fn aligned(len: usize, shift: usize) -> (Vec<f32>, usize) {
            let v = vec![0.0f32; len + 32];
            let off = (16 - (v.as_ptr() as usize / 4) % 16) % 16 + shift;
            (v, off)
        }
        let (mut abuf, ao) = aligned(rows * k, shift);
        let (mut bbuf, bo) = aligned(k * cols, shift);
        let (mut dbuf, d_o) = aligned(rows * cols, shift);
        for i in 0..rows * k {
            abuf[ao + i] = ((i * 7 % 13) as f32) * 0.1 - 0.6;
        }
        for i in 0..k * cols {
            bbuf[bo + i] = ((i * 5 % 11) as f32) * 0.1 - 0.5;
        }
        let a = &abuf[ao..ao + rows * k];
        let b = &bbuf[bo..bo + k * cols];
        let d = &mut dbuf[d_o..d_o + rows * cols];
        let av = if tr {
            Strided::transposed(a, rows)
        } else {
            Strided::rows(a, k)
        };
        // check against a plain loop
        for isa in [Isa::SCALAR, isa] {
            gemm(
                isa,
                MatMut::new(d, rows, cols, cols),
                av,
                Mat::new(b, k, cols, cols),
                1.0,
                false,
            );
            let mut err = 0.0f32;
            for i in 0..rows {
                for j in 0..cols {
                    let want: f32 = (0..k)
                        .map(|kk| a[i * av.rs + kk * av.cs] * b[kk * cols + j])
                        .sum();
                    err = err.max((want - d[i * cols + j]).abs());
                }
            }
            assert!(err < 1e-3, "{label} {isa:?} err {err}");
        }
        let reps = 200_000_000 / (rows * cols * k);
        let t = Instant::now();
        for _ in 0..reps {
            gemm(
                isa,
                MatMut::new(d, rows, cols, cols),
                av,
                Mat::new(b, k, cols, cols),
                1.0,
                true,
            );
        }
        let s = t.elapsed().as_secs_f64();
        let gf = 2.0 * (rows * cols * k * reps) as f64 / s / 1e9;
        println!("{label:16} {gf:7.1} GFLOP/s (one core)");
    }
    // Nt: D = A Bᵀ (label, rows, cols, k).
    for (label, rows, cols, k) in [
        ("nt proj LP=4", 64, 4, 128),
        ("nt proj LP=16", 64, 16, 128),
        ("nt bank m=8", 16, 8, 128),
        ("nt bank m=64", 32, 64, 128),
        ("nt gram 32x32", 32, 32, 128),
    ] {
        // Rows 64-byte aligned, or (SHIFT=n) shifted by n floats, as for the gemm shapes.
        let shift: usize = std::env::var("SHIFT")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let fill = |len: usize, m: usize, c: f32| -> (Vec<f32>, usize) {
            let mut v = vec![0.0f32; len + 32];
            let off = (16 - (v.as_ptr() as usize / 4) % 16) % 16 + shift;
            for i in 0..len {
                v[off + i] = ((i * m % 13) as f32) * 0.1 - c;
            }
            (v, off)
        };
        let ((av, ao), (bv, bo)) = (fill(rows * k, 7, 0.6), fill(cols * k, 5, 0.5));
        let (a, b) = (&av[ao..ao + rows * k], &bv[bo..bo + cols * k]);
        let mut d = vec![0.0f32; rows * cols];
        let reps = 200_000_000 / (rows * cols * k);
        let t = Instant::now();
        for _ in 0..reps {
            Nt {
                tri: Tri::Full,
                d: &mut d,
                ldd: cols,
                rows,
                cols,
                k,
                a,
                lda: k,
                b,
                b2: None,
                ldb: k,
            }
            .run(isa);
            std::hint::black_box(&mut d);
        }
        let s = t.elapsed().as_secs_f64();
        let gf = 2.0 * (rows * cols * k * reps) as f64 / s / 1e9;
        println!("{label:16} {gf:7.1} GFLOP/s (one core)");
    }
}
