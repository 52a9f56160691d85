//! Replays `proofs-notes/certificates/pair_bias.json`, the Arb certificate of the four
//! majorants behind [`super::pair`], in independent f64 interval arithmetic.
//!
//! Each inequality is `G(x) = Σ cₙ tanh(x)ⁿ − F(x) ≥ 0` on x ≥ 0. The replay checks that the
//! certificate's polynomials are the ones [`super::pair`] uses, that its Taylor coefficients
//! below `x^m` are 0 and the `x^m` one positive, that `G(x)/x^m` (the Taylor polynomial plus
//! the certificate's remainder enclosure) is positive on `[0, a]`, that the boxes tile
//! `[a, X]` and `G > 0` on each (monotone enclosures on x ≥ 0, bisected where needed), and
//! the tail at X. Sums and products round outward (`next_up`/`next_down`); the results of
//! `exp`, `tanh` and `cosh` are widened by 1e-15 relative (about 4.5 ulps; the platform's
//! libm is within 1 ulp). The certificate's own rigour is Arb's: this replay is a second,
//! independent check of what it asserts, not a proof in itself.

use super::pair::{F1_MAJORANTS, F2_MAJORANTS};
use crate::error::{RaceError, Result};
use serde_json::Value;

/// The committed certificate.
pub const CERTIFICATE: &str = include_str!("../../proofs-notes/certificates/pair_bias.json");

/// What the replay found, per inequality: `(name, boxes, bisections)`.
#[derive(Debug, Clone)]
pub struct Replay {
    /// Each inequality replayed: its name, the boxes checked and the bisections made.
    pub checked: Vec<(String, usize, usize)>,
}

fn bad(msg: impl Into<String>) -> RaceError {
    RaceError::Config {
        path: "proofs-notes/certificates/pair_bias.json".into(),
        msg: msg.into(),
    }
}

/// A closed interval, rounded outward.
#[derive(Debug, Clone, Copy)]
struct Iv {
    lo: f64,
    hi: f64,
}

impl Iv {
    fn pt(x: f64) -> Iv {
        Iv { lo: x, hi: x }
    }
    fn add(self, o: Iv) -> Iv {
        Iv {
            lo: (self.lo + o.lo).next_down(),
            hi: (self.hi + o.hi).next_up(),
        }
    }
    /// The smallest interval holding the four corner values, one rounding wider.
    fn hull(c: [f64; 4]) -> Iv {
        Iv {
            lo: c
                .iter()
                .cloned()
                .fold(f64::INFINITY, crate::stats::nan_min)
                .next_down(),
            hi: c
                .iter()
                .cloned()
                .fold(f64::NEG_INFINITY, crate::stats::nan_max)
                .next_up(),
        }
    }
    fn mul(self, o: Iv) -> Iv {
        Iv::hull([
            self.lo * o.lo,
            self.lo * o.hi,
            self.hi * o.lo,
            self.hi * o.hi,
        ])
    }
    fn powi(self, n: usize) -> Iv {
        (0..n).fold(Iv::pt(1.0), |acc, _| acc.mul(self))
    }
}

/// An increasing libm function's value at `x`, widened: a lower or an upper bound.
fn widen(v: f64, up: bool) -> f64 {
    const REL: f64 = 1e-15;
    if up {
        (v + v.abs() * REL + f64::MIN_POSITIVE).next_up()
    } else {
        (v - v.abs() * REL - f64::MIN_POSITIVE).next_down()
    }
}

/// A rational `"p/q"` or integer from the certificate, as an enclosing interval.
fn rational(s: &str) -> Result<Iv> {
    let (p, q) = s.split_once('/').unwrap_or((s, "1"));
    let p: f64 = p
        .trim()
        .parse()
        .map_err(|_| bad(format!("`{s}` is not a rational")))?;
    let q: f64 = q
        .trim()
        .parse()
        .map_err(|_| bad(format!("`{s}` is not a rational")))?;
    if q <= 0.0 {
        return Err(bad(format!("`{s}`: denominator not > 0")));
    }
    if p == 0.0 {
        return Ok(Iv::pt(0.0));
    }
    // Each parse rounds once; the quotient once more.
    let (pl, ph) = (p.next_down(), p.next_up());
    let (ql, qh) = (q.next_down(), q.next_up());
    Ok(Iv::hull([pl / ql, pl / qh, ph / ql, ph / qh]))
}

/// A lower bound of `G` on `[lo, hi]`, 0 ≤ lo: the polynomial in tanh is increasing (cₙ ≥ 0),
/// `F2 = e^{−x²/2}cosh²x ≤ e^{−lo²/2}cosh²(hi)`, `F1 = x·F2 ≤ hi·(that)`.
fn g_lower(poly: &[(usize, f64)], f1: bool, lo: f64, hi: f64) -> f64 {
    let t = widen(lo.tanh(), false).max(0.0);
    let p = poly.iter().fold(Iv::pt(0.0), |acc, &(n, c)| {
        acc.add(Iv::pt(c).mul(Iv::pt(t).powi(n)))
    });
    let e = widen((-(lo * lo) / 2.0).exp(), true);
    let ch = widen(hi.cosh(), true);
    let mut f = Iv::pt(e).mul(Iv::pt(ch)).mul(Iv::pt(ch));
    if f1 {
        f = f.mul(Iv::pt(hi));
    }
    (p.lo - f.hi).next_down()
}

