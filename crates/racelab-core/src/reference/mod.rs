//! f64 reference estimators: plain, literal, obviously correct. Every fast path is tested
//! against these on the same inputs and planes. Soft RACE has two: the literal bucket sums
//! ([`race`]) and the same estimator in the log domain ([`logdomain`]), exact at any beta;
//! `attend --device reference` uses the latter.
//!
//! Each works on one head (`N × d` queries, `M × d` keys, `M × dv` values); batch and heads
//! are lifted by [`crate::attend::attend()`]. A row whose denominator is exactly 0 (possible for hard
//! LSH and for degenerate angular inputs) is defined as 0 and counted in
//! [`HeadOutput::empty_rows`], never NaN.

#![deny(missing_docs)]
// The references are written as the formulas' index loops (rows i, keys j), which is what
// makes them easy to check against the paper by eye.
#![allow(clippy::needless_range_loop)]

pub mod angular;
pub mod backend;
pub mod backward;
pub mod baselines;
pub mod expected;
pub mod kernels;
pub mod logdomain;
pub mod race;
pub mod softmax;

pub use backend::ReferenceRace;

use crate::tensor::Mat;

/// One head's output plus the number of rows whose denominator was 0 (set to 0).
#[derive(Debug, Clone, PartialEq)]
pub struct HeadOutput {
    /// `O`, `N × dv`.
    pub o: Mat<f64>,
    /// Rows whose denominator was 0 (left 0).
    pub empty_rows: usize,
}

/// `O_i = num_i / den_i`, with rows of `den_i == 0` set to 0 and counted. A subnormal `den_i`
/// (below 2.2e-308, as soft RACE's kernel can be at very large beta) counts as empty too: its
/// terms then carry only a few significant digits (a single key's `num/den` was off from
/// `v` by 2.4e-5), so the ratio is not an answer to trust.
pub fn ratio_rows(num: Mat<f64>, den: &[f64]) -> HeadOutput {
    let mut o = num;
    let mut empty_rows = 0;
    for (i, &dn) in den.iter().enumerate() {
        let row = o.row_mut(i);
        if dn == 0.0 || dn.is_subnormal() {
            empty_rows += 1;
            row.iter_mut().for_each(|x| *x = 0.0);
        } else {
            row.iter_mut().for_each(|x| *x /= dn);
        }
    }
    HeadOutput { o, empty_rows }
}

/// `out += w · x`.
#[inline]
pub fn axpy(out: &mut [f64], w: f64, x: &[f64]) {
    out.iter_mut().zip(x).for_each(|(o, &xi)| *o += w * xi);
}
