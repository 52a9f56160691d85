//! The README's library example: soft RACE on the CPU kernels (f32 end to end) against the f64
//! reference on the same planes, on ndarray arrays. `cargo run --release --example quickstart`
use ndarray::Array3;
use racelab::attend::attend_array;
use racelab::rng::SeededRng;
use racelab::{AttendOptions, Device, Method};

fn main() -> racelab::Result<()> {
    // Q, K, V as [heads, tokens, d] = [2, 512, 64], seeded normal draws.
    let mut rng = SeededRng::new(7, 0);
    let mut draw = || Array3::from_shape_vec((2, 512, 64), rng.normals(2 * 512 * 64)).unwrap();
    let (q, k, v) = (draw(), draw(), draw());
    // Soft RACE with P = 2 bits, L = 4 tables, β = 8, planes drawn from seed 0; causal.
    let opts = AttendOptions::new(Method::soft(2, 4, 8.0, 0)).causal(true);
    // f64 arrays to the reference (exact, log domain); f32 arrays to the f32 kernels, which
    // read them in place and return f32.
    let exact = attend_array(q.view(), k.view(), v.view(), &opts, Device::Reference)?;
    let (q32, k32, v32) = (
        q.mapv(|x| x as f32),
        k.mapv(|x| x as f32),
        v.mapv(|x| x as f32),
    );
    let fast = attend_array(q32.view(), k32.view(), v32.view(), &opts, Device::Cpu)?;
    let err = exact
        .o
        .iter()
        .zip(fast.o.iter())
        .map(|(a, &b)| (a - b as f64).abs())
        .fold(0.0, f64::max);
    println!("soft RACE (P=2, L=4, causal): CPU kernels within {err:.1e} of the f64 reference");
    Ok(())
}