/// `G > 0` on `[lo, hi]`, bisecting up to `depth` times; returns the bisections used.
fn positive_on(poly: &[(usize, f64)], f1: bool, lo: f64, hi: f64, depth: u32) -> Option<usize> {
    if g_lower(poly, f1, lo, hi) > 0.0 {
        return Some(0);
    }
    if depth == 0 {
        return None;
    }
    let mid = 0.5 * (lo + hi);
    let a = positive_on(poly, f1, lo, mid, depth - 1)?;
    let b = positive_on(poly, f1, mid, hi, depth - 1)?;
    Some(1 + a + b)
}

/// A dyadic rational `"p/2^k"` (or integer), exact in f64.
fn dyadic(s: &str) -> Result<f64> {
    let (p, q) = s.split_once('/').unwrap_or((s, "1"));
    let (p, q): (i64, i64) = match (p.trim().parse(), q.trim().parse()) {
        (Ok(p), Ok(q)) => (p, q),
        _ => return Err(bad(format!("`{s}` is not a rational"))),
    };
    if q <= 0 || q & (q - 1) != 0 || p.unsigned_abs() >= 1 << 53 {
        return Err(bad(format!("`{s}` is not a dyadic rational exact in f64")));
    }
    Ok(p as f64 / q as f64)
}

fn num(v: &Value, key: &str) -> Result<f64> {
    v[key]
        .as_f64()
        .or_else(|| v[key].as_str().and_then(|s| rational(s).ok().map(|i| i.lo)))
        .ok_or_else(|| bad(format!("no number `{key}`")))
}

