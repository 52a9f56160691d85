//! Soft RACE as one operator object on f32 `Array4` inputs `[batch, heads, tokens, d]`:
//! forward, forward for training and backward, causal and not, beside exact softmax.
//! `cargo run --release --example operator` (`tests/operator_example.rs` checks what it
//! computes against the f64 reference).
use ndarray::Array4;
use racelab_core::op::{Beta, Bits, Causal, Grads, Seed, SoftRace, Tables};
use racelab_core::rng::SeededRng;

/// What the example computes: soft RACE's outputs and gradients (not causal, then causal),
/// exact softmax attention (causal), and the operator.
pub struct Outputs {
    pub soft: Vec<Array4<f32>>,
    pub grads: Vec<Grads<f32, ndarray::Ix4>>,
    pub exact: Array4<f32>,
    pub op: SoftRace,
}

/// Soft RACE at P = 2 bits, L = 8 tables, β = 10 on planes drawn from seed 0, on `q`, `k`,
/// `v` with upstream gradient `go`; and exact softmax.
pub fn run(
    q: &Array4<f32>,
    k: &Array4<f32>,
    v: &Array4<f32>,
    go: &Array4<f32>,
) -> racelab_core::Result<Outputs> {
    let d = q.shape()[3];
    let op = SoftRace::new(Bits(2), Tables(8), Beta(10.0), Seed(0), d)?;
    let (mut soft, mut grads) = (Vec::new(), Vec::new());
    for causal in [Causal::No, Causal::Yes] {
        let (o, saved) = op.forward_train(q.view(), k.view(), v.view(), causal)?;
        grads.push(op.backward(&saved, go.view())?);
        soft.push(o);
    }
    let exact = racelab_core::softmax(q.view(), k.view(), v.view(), Causal::Yes)?;
    Ok(Outputs {
        soft,
        grads,
        exact,
        op,
    })
}

/// Seeded N(0, 1) draws `[batch, heads, tokens, d]`.
pub fn draw(shape: (usize, usize, usize, usize), seed: u64) -> Array4<f32> {
    let mut rng = SeededRng::new(seed, 0);
    Array4::from_shape_simple_fn(shape, || rng.normal() as f32)
}

fn main() -> racelab_core::Result<()> {
    let shape = (2, 4, 1024, 32);
    let [q, k, v, go] = [1, 2, 3, 4].map(|seed| draw(shape, seed));
    let out = run(&q, &k, &v, &go)?;
    let gap = (&out.soft[1] - &out.exact)
        .mapv(f32::abs)
        .mean()
        .unwrap_or(0.0);
    println!("soft RACE (P=2, L=8, β=10) on {shape:?}: mean |Ô − softmax| (causal) = {gap:.3}");
    for (causal, g) in ["not causal", "causal"].iter().zip(&out.grads) {
        let norm = |a: &Array4<f32>| a.mapv(|x| x * x).sum().sqrt();
        println!(
            "{causal}: |∂ℓ/∂q| = {:.3}, |∂ℓ/∂k| = {:.3}, |∂ℓ/∂v| = {:.3}, ∂ℓ/∂β = {:.3e}",
            norm(&g.dq),
            norm(&g.dk),
            norm(&g.dv),
            g.dbeta
        );
    }
    Ok(())
}
