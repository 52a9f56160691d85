//! `racelab attend --distributed`: each rank reads its slice of the token axis from the
//! `.npy` files (seeked, never the whole file), the ranks agree with one collective, the
//! distributed forward runs, and rank 0 writes the output (or each rank its shard).

use super::{slice_of, Comm, Distributed, Layout, Traffic};
use racelab_core::backend::{Backend, Heads, PlanesF32, RaceParams};
use racelab_core::error::{RaceError, Result};
use racelab_core::io::{read_npy_header, read_npy_rows, write_npy, Dtype, NpyHeader};
use racelab_core::params::{Beta, Bits, Seed, Tables};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// What `attend --distributed` was asked for.
#[derive(Debug, Clone)]
pub struct AttendJob {
    /// The queries, `.npy` (`[heads, n, d]` or `[n, d]`).
    pub q: PathBuf,
    /// The keys, `.npy`, the queries' shape.
    pub k: PathBuf,
    /// The values, `.npy` (`[heads, n, dv]` or `[n, dv]`).
    pub v: PathBuf,
    /// P, L, β, causal and the combine rule.
    pub params: RaceParams,
    /// Where the hash planes come from.
    pub planes: JobPlanes,
    /// Rank 0 writes the whole output here.
    pub out: Option<PathBuf>,
    /// Each rank writes its slice here instead (`o.rank-NNNNN.npy`, and rank 0 `shards.json`).
    pub out_shards: Option<PathBuf>,
    /// Output dtype (default: that of `q`).
    pub dtype: Option<Dtype>,
}

/// Where a job's planes come from.
#[derive(Debug, Clone, PartialEq)]
pub enum JobPlanes {
    /// `[L, P, d]` i.i.d. N(0, 1) drawn from this seed (`d` from the inputs).
    Seed(u64),
    /// Read from this `.npy` file (`[L, P, d]`).
    File(PathBuf),
}

/// What rank 0 reports.
#[derive(Debug, Clone, Serialize)]
pub struct AttendReport {
    /// Ranks the tokens were split over.
    pub ranks: usize,
    /// How the ranks talked (`threads` or `mpi`).
    pub transport: String,
    /// Shape of the queries.
    pub q_shape: Vec<usize>,
    /// Shape of the output.
    pub o_shape: Vec<usize>,
    /// Causal attention (Algorithm 2): token i sees keys `0..=i`.
    pub causal: bool,
    /// Bits per table `P` (`2^P` buckets).
    pub p: usize,
    /// Tables `L`.
    pub l: usize,
    /// Soft-hash inverse temperature β.
    pub beta: f64,
    /// The planes' seed (none when they were read from a file).
    pub seed: Option<u64>,
    /// Query rows each rank owned.
    pub q_rows_per_rank: Vec<usize>,
    /// Seconds of the forward on rank 0 and the share of them in collectives.
    pub seconds: f64,
    /// Of them, seconds in collectives (waiting included).
    pub collective_seconds: f64,
    /// Collectives and bytes of rank 0.
    pub traffic: Traffic,
    /// Where the output was written.
    pub out: String,
}

impl std::fmt::Display for AttendReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "soft RACE{} over {} ({}): q {:?} -> {} ({:.3} s, {:.1}% in {} collectives of {} bytes per rank)",
            if self.causal { " (causal)" } else { "" },
            self.ranks,
            self.transport,
            self.q_shape,
            self.out,
            self.seconds,
            100.0 * self.collective_seconds / self.seconds.max(1e-12),
            self.traffic.collectives,
            self.traffic.bytes
        )
    }
}

/// An error and whether every rank has it (a collective decided it): then each rank can
/// print it and exit; otherwise the rank that hit it must end the job (`MPI_Abort`).
#[derive(Debug)]
pub struct JobError {
    /// The error.
    pub error: RaceError,
    /// Whether every rank has it (a collective decided it).
    pub every_rank: bool,
}

