//! `examples/operator.rs`, run as written and checked against the f64 reference: soft RACE's
//! forward and gradients on the operator's own planes, and exact softmax.
#[path = "../examples/operator.rs"]
#[allow(dead_code)]
mod example;

use ndarray::Array4;
use racelab_core::backend::{Backend, Heads, PlanesF32};
use racelab_core::params::{Beta, Bits, Tables};
use racelab_core::reference::ReferenceRace;
use racelab_core::{AttendOptions, Method, RaceParams, Tensor};

fn heads(a: &Array4<f32>) -> Heads<'_> {
    let s = a.shape();
    Heads::new(s[0] * s[1], s[2], s[3], a.as_slice().unwrap()).unwrap()
}

/// `max |a − b| / max(|b|, 1e-3)` over the entries.
fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    let scale = b.iter().fold(1e-3f64, |m, &x| m.max(x.abs() as f64));
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 - y as f64).abs())
        .fold(0.0, f64::max)
        / scale
}

#[test]
fn the_operator_example_matches_the_reference() {
    let shape = (1, 2, 96, 16);
    let [q, k, v, go] = [1, 2, 3, 4].map(|seed| example::draw(shape, seed));
    let out = example::run(&q, &k, &v, &go).unwrap();
    // The reference backend, given the operator's planes (f64 values holding its f32 ones).
    let planes = PlanesF32::from_planes(out.op.planes());
    for (i, causal) in [false, true].into_iter().enumerate() {
        let params = RaceParams::new(Bits(2), Tables(8), Beta(10.0))
            .unwrap()
            .with_causal(causal);
        let (f, g) = ReferenceRace
            .forward_backward(
                &params,
                &planes,
                heads(&q),
                heads(&k),
                heads(&v),
                heads(&go),
            )
            .unwrap();
        let e = rel_err(out.soft[i].as_slice().unwrap(), &f.o);
        assert!(e < 1e-4, "causal {causal}: output {e:e}");
        let got = &out.grads[i];
        for (name, a, b) in [
            ("dq", &got.dq, &g.dq),
            ("dk", &got.dk, &g.dk),
            ("dv", &got.dv, &g.dv),
        ] {
            assert_eq!(a.shape(), q.shape(), "{name}");
            let e = rel_err(a.as_slice().unwrap(), b);
            assert!(e < 1e-3, "causal {causal}: {name} {e:e}");
        }
        let e = (got.dbeta - g.dbeta).abs() / g.dbeta.abs().max(1e-6);
        assert!(
            e < 1e-3,
            "causal {causal}: dbeta {} vs {}",
            got.dbeta,
            g.dbeta
        );
    }
    // Exact softmax against the f64 reference of `attend`.
    let t = |a: &Array4<f32>| {
        Tensor::new(a.shape().to_vec(), a.iter().map(|&x| x as f64).collect()).unwrap()
    };
    let opts = AttendOptions::new(Method::Softmax { scale: None }).causal(true);
    let want = racelab_core::attend::attend(&t(&q), &t(&k), &t(&v), &opts).unwrap();
    let want: Vec<f32> = want.o.data.iter().map(|&x| x as f32).collect();
    let e = rel_err(out.exact.as_slice().unwrap(), &want);
    assert!(e < 1e-5, "softmax {e:e}");
}

/// The example stays the short program the README promises: at most four `use` lines.
#[test]
fn the_operator_example_needs_at_most_four_imports() {
    let src = include_str!("../examples/operator.rs");
    let uses = src
        .lines()
        .filter(|l| l.trim_start().starts_with("use "))
        .count();
    assert!(uses <= 4, "examples/operator.rs has {uses} use lines");
}
