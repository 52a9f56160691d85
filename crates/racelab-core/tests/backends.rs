//! The backend contract (`racelab_core::backend::Backend`): every backend on the same inputs,
//! planes and parameters. The CPU kernels and the f64 reference must agree (forward ≤ 1e-5,
//! gradients ≤ 1e-4 of each tensor's largest entry; dβ ≤ 1e-4 relative), their decoders must
//! reproduce the causal forward row by row, and the CUDA backend must either agree or refuse
//! with the no-device error ("skipped: no CUDA device", never counted as passed).
//!
//! Also the sweep of input magnitudes (in the manner of faer's): Q, K and V scaled by
//! 10^-20 … 10^20, the kernels against the reference on the scaled inputs: the outputs must
//! agree (gradients up to f32's resolution of their natural scale, see the test), or the call
//! must fail with a clear error; never a silent NaN.
mod common;

use common::rel;
use racelab_core::params::{Beta, Bits, Seed, Tables};

use racelab_core::attend::for_device;
use racelab_core::backend::{Backend, Device, Heads, PlanesF32, RaceParams};
use racelab_core::hashing::Planes;
use racelab_core::params::Combine;
use racelab_core::rng::SeededRng;

fn data(len: usize, seed: u64, scale: f64) -> Vec<f32> {
    let mut rng = SeededRng::new(seed, 7);
    rng.normals(len)
        .iter()
        .map(|x| (x * scale) as f32)
        .collect()
}

struct Case {
    heads: usize,
    n: usize,
    d: usize,
    dv: usize,
    params: RaceParams,
}

struct Inputs {
    planes: PlanesF32,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
}

impl Case {
    fn inputs(&self, scale: f64) -> Inputs {
        let planes = Planes::gaussian(
            Bits(self.params.p()),
            Tables(self.params.l()),
            self.d,
            Seed(11),
        )
        .unwrap();
        let (h, n, d, dv) = (self.heads, self.n, self.d, self.dv);
        Inputs {
            planes: PlanesF32::from_planes(&planes),
            q: data(h * n * d, 1, scale),
            k: data(h * n * d, 2, scale),
            v: data(h * n * dv, 3, scale),
            g: data(h * n * dv, 4, 1.0),
        }
    }
}

fn heads<'a>(c: &Case, x: &'a Inputs) -> [Heads<'a>; 4] {
    [
        Heads::new(c.heads, c.n, c.d, &x.q).unwrap(),
        Heads::new(c.heads, c.n, c.d, &x.k).unwrap(),
        Heads::new(c.heads, c.n, c.dv, &x.v).unwrap(),
        Heads::new(c.heads, c.n, c.dv, &x.g).unwrap(),
    ]
}

/// `backend` against the reference: forward, gradients and (causal) the decoder.
fn agree(backend: &dyn Backend, c: &Case) {
    let x = c.inputs(1.0);
    let [q, k, v, g] = heads(c, &x);
    let reference = for_device(Device::Reference).unwrap();
    let tag = format!(
        "{:?} P={} L={} causal={}",
        backend.device(),
        c.params.p(),
        c.params.l(),
        c.params.causal()
    );
    let want = reference.forward(&c.params, &x.planes, q, k, v).unwrap();
    let got = backend.forward(&c.params, &x.planes, q, k, v).unwrap();
    let e = rel(&got.o, &want.o);
    assert!(e <= 1e-5, "{tag}: forward {e:.2e}");
    let (wf, wg) = reference
        .forward_backward(&c.params, &x.planes, q, k, v, g)
        .unwrap();
    let (gf, gg) = backend
        .forward_backward(&c.params, &x.planes, q, k, v, g)
        .unwrap();
    assert!(
        rel(&gf.o, &wf.o) <= 1e-5,
        "{tag}: forward of forward_backward"
    );
    for (name, a, b) in [
        ("dq", &gg.dq, &wg.dq),
        ("dk", &gg.dk, &wg.dk),
        ("dv", &gg.dv, &wg.dv),
    ] {
        let e = rel(a, b);
        assert!(e <= 1e-4, "{tag}: {name} {e:.2e}");
    }
    let eb = (gg.dbeta - wg.dbeta).abs() / wg.dbeta.abs().max(1e-12);
    assert!(eb <= 1e-4, "{tag}: dbeta {} vs {}", gg.dbeta, wg.dbeta);
    if c.params.causal() {
        // The decoder, token by token, is the causal forward's rows (head 0).
        let mut dec = backend.decoder(&c.params, &x.planes, c.dv).unwrap();
        for t in 0..c.n {
            let row = |y: &[f32], w: usize| y[t * w..(t + 1) * w].to_vec();
            let o = dec
                .step(&row(&x.q, c.d), &row(&x.k, c.d), &row(&x.v, c.dv))
                .unwrap();
            let e = rel(&o, &row(&want.o, c.dv));
            assert!(e <= 1e-5, "{tag}: decoder row {t}: {e:.2e}");
        }
        assert_eq!(dec.len(), c.n);
    }
}

fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    for (p, l) in [(1, 1), (2, 2), (3, 2), (2, 4)] {
        for causal in [false, true] {
            out.push(Case {
                heads: 2,
                n: 37,
                d: 8,
                dv: 5,
                params: RaceParams::new(Bits(p), Tables(l), Beta(3.0))
                    .unwrap()
                    .with_causal(causal),
            });
        }
    }
    out
}

#[test]
fn cpu_backend_agrees_with_the_reference_backend() {
    let cpu = for_device(Device::Cpu).unwrap();
    for c in cases() {
        agree(cpu.as_ref(), &c);
    }
    // The reference's own decoder reproduces its causal forward.
    let reference = for_device(Device::Reference).unwrap();
    for c in cases().into_iter().filter(|c| c.params.causal()) {
        agree(reference.as_ref(), &c);
    }
}

#[test]
fn cuda_backend_agrees_or_says_there_is_no_device() {
    match for_device(Device::Cuda) {
        Ok(cuda) => {
            for c in cases() {
                let x = c.inputs(1.0);
                let [q, k, v, _] = heads(&c, &x);
                let want = for_device(Device::Reference)
                    .unwrap()
                    .forward(&c.params, &x.planes, q, k, v)
                    .unwrap();
                let got = cuda.forward(&c.params, &x.planes, q, k, v).unwrap();
                assert!(rel(&got.o, &want.o) <= 1e-5);
            }
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.contains("no CUDA device"), "{msg}");
            println!("skipped: no CUDA device ({msg})");
        }
    }
}

#[test]
fn every_backend_refuses_mismatched_arguments_by_name() {
    let c = &cases()[2];
    let x = c.inputs(1.0);
    let [q, k, v, g] = heads(c, &x);
    for device in [Device::Reference, Device::Cpu] {
        let b = for_device(device).unwrap();
        let wrong_p = RaceParams::new(Bits(3), Tables(c.params.l()), Beta(c.params.beta()))
            .unwrap()
            .with_causal(c.params.causal());
        let e = b.forward(&wrong_p, &x.planes, q, k, v).unwrap_err();
        assert!(e.to_string().contains("planes"), "{device:?}: {e}");
        let e = RaceParams::new(Bits(2), Tables(2), Beta(-1.0)).unwrap_err();
        assert!(e.to_string().contains("beta"), "{device:?}: {e}");
        let short_g = Heads::new(
            c.heads,
            c.n,
            c.dv - 1,
            &g.data()[..c.heads * c.n * (c.dv - 1)],
        )
        .unwrap();
        let e = b
            .forward_backward(&c.params, &x.planes, q, k, v, short_g)
            .unwrap_err();
        assert!(e.to_string().contains("`g`"), "{device:?}: {e}");
        let mut nan = x.k.clone();
        nan[5] = f32::NAN;
        let kn = Heads::new(c.heads, c.n, c.d, &nan).unwrap();
        let e = b.forward(&c.params, &x.planes, q, kn, v).unwrap_err();
        assert!(e.to_string().contains("`k`"), "{device:?}: {e}");
    }
    // The authors' combine rule: forward in the reference, refused by the kernels' backend.
    let authors = c.params.with_combine(Combine::Authors);
    assert!(for_device(Device::Reference)
        .unwrap()
        .forward(&authors, &x.planes, q, k, v)
        .is_ok());
    let e = for_device(Device::Cpu)
        .unwrap()
        .forward(&authors, &x.planes, q, k, v)
        .unwrap_err();
    assert!(e.to_string().contains("combine"), "{e}");
}

