//! The array boundary: ndarray views in standard and strided layout, f32 end to end.
mod common;
use common::randn_t;
use ndarray::{Array4, ArrayView4, Axis};
use racelab_core::attend::{attend_array, attend_in, attend_with};
use racelab_core::params::{Beta, Bits, Seed, Tables};
use racelab_core::tensor::{Element, TensorRef};
use racelab_core::{AttendOptions, Device, Method};
use std::borrow::Cow;

/// `[B, N, H, d]` seeded normal draws (a layout an attention layer often holds before its
/// heads are split out).
fn bnhd(n: usize, h: usize, d: usize, seed: u64) -> Array4<f32> {
    let t = randn_t(&[1, n, h, d], seed);
    Array4::from_shape_vec((1, n, h, d), t.data.iter().map(|&x| x as f32).collect()).unwrap()
}

fn soft(causal: bool) -> AttendOptions {
    AttendOptions::new(Method::soft(Bits(2), Tables(3), Beta(6.0), Seed(0))).causal(causal)
}

#[test]
fn a_strided_view_round_trips_through_the_cpu_kernels_and_the_reference() {
    let (n, h, d) = (40, 2, 16);
    let (q, k, v) = (bnhd(n, h, d, 1), bnhd(n, h, d, 2), bnhd(n, h, d, 3));
    // `[B, H, N, d]` as a permuted (non-contiguous) view of the `[B, N, H, d]` arrays.
    fn heads(a: &Array4<f32>) -> ArrayView4<'_, f32> {
        a.view().permuted_axes([0, 2, 1, 3])
    }
    let (qs, ks, vs) = (heads(&q), heads(&k), heads(&v));
    assert!(!qs.is_standard_layout());
    let (qc, kc, vc) = (
        qs.as_standard_layout().into_owned(),
        ks.as_standard_layout().into_owned(),
        vs.as_standard_layout().into_owned(),
    );
    for causal in [false, true] {
        let opts = soft(causal);
        let strided = attend_array(qs, ks, vs, &opts, Device::Cpu).unwrap();
        let standard = attend_array(qc.view(), kc.view(), vc.view(), &opts, Device::Cpu).unwrap();
        assert_eq!(strided.copied, [true; 3], "a permuted view is copied once");
        assert_eq!(
            standard.copied, [false; 3],
            "a standard view is read in place"
        );
        assert_eq!(strided.o.shape(), &[1, h, n, d]);
        assert_eq!(strided.o, standard.o, "the layout changes nothing");
        // The f64 reference on the same values (widened exactly), through a strided f64 view.
        let (q64, k64, v64) = (q.mapv(f64::from), k.mapv(f64::from), v.mapv(f64::from));
        let exact = attend_array(
            q64.view().permuted_axes([0, 2, 1, 3]),
            k64.view().permuted_axes([0, 2, 1, 3]),
            v64.view().permuted_axes([0, 2, 1, 3]),
            &opts,
            Device::Reference,
        )
        .unwrap();
        let scale = exact.o.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        let err = strided
            .o
            .iter()
            .zip(exact.o.iter())
            .fold(0.0f64, |m, (a, b)| m.max((*a as f64 - b).abs()));
        assert!(
            err <= 1e-4 * scale,
            "causal {causal}: CPU vs reference {err:e} (scale {scale})"
        );
        // Per head, the output is the head's own problem: head 1 alone gives head 1's rows.
        let one = attend_array(
            qc.index_axis(Axis(1), 1).insert_axis(Axis(1)),
            kc.index_axis(Axis(1), 1).insert_axis(Axis(1)),
            vc.index_axis(Axis(1), 1).insert_axis(Axis(1)),
            &opts,
            Device::Cpu,
        )
        .unwrap();
        assert_eq!(
            one.o.index_axis(Axis(1), 0),
            standard.o.index_axis(Axis(1), 1)
        );
    }
}

