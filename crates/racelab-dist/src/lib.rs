//! # racelab-dist
//!
//! Sequence-parallel soft RACE: the token axis split across ranks, one collective of an
//! `O(L·R·dv)` state per layer.
//!
//! Rank `r` of `R` owns the contiguous tokens [`slice_of`]`(N, R, r)` of every head (queries,
//! keys, values and gradients alike). With `S_r = Σ_{j ∈ slice r} φ(k_j)[v_j, 1]ᵀ` (per head,
//! `m = L·2^P` rows of width `w = bank_width(dv)`, f64):
//!
//! - **non-causal** (Algorithm 1): every query reads the whole bank, so each rank forms its
//!   `S_r` ([`Partial::key_banks`]), one **all-reduce** gives `Σ_r S_r`, and each rank reads
//!   its queries from it ([`Partial::read`]). Backward: each rank's queries give their `∂ℓ/∂q`
//!   and their share of `d𝔅 = Σ_i φ(q_i) ĝ_iᵀ` ([`Partial::query_grads`]); an all-reduce of
//!   `d𝔅`, then the keys' gradients ([`Partial::key_grads`]);
//! - **causal** (Algorithm 2): token `i` sees the keys before its slice, `Σ_{r' < r} S_{r'}`:
//!   an **exclusive prefix scan** of the slice totals, then the chunked causal pass started
//!   from it ([`Partial::causal_forward`]). Backward: a key sees the queries after it, so each
//!   rank forms its queries' `dS_r = Σ_{i ∈ slice r} φ(q_i) ĝ_iᵀ` ([`Partial::query_totals`])
//!   and an **exclusive suffix scan** gives `Σ_{r' > r} dS_{r'}`, the state its keys' reverse
//!   pass starts from ([`Partial::causal_backward`]);
//! - `∂ℓ/∂β` is the **all-reduce** of the ranks' shares; it carries a status word (the rows each
//!   rank flagged), so a forward+backward is three collectives and a forward two.
//!
//! The states are reduced in f64. A rank's own sums are the single-process kernels' (f32
//! within a block, f64 across blocks), so results for different rank counts differ only by
//! where the block boundaries fall: f32 block-sum rounding, measured in `tests/distributed.rs`.
//!
//! The kernels are reached only through the partial-kernel contract of the core
//! ([`racelab_core::shared::Partial`], implemented by [`racelab_core::cpu::CpuRace`]), and the
//! layout every backend shares ([`racelab_core::shared::layout`]).
//!
//! **Bytes per layer.** Each collective moves `heads · m · w` f64 per rank:
//! `8 · heads · L·2^P · bank_width(dv)` bytes; at the paper shape (4 heads, (P, L) = (2, 2),
//! dv = 128) 36,864 bytes, whatever N is.
//!
//! **Agreement.** Before computing, one all-reduce (max) of every rank's parameters, planes
//! digest, shapes and local error flag with their bitwise complements gives each rank the
//! minimum and the maximum of every field: a field that differs is named on every rank, a rank
//! whose own inputs were refused is named to the others, and every rank returns the error
//! instead of waiting in a collective the others never enter. The same reduction carries each
//! rank's token counts, so every rank learns the whole layout. [`Distributed::trusting`] skips
//! it for callers that checked once at start-up ([`Distributed::agree`]).
//!
//! **Rows f32 cannot hold** (denominator below [`racelab_core::shared::recompute::den_floor`], large β):
//! the single-process kernels recompute them exactly with every key; a rank holds only its
//! own keys, so the distributed operator refuses them on every rank with an error that names
//! β and the fix (one process, or a smaller β) instead of returning them wrong.
//!
//! Transports ([`comm`]): [`Solo`], [`ThreadComm`] (ranks as threads: the algorithm is tested in
//! every build) and, with the `mpi` cargo feature, `mpi::MpiComm`.

#![deny(missing_docs)]

pub mod bench;
pub mod comm;
pub mod job;
pub mod model;
#[cfg(feature = "mpi")]
pub mod mpi;
pub mod stream;

pub use comm::{thread_group, Comm, Solo, ThreadComm};