/// Q, K and V scaled by 10^-20 … 10^20 (10^±20 squared is outside f32's range, so products
/// of raw inputs would overflow or underflow; the kernels project onto unit planes through
/// tanh, so they must stay right). Forward and gradients against the reference on the same
/// scaled f32 inputs; an error is allowed only if it is a clear one, and a NaN never.
#[test]
fn magnitude_sweep_kernels_match_the_reference_or_refuse_clearly() {
    let reference = for_device(Device::Reference).unwrap();
    let cpu = for_device(Device::Cpu).unwrap();
    let mut checked = 0;
    for exp in (-20..=20).step_by(5) {
        let scale = 10f64.powi(exp);
        for causal in [false, true] {
            let c = Case {
                heads: 2,
                n: 24,
                d: 8,
                dv: 4,
                params: RaceParams::new(Bits(2), Tables(3), Beta(4.0))
                    .unwrap()
                    .with_causal(causal),
            };
            let x = c.inputs(scale);
            let [q, k, v, g] = heads(&c, &x);
            let tag = format!("scale 1e{exp} causal={causal}");
            let want = reference.forward(&c.params, &x.planes, q, k, v);
            let got = cpu.forward(&c.params, &x.planes, q, k, v);
            match (got, want) {
                (Ok(got), Ok(want)) => {
                    let e = rel(&got.o, &want.o);
                    assert!(e <= 1e-5, "{tag}: forward {e:.2e}");
                }
                (Err(e), _) | (_, Err(e)) => {
                    let msg = e.to_string();
                    assert!(msg.contains('`'), "{tag}: unclear error {msg}");
                    continue;
                }
            }
            let (_, wg) = reference
                .forward_backward(&c.params, &x.planes, q, k, v, g)
                .unwrap();
            let (_, gg) = cpu
                .forward_backward(&c.params, &x.planes, q, k, v, g)
                .unwrap();
            // dq and dk flow through the features' contrasts `Σ_r ±φ_r ∂ℓ/∂φ_r`; for inputs
            // far below unit norm every `∂ℓ/∂φ_r` is nearly the same and their differences,
            // the gradient, fall below what f32 resolves in them. The stated floor: errors
            // over the larger of the gradient's own largest entry and its natural scale
            // `β·max|G|·max|V|·max|W|` (the size of each `∂ℓ/∂φ_r` through the planes).
            let amax = |x: &[f32]| x.iter().fold(0.0f64, |m, &y| m.max(y.abs() as f64));
            let natural = c.params.beta() * amax(&x.g) * amax(&x.v) * amax(x.planes.w());
            for (name, a, b, floor) in [
                ("dq", &gg.dq, &wg.dq, natural),
                ("dk", &gg.dk, &wg.dk, natural),
                ("dv", &gg.dv, &wg.dv, 0.0),
            ] {
                assert!(a.iter().all(|x| x.is_finite()), "{tag}: {name} not finite");
                let err = a
                    .iter()
                    .zip(b.iter())
                    .fold(0.0f64, |m, (&p, &q)| m.max((p as f64 - q as f64).abs()));
                let e = err / amax(b).max(floor).max(1e-300);
                assert!(e <= 1e-4, "{tag}: {name} {e:.2e}");
            }
            assert!(gg.dbeta.is_finite(), "{tag}: dbeta");
            checked += 1;
        }
    }
    assert_eq!(
        checked, 18,
        "every magnitude was checked against the reference"
    );
}