impl From<RaceError> for JobError {
    /// A [`RaceError::Distributed`] comes from a collective ([`Distributed::agree`], the
    /// status reduction): every rank has it. Any other error is this rank's alone.
    fn from(error: RaceError) -> Self {
        let every_rank = matches!(error, RaceError::Distributed(_));
        JobError { error, every_rank }
    }
}

/// The shapes of q, k and v from their headers, checked against each other: `(lead, n_q,
/// n_k, d, dv)` with `lead` the leading (batch × head) count.
fn shapes(h: [&NpyHeader; 3], causal: bool) -> Result<(usize, usize, usize, usize, usize)> {
    let [q, k, v] = h.map(|x| &x.shape);
    let nd = q.len();
    if !(2..=4).contains(&nd) || k.len() != nd || v.len() != nd {
        return Err(RaceError::shape(
            "q/k/v",
            format!("shapes {q:?}, {k:?}, {v:?}: give all three as [N,d], [H,N,d] or [B,H,N,d]"),
        ));
    }
    if q[..nd - 2] != k[..nd - 2] || q[..nd - 2] != v[..nd - 2] {
        return Err(RaceError::shape(
            "q/k/v",
            format!("batch/head dims differ: q {q:?}, k {k:?}, v {v:?}"),
        ));
    }
    let (nq, nk, d, dv) = (q[nd - 2], k[nd - 2], q[nd - 1], v[nd - 1]);
    if k[nd - 1] != d || v[nd - 2] != nk {
        return Err(RaceError::shape(
            "k/v",
            format!("q {q:?}, k {k:?}, v {v:?}: k needs q's width and v k's tokens"),
        ));
    }
    if causal && nq != nk {
        return Err(RaceError::shape(
            "q/k",
            format!("causal attention needs as many queries as keys (got {nq} and {nk})"),
        ));
    }
    if nq == 0 || nk == 0 || d == 0 || dv == 0 {
        return Err(RaceError::empty("q/k/v", "a dimension is 0"));
    }
    Ok((q[..nd - 2].iter().product(), nq, nk, d, dv))
}

/// This rank's inputs: planes, slices of q, k, v and the shapes; any error is this rank's.
struct Inputs {
    planes: PlanesF32,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    lead: usize,
    rows: (usize, usize),
    d: usize,
    dv: usize,
    q_shape: Vec<usize>,
    dtype: Dtype,
}

fn read_inputs(job: &AttendJob, size: usize, rank: usize) -> Result<Inputs> {
    let hq = read_npy_header(&job.q)?;
    let hk = read_npy_header(&job.k)?;
    let hv = read_npy_header(&job.v)?;
    let (lead, nq, nk, d, dv) = shapes([&hq, &hk, &hv], job.params.causal())?;
    let planes = match &job.planes {
        JobPlanes::File(p) => racelab_core::io::read_planes(p)?,
        JobPlanes::Seed(seed) => racelab_core::hashing::Planes::gaussian(
            Bits(job.params.p()),
            Tables(job.params.l()),
            d,
            Seed(*seed),
        )?,
    };
    if planes.d() != d {
        return Err(RaceError::shape(
            "planes",
            format!("planes have d = {} but q/k have d = {d}", planes.d()),
        ));
    }
    let (qr, kr) = (slice_of(nq, size, rank), slice_of(nk, size, rank));
    Ok(Inputs {
        planes: PlanesF32::from_planes(&planes),
        q: read_npy_rows(&job.q, &hq, qr)?,
        k: read_npy_rows(&job.k, &hk, kr)?,
        v: read_npy_rows(&job.v, &hv, kr)?,
        lead,
        rows: qr,
        d,
        dv,
        q_shape: hq.shape.clone(),
        dtype: job.dtype.unwrap_or(hq.dtype),
    })
}

