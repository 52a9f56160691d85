#!/usr/bin/env python3
"""The median of paired NEW/OLD time ratios and its distribution-free 95% interval.

    scripts/pair_summary.py RATIO... [--limit 1.03]

The interval is the one from order statistics (the sign test's): with n ratios sorted,
[x_(k), x_(n+1-k)] holds the population median with probability 1 - 2 P(B <= k-1),
B ~ Binomial(n, 1/2); k is the largest with that coverage >= 95%. Five pairs cannot give
95% (the widest, [min, max], covers 93.75%): it is then printed with its own coverage.
With --limit, also says whether the median is at most the limit (a slowdown bound: "within"
or "over"). Run with --test for the unit checks.
"""
import sys
from math import comb


def median(xs):
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def interval(xs, level=0.95):
    """(lo, hi, coverage): the widest-needed order-statistic interval for the median."""
    s = sorted(xs)
    n = len(s)
    tail = lambda k: sum(comb(n, i) for i in range(k)) / 2**n  # P(B <= k-1)
    k = 1
    while k + 1 <= (n + 1) // 2 and 1 - 2 * tail(k + 1) >= level:
        k += 1
    return s[k - 1], s[n - k], 1 - 2 * tail(k)


def summary(xs, limit=None):
    lo, hi, cov = interval(xs)
    m = median(xs)
    out = f"median new/old {m:.4f}, {100 * cov:.1f}% interval [{lo:.4f}, {hi:.4f}] ({len(xs)} pairs)"
    if limit is not None:
        out += f"; {'within' if m <= limit else 'over'} {limit}"
    return out


def test():
    assert median([3, 1, 2]) == 2 and median([4, 1, 2, 3]) == 2.5
    lo, hi, cov = interval([1.0, 1.1, 0.9, 1.05, 0.95])
    assert (lo, hi) == (0.9, 1.1) and abs(cov - 0.9375) < 1e-12
    lo, hi, cov = interval([1, 2, 3, 4, 5, 6])
    assert (lo, hi) == (1, 6) and abs(cov - 62 / 64) < 1e-12
    # Nine pairs: k = 2 (coverage 1 - 2*10/512 = 0.961), the extremes dropped.
    lo, hi, cov = interval(list(range(1, 10)))
    assert (lo, hi) == (2, 8) and cov >= 0.95
    assert summary([1.02, 1.04, 1.05], 1.03).endswith("over 1.03")
    assert summary([1.0, 1.01, 1.02], 1.03).endswith("within 1.03")
    print("pair_summary: ok")


if __name__ == "__main__":
    args = sys.argv[1:]
    if args == ["--test"]:
        test()
        sys.exit()
    limit = None
    if "--limit" in args:
        i = args.index("--limit")
        limit = float(args[i + 1])
        del args[i : i + 2]
    print(summary([float(a) for a in args], limit))
