#!/usr/bin/env python3
"""Certificate for the four one-variable inequalities behind the per-pair soft-hash bias bound.

proofs-notes/soft-bias.md reduces |g(θ) − κ(θ)| ≤ ε_β(θ), for every θ and every β > 0, to
moments of σ(−2βt) against polynomials in t = tanh x, through four inequalities on x ≥ 0:

  F1(x) = x·exp(−x²/2)·cosh²x ≤ t + 27/32·t³ + 85/32·t⁵      (I, three terms)
  F1(x)                       ≤ t + 27/8·t³                  (I, two terms)
  F2(x) = exp(−x²/2)·cosh²x   ≤ 1 + 33/32·t²                 (J and E₂, two terms)
  F2(x)                       ≤ 1 + 17/32·t² + 9/16·t⁴       (J and E₂, three terms)

Each is G(x) = Σ c_n tanh(x)ⁿ − F(x) ≥ 0, certified on three pieces with Arb's ball
arithmetic (python-flint), every rounding outward:

  [0, a]   Taylor model: the coefficients of G at 0 in exact rationals (fmpq_series): those
           below x^m are exactly 0 and the x^m one is > 0; the remainder's coefficient
           G^(K)(ξ)/K! enclosed over ξ ∈ [0, a] (arb_series at the ball [0, a]); then
           G(x)/x^m = Σ_{k=m}^{K−1} c_k x^{k−m} + R·x^{K−m} is shown > 0 on sub-boxes of [0, a].
  [a, X]   bisection into boxes, each shown > 0 by the mean-value form
           G(mid) − |G'(box)|·radius (G' from a length-2 arb_series at the box).
  [X, ∞)   cosh²x ≤ e^{2x}, so F1 ≤ x·e^{2x−x²/2} and F2 ≤ e^{2x−x²/2}, both decreasing for
           x ≥ 1 + √2; the polynomial in tanh is increasing (c_n ≥ 0); G(X)'s bound > 0 suffices.

Run with python-flint 0.9.0 (`pip install python-flint==0.9.0`):
`python3 proofs-notes/certificates/pair_bias.py` writes pair_bias.json beside it; `--check`
recomputes it and compares with the committed file (exit 1 on any difference; a piece that
cannot be shown positive stops it with an AssertionError). `cargo test` replays the committed
file in independent f64 interval arithmetic (src/bound/certificate.rs).
"""
import json
import sys
from pathlib import Path

from flint import arb, arb_series, ctx, fmpq, fmpq_series

ctx.prec = 160
ctx.cap = 32  # series length
HERE = Path(__file__).resolve().parent
OUT = HERE / "pair_bias.json"

# name, F (1 or 2), polynomial {power: (numerator, denominator)}, order m of G at 0
INEQUALITIES = [
    ("F1_three_terms", 1, {1: (1, 1), 3: (27, 32), 5: (85, 32)}, 3),
    ("F1_two_terms", 1, {1: (1, 1), 3: (27, 8)}, 3),
    ("F2_two_terms", 2, {0: (1, 1), 2: (33, 32)}, 2),
    ("F2_three_terms", 2, {0: (1, 1), 2: (17, 32), 4: (9, 16)}, 2),
]
A = fmpq(1, 8)  # the Taylor piece [0, A]
X = 10  # the tail [X, ∞)
K = 14  # Taylor order


def ops(x, exp):
    """tanh and cosh² from exp, for any of fmpq_series, arb_series, arb."""
    e2 = exp(2 * x)
    tanh = 1 - 2 / (e2 + 1)
    em2 = exp(-2 * x)
    cosh2 = (e2 + 2 + em2) / 4
    return tanh, cosh2


def G(which, poly, x, exp):
    tanh, cosh2 = ops(x, exp)
    p = 0
    for n, (a, b) in poly.items():
        p = p + fmpq(a, b) * tanh**n if n else p + fmpq(a, b)
    f = exp(-x * x / 2) * cosh2
    if which == 1:
        f = x * f
    return p - f


def series_exp(s):
    return s.exp()


def arb_exp(v):
    return v.exp()


