//! The statistics every experiment and benchmark shares: quantiles, medians, means with
//! their standard errors, and log–log slopes.

#![deny(missing_docs)]

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

/// `a.max(b)`, but NaN when either is NaN (`f64::max` returns the other one): the fold
/// `xs.fold(0.0, nan_max)` carries a NaN to the result instead of passing over it.
pub fn nan_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

/// `a.min(b)` with the same propagation as [`nan_max`].
pub fn nan_min(a: f64, b: f64) -> f64 {
    -nan_max(-a, -b)
}

/// The index of the largest value; `None` for empty data or when any value is not finite (a
/// non-finite value is never passed over as if it were not there).
pub fn argmax(v: impl IntoIterator<Item = f64>) -> Option<usize> {
    let mut best: Option<(usize, f64)> = None;
    for (i, x) in v.into_iter().enumerate() {
        if !x.is_finite() {
            return None;
        }
        if best.is_none_or(|(_, b)| x > b) {
            best = Some((i, x));
        }
    }
    best.map(|b| b.0)
}

/// The index of the smallest value, with the same propagation as [`argmax`].
pub fn argmin(v: impl IntoIterator<Item = f64>) -> Option<usize> {
    argmax(v.into_iter().map(|x| -x))
}

/// Sort by a float key in the total order (`-NaN < -∞ < … < ∞ < NaN`): a non-finite key is
/// kept and placed, never dropped, and the sort never panics.
pub fn sort_by_float<T>(v: &mut [T], key: impl Fn(&T) -> f64) {
    v.sort_by(|a, b| key(a).total_cmp(&key(b)));
}

/// The smallest and largest value (`(∞, −∞)` for no data); NaN in both where any value is
/// NaN, as [`nan_min`] and [`nan_max`] carry it.
pub fn min_max(v: impl IntoIterator<Item = f64>) -> (f64, f64) {
    v.into_iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
            (nan_min(a, x), nan_max(b, x))
        })
}

/// The item with the smallest key; `None` for no items or when any key is not finite.
pub fn min_by_float<T>(items: impl IntoIterator<Item = T>, key: impl Fn(&T) -> f64) -> Option<T> {
    let items: Vec<T> = items.into_iter().collect();
    let i = argmin(items.iter().map(&key))?;
    items.into_iter().nth(i)
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

    #[test]
    fn the_folds_picks_and_sorts_carry_nan() {
        let xs = [1.0, f64::NAN, 3.0];
        assert!(xs.iter().cloned().fold(0.0, nan_max).is_nan());
        assert!(xs.iter().cloned().fold(f64::INFINITY, nan_min).is_nan());
        assert_eq!([1.0, 3.0, 2.0].iter().cloned().fold(0.0, nan_max), 3.0);
        let (lo, hi) = min_max([2.0, -1.0, 5.0]);
        assert_eq!((lo, hi), (-1.0, 5.0));
        assert!(min_max(xs).0.is_nan());
        assert_eq!(argmax([1.0, 3.0, 2.0]), Some(1));
        assert_eq!(argmin([1.0, 3.0, 0.5]), Some(2));
        assert_eq!(argmax(xs), None);
        assert_eq!(argmax(std::iter::empty()), None);
        assert_eq!(
            min_by_float(vec![(0, 2.0), (1, 1.0)], |x| x.1),
            Some((1, 1.0))
        );
        assert_eq!(min_by_float(vec![(0, 2.0), (1, f64::NAN)], |x| x.1), None);
        let mut v = vec![3.0, f64::NAN, 1.0];
        sort_by_float(&mut v, |&x| x);
        assert_eq!(v[..2], [1.0, 3.0]);
        assert!(v[2].is_nan());
    }
}
