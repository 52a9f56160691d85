//! Timing loops: medians of timed runs, a warm-up for rows whose buffers are reused, and
//! two modes alternated run by run (so both see the same machine state).

use crate::stats::median;
use std::time::Instant;

/// Untimed runs before a CPU RACE row's timed runs (see the module docs).
pub const WARMUP_RUNS: usize = 1;

/// Time `f` `runs` times; returns (median, all).
pub(super) fn time_runs(runs: usize, mut f: impl FnMut()) -> (f64, Vec<f64>) {
    let mut once = || {
        let t = Instant::now();
        f();
        t.elapsed().as_secs_f64()
    };
    let first = once();
    let mut ts = vec![first];
    ts.extend((1..runs_for(runs, first)).map(|_| once()));
    let all = ts.clone();
    (median(&ts), all)
}

/// Timed runs of a row: at least `runs`, and for a short row as many as make
/// [`SHORT_ROW_SECONDS`] (at most [`MAX_RUNS`]), from the first run's time `first`. The
/// median of three millisecond runs is at the mercy of one interruption: in a quick
/// `racelab reproduce` at its earlier sizes (two heads, d = 64, N ≤ 8192) one
/// such row once took 2.2 ms instead of about 1.1 and turned the fitted exponent of `(2, 2)`
/// from 0.9 into 1.99.
pub(super) fn runs_for(runs: usize, first: f64) -> usize {
    let runs = runs.max(1);
    if first * runs as f64 >= SHORT_ROW_SECONDS {
        return runs;
    }
    ((SHORT_ROW_SECONDS / first.max(1e-9)).ceil() as usize).clamp(runs, MAX_RUNS)
}

/// See `runs_for`.
pub const SHORT_ROW_SECONDS: f64 = 0.25;
/// See `runs_for`.
pub const MAX_RUNS: usize = 101;

/// [`time_runs`] after [`WARMUP_RUNS`] untimed calls of `f`.
pub(super) fn time_runs_warm(runs: usize, mut f: impl FnMut()) -> (f64, Vec<f64>) {
    (0..WARMUP_RUNS).for_each(|_| f());
    time_runs(runs, f)
}

/// `f(false)` and `f(true)` timed alternately `runs` times each (more for a short pair, see
/// [`runs_for`]), after [`WARMUP_RUNS`] untimed calls of both; returns (median, all) for
/// `false`, then for `true`.
pub(super) type Timed = (f64, Vec<f64>);
pub(super) fn time_alternated(runs: usize, mut f: impl FnMut(bool)) -> (Timed, Timed) {
    for _ in 0..WARMUP_RUNS {
        f(false);
        f(true);
    }
    let mut ts = [Vec::new(), Vec::new()];
    let mut pairs = runs.max(1);
    let mut i = 0;
    while i < pairs {
        for (which, t) in ts.iter_mut().enumerate() {
            let t0 = Instant::now();
            f(which == 1);
            t.push(t0.elapsed().as_secs_f64());
        }
        if i == 0 {
            pairs = runs_for(runs, ts[0][0] + ts[1][0]);
        }
        i += 1;
    }
    let [a, b] = ts;
    let (ma, mb) = (median(&a), median(&b));
    ((ma, a), (mb, b))
}
