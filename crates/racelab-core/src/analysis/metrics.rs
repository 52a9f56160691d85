//! Error metrics between outputs.

/// `max_i |a_i − b_i|`.
pub fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, crate::stats::nan_max)
}

/// `max_i |a_i − b_i| / max(max_i |b_i|, tiny)`: error relative to the reference's scale.
pub fn rel_max_err(a: &[f64], reference: &[f64]) -> f64 {
    let scale = reference
        .iter()
        .map(|x| x.abs())
        .fold(0.0, crate::stats::nan_max)
        .max(f64::MIN_POSITIVE);
    max_abs_diff(a, reference) / scale
}

/// Frobenius norm.
pub fn frob(a: &[f64]) -> f64 {
    a.iter().map(|x| x * x).sum::<f64>().sqrt()
}

/// RMS over rows of the row-difference norm: `sqrt((1/N) Σ_i |a_i − b_i|²)`.
pub fn rms_row_err(a: &[f64], b: &[f64], rows: usize) -> f64 {
    (a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum::<f64>() / rows.max(1) as f64).sqrt()
}
