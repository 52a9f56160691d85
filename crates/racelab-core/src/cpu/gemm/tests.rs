//! The products' unit tests: every tile shape and partial vector at every ISA against the f64 sum.

use crate::cpu::Level;
use super::*;

/// Every ISA's `A Bᵀ` (one- and two-part `B`, full and triangular) matches the f64 sum at
/// whole and partial tiles and at `k` not a multiple of any width, and writes nothing
/// outside the outputs it guarantees.
#[test]
fn nt_matches_its_definition() {
    let isas = [Level::Scalar, Level::Avx2, Level::Avx512].map(Isa::at_most);
    for (rows, cols, k) in [
        (1, 1, 1),
        (7, 4, 128),
        (64, 4, 128),
        (13, 9, 37),
        (5, 16, 5),
    ] {
        let (lda, ldb, ldd) = (k + 3, k + 1, cols + 2);
        let a: Vec<f32> = (0..rows * lda)
            .map(|i| ((i * 7 % 13) as f32) * 0.1 - 0.6)
            .collect();
        let b: Vec<f32> = (0..cols * ldb)
            .map(|i| ((i * 5 % 11) as f32) * 0.1 - 0.5)
            .collect();
        let b2: Vec<f32> = (0..cols * ldb)
            .map(|i| ((i * 3 % 7) as f32) * 0.2 - 0.7)
            .collect();
        for isa in isas {
            for two in [false, true] {
                for tri in [Tri::Full, Tri::Lower, Tri::Upper] {
                    let mut d = vec![f32::NAN; rows * ldd];
                    Nt {
                        tri,
                        d: &mut d,
                        ldd,
                        rows,
                        cols,
                        k,
                        a: &a,
                        lda,
                        b: &b,
                        b2: two.then_some(&b2[..]),
                        ldb,
                    }
                    .run(isa);
                    for i in 0..rows {
                        for j in 0..ldd {
                            let got = d[i * ldd + j];
                            let wanted = match tri {
                                Tri::Full => j < cols,
                                Tri::Lower => j < cols && j <= i,
                                Tri::Upper => j < cols && j >= i,
                            };
                            if j >= cols {
                                assert!(got.is_nan(), "{isa:?} wrote padding ({i},{j})");
                            }
                            if !wanted {
                                continue;
                            }
                            let want: f64 = (0..k)
                                .map(|c| {
                                    let bj = b[j * ldb + c] as f64
                                        + if two { b2[j * ldb + c] as f64 } else { 0.0 };
                                    a[i * lda + c] as f64 * bj
                                })
                                .sum();
                            assert!(
                                (got as f64 - want).abs() <= 1e-5 * (1.0 + want.abs()),
                                "{isa:?} {rows}x{cols}x{k} two={two} {tri:?} ({i},{j}): {got} vs {want}"
                            );
                        }
                    }
                }
            }
        }
    }
}

/// Every ISA's transpose equals the element-by-element definition, at whole and partial
/// 16 × 16 tiles, with strides wider than the matrix, and never writes outside it.
#[test]
fn transpose_matches_its_definition() {
    let isas = [Level::Scalar, Level::Avx2, Level::Avx512].map(Isa::at_most);
    for (rows, cols) in [
        (1, 1),
        (16, 16),
        (64, 64),
        (37, 5),
        (5, 37),
        (128, 9),
        (3, 64),
    ] {
        let (ld, ld_out) = (cols + 3, rows + 5);
        let x: Vec<f32> = (0..rows * ld).map(|i| i as f32 * 0.5 - 7.0).collect();
        for isa in isas {
            let mut out = vec![f32::NAN; cols * ld_out];
            transpose_into(isa, &x, rows, cols, ld, &mut out, ld_out);
            for c in 0..cols {
                for r in 0..ld_out {
                    let got = out[c * ld_out + r];
                    if r < rows {
                        assert_eq!(got, x[r * ld + c], "{isa:?} {rows}x{cols} at ({r},{c})");
                    } else {
                        assert!(
                            got.is_nan(),
                            "{isa:?} {rows}x{cols}: wrote padding ({r},{c})"
                        );
                    }
                }
            }
        }
    }
}
