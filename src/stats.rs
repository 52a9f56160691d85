//! The statistics every experiment and benchmark shares: quantiles, medians, means with
//! their standard errors, and log–log slopes.

/// Quantile `q ∈ [0, 1]` of unsorted data, by linear interpolation between order
/// statistics (`t = q·(n−1)`). NaN for empty data or when any value is not finite: a
/// non-finite value is propagated, never dropped, so it reaches the verdict.
pub fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() || v.iter().any(|x| !x.is_finite()) {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let t = q * (s.len() - 1) as f64;
    let i = t.floor() as usize;
    let j = (i + 1).min(s.len() - 1);
    s[i] + (t - i as f64) * (s[j] - s[i])
}

/// The order statistic `⌊n/2⌋` of `v` (the median for odd `n`, the upper median for even
/// `n`: always a measured value, as a benchmark reports). NaN for empty data.
pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    s[s.len() / 2]
}

/// Mean and standard error of the mean (`s/√n` with the `n − 1` variance; infinite for one
/// value, NaN for none).
pub fn mean_se(x: &[f64]) -> (f64, f64) {
    let n = x.len() as f64;
    if x.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let m = x.iter().sum::<f64>() / n;
    if x.len() < 2 {
        return (m, f64::INFINITY);
    }
    let v = x.iter().map(|y| (y - m).powi(2)).sum::<f64>() / (n - 1.0);
    (m, (v / n).sqrt())
}

/// The largest value; NaN for empty data or when any value is not finite (unlike
/// `fold(.., f64::max)`, which skips NaN).
pub fn max_all(v: impl IntoIterator<Item = f64>) -> f64 {
    let mut m = f64::NAN;
    for (i, x) in v.into_iter().enumerate() {
        if !x.is_finite() {
            return f64::NAN;
        }
        m = if i == 0 { x } else { m.max(x) };
    }
    m
}

/// The smallest value, with the same propagation as [`max_all`].
pub fn min_all(v: impl IntoIterator<Item = f64>) -> f64 {
    -max_all(v.into_iter().map(|x| -x))
}

/// Least-squares slope of `log y` on `log x`. NaN for fewer than two points or when any
/// point is not finite or not positive (a point is never dropped silently).
pub fn loglog_slope(pts: &[(f64, f64)]) -> f64 {
    if pts.len() < 2
        || pts
            .iter()
            .any(|&(x, y)| !(x.is_finite() && y.is_finite() && x > 0.0 && y > 0.0))
    {
        return f64::NAN;
    }
    let n = pts.len() as f64;
    let (sx, sy) = pts
        .iter()
        .fold((0.0, 0.0), |(a, b), (x, y)| (a + x.ln(), b + y.ln()));
    let (mx, my) = (sx / n, sy / n);
    let (num, den) = pts.iter().fold((0.0, 0.0), |(a, b), (x, y)| {
        (a + (x.ln() - mx) * (y.ln() - my), b + (x.ln() - mx).powi(2))
    });
    num / den
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        assert_eq!(quantile(&[3.0, 1.0, 2.0], 0.5), 2.0);
        assert_eq!(quantile(&[0.0, 10.0], 0.25), 2.5);
        assert!(quantile(&[f64::NAN], 0.5).is_nan());
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 3.0);
        assert_eq!(median(&[5.0, 1.0, 3.0]), 3.0);
        let (m, se) = mean_se(&[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(m, 2.5);
        assert!((se - (5.0f64 / 12.0).sqrt()).abs() < 1e-12);
        let pts: Vec<(f64, f64)> = (1..6)
            .map(|i| (i as f64, 3.0 * (i as f64).powf(-1.5)))
            .collect();
        assert!((loglog_slope(&pts) + 1.5).abs() < 1e-12);
    }

    #[test]
    fn non_finite_values_propagate_through_quantiles_folds_and_slopes() {
        assert!(quantile(&[3.0, 1.0, 2.0, f64::NAN], 0.5).is_nan());
        assert!(quantile(&[3.0, f64::INFINITY], 0.0).is_nan());
        assert!(quantile(&[], 0.5).is_nan());
        assert!(max_all([1.0, f64::NAN, 3.0]).is_nan());
        assert!(min_all([1.0, f64::NAN, 3.0]).is_nan());
        assert!(max_all(std::iter::empty()).is_nan());
        assert_eq!(max_all([1.0, 3.0, 2.0]), 3.0);
        assert_eq!(min_all([1.0, 3.0, -2.0]), -2.0);
        assert!(loglog_slope(&[(1.0, 1.0), (2.0, f64::NAN), (4.0, 0.25)]).is_nan());
        assert!(loglog_slope(&[(1.0, 1.0), (2.0, 0.0)]).is_nan());
        assert!(loglog_slope(&[(1.0, 1.0)]).is_nan());
    }
}
