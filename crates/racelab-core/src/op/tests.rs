use super::*;
use crate::backend::{Backend, Heads};
use crate::rng::SeededRng;
use ndarray::{Array3, Array4};

fn draw4(shape: (usize, usize, usize, usize), seed: u64) -> Array4<f32> {
    let n = shape.0 * shape.1 * shape.2 * shape.3;
    let mut rng = SeededRng::new(seed, 97);
    Array4::from_shape_vec(shape, rng.normals(n).iter().map(|&x| x as f32).collect()).unwrap()
}

fn max_diff<T: Into<f64> + Copy, U: Into<f64> + Copy>(a: &[T], b: &[U]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (x.into() - y.into()).abs())
        .fold(0.0, f64::max)
}

fn flat(a: &Array4<f32>) -> Heads<'_> {
    Heads::new(4, 24, 8, a.as_slice().unwrap()).unwrap()
}

fn qkv() -> [Array4<f32>; 3] {
    [1, 2, 3].map(|s| draw4((2, 2, 24, 8), s))
}

#[test]
fn the_operator_runs_the_backend_contract_on_its_own_planes() {
    let [q, k, v] = qkv();
    let op = SoftRace::new(Bits(2), Tables(3), Beta(6.0), Seed(5), 8).unwrap();
    for causal in [Causal::No, Causal::Yes] {
        let o = op.forward(q.view(), k.view(), v.view(), causal).unwrap();
        let params = op.params(causal);
        let want = crate::cpu::CpuRace::detected()
            .forward(&params, &op.planes, flat(&q), flat(&k), flat(&v))
            .unwrap();
        assert_eq!(o.as_slice().unwrap(), want.o.as_slice(), "{causal:?}");
        // The f64 reference on the same (f32-rounded) planes.
        let exact = op
            .clone()
            .on(Device::Reference)
            .unwrap()
            .forward(
                q.mapv(f64::from).view(),
                k.mapv(f64::from).view(),
                v.mapv(f64::from).view(),
                causal,
            )
            .unwrap();
        let err = max_diff(o.as_slice().unwrap(), exact.as_slice().unwrap());
        assert!(err < 1e-4, "{causal:?}: CPU vs reference {err:e}");
    }
}

#[test]
fn causal_is_an_argument_and_changes_the_answer() {
    let [q, k, v] = qkv();
    let op = SoftRace::new(Bits(2), Tables(3), Beta(6.0), Seed(5), 8).unwrap();
    let a = op
        .forward(q.view(), k.view(), v.view(), Causal::No)
        .unwrap();
    let b = op
        .forward(q.view(), k.view(), v.view(), Causal::Yes)
        .unwrap();
    let c = op
        .forward(q.view(), k.view(), v.view(), true.into())
        .unwrap();
    assert!(max_diff(a.as_slice().unwrap(), b.as_slice().unwrap()) > 1e-3);
    assert_eq!(b, c);
    // The last query sees every key either way.
    let last = |x: &Array4<f32>| x.slice(ndarray::s![.., .., 23, ..]).to_owned();
    assert!(max_diff(last(&a).as_slice().unwrap(), last(&b).as_slice().unwrap()) < 1e-5);
}

#[test]
fn backward_matches_the_reference_gradients() {
    let [q, k, v] = qkv();
    let go = draw4((2, 2, 24, 8), 4);
    let cpu = SoftRace::new(Bits(2), Tables(3), Beta(4.0), Seed(1), 8).unwrap();
    let reference = cpu.clone().on(Device::Reference).unwrap();
    for causal in [Causal::No, Causal::Yes] {
        let (o, tr) = cpu
            .forward_train(q.view(), k.view(), v.view(), causal)
            .unwrap();
        assert_eq!(
            o,
            cpu.forward(q.view(), k.view(), v.view(), causal).unwrap()
        );
        let g = cpu.backward(&tr, go.view()).unwrap();
        let (_, tr64) = reference
            .forward_train(q.view(), k.view(), v.view(), causal)
            .unwrap();
        let g64 = reference.backward(&tr64, go.view()).unwrap();
        for (name, a, b) in [
            ("dq", &g.dq, &g64.dq),
            ("dk", &g.dk, &g64.dk),
            ("dv", &g.dv, &g64.dv),
        ] {
            assert_eq!(a.shape(), q.shape());
            let scale = b.iter().fold(1e-3f32, |m, x| m.max(x.abs()));
            let err = max_diff(a.as_slice().unwrap(), b.as_slice().unwrap());
            assert!(
                err < 2e-3 * scale as f64,
                "{causal:?} {name}: {err:e} (scale {scale:e})"
            );
        }
        assert!((g.dbeta - g64.dbeta).abs() < 1e-3 * g64.dbeta.abs().max(1.0));
    }
}

#[test]
fn forward_into_writes_the_forward_and_reuses_its_workspace() {
    let [q, k, v] = qkv();
    let op = SoftRace::new(Bits(3), Tables(2), Beta(8.0), Seed(2), 8).unwrap();
    let mut ws = Workspace::new();
    let mut o = Array4::<f32>::zeros((2, 2, 24, 8));
    for causal in [Causal::No, Causal::Yes, Causal::No] {
        op.forward_into(q.view(), k.view(), v.view(), causal, o.view_mut(), &mut ws)
            .unwrap();
        assert_eq!(o, op.forward(q.view(), k.view(), v.view(), causal).unwrap());
    }
    // An output of the wrong shape, and one not in standard layout.
    let (mut short, mut t) = (
        Array4::<f32>::zeros((2, 2, 24, 7)),
        Array4::<f32>::zeros((2, 2, 8, 24)),
    );
    for o in [short.view_mut(), t.view_mut().reversed_axes()] {
        let e = op
            .forward_into(q.view(), k.view(), v.view(), Causal::No, o, &mut ws)
            .unwrap_err();
        assert_eq!(e.arg(), Some("o"), "{e}");
    }
}

