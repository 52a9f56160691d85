//! `racelab attend`: one operator on user Q/K/V (`--distributed`: over MPI's ranks).

use crate::args::AttendArgs;
use crate::distributed::mpi_run;
use anyhow::{Context, Result};
use racelab::attend::{attend_in, AttendResult};
use racelab::experiments::registry;
use racelab::io::{read_npy_native, read_planes, write_npy, write_planes, Dtype, NpyData};
use racelab::tensor::Element;
use racelab::method::Flags;
use racelab::{AttendOptions, Device, FeatureSpec, Method, MethodKind};
use serde_json::json;
use std::path::Path;
use std::time::Instant;

/// `attend`: one operator on the user's Q/K/V, written to `--out`.
pub fn run(a: AttendArgs) -> Result<()> {
    if a.distributed {
        return run_distributed(a);
    }
    if a.out_shards.is_some() {
        anyhow::bail!("invalid parameter `out-shards`: it writes the slices of a distributed run; add --distributed (under mpirun) or use --out");
    }
    let (method, combine) = (a.method, a.combine);
    let (q, k, v) = (
        read_npy_native(&a.q)?,
        read_npy_native(&a.k)?,
        read_npy_native(&a.v)?,
    );
    let planes = match &a.planes {
        Some(p) => Some(read_planes(p)?),
        None => None,
    };
    let (p, l) = match &planes {
        Some(pl) => (pl.p, pl.l),
        None => (a.p, a.l),
    };
    let flags = Flags {
        p,
        l,
        beta: a.beta,
        combine,
        gamma: a.gamma,
        scale: a.scale,
        features: a.features,
        planes,
        seed: a.common.seed,
    };
    let typed = match (method, &a.omega) {
        (MethodKind::Performer, Some(path)) => Method::Performer {
            features: FeatureSpec::Given(registry::read_matrix(path, "omega")?),
            scale: a.scale,
        },
        _ => method.with(&flags),
    };
    let opts = AttendOptions {
        method: typed,
        causal: a.causal,
        max_memory: a.max_memory,
    };
    let out = a
        .common
        .out
        .clone()
        .context("--out O.npy is required for attend")?;
    let dtype = a.dtype.unwrap_or(q.dtype());
    let shapes = [q.shape().to_vec(), k.shape().to_vec(), v.shape().to_vec()];
    // f32 files reach the f32 kernels as they are; any f64 input makes the call f64.
    let (res, seconds) = match (q, k, v) {
        (NpyData::F32(q), NpyData::F32(k), NpyData::F32(v)) => timed_write(
            || attend_in(&q.view(), &k.view(), &v.view(), &opts, a.device),
            &out,
            dtype,
        )?,
        (q, k, v) => {
            let (q, k, v) = (q.into_f64(), k.into_f64(), v.into_f64());
            timed_write(
                || attend_in(&q.view(), &k.view(), &v.view(), &opts, a.device),
                &out,
                dtype,
            )?
        }
    };
    let [q_shape, k_shape, v_shape] = &shapes;
    if let (Some(path), Some(pl)) = (&a.save_planes, &res.planes) {
        write_planes(path, pl)?;
    }
    let summary = json!({
        "method": method.name(),
        "q_shape": q_shape, "k_shape": k_shape, "v_shape": v_shape, "o_shape": res.o.shape,
        "causal": a.causal,
        "p": method.uses_planes().then_some(p), "l": method.uses_planes().then_some(l),
        "beta": (method == MethodKind::Soft).then_some(a.beta),
        "gamma": (method == MethodKind::Angular).then_some(a.gamma),
        "combine": (method == MethodKind::Soft).then_some(combine),
        "features": (method == MethodKind::Performer).then_some(a.features),
        "seed": a.common.seed,
        "device": a.device,
        "planes": a.planes.as_ref().map(|p| p.display().to_string()),
        "seconds": seconds,
        "empty_rows": res.empty_rows,
        "recomputed_rows": (method == MethodKind::Soft).then_some(res.recomputed.rows.len()),
        "recompute_seconds": (method == MethodKind::Soft).then_some(res.recomputed.seconds),
        "out": out.display().to_string(),
    });
    if a.common.json {
        println!("{summary}");
    } else {
        println!(
            "{} attention: q {:?} k {:?} v {:?} -> {} ({:.3} s){}",
            method.name(),
            q_shape,
            k_shape,
            v_shape,
            out.display(),
            seconds,
            if res.empty_rows > 0 || method == MethodKind::Hard {
                format!(", {} empty rows", res.empty_rows)
            } else {
                String::new()
            }
        );
    }
    if !res.recomputed.rows.is_empty() {
        eprintln!(
            "note: {} rows had a denominator below what f32 holds and were recomputed exactly \
             in the log domain ({:.3} s)",
            res.recomputed.rows.len(),
            res.recomputed.seconds
        );
    }
    if res.empty_rows > 0 {
        eprintln!(
            "warning: {} rows had denominator 0 and were set to 0 ({})",
            res.empty_rows,
            if method == MethodKind::Hard {
                "queries that collide with no key"
            } else {
                "rows below f32's range that this method's kernel cannot recompute; try \
                 --device reference"
            }
        );
    }
    Ok(())
}

/// `attend --distributed`: checks what this build and the arguments allow, then runs the job
/// on MPI's world ([`racelab::distributed::job`]).
fn run_distributed(a: AttendArgs) -> Result<()> {
    if a.method != MethodKind::Soft || a.device != Device::Cpu && a.device != Device::Reference {
        anyhow::bail!("invalid parameter `distributed`: it runs soft RACE on the CPU kernels; use --method soft --device cpu");
    }
    if a.device == Device::Reference {
        anyhow::bail!("invalid parameter `device`: --distributed runs the f32 CPU kernels on every rank; add --device cpu");
    }
    let job = racelab::distributed::job::AttendJob {
        q: a.q,
        k: a.k,
        v: a.v,
        params: racelab::RaceParams {
            p: a.p,
            l: a.l,
            beta: a.beta,
            combine: a.combine,
            causal: a.causal,
        },
        planes: match a.planes {
            Some(path) => racelab::distributed::job::JobPlanes::File(path),
            None => racelab::distributed::job::JobPlanes::Seed(a.common.seed),
        },
        out: a.common.out,
        out_shards: a.out_shards,
        dtype: a.dtype,
    };
    let json = a.common.json;
    mpi_run(|comm| {
        let report = racelab::distributed::job::attend(comm, &job)?;
        Ok(report.map(|r| {
            if json {
                serde_json::to_string(&r).unwrap_or_default()
            } else {
                r.to_string()
            }
        }))
    })
}

/// Run `call`, time it, and write its output to `out` as `dtype`; the result keeps everything
/// but the output rows.
fn timed_write<T: Element>(
    call: impl FnOnce() -> racelab::Result<AttendResult<T>>,
    out: &Path,
    dtype: Dtype,
) -> Result<(AttendResult<()>, f64)> {
    let t0 = Instant::now();
    let r = call()?;
    let seconds = t0.elapsed().as_secs_f64();
    write_npy(out, &r.o.shape, &r.o.data, dtype)?;
    let o = racelab::Tensor {
        shape: r.o.shape,
        data: Vec::new(),
    };
    Ok((
        AttendResult {
            o,
            shape: r.shape,
            empty_rows: r.empty_rows,
            planes: r.planes,
            recomputed: r.recomputed,
        },
        seconds,
    ))
}