/// Run `attend --distributed` on this rank. Rank 0 returns the report; the others `None`.
pub fn attend<C: Comm + Send + Sync>(
    comm: C,
    job: &AttendJob,
) -> std::result::Result<Option<AttendReport>, JobError> {
    let (size, rank) = (comm.size(), comm.rank());
    let mut params = job.params;
    let read = read_inputs(job, size, rank);
    let dist = Distributed::trusting(comm);
    // The start-up agreement: with this rank's inputs, or empty stand-ins and its error.
    let empty = Inputs {
        planes: PlanesF32::none(),
        q: Vec::new(),
        k: Vec::new(),
        v: Vec::new(),
        lead: 0,
        rows: (0, 0),
        d: 0,
        dv: 0,
        q_shape: Vec::new(),
        dtype: Dtype::F32,
    };
    let (x, mut status) = match read {
        Ok(x) => (x, Ok(())),
        Err(e) => (empty, Err(e)),
    };
    if matches!(job.planes, JobPlanes::File(_)) && status.is_ok() {
        // The planes file's P and L, with the job's β, combine rule and mask.
        match RaceParams::new(
            Bits(x.planes.p()),
            Tables(x.planes.l()),
            Beta(params.beta()),
        ) {
            Ok(p) => {
                params = p
                    .with_combine(params.combine())
                    .with_causal(params.causal())
            }
            Err(e) => status = Err(e),
        }
    }
    let nq = x.rows.1 - x.rows.0;
    let nk = x.k.len() / (x.lead * x.d).max(1);
    // This rank's rows (none, and the error, if they do not fit: the agreement then ends
    // the job on every rank).
    let mut rows = |n: usize, cols: usize, data| match Heads::new(x.lead, n, cols, data) {
        Ok(h) => h,
        Err(e) => {
            if status.is_ok() {
                status = Err(e);
            }
            Heads::empty()
        }
    };
    let (q, k, v) = (
        rows(nq, x.d, &x.q),
        rows(nk, x.d, &x.k),
        rows(nk, x.dv, &x.v),
    );
    let status = status.and_then(|_| super::check_slice(&params, &x.planes, &q, &k, &v, None));
    let layout: Layout = dist
        .agree(&params, &x.planes, &q, &k, &v, None, status)
        .map_err(JobError::from)?;
    dist.comm.barrier();
    let t = Instant::now();
    let f = dist
        .forward(&params, &x.planes, q, k, v)
        .map_err(JobError::from)?;
    let seconds = t.elapsed().as_secs_f64();
    let traffic = dist.take_traffic();
    let mut o_shape = x.q_shape.clone();
    let nd = o_shape.len();
    o_shape[nd - 1] = x.dv;
    let data64 = |o: &[f32]| o.iter().map(|&y| y as f64).collect::<Vec<f64>>();
    let out = if let Some(dir) = &job.out_shards {
        std::fs::create_dir_all(dir).map_err(|e| JobError::from(RaceError::io(dir, e)))?;
        let mut shape = o_shape.clone();
        shape[nd - 2] = nq;
        let path = dir.join(shard_name(rank));
        write_npy(&path, &shape, &data64(&f.o), x.dtype).map_err(JobError::from)?;
        if rank == 0 {
            write_manifest(dir, &o_shape, &layout).map_err(JobError::from)?;
        }
        dir.display().to_string()
    } else {
        let path = job.out.as_ref().ok_or_else(|| {
            JobError::from(RaceError::param(
                "out",
                format!(
                    "{} (written by rank 0) or {} is required",
                    racelab_core::error::setting("out", "O.npy"),
                    racelab_core::error::setting("out_shards", "DIR")
                ),
            ))
        })?;
        if f.o.len() > i32::MAX as usize {
            return Err(JobError::from(RaceError::param(
                "out",
                format!(
                    "rank {rank}'s output has {} values, more than one MPI message holds; use {}",
                    f.o.len(),
                    racelab_core::error::setting("out_shards", "DIR")
                ),
            )));
        }
        if let Some(parts) = dist.comm.gather_to_root(&f.o) {
            let o = assemble(&parts, &layout.q_rows, x.lead, x.dv);
            write_npy(path, &o_shape, &data64(&o), x.dtype).map_err(JobError::from)?;
        }
        path.display().to_string()
    };
    dist.comm.barrier();
    Ok((rank == 0).then(|| AttendReport {
        ranks: size,
        transport: dist.comm.transport(),
        q_shape: x.q_shape.clone(),
        o_shape,
        causal: params.causal(),
        p: params.p(),
        l: params.l(),
        beta: params.beta(),
        seed: match job.planes {
            JobPlanes::Seed(s) => Some(s),
            JobPlanes::File(_) => None,
        },
        q_rows_per_rank: layout.q_rows.clone(),
        seconds,
        collective_seconds: traffic.seconds,
        traffic,
        out,
    }))
}

