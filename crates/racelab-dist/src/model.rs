//! A model of sequence-parallel RACE's time against the rank count, fitted to measured runs
//! and projected to a cluster.
//!
//! One forward+backward over `N` tokens on `p` ranks:
//!
//! `T(p) = N · c / min(p · t, C)  +  Σ_collectives ⌈log2 p⌉ · (α + m · β_net)`
//!
//! - `c`: seconds per token on one core, measured (the one-rank run with `t` threads on `C`
//!   cores: `c = T(1) · min(t, C) / N`); the compute runs on the `min(p · t, C)` cores the
//!   ranks' threads can occupy (past `C` they share cores: oversubscribed);
//! - the collectives of a layer ([`super`]): the state scan of the forward, the one of the
//!   backward (each `m = 8 · heads · L·2^P · bank_width(dv)` bytes per rank) and the status
//!   all-reduce (16 bytes); each as `⌈log2 p⌉` rounds of one message (a recursive-doubling
//!   scan or all-reduce), a round costing the latency `α` plus `m` bytes at `1/β_net` bytes per
//!   second;
//! - [`Interconnect::IB_HDR`]: InfiniBand HDR, 200 Gb/s per port (25 GB/s) and about 1–2 µs
//!   of MPI latency; the model takes the upper end, `α = 2 µs`.
//!
//! The model leaves out what it cannot know from one machine: load imbalance beyond one token,
//! the network's contention and topology, and nodes slower than the one measured.

use serde::Serialize;

/// A network: latency per message round and seconds per byte.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Interconnect {
    /// A label (latency, bandwidth).
    pub name: &'static str,
    /// Seconds per message round (latency).
    pub alpha: f64,
    /// Seconds per byte (`1 / bandwidth`).
    pub beta: f64,
}

impl Interconnect {
    /// InfiniBand HDR: 200 Gb/s = 25 GB/s per port (NVIDIA ConnectX-6 HDR data sheet), MPI
    /// latency about 1–2 µs (the upper end taken).
    pub const IB_HDR: Interconnect = Interconnect {
        name: "InfiniBand HDR (2 µs, 25 GB/s)",
        alpha: 2e-6,
        beta: 1.0 / 25e9,
    };
}

/// The fitted model of one operator (shape, causal or not) on one kind of node.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Model {
    /// Seconds per token on one core.
    pub per_token_core: f64,
    /// Cores of one node.
    pub cores: usize,
    /// Bytes per rank of each state collective of a layer, and their count.
    pub state_bytes: u64,
    /// How many state collectives a layer takes.
    pub state_collectives: u32,
    /// Latency-only collectives of a layer (the status all-reduce).
    pub small_collectives: u32,
}

/// `⌈log2 p⌉` (0 for one rank).
pub fn rounds(p: usize) -> u32 {
    p.max(1).next_power_of_two().trailing_zeros()
}

impl Model {
    /// From a one-rank run: `seconds` for `n` tokens with `threads` threads.
    pub fn fit(seconds: f64, n: usize, threads: usize, cores: usize, state_bytes: u64) -> Model {
        Model {
            per_token_core: seconds * threads.min(cores).max(1) as f64 / n as f64,
            cores,
            state_bytes,
            state_collectives: 2,
            small_collectives: 1,
        }
    }

    /// Compute seconds for `n` tokens on `p` ranks of `threads` threads sharing one node's cores.
    pub fn compute_one_node(&self, n: usize, p: usize, threads: usize) -> f64 {
        n as f64 * self.per_token_core / (p * threads).min(self.cores).max(1) as f64
    }

    /// Collective seconds of one layer on `p` ranks over `net`.
    pub fn communication(&self, p: usize, net: &Interconnect) -> f64 {
        let r = rounds(p) as f64;
        let state =
            self.state_collectives as f64 * (net.alpha + self.state_bytes as f64 * net.beta);
        let small = self.small_collectives as f64 * (net.alpha + 16.0 * net.beta);
        r * (state + small)
    }

    /// Seconds of one layer for `n` tokens on `nodes` nodes of `self.cores` cores (one rank
    /// per node, all its cores), over `net`.
    pub fn cluster(&self, n: usize, nodes: usize, net: &Interconnect) -> f64 {
        n as f64 / nodes as f64 * self.per_token_core / self.cores as f64
            + self.communication(nodes, net)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_are_the_ceiling_of_log2() {
        let got: Vec<u32> = [1, 2, 3, 4, 5, 1024, 1025]
            .iter()
            .map(|&p| rounds(p))
            .collect();
        assert_eq!(got, [0, 1, 2, 2, 3, 10, 11]);
    }

    /// The fit inverts the one-rank time; compute stops scaling at the cores; communication
    /// grows with log2 p and is zero on one rank.
    #[test]
    fn the_model_scales_compute_by_cores_and_communication_by_log_p() {
        let m = Model::fit(2.0, 1000, 2, 2, 36_864);
        assert!((m.compute_one_node(1000, 1, 2) - 2.0).abs() < 1e-12);
        assert_eq!(
            m.compute_one_node(1000, 2, 1),
            m.compute_one_node(1000, 1, 2)
        );
        assert_eq!(
            m.compute_one_node(1000, 4, 1),
            m.compute_one_node(1000, 2, 1)
        );
        let net = Interconnect::IB_HDR;
        assert_eq!(m.communication(1, &net), 0.0);
        let per_round = 2.0 * (2e-6 + 36_864.0 / 25e9) + (2e-6 + 16.0 / 25e9);
        assert!((m.communication(1024, &net) - 10.0 * per_round).abs() < 1e-15);
        assert!(m.cluster(1 << 30, 1024, &net) < m.cluster(1 << 30, 512, &net));
    }
}
