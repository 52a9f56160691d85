//! Every operator on the same f32 inputs `[heads, tokens, d]`, each against exact softmax:
//! soft RACE, hard LSH, exact angular attention, linear attention and Performer.
//! `cargo run --release --example methods`
use ndarray::Array3;
use racelab_core::op::{Angular, Beta, Bits, Causal, Features, Gamma, HardLsh, Linear, Performer};
use racelab_core::op::{Seed, SoftRace, Tables};
use racelab_core::rng::SeededRng;

fn main() -> racelab_core::Result<()> {
    let (h, n, d) = (4, 512, 32);
    let mut rng = SeededRng::new(11, 0);
    let mut draw = || Array3::from_shape_simple_fn((h, n, d), || rng.normal() as f32);
    let (q, k, v) = (draw(), draw(), draw());
    let (q, k, v) = (q.view(), k.view(), v.view());
    let exact = racelab_core::softmax(q, k, v, Causal::Yes)?;
    let gap = |o: Array3<f32>| (&o - &exact).mapv(f32::abs).mean().unwrap_or(0.0);
    let soft = SoftRace::new(Bits(2), Tables(8), Beta(10.0), Seed(0), d)?;
    let rows = [
        (
            "soft RACE, P = 2, L = 8, β = 10",
            gap(soft.forward(q, k, v, Causal::Yes)?),
        ),
        (
            "hard LSH, P = 2, L = 8",
            gap(HardLsh::new(Bits(2), Tables(8), Seed(0), d)?.forward(q, k, v, Causal::Yes)?),
        ),
        (
            "exact angular, γ = 2",
            gap(Angular::new(Gamma(2.0))?.forward(q, k, v, Causal::Yes)?),
        ),
        (
            "linear (elu + 1)",
            gap(Linear::new().forward(q, k, v, Causal::Yes)?),
        ),
        (
            "Performer, m = 64",
            gap(Performer::new(Features(64), Seed(0))?.forward(q, k, v, Causal::Yes)?),
        ),
    ];
    println!("mean |Ô − softmax| on [{h}, {n}, {d}], causal:");
    for (name, g) in rows {
        println!("  {name:<34} {g:.4}");
    }
    Ok(())
}