def taylor_piece(which, poly, m):
    """Exact coefficients at 0 and the remainder's enclosure over [0, A]."""
    x = fmpq_series([0, 1], prec=K)
    coeffs = G(which, poly, x, series_exp).coeffs()
    coeffs = [fmpq(c) for c in coeffs] + [fmpq(0)] * (K - len(coeffs))
    assert all(c == 0 for c in coeffs[:m]), f"{which}: low coefficients not zero: {coeffs[:m]}"
    assert coeffs[m] > 0, f"{which}: leading coefficient {coeffs[m]} not > 0"
    ball = arb(A / 2, A / 2)
    xs = arb_series([ball, 1], prec=K + 1)
    rem = G(which, poly, xs, series_exp).coeffs()[K]  # G^(K)(ξ)/K!, ξ ∈ [0, A]
    # H(x) = G(x)/x^m on sub-boxes of [0, A].
    steps = 64
    worst = None
    for i in range(steps):
        lo, hi = A * i / steps, A * (i + 1) / steps
        xb = arb((lo + hi) / 2, (hi - lo) / 2)
        h = sum((arb(coeffs[k]) * xb ** (k - m) for k in range(m, K)), arb(0)) + rem * xb ** (K - m)
        lower = h.lower()
        assert lower > 0, f"{which}: Taylor piece not positive on [{lo}, {hi}]: {h}"
        worst = lower if worst is None or lower < worst else worst
    return {
        "a": str(A),
        "order": K,
        "m": m,
        "coefficients": [str(c) for c in coeffs],
        "remainder_lower": float(rem.lower()),
        "remainder_upper": float(rem.upper()),
        "min_lower_bound_of_G_over_x^m": float(worst),
    }


def middle_piece(which, poly):
    """Boxes tiling [A, X], each with a positive lower bound of G."""
    boxes, stack = [], [(arb(A), arb(X))]
    while stack:
        lo, hi = stack.pop()
        mid, rad = (lo + hi) / 2, (hi - lo) / 2
        gm = G(which, poly, mid, arb_exp)
        d = G(which, poly, arb_series([arb(mid, rad), 1], prec=2), series_exp).coeffs()[1]
        lower = gm - abs(d) * rad
        if lower > 0:
            boxes.append((float(lo.mid()), float(hi.mid()), float(lower.lower())))
        else:
            assert rad > arb(2) ** -30, f"{which}: no positive bound near {mid}"
            stack.append((mid, hi))
            stack.append((lo, mid))
    boxes.sort()
    return boxes


def tail_piece(which, poly):
    x = arb(X)
    tanh, _ = ops(x, arb_exp)
    p = sum((arb(fmpq(a, b)) * tanh**n for n, (a, b) in poly.items()), arb(0))
    env = (2 * x - x * x / 2).exp()
    if which == 1:
        env = x * env
    margin = p - env
    assert margin > 0, f"{which}: tail not positive"
    return {"x": X, "lower_bound_of_G": float(margin.lower())}


def top_needed(which, poly):
    """The largest value of (F − the lower terms)/t^top on a grid of (0, X]: the least top
    coefficient that could work, sampled (informative, not certified)."""
    top = max(poly)
    best = None
    for i in range(1, 4001):
        x = arb(X) * i / 4000
        tanh, cosh2 = ops(x, arb_exp)
        f = (-x * x / 2).exp() * cosh2
        if which == 1:
            f = x * f
        lower = sum((arb(fmpq(a, b)) * tanh**n for n, (a, b) in poly.items() if n != top), arb(0))
        r = (f - lower) / tanh**top
        best = r if best is None or r.mid() > best.mid() else best
    return float(best.mid())


def certify():
    out = {
        "what": "G(x) = sum_n c_n tanh(x)^n - F(x) >= 0 for x >= 0; F1 = x exp(-x^2/2) cosh(x)^2, F2 = exp(-x^2/2) cosh(x)^2",
        "arithmetic": f"Arb ball arithmetic (python-flint), {ctx.prec}-bit",
        "inequalities": [],
    }
    for name, which, poly, m in INEQUALITIES:
        boxes = middle_piece(which, poly)
        # The boxes tile [A, X] with no gap (their ends are dyadic, exact in f64).
        assert boxes[0][0] == float(A) and boxes[-1][1] == X
        assert all(b[1] == c[0] for b, c in zip(boxes, boxes[1:]))
        out["inequalities"].append(
            {
                "name": name,
                "f": f"F{which}",
                "poly": {str(n): f"{a}/{b}" for n, (a, b) in poly.items()},
                "top_coefficient_needed_sampled": round(top_needed(which, poly), 4),
                "taylor": taylor_piece(which, poly, m),
                "boxes": [[lo, hi] for lo, hi, _ in boxes],
                "min_box_lower_bound": min(b[2] for b in boxes),
                "tail": tail_piece(which, poly),
            }
        )
    return out


def main():
    cert = certify()
    text = json.dumps(cert, indent=1) + "\n"
    if "--check" in sys.argv:
        if OUT.read_text() != text:
            print("pair_bias.json differs from a fresh certificate", file=sys.stderr)
            sys.exit(1)
        print("pair_bias.json: the four inequalities certified again, identical")
    else:
        OUT.write_text(text)
        for q in cert["inequalities"]:
            print(f"{q['name']}: Taylor on [0, {q['taylor']['a']}] (G/x^{q['taylor']['m']} ≥ {q['taylor']['min_lower_bound_of_G_over_x^m']:.3g}), {len(q['boxes'])} boxes on [1/8, {X}] (G ≥ {q['min_box_lower_bound']:.3g}), tail G({X}) ≥ {q['tail']['lower_bound_of_G']:.3g}")


if __name__ == "__main__":
    main()
