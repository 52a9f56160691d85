//! The README's library example: soft RACE on the CPU kernels against the f64 reference on
//! the same planes. `cargo run --release --example quickstart`
use racelab::attend::attend_with;
use racelab::rng::SeededRng;
use racelab::Device;
use racelab::{AttendOptions, Method, Tensor};

fn main() -> racelab::Result<()> {
    // Q, K, V as [heads, tokens, d] = [2, 512, 64], seeded normal draws.
    let mut rng = SeededRng::new(7, 0);
    let mut draw = || Tensor::new(vec![2, 512, 64], rng.normals(2 * 512 * 64));
    let (q, k, v) = (draw()?, draw()?, draw()?);

    let opts = AttendOptions {
        method: Method::Soft,
        p: 2,
        l: 4,
        beta: 8.0,
        causal: true,
        ..Default::default()
    };
    let exact = attend_with(&q, &k, &v, &opts, Device::Reference)?;
    let fast = attend_with(&q, &k, &v, &opts, Device::Cpu)?;
    let err = exact
        .o
        .data
        .iter()
        .zip(&fast.o.data)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    println!("soft RACE (P=2, L=4, causal): CPU kernels within {err:.1e} of the f64 reference");
    Ok(())
}