/// Work that cannot fit is refused before anything is allocated, naming P, L and the bytes:
/// P = 20, L = 100 is 10^8 features per token: the forward's banks and workspaces need
/// about a TiB, a decoder with dv = 1000 keeps 840 GB of state.
#[test]
fn every_backend_refuses_work_that_cannot_fit() {
    let params = RaceParams::new(
        Bits(20),
        Tables(100),
        Beta(racelab_core::params::DEFAULT_BETA),
    )
    .unwrap();
    let planes =
        PlanesF32::from_planes(&Planes::gaussian(Bits(20), Tables(100), 8, Seed(1)).unwrap());
    let (q, v) = (data(3 * 8, 1, 1.0), data(3 * 4, 2, 1.0));
    let (qh, vh) = (
        Heads::new(1, 3, 8, &q).unwrap(),
        Heads::new(1, 3, 4, &v).unwrap(),
    );
    for device in [Device::Reference, Device::Cpu] {
        let b = for_device(device).unwrap();
        let e = b
            .forward(&params, &planes, qh, qh, vh)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("P = 20") && e.contains("L = 100") && e.contains("bytes"),
            "{e}"
        );
        let e = b.decoder(&params, &planes, 1000).err().unwrap().to_string();
        assert!(
            e.contains("P = 20") && e.contains("bytes"),
            "{device:?}: {e}"
        );
    }
}

/// Planes and rows are made only by validating constructors (their fields are private): short
/// or non-finite plane data and rows whose dimensions disagree with their data (or wrap) are
/// refused where they are made, naming what is wrong; planes that do not fit the inputs' `d`
/// or the parameters' P and L are refused by every backend's validation before a kernel runs.
#[test]
fn planes_and_rows_that_disagree_with_their_data_are_refused() {
    let (heads, n, d) = (1usize, 8usize, 4usize);
    let params = RaceParams::new(Bits(2), Tables(3), Beta(4.0)).unwrap();
    let good = Planes::gaussian(Bits(2), Tables(3), d, Seed(1)).unwrap();
    let w = good.w().to_vec();
    let e = Planes::from_data(Bits(2), Tables(3), d, w[..w.len() - 1].to_vec()).unwrap_err();
    assert_eq!(e.arg(), Some("planes"), "{e}");
    for bad in [f64::NAN, f64::INFINITY] {
        let mut nan = w.clone();
        nan[1] = bad;
        let e = Planes::from_data(Bits(2), Tables(3), d, nan).unwrap_err();
        assert_eq!(e.arg(), Some("planes"), "{bad}: {e}");
    }
    let x = data(heads * n * d, 2, 1.0);
    assert!(Heads::new(heads, n + 1, d, &x).is_err());
    assert!(Heads::new(2, usize::MAX / 2 + 1, d, &x).is_err());
    let h = Heads::new(heads, n, d, &x).unwrap();
    let good = PlanesF32::from_planes(&good);
    let wide = PlanesF32::from_planes(
        &Planes::from_data(Bits(2), Tables(3), d + 1, vec![0.5; 3 * 2 * (d + 1)]).unwrap(),
    );
    let other = PlanesF32::from_planes(&Planes::gaussian(Bits(3), Tables(3), d, Seed(1)).unwrap());
    for device in [Device::Cpu, Device::Reference] {
        let backend = for_device(device).unwrap();
        assert!(backend.forward(&params, &good, h, h, h).is_ok());
        for (what, planes) in [("wide", &wide), ("P = 3", &other)] {
            let e = backend.forward(&params, planes, h, h, h).unwrap_err();
            assert_eq!(e.arg(), Some("planes"), "{device:?} {what}: {e}");
            let e = backend
                .forward_backward(&params, planes, h, h, h, h)
                .unwrap_err();
            assert_eq!(e.arg(), Some("planes"), "{device:?} {what}: {e}");
        }
    }
}
