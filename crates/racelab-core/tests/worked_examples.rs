//! The worked examples from the seeds, computed by the library.
mod common;
use common::assert_close;
use racelab_core::reference::baselines::feature_attention;
use racelab_core::reference::race::{bucket_attention, Features};
use racelab_core::{Combine, MatRef};

/// Slides backup: φ(K1)=(0.8,0.2), φ(K2)=(0.1,0.9), V=(2,10), φ(Q)=(0.75,0.25).
#[test]
fn bucket_mass_example_paper_vs_authors() {
    let fq = [0.75, 0.25];
    let fk = [0.8, 0.2, 0.1, 0.9];
    let v = [2.0, 10.0];
    let q = Features::new(1, 1, 2, &fq);
    let k = Features::new(1, 2, 2, &fk);
    let paper = bucket_attention(
        &q,
        &k,
        MatRef::new(2, 1, &v).unwrap(),
        false,
        Combine::Paper,
    );
    assert_close(
        "Algorithm 1 = 4.3/0.95",
        &paper.o.data,
        &[4.3 / 0.95],
        1e-14,
    );
    assert!((paper.o.data[0] - 4.5263).abs() < 1e-4);
    let authors = bucket_attention(
        &q,
        &k,
        MatRef::new(2, 1, &v).unwrap(),
        false,
        Combine::Authors,
    );
    // 0.75·2.6/(0.9+1e-6) + 0.25·9.4/(1.1+1e-6)
    let want = 0.75 * 2.6 / (0.9 + 1e-6) + 0.25 * 9.4 / (1.1 + 1e-6);
    assert_close("per-bucket means", &authors.o.data, &[want], 1e-14);
    assert!(
        (authors.o.data[0] - 4.3030).abs() < 1e-4,
        "got {}",
        authors.o.data[0]
    );
}

/// Linear-attention walkthrough: φ(x) = [1, x1, x2], keys' φ given, values 1..4, out_1 = 14/6.
#[test]
fn linear_attention_walkthrough_example() {
    let phi_k = [1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0];
    let phi_q = [1.0, 1.0, 0.0];
    let v = [1.0, 2.0, 3.0, 4.0];
    let out = feature_attention(
        MatRef::new(1, 3, &phi_q).unwrap(),
        MatRef::new(4, 3, &phi_k).unwrap(),
        MatRef::new(4, 1, &v).unwrap(),
        false,
    );
    assert_close("out_1 = 14/6", &out.o.data, &[14.0 / 6.0], 1e-14);
}
