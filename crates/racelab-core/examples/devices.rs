//! One operator on two devices: soft RACE on the CPU kernels (f32 end to end) against the f64
//! reference (log domain, exact at any β) on the same planes. `cargo run --release --example
//! devices`
use ndarray::Array3;
use racelab_core::op::{Beta, Bits, Causal, Device, Seed, SoftRace, Tables};
use racelab_core::rng::SeededRng;

fn main() -> racelab_core::Result<()> {
    // Q, K, V as [heads, tokens, d] = [2, 512, 64], seeded normal draws.
    let mut rng = SeededRng::new(7, 0);
    let mut draw = || Array3::from_shape_simple_fn((2, 512, 64), || rng.normal());
    let (q, k, v) = (draw(), draw(), draw());
    // Soft RACE with P = 2 bits, L = 4 tables, β = 8, planes drawn from seed 0; causal.
    let op = SoftRace::new(Bits(2), Tables(4), Beta(8.0), Seed(0), 64)?;
    let reference = op.clone().on(Device::Reference)?;
    let exact = reference.forward(q.view(), k.view(), v.view(), Causal::Yes)?; // f64 in, f64 out
    let (q32, k32, v32) = (
        q.mapv(|x| x as f32),
        k.mapv(|x| x as f32),
        v.mapv(|x| x as f32),
    );
    let fast = op.forward(q32.view(), k32.view(), v32.view(), Causal::Yes)?; // f32 kernels
    let err = exact
        .iter()
        .zip(fast.iter())
        .map(|(a, &b)| (a - b as f64).abs())
        .fold(0.0, f64::max);
    println!("soft RACE (P=2, L=4, causal): CPU kernels within {err:.1e} of the f64 reference");
    Ok(())
}
