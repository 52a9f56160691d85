//! Production soft RACE as blocked matrix products, non-causal (Algorithm 1) and causal
//! (Algorithm 2 as chunked linear attention).
//!
//! ## Non-causal ([`forward`], [`backward`])
//!
//! Tokens are processed in blocks of [`block_rows`] (128 for banks of at most 16 features,
//! else [`T`] = 64): with `Φ` the block's `T × m` features, `X̂ = [V, 1]` its extended values,
//! `Ĝ = [G/Den, −GᵀÔ/Den]`, and the bank `𝔅 = [B | A]` (`m × w`):
//!
//! - keys: `𝔅 += Φ_Kᵀ X̂` (f32 within a block, added into f64 after every block);
//! - queries: `Den = Φ_Q A`, then `O = (Φ_Q / Den) B` straight into the output rows;
//! - backward, queries: `∂ℓ/∂Φ_Q = Ĝ 𝔅ᵀ / L`, `d𝔅 += Φ_Qᵀ Ĝ / L`;
//! - backward, keys: `∂ℓ/∂Φ_K = X̂ d𝔅ᵀ`, `∂ℓ/∂V = Φ_K dB`;
//! - projections `Z = X Wᵀ` and `∂ℓ/∂X = dZ W`.
//!
//! Every product is one call on the block (the bank is read once per block, not once per
//! token): [`gemm`](crate::cpu::gemm::gemm) register tiles, or
//! [`Nt`](crate::cpu::gemm::Nt) dot products where the output has few columns and a
//! long inner dimension. The extension columns are never materialised:
//! `Φᵀ[V, 1] = [ΦᵀV, Φᵀ1]`, and `Ĝ`'s per-row scale `1/(L·Den)` is folded into `Φ` or into the
//! `T × m` result.
//!
//! ## Causal ([`causal`], [`causal_forward`], [`causal_backward`])
//!
//! Tokens are processed in blocks of [`TB`] (features, their backward and the input
//! gradients, one product each) split into sub-blocks of [`TC`]. With `S = [B | A]` the bank
//! entering a sub-block (f64 base + f32 block-local sum, read as one f32 matrix),
//! lower-triangular masks (`j ≤ i`, token i sees itself), and `Ĝ = [G/Den, −s/Den]/L` with
//! its row factors `c_i = 1/(L·Den_i)`, `s_i = g_i·ô_i`:
//!
//! - forward: `[Num | Den] = Φ_Q S + tril(Φ_Q Φ_Kᵀ) X̂`, then `S += Φ_Kᵀ X̂`;
//! - backward, queries (forward order): `∂ℓ/∂Φ_Q = Ĝ Sᵀ + tril(Ĝ X̂ᵀ) Φ_K`, where
//!   `(Ĝ X̂ᵀ)_ij = c_i (g_i·v_j − s_i)`; `Ô` is not read:
//!   `s_i = c_i (Σ_f φ_if (g_i·S_f) + Σ_{j≤i} (φ_i·φ_j)(g_i·v_j))`;
//! - backward, keys (reverse order; `dS` = suffix `Σ_{t>block} φ(q_t) ĝ_tᵀ`):
//!   `∂ℓ/∂Φ_K = X̂ dSᵀ + triu(X̂ Ĝᵀ) Φ_Q`, `∂ℓ/∂V = Φ_K dS_B + triu(Φ_K Φ_Qᵀ) (c ⊙ G)`.
//!
//! Segments (for parallelism at few heads) start from f64 exclusive scans of segment totals;
//! the f32 block-local sums move into f64 every [`TB`] tokens, so accuracy does not depend on
//! N. When each head is one segment, the forward keeps the state entering every block
//! ([`Ctx::states`](crate::cpu::Ctx::states), `m·w/TB` floats per token) and the backward is
//! one reverse pass over the blocks: per block the queries' half (in order, from the saved
//! block-start state), then the keys' half (in reverse, with `dS` carried from the end of the
//! head), reading the queries' `tril(Ĝ X̂ᵀ)` and `c ⊙ tril(Φ_Q Φ_Kᵀ)` transposed. Within a
//! block the prefix state is one f32 matrix; it differs from the two-level sum only by the
//! roundings of at most `TB/TC − 1` additions.
//!
//! ## Both forms
//!
//! The forward saves `u = tanh(Wq)`, `u = tanh(Wk)` in the [`Ctx`](crate::cpu::Ctx), so the
//! backward reads only `G` and `V` besides them. The next block's input rows are prefetched
//! a share at a time; outputs of at least 32 MiB are written with streaming stores
//! ([`crate::cpu::mem`]). Banks of at most 16 features (one 512-bit vector per token) take
//! AVX-512 row passes ([`crate::cpu::bank16`]) instead of chains of small products. Rows whose
//! denominator f32 cannot hold are flagged for [`crate::cpu::recompute`]. Same maths, same
//! planes and same context as the per-token twin [`crate::cpu::token`]; tested against the f64
//! reference on the same planes.