#[test]
fn f32_rows_reach_the_kernels_without_a_copy_and_come_back_f32() {
    let rows = [1.0f32, 2.0, 3.0];
    assert!(matches!(f32::as_f32(&rows), Cow::Borrowed(_)));
    assert!(matches!(f64::as_f64(&[1.0f64]), Cow::Borrowed(_)));
    // The f32 call and the f64 call on the same (f32-representable) values agree on the
    // kernels: both run the same f32 arithmetic.
    let t = randn_t(&[2, 24, 8], 5).map(|x| x as f32 as f64);
    let t32 = t.map(|x| x as f32);
    let opts = soft(true);
    let o32 = attend_in(&t32.view(), &t32.view(), &t32.view(), &opts, Device::Cpu).unwrap();
    let o64 = attend_with(&t, &t, &t, &opts, Device::Cpu).unwrap();
    let widened: Vec<f64> = o32.o.data.iter().map(|&x| x as f64).collect();
    assert_eq!(widened, o64.o.data);
    // A view whose shape does not hold its data is refused, naming the argument.
    let e = TensorRef::new("q", vec![2, 3], &rows[..])
        .unwrap_err()
        .to_string();
    assert!(e.contains("`q`"), "{e}");
}

/// The backend contract on views: a permuted `ArrayView4` through the CPU kernels and the
/// reference (`BackendArrays`), forward and backward, equal to the same call on the
/// standard-layout copy, and the two backends within f32 tolerance of each other.
#[test]
fn the_backend_contract_takes_strided_views_forward_and_backward() {
    use racelab_core::backend::{BackendArrays, PlanesF32, RaceParams};
    use racelab_core::cpu::CpuRace;
    use racelab_core::reference::ReferenceRace;
    let (n, h, d) = (33, 2, 8);
    let (q, k, v, g) = (
        bnhd(n, h, d, 11),
        bnhd(n, h, d, 12),
        bnhd(n, h, d, 13),
        bnhd(n, h, d, 14),
    );
    let view = |a: &Array4<f32>| {
        a.view()
            .permuted_axes([0, 2, 1, 3])
            .as_standard_layout()
            .into_owned()
    };
    let (qo, ko, vo, go) = (view(&q), view(&k), view(&v), view(&g));
    fn heads(a: &Array4<f32>) -> ArrayView4<'_, f32> {
        a.view().permuted_axes([0, 2, 1, 3])
    }
    let planes = PlanesF32::from_planes(
        &racelab_core::Planes::gaussian(Bits(2), Tables(3), d, Seed(5)).unwrap(),
    );
    let params = RaceParams::new(Bits(2), Tables(3), Beta(6.0))
        .unwrap()
        .with_causal(true);
    let cpu = CpuRace::detected();
    let qkv = [heads(&q), heads(&k), heads(&v)];
    let (f, gr) = cpu
        .forward_backward_array(&params, &planes, qkv, heads(&g))
        .unwrap();
    assert_eq!(f.copied, [true; 3]);
    assert_eq!(f.o.shape(), &[1, h, n, d]);
    let std_qkv = [qo.view(), ko.view(), vo.view()];
    let (fs, grs) = cpu
        .forward_backward_array(&params, &planes, std_qkv, go.view())
        .unwrap();
    assert_eq!(fs.copied, [false; 3]);
    assert_eq!(f.o, fs.o);
    assert_eq!((&gr.dq, &gr.dk, &gr.dv), (&grs.dq, &grs.dk, &grs.dv));
    // The reference on the same f32 views (widened exactly), forward only.
    let r = ReferenceRace
        .forward_array(&params, &planes, heads(&q), heads(&k), heads(&v))
        .unwrap();
    let err =
        f.o.iter()
            .zip(r.o.iter())
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
    assert!(err < 1e-4, "CPU vs reference on views: {err}");
    // Rank 2 is one head: the rank-3 answer with that axis dropped.
    let flat = ndarray::Array2::from_shape_fn((n, d), |(i, j)| ((i * 7 + j * 3) as f32).sin());
    let two = cpu
        .forward_array(&params, &planes, flat.view(), flat.view(), flat.view())
        .unwrap();
    let one = flat.view().insert_axis(Axis(0));
    let three = cpu.forward_array(&params, &planes, one, one, one).unwrap();
    assert_eq!(two.o.view().insert_axis(Axis(0)), three.o);
    // Rank 5 is refused, naming the argument.
    let deep = ndarray::Array5::<f32>::zeros((1, 1, 1, n, d));
    let e = cpu
        .forward_array(&params, &planes, deep.view(), deep.view(), deep.view())
        .unwrap_err()
        .to_string();
    assert!(e.contains("`q`") && e.contains("[heads, n, cols]"), "{e}");
}