#[test]
fn bad_values_are_refused_naming_the_argument() {
    let arg = |r: Result<SoftRace>| r.unwrap_err().arg().map(str::to_owned);
    assert_eq!(
        arg(SoftRace::new(Bits(0), Tables(2), Beta(1.0), Seed(0), 8)).as_deref(),
        Some("p")
    );
    assert_eq!(
        arg(SoftRace::new(Bits(2), Tables(0), Beta(1.0), Seed(0), 8)).as_deref(),
        Some("l")
    );
    assert_eq!(
        arg(SoftRace::new(
            Bits(2),
            Tables(2),
            Beta(f64::NAN),
            Seed(0),
            8
        ))
        .as_deref(),
        Some("beta")
    );
    assert_eq!(
        arg(SoftRace::new(Bits(2), Tables(2), Beta(1.0), Seed(0), 0)).as_deref(),
        Some("d")
    );
    // A NaN plane and short planes: refused where the planes are made.
    let mut w = vec![0.5; 2 * 2 * 4];
    assert!(Planes::from_data(Bits(2), Tables(2), 4, w[..15].to_vec()).is_err());
    w[3] = f64::NAN;
    let e = Planes::from_data(Bits(2), Tables(2), 4, w).unwrap_err();
    assert_eq!(e.arg(), Some("planes"), "{e}");
    // Planes that do not fit the inputs' d.
    let op = SoftRace::with_planes(
        &Planes::from_data(Bits(2), Tables(2), 4, vec![0.5; 16]).unwrap(),
        Beta(2.0),
    )
    .unwrap();
    let [q, k, v] = qkv();
    let e = op
        .forward(q.view(), k.view(), v.view(), Causal::No)
        .unwrap_err();
    assert_eq!(e.arg(), Some("planes"), "{e}");
    // A NaN input.
    let mut qn = q.clone();
    qn[[1, 1, 3, 2]] = f32::NAN;
    let op = SoftRace::new(Bits(2), Tables(2), Beta(2.0), Seed(0), 8).unwrap();
    let e = op
        .forward(qn.view(), k.view(), v.view(), Causal::No)
        .unwrap_err();
    assert_eq!(e.arg(), Some("q"), "{e}");
    // A backward from another operator, and an upstream gradient of the wrong shape.
    let other = SoftRace::new(Bits(2), Tables(2), Beta(2.0), Seed(0), 8).unwrap();
    let (o, tr) = other
        .forward_train(q.view(), k.view(), v.view(), Causal::No)
        .unwrap();
    assert_eq!(
        op.backward(&tr, o.view()).unwrap_err().arg(),
        Some("trained")
    );
    let go = Array4::<f32>::zeros((4, 1, 24, 8));
    assert_eq!(
        other.backward(&tr, go.view()).unwrap_err().arg(),
        Some("go")
    );
    // CUDA runs soft RACE only.
    assert_eq!(
        Softmax::new().on(Device::Cuda).unwrap_err().arg(),
        Some("device")
    );
    assert_eq!(Angular::new(Gamma(0.0)).unwrap_err().arg(), Some("gamma"));
    assert_eq!(
        Softmax::scaled(Scale(-1.0)).unwrap_err().arg(),
        Some("scale")
    );
    assert_eq!(
        Performer::new(Features(0), Seed(0)).unwrap_err().arg(),
        Some("features")
    );
}

#[test]
fn every_method_matches_its_reference_in_rank_3_and_4() {
    let [q, k, v] = qkv();
    type Run<'a> = Box<dyn Fn(Device) -> Result<Array4<f32>> + 'a>;
    // `$op` on device `d`, forward on q, k, v.
    macro_rules! on {
        ($op:expr, $causal:expr) => {
            Box::new(|d| $op.on(d)?.forward(q.view(), k.view(), v.view(), $causal)) as Run
        };
    }
    let ops: Vec<(&str, Run)> = vec![
        ("softmax", on!(Softmax::new(), Causal::Yes)),
        ("angular", on!(Angular::new(Gamma(2.0))?, Causal::No)),
        (
            "hard",
            on!(HardLsh::new(Bits(2), Tables(4), Seed(3), 8)?, Causal::No),
        ),
        ("linear", on!(Linear::new(), Causal::Yes)),
        (
            "performer",
            on!(
                Performer::new(Features(64), Seed(1))?.scaled(Scale(0.1))?,
                Causal::No
            ),
        ),
    ];
    for (name, run) in &ops {
        let (a, b) = (run(Device::Cpu).unwrap(), run(Device::Reference).unwrap());
        let err = max_diff(a.as_slice().unwrap(), b.as_slice().unwrap());
        assert!(err < 1e-4, "{name}: CPU vs reference {err:e}");
    }
    // Rank 3 gives the rank-4 answer with the leading axes merged.
    let r3 =
        |a: &Array4<f32>| -> Array3<f32> { a.clone().into_shape_with_order((4, 24, 8)).unwrap() };
    let (q3, k3, v3) = (r3(&q), r3(&k), r3(&v));
    let o3 = softmax(q3.view(), k3.view(), v3.view(), Causal::Yes).unwrap();
    let o4 = softmax(q.view(), k.view(), v.view(), Causal::Yes).unwrap();
    assert_eq!(o3.as_slice().unwrap(), o4.as_slice().unwrap());
}