use racelab_core::backend::{
    Backend, BackwardInputs, Decode, Device, Forward, GradsMut, Heads, PlanesF32, RaceParams,
    SoftGrads,
};
use racelab_core::cpu::{CpuRace, Isa, SliceSaved};
use racelab_core::error::{RaceError, Result};
use racelab_core::shared::{zero_banks, Partial, SoftMap};
use serde::Serialize;
use std::sync::Mutex;
use std::time::Instant;

/// The contiguous tokens `start..end` rank `rank` of `size` owns out of `n`: the first
/// `n mod size` ranks one more than the others (a rank may own none).
pub fn slice_of(n: usize, size: usize, rank: usize) -> (usize, usize) {
    let (base, extra) = (n / size, n % size);
    let start = rank * base + rank.min(extra);
    (start, start + base + usize::from(rank < extra))
}

/// Bytes each rank contributes to one state collective: `8 · heads · L·2^P · bank_width(dv)`.
pub fn state_bytes(heads: usize, p: usize, l: usize, dv: usize) -> u64 {
    8 * (heads * (l << p) * racelab_core::shared::bank_width(dv)) as u64
}

/// Collectives taken, bytes this rank contributed and seconds spent in them.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct Traffic {
    /// Collectives taken.
    pub collectives: u64,
    /// Bytes this rank contributed to them.
    pub bytes: u64,
    /// Seconds spent in them.
    pub seconds: f64,
}

/// Every rank's token counts, learned by the agreement reduction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Queries per rank.
    pub q_rows: Vec<usize>,
    /// Keys (and values) per rank.
    pub k_rows: Vec<usize>,
}

impl Layout {
    /// Queries in the whole sequence.
    pub fn queries(&self) -> usize {
        self.q_rows.iter().sum()
    }
    /// Keys in the whole sequence.
    pub fn keys(&self) -> usize {
        self.k_rows.iter().sum()
    }
    /// The first query of `rank`'s slice.
    pub fn q_start(&self, rank: usize) -> usize {
        self.q_rows[..rank].iter().sum()
    }
}

/// The soft-RACE operator over a group of ranks ([`Comm`]), each holding its slice of the
/// token axis, computed with the production CPU kernels. Implements [`Backend`] with
/// `q`, `k`, `v`, `g` the rank's slices (`[heads, n_r, ·]`) and results for its slice.
pub struct Distributed<C: Comm> {
    /// The group of ranks this one talks to.
    pub comm: C,
    /// The instruction set the kernels run at.
    pub isa: Isa,
    /// Check that the ranks agree ([`Distributed::agree`]) on every call.
    pub check_each_call: bool,
    traffic: Mutex<Traffic>,
    /// The layout of the last agreement.
    layout: Mutex<Option<Layout>>,
}

/// The one validation ([`racelab_core::backend::check`]) of a rank's slice. A rank may hold no rows
/// of its own: it then checks its parameters and planes, and the widths it shares with the
/// others are agreed by [`Distributed::agree`].
pub fn check_slice(
    params: &RaceParams,
    planes: &PlanesF32,
    q: &Heads,
    k: &Heads,
    v: &Heads,
    g: Option<&Heads>,
) -> Result<()> {
    if q.n() == 0 || k.n() == 0 {
        racelab_core::backend::soft_method(params, planes).map(|_| ())
    } else {
        racelab_core::backend::check(params, planes, q, k, v, g)
    }
}

/// The names of the fields [`Distributed::agree`] compares, in order.
const FIELDS: [&str; 10] = [
    "P",
    "L",
    "beta",
    "combine",
    "causal",
    "heads",
    "d",
    "dv",
    "g's width",
    "planes",
];

impl<C: Comm> Distributed<C> {
    /// The operator over `comm`, checking agreement on every call.
    pub fn new(comm: C) -> Self {
        Distributed {
            comm,
            isa: racelab_core::cpu::detected_isa(),
            check_each_call: true,
            traffic: Mutex::new(Traffic::default()),
            layout: Mutex::new(None),
        }
    }

    /// The operator over `comm` without the per-call agreement check, for callers that ran
    /// [`Distributed::agree`] once at start-up with the arguments every call will use.
    pub fn trusting(comm: C) -> Self {
        Distributed {
            check_each_call: false,
            ..Self::new(comm)
        }
    }