/// `o.rank-NNNNN.npy`: rank `rank`'s slice of the output.
pub fn shard_name(rank: usize) -> String {
    format!("o.rank-{rank:05}.npy")
}

/// `shards.json`: the whole output's shape and each shard's file and token range, as
/// pretty-printed JSON (keys in sorted order, two-space indents).
fn write_manifest(dir: &Path, shape: &[usize], layout: &Layout) -> Result<()> {
    let path = dir.join("shards.json");
    racelab_core::io::write_atomic(&path, manifest(shape, layout).as_bytes())
}

/// The text of `shards.json` (file names are `o.rank-NNNNN.npy`: nothing to escape).
fn manifest(shape: &[usize], layout: &Layout) -> String {
    let list = |xs: &[usize], indent: &str| -> String {
        let items: Vec<String> = xs.iter().map(|x| format!("{indent}  {x}")).collect();
        format!("[\n{}\n{indent}]", items.join(",\n"))
    };
    let shards: Vec<String> = (0..layout.q_rows.len())
        .map(|r| {
            let a = layout.q_start(r);
            format!(
                "    {{\n      \"file\": \"{}\",\n      \"tokens\": {}\n    }}",
                shard_name(r),
                list(&[a, a + layout.q_rows[r]], "      ")
            )
        })
        .collect();
    format!(
        "{{\n  \"shape\": {},\n  \"shards\": [\n{}\n  ],\n  \"token_axis\": {}\n}}",
        list(shape, "  "),
        shards.join(",\n"),
        shape.len() - 2
    )
}

/// The ranks' `[lead, n_r, cols]` slices as one `[lead, Σ n_r, cols]`.
pub fn assemble(parts: &[Vec<f32>], rows: &[usize], lead: usize, cols: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(parts.iter().map(|p| p.len()).sum());
    for h in 0..lead {
        for (p, &n) in parts.iter().zip(rows) {
            out.extend_from_slice(&p[h * n * cols..(h + 1) * n * cols]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{manifest, shard_name};
    use crate::Layout;

    /// The hand-written manifest is the JSON serde_json writes for the same value, byte for
    /// byte (what readers of `shards.json` parse).
    #[test]
    fn the_manifest_is_serde_jsons_pretty_json() {
        for (shape, rows) in [
            (vec![2usize, 7, 3], vec![3usize, 4]),
            (vec![5, 2], vec![0, 2, 3]),
        ] {
            let layout = Layout {
                q_rows: rows.clone(),
                k_rows: rows,
            };
            let shards: Vec<serde_json::Value> = (0..layout.q_rows.len())
                .map(|r| {
                    let a = layout.q_start(r);
                    serde_json::json!({"file": shard_name(r), "tokens": [a, a + layout.q_rows[r]]})
                })
                .collect();
            let want = serde_json::json!({
                "shape": shape,
                "token_axis": shape.len() - 2,
                "shards": shards,
            });
            let text = manifest(&shape, &layout);
            assert_eq!(text, serde_json::to_string_pretty(&want).unwrap());
            assert_eq!(
                serde_json::from_str::<serde_json::Value>(&text).unwrap(),
                want
            );
        }
    }
}