/// Replay the certificate `text` (normally [`CERTIFICATE`]).
pub fn replay(text: &str) -> Result<Replay> {
    let cert: Value = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
    let ineqs = cert["inequalities"]
        .as_array()
        .ok_or_else(|| bad("no `inequalities`"))?;
    let wanted: Vec<(bool, &[(usize, f64)])> = F1_MAJORANTS
        .iter()
        .map(|p| (true, *p))
        .chain(F2_MAJORANTS.iter().map(|p| (false, *p)))
        .collect();
    let mut found = vec![false; wanted.len()];
    let mut checked = Vec::new();
    for q in ineqs {
        let name = q["name"].as_str().unwrap_or("?").to_string();
        let f1 = match q["f"].as_str() {
            Some("F1") => true,
            Some("F2") => false,
            other => return Err(bad(format!("{name}: unknown f {other:?}"))),
        };
        let mut poly: Vec<(usize, f64)> = Vec::new();
        for (k, v) in q["poly"]
            .as_object()
            .ok_or_else(|| bad(format!("{name}: no poly")))?
        {
            let n: usize = k.parse().map_err(|_| bad(format!("{name}: power `{k}`")))?;
            poly.push((n, dyadic(v.as_str().unwrap_or(""))?));
        }
        poly.sort_by_key(|x| x.0);
        let Some(w) = wanted.iter().position(|(wf, wp)| {
            *wf == f1
                && wp.len() == poly.len()
                && wp.iter().zip(&poly).all(|(a, b)| a.0 == b.0 && a.1 == b.1)
        }) else {
            return Err(bad(format!(
                "{name}: its polynomial {poly:?} is not one the bound uses"
            )));
        };
        found[w] = true;
        let poly = wanted[w].1;

        // [0, a]: G/x^m from the exact low coefficients and the remainder enclosure.
        let t = &q["taylor"];
        let a = dyadic(t["a"].as_str().unwrap_or(""))?;
        let (order, m) = (
            t["order"].as_u64().ok_or_else(|| bad("order"))? as usize,
            t["m"].as_u64().ok_or_else(|| bad("m"))? as usize,
        );
        let coeffs: Vec<Iv> = t["coefficients"]
            .as_array()
            .ok_or_else(|| bad(format!("{name}: no coefficients")))?
            .iter()
            .map(|c| rational(c.as_str().unwrap_or("x")))
            .collect::<Result<_>>()?;
        if coeffs.len() != order || m >= order {
            return Err(bad(format!(
                "{name}: {} coefficients, order {order}, m {m}",
                coeffs.len()
            )));
        }
        if coeffs[..m].iter().any(|c| c.lo != 0.0 || c.hi != 0.0) || coeffs[m].lo <= 0.0 {
            return Err(bad(format!(
                "{name}: the coefficients below x^{m} are not 0, or x^{m}'s not > 0"
            )));
        }
        let rem = Iv {
            lo: num(t, "remainder_lower")?,
            hi: num(t, "remainder_upper")?,
        };
        let steps = 256;
        for i in 0..steps {
            let x = Iv {
                lo: a * i as f64 / steps as f64,
                hi: (a * (i + 1) as f64 / steps as f64).next_up(),
            };
            let h = (m..order)
                .fold(Iv::pt(0.0), |acc, k| acc.add(coeffs[k].mul(x.powi(k - m))))
                .add(rem.mul(x.powi(order - m)));
            if h.lo <= 0.0 {
                return Err(bad(format!(
                    "{name}: G/x^{m} not shown > 0 on [{}, {}]",
                    x.lo, x.hi
                )));
            }
        }

        // [a, X]: the boxes tile it, and G > 0 on each.
        let boxes = q["boxes"]
            .as_array()
            .ok_or_else(|| bad(format!("{name}: no boxes")))?;
        let tail_x = num(&q["tail"], "x")?;
        let mut at = a;
        let mut bisections = 0;
        for b in boxes {
            let (lo, hi) = (
                b[0].as_f64().ok_or_else(|| bad("box"))?,
                b[1].as_f64().ok_or_else(|| bad("box"))?,
            );
            if lo != at || hi <= lo {
                return Err(bad(format!(
                    "{name}: box [{lo}, {hi}] leaves a gap after {at}"
                )));
            }
            bisections += positive_on(poly, f1, lo, hi, 16)
                .ok_or_else(|| bad(format!("{name}: G not shown > 0 on [{lo}, {hi}]")))?;
            at = hi;
        }
        if at != tail_x {
            return Err(bad(format!(
                "{name}: the boxes end at {at}, the tail starts at {tail_x}"
            )));
        }

        // [X, ∞): F1 ≤ x·e^{2x − x²/2}, F2 ≤ e^{2x − x²/2}, decreasing for x ≥ 1 + √2.
        if tail_x < 1.0 + 2f64.sqrt() {
            return Err(bad(format!("{name}: the tail starts below 1 + √2")));
        }
        let t_lo = widen(tail_x.tanh(), false);
        let p_lo = poly
            .iter()
            .fold(Iv::pt(0.0), |acc, &(n, c)| {
                acc.add(Iv::pt(c).mul(Iv::pt(t_lo).powi(n)))
            })
            .lo;
        let mut env = widen((2.0 * tail_x - tail_x * tail_x / 2.0).exp(), true);
        if f1 {
            env = (env * tail_x).next_up();
        }
        if p_lo - env <= 0.0 {
            return Err(bad(format!("{name}: the tail is not shown > 0")));
        }
        checked.push((name, boxes.len(), bisections));
    }
    if let Some(i) = found.iter().position(|f| !f) {
        return Err(bad(format!(
            "no inequality certifies the majorant {:?} the bound uses",
            wanted[i].1
        )));
    }
    Ok(Replay { checked })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_committed_certificate_replays() {
        let r = replay(CERTIFICATE).unwrap();
        assert_eq!(r.checked.len(), 4, "{r:?}");
    }

    /// The replay can fail: a majorant's coefficient lowered below the supremum it must
    /// exceed, a box removed, a wrong remainder.
    #[test]
    fn a_wrong_certificate_is_refused() {
        // 85/32 → 80/32 in the three-term F1 majorant: no longer one the bound uses.
        let text = CERTIFICATE.replacen("\"85/32\"", "\"80/32\"", 1);
        assert!(replay(&text).is_err());
        // A gap in the boxes.
        let mut v: Value = serde_json::from_str(CERTIFICATE).unwrap();
        v["inequalities"][0]["boxes"]
            .as_array_mut()
            .unwrap()
            .remove(5);
        assert!(replay(&v.to_string()).is_err());
        // A remainder enclosure far too negative for [0, a].
        let mut v: Value = serde_json::from_str(CERTIFICATE).unwrap();
        v["inequalities"][0]["taylor"]["remainder_lower"] = serde_json::json!(-1e9);
        assert!(replay(&v.to_string()).is_err());
    }

    /// The enclosure itself can fail: with a majorant below F (coefficient 3 instead of
    /// 27/8 against a supremum of 3.36), some box is not positive.
    #[test]
    fn a_majorant_below_f_is_not_shown_positive() {
        let low: &[(usize, f64)] = &[(1, 1.0), (3, 3.0)];
        let shown = (0..400).all(|i| {
            let (lo, hi) = (0.125 + i as f64 * 0.025, 0.125 + (i + 1) as f64 * 0.025);
            positive_on(low, true, lo, hi, 16).is_some()
        });
        assert!(!shown);
        let right = F1_MAJORANTS[1];
        assert!((0..400).all(|i| {
            let (lo, hi) = (0.125 + i as f64 * 0.025, 0.125 + (i + 1) as f64 * 0.025);
            positive_on(right, true, lo, hi, 16).is_some()
        }));
    }
}