pub mod backward;
pub mod banks;
pub mod block;
pub mod causal;
pub mod causal_backward;
pub mod causal_forward;
pub mod causal_query;
pub mod forward;
pub mod probs;

pub use backward::{backward_into, key_grads, query_grads, QuerySaved};
#[cfg(test)]
pub(crate) use causal::TB;
pub use causal_backward::{causal_backward_from, causal_backward_into};
pub use causal_forward::{causal_forward_from, causal_forward_into, Boundary};
pub use forward::{forward_into, key_banks, read_ctx};

#[cfg(test)]
mod tests {
    use crate::params::{Bits, Seed, Tables};
    /// The memory model's block is the kernels' ([`crate::memory::saved_floats_per_token`]);
    /// its bank width is the one definition the kernels read.
    #[test]
    fn the_memory_model_knows_the_kernels_block() {
        assert_eq!(crate::memory::STATE_BLOCK, super::TB);
    }

    /// The blocked kernels against the per-token twin on a shape small enough for Miri (which
    /// runs it in CI: every slice, pointer and queued write of both engines checked), causal
    /// and not, forward and backward, at every level this CPU has (under Miri: scalar).
    #[test]
    fn the_blocked_kernels_match_the_token_twin_on_a_small_shape() {
        use crate::backend::{BackwardInputs, Heads, PlanesF32};
        use crate::cpu::simd::{Isa, Level};
        use crate::cpu::{soft_backward, soft_forward, token, SoftMap};
        let (heads, n, d, dv) = (2usize, 37usize, 5usize, 3usize);
        let x = |len: usize, k: f32| -> Vec<f32> {
            (0..len).map(|i| (i as f32 * k + 0.3).sin()).collect()
        };
        let (q, k, v, g) = (
            x(heads * n * d, 0.7),
            x(heads * n * d, 1.3),
            x(heads * n * dv, 2.1),
            x(heads * n * dv, 0.9),
        );
        let planes = PlanesF32::from_planes(
            &crate::Planes::gaussian(Bits(2), Tables(2), d, Seed(1)).unwrap(),
        );
        let map = SoftMap::new(&planes, 3.0).unwrap();
        fn rows(a: &[f32], heads: usize, n: usize, c: usize) -> Heads<'_> {
            Heads::new(heads, n, c, a).unwrap()
        }
        let (qh, kh, vh, gh) = (
            rows(&q, heads, n, d),
            rows(&k, heads, n, d),
            rows(&v, heads, n, dv),
            rows(&g, heads, n, dv),
        );
        // Miri perturbs the results of `tanh`, `exp` and the like by a few units (it checks
        // that nothing relies on their last bits): there the engines agree less closely.
        let tol = if cfg!(miri) { 1e-3 } else { 1e-5 };
        let close = |tag: &str, a: &[f32], b: &[f32]| {
            let top = b.iter().fold(1e-6f32, |m, y| m.max(y.abs()));
            for (i, (p, r)) in a.iter().zip(b).enumerate() {
                assert!((p - r).abs() <= tol * top, "{tag}[{i}]: {p} vs {r}");
            }
        };
        let mut isas: Vec<Isa> = Vec::new();
        for level in [Level::Scalar, Level::Avx2, Level::Avx512] {
            let isa = Isa::at_most(level);
            if !isas.contains(&isa) {
                isas.push(isa);
            }
        }
        for isa in isas {
            for causal in [false, true] {
                let tag = format!("{:?} causal={causal}", isa.level());
                let (blk, tw) = (
                    soft_forward(&map, qh, kh, vh, causal, isa),
                    token::forward(&map, qh, kh, vh, causal, isa),
                );
                close(&format!("{tag} o"), &blk.o, &tw.o);
                let (ob, ot) = (rows(&blk.o, heads, n, dv), rows(&tw.o, heads, n, dv));
                let gb =
                    soft_backward(&map, &blk.ctx, BackwardInputs::new(qh, kh, vh, ob, gh), isa);
                let gt = token::soft_backward(
                    &map,
                    &tw.ctx,
                    BackwardInputs::new(qh, kh, vh, ot, gh),
                    isa,
                );
                close(&format!("{tag} dq"), &gb.dq, &gt.dq);
                close(&format!("{tag} dk"), &gb.dk, &gt.dk);
                close(&format!("{tag} dv"), &gb.dv, &gt.dv);
            }
        }
    }
}