    /// The collectives since the last call (and reset).
    pub fn take_traffic(&self) -> Traffic {
        std::mem::take(&mut *self.traffic.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn timed<T>(&self, bytes: usize, f: impl FnOnce(&C) -> T) -> T {
        let t = Instant::now();
        let out = f(&self.comm);
        let mut tr = self.traffic.lock().unwrap_or_else(|e| e.into_inner());
        tr.collectives += 1;
        tr.bytes += bytes as u64;
        tr.seconds += t.elapsed().as_secs_f64();
        out
    }

    /// Per-head banks through one collective (flattened, reduced in f64, split again).
    fn reduce_banks(&self, banks: &mut [Vec<f64>], op: fn(&C, &mut [f64])) {
        let mut flat: Vec<f64> = banks.iter().flatten().copied().collect();
        self.timed(flat.len() * 8, |c| op(c, &mut flat));
        let len = banks.first().map_or(0, |b| b.len());
        for (b, x) in banks.iter_mut().zip(flat.chunks(len.max(1))) {
            b.copy_from_slice(x);
        }
    }

    /// One all-reduce (max) of what every rank must agree on — the parameters, the planes'
    /// digest, the widths of `q`, `v` and `g` — and of whether each rank's own inputs were
    /// refused (`local`), with each rank's token counts. Returns the layout, or the same
    /// error on every rank: the rank's own error, the first field the ranks disagree on, or
    /// the ranks that were refused.
    #[allow(clippy::too_many_arguments)]
    pub fn agree(
        &self,
        params: &RaceParams,
        planes: &PlanesF32,
        q: &Heads,
        k: &Heads,
        v: &Heads,
        g: Option<&Heads>,
        local: Result<()>,
    ) -> Result<Layout> {
        let (size, rank) = (self.comm.size(), self.comm.rank());
        let fields: [u64; 10] = [
            params.p() as u64,
            params.l() as u64,
            params.beta().to_bits(),
            params.combine() as u64,
            params.causal() as u64,
            q.heads() as u64,
            q.cols() as u64,
            v.cols() as u64,
            g.map_or(u64::MAX, |g| g.cols() as u64),
            planes_digest(planes),
        ];
        let nf = fields.len();
        let mut buf = vec![0u64; 2 * nf + 3 * size];
        buf[..nf].copy_from_slice(&fields);
        for (i, f) in fields.iter().enumerate() {
            buf[nf + i] = !f;
        }
        let at = 2 * nf;
        buf[at + rank] = u64::from(local.is_err());
        buf[at + size + rank] = q.n() as u64;
        buf[at + 2 * size + rank] = k.n() as u64;
        self.timed(buf.len() * 8, |c| c.all_max(&mut buf));
        local?;
        for (i, name) in FIELDS.iter().enumerate() {
            let (max, min) = (buf[i], !buf[nf + i]);
            if max != min {
                let show = |x: u64| match *name {
                    "beta" => f64::from_bits(x).to_string(),
                    "planes" => format!("digest {x:016x}"),
                    "g's width" if x == u64::MAX => "none (forward only)".to_string(),
                    _ => x.to_string(),
                };
                return Err(RaceError::Distributed(format!(
                    "the ranks disagree on {name} (from {} to {}); start every rank with the \
                     same arguments and inputs of the same shape",
                    show(min),
                    show(max)
                )));
            }
        }
        let refused: Vec<String> = (0..size)
            .filter(|&r| buf[at + r] != 0)
            .map(|r| r.to_string())
            .collect();
        if !refused.is_empty() {
            return Err(RaceError::Distributed(format!(
                "rank(s) {} refused their inputs (their own error says why)",
                refused.join(", ")
            )));
        }
        let rows = |o: usize| (0..size).map(|r| buf[at + o * size + r] as usize).collect();
        let layout = Layout {
            q_rows: rows(1),
            k_rows: rows(2),
        };
        *self.layout.lock().unwrap_or_else(|e| e.into_inner()) = Some(layout.clone());
        Ok(layout)
    }

    /// The local checks and, when asked, the agreement; the layout (when agreed) or the
    /// error.
    fn start(
        &self,
        params: &RaceParams,
        planes: &PlanesF32,
        q: &Heads,
        k: &Heads,
        v: &Heads,
        g: Option<&Heads>,
    ) -> Result<Option<Layout>> {
        let local = check_slice(params, planes, q, k, v, g)
            .and_then(|_| SoftMap::for_params(params, planes).map(|_| ()));
        if self.check_each_call {
            self.agree(params, planes, q, k, v, g, local).map(Some)
        } else {
            local.map(|_| None)
        }
    }

    /// The forward on this rank's slice into `o`, after the state collective, through the
    /// partial kernel ([`Partial`]); the rows it flagged and what the backward needs
    /// (`reuse`: a previous call's, whose buffers are recycled).
    fn forward_local(
        &self,
        map: &SoftMap,
        causal: bool,
        (q, k, v): (Heads, Heads, Heads),
        keys: usize,
        o: &mut [f32],
        reuse: SliceSaved,
    ) -> Result<(usize, SliceSaved)> {
        let kernel = CpuRace { isa: self.isa };
        if causal {
            // The last rank's total reaches no one (the scan is exclusive): not computed.
            let last = self.comm.rank() + 1 == self.comm.size();
            let mut before = if last {
                zero_banks(map, k.heads(), v.cols())?
            } else {
                kernel.key_banks(map, k, v)?
            };
            self.reduce_banks(&mut before, C::exscan_sum);
            let x = racelab_core::backend::ForwardInputs::new(q, k, v);
            kernel.causal_forward(map, x, (&before, keys), o, reuse)
        } else {
            let mut banks = kernel.key_banks(map, k, v)?;
            self.reduce_banks(&mut banks, C::all_sum);
            kernel.read(map, q, (&banks, v.cols()), keys, o, reuse)
        }
    }

    /// Forward+backward of this rank's slice into caller buffers: `o` (`[heads, n_r, dv]`),
    /// the gradients (overwritten); `reuse` is the context of a previous call (or
    /// `Ctx::default()`), whose buffers are recycled, and the new one is returned with
    /// `∂ℓ/∂β` (summed over ranks). What [`Backend::forward_backward`] does without
    /// allocating: a training loop or a benchmark keeps its pages.
    pub fn forward_backward_into(
        &self,
        params: &RaceParams,
        planes: &PlanesF32,
        (q, k, v, g): (Heads, Heads, Heads, Heads),
        o: &mut [f32],
        mut grads: GradsMut,
        reuse: SliceSaved,
    ) -> Result<(f64, SliceSaved)> {
        let layout = self.start(params, planes, &q, &k, &v, Some(&g))?;
        let map = SoftMap::for_params(params, planes)?;
        let sizes = [
            ("o", o.len(), q.heads() * q.n() * v.cols()),
            ("dq", grads.dq.len(), q.data().len()),
            ("dk", grads.dk.len(), k.data().len()),
            ("dv", grads.dv.len(), v.data().len()),
        ];
        if let Some((name, got, want)) = sizes.into_iter().find(|(_, a, b)| a != b) {
            return Err(RaceError::shape(
                name,
                format!("the buffer holds {got} values but the slice needs {want}"),
            ));
        }
        let keys = self.keys(layout.as_ref(), k.n());
        let (flagged, saved) =
            self.forward_local(&map, params.causal(), (q, k, v), keys, o, reuse)?;
        let oh = Heads::new(q.heads(), q.n(), v.cols(), o)?;
        let x = BackwardInputs::new(q, k, v, oh, g);
        let dbeta = self.backward_local(&map, params.causal(), &saved, x, grads.reborrow())?;
        Ok((self.finish(params, flagged, dbeta)?, saved))
    }

    /// The backward on this rank's slice from its forward (`saved`, output `x.o`), with the
    /// state collective in the middle, through the partial kernel; returns this rank's share
    /// of `∂ℓ/∂β`.
    fn backward_local(
        &self,
        map: &SoftMap,
        causal: bool,
        saved: &SliceSaved,
        x: BackwardInputs,
        gr: GradsMut,
    ) -> Result<f64> {
        let (q, k, v, g) = (x.q, x.k, x.v, x.g);
        let kernel = CpuRace { isa: self.isa };
        if causal {
            // Σ_{i ∈ slice} φ(q_i) ĝ_iᵀ per head, then the suffix scan. Rank 0's queries
            // reach no later key of another rank: their total is not computed.
            let mut after = if self.comm.rank() > 0 {
                kernel.query_totals(map, saved, q, g, x.o)?
            } else {
                zero_banks(map, q.heads(), v.cols())?
            };
            self.reduce_banks(&mut after, C::exscan_sum_rev);
            kernel.causal_backward(map, saved, x, &after, gr)
        } else {
            let GradsMut { dq, dk, dv } = gr;
            let (mut dbanks, dbeta_q) = kernel.query_grads(map, saved, q, g, dq)?;
            self.reduce_banks(&mut dbanks, C::all_sum);
            Ok(dbeta_q + kernel.key_grads(map, &dbanks, (k, v), (dk, dv))?)
        }
    }

    /// The status every rank shares after its kernels: rows flagged over all ranks, and the
    /// sum of the extra values (`∂ℓ/∂β`); an error on every rank when any row was flagged.
    fn finish(&self, params: &RaceParams, flagged: usize, extra: f64) -> Result<f64> {
        let mut st = [flagged as f64, extra];
        self.timed(16, |c| c.all_sum(&mut st));
        if st[0] > 0.0 {
            return Err(RaceError::Distributed(format!(
                "{} rows (over all ranks) have a denominator below f32's floor at beta = {}: \
                 f32 cannot hold their weights, and a rank holds only its own keys, so they \
                 cannot be recomputed exactly across ranks; run on one process ({} \
                 recomputes them) or use a smaller beta",
                st[0],
                params.beta(),
                racelab_core::error::setting("device", "cpu")
            )));
        }
        Ok(st[1])
    }
}

/// FNV-1a over the planes' shape and f32 bits.
pub fn planes_digest(planes: &PlanesF32) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let words = [planes.l() as u32, planes.p() as u32, planes.d() as u32]
        .into_iter()
        .chain(planes.w().iter().map(|x| x.to_bits()));
    for w in words {
        for b in w.to_le_bytes() {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

impl<C: Comm + Send + Sync> Backend for Distributed<C> {
    /// The kernels each rank runs.
    fn device(&self) -> Device {
        Device::Cpu
    }

    fn forward(
        &self,
        params: &RaceParams,
        planes: &PlanesF32,
        q: Heads,
        k: Heads,
        v: Heads,
    ) -> Result<Forward> {
        let layout = self.start(params, planes, &q, &k, &v, None)?;
        let map = SoftMap::for_params(params, planes)?;
        let keys = self.keys(layout.as_ref(), k.n());
        let mut o = vec![0.0f32; q.heads() * q.n() * v.cols()];
        let (flagged, _) = self.forward_local(
            &map,
            params.causal(),
            (q, k, v),
            keys,
            &mut o,
            SliceSaved::default(),
        )?;
        self.finish(params, flagged, 0.0)?;
        Ok(Forward {
            o,
            empty_rows: 0,
            recomputed: Default::default(),
        })
    }

    fn forward_backward(
        &self,
        params: &RaceParams,
        planes: &PlanesF32,
        q: Heads,
        k: Heads,
        v: Heads,
        g: Heads,
    ) -> Result<(Forward, SoftGrads)> {
        let mut o = vec![0.0f32; q.heads() * q.n() * v.cols()];
        let mut gr = SoftGrads::zeros(q, k, v);
        let (dbeta, _) = self.forward_backward_into(
            params,
            planes,
            (q, k, v, g),
            &mut o,
            gr.as_mut(),
            SliceSaved::default(),
        )?;
        gr.dbeta = dbeta;
        let fwd = Forward {
            o,
            empty_rows: 0,
            recomputed: Default::default(),
        };
        Ok((fwd, gr))
    }

    fn decoder(&self, _: &RaceParams, _: &PlanesF32, _: usize) -> Result<Box<dyn Decode>> {
        Err(RaceError::param(
            "device",
            "recurrent decoding is one token at a time on one process; use the cpu backend's decoder",
        ))
    }
}

impl<C: Comm> Distributed<C> {
    /// Keys in the whole sequence: from the layout the ranks last agreed on (this call's, or
    /// the start-up check's for a trusting operator), else one small all-reduce.
    fn keys(&self, layout: Option<&Layout>, local: usize) -> usize {
        let agreed = self
            .layout
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        match layout.cloned().or(agreed) {
            Some(l) => l.keys(),
            None => {
                let mut n = [local as f64];
                self.timed(8, |c| c.all_sum(&mut n));
                n[0] as usize
            }
        }
    }
}
