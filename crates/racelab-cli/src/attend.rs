//! `racelab attend`: one operator on user Q/K/V (`--distributed`: over MPI's ranks).

use crate::args::AttendArgs;
use crate::distributed::mpi_run;
use crate::ticker::Ticker;
use anyhow::{Context, Result};
use racelab::attend::{attend_in, AttendResult};
use racelab::experiments::registry;
use racelab::io::{
    read_npy_header, read_npy_native, read_planes, write_npy, write_planes, Dtype, NpyData,
    NpyHeader,
};
use racelab::method::Flags;
use racelab::params::{Beta, Bits, Tables};
use racelab::tensor::AttnShape;
use racelab::tensor::Element;
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
    let out = a
        .common
        .out
        .clone()
        .context("--out O.npy is required for attend")?;
    check_outputs(&a, &out)?;
    // From the headers alone, before any data is read: the memory the inputs, their
    // conversions, the output and the operator need, and the time exact attention would take.
    let headers = [
        read_npy_header(&a.files.q)?,
        read_npy_header(&a.files.k)?,
        read_npy_header(&a.files.v)?,
    ];
    let eta = check_before_reading(&a, &headers)?;
    let what = format!("attend: {} on {}", a.method.name(), a.device.name());
    let (q, k, v) = (
        read_npy_native(&a.files.q)?,
        read_npy_native(&a.files.k)?,
        read_npy_native(&a.files.v)?,
    );
    let planes = match &a.planes {
        Some(p) => Some(read_planes(p)?),
        None => None,
    };
    let (p, l) = table_counts(&a, planes.as_ref())?;
    // --save-planes is written before the work: a full disk or a bad path fails at once,
    // and the planes passed on are the ones saved.
    let planes = match (&a.save_planes, method.uses_planes()) {
        (Some(path), true) => {
            let d = *q.shape().last().unwrap_or(&0);
            let drawn = match planes {
                Some(given) => given,
                None => racelab::PlaneSpec::Draw {
                    p,
                    l,
                    seed: a.common.seed,
                }
                .resolve(d)?,
            };
            write_planes(path, &drawn)?;
            Some(drawn)
        }
        _ => planes,
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
    let dtype = a.dtype.unwrap_or(q.dtype());
    let shapes = [q.shape().to_vec(), k.shape().to_vec(), v.shape().to_vec()];
    // f32 files reach the f32 kernels as they are; any f64 input makes the call f64, and so
    // does the reference, which computes in f64 whatever the files hold (--dtype rounds only
    // the written file).
    let (res, seconds) = match (q, k, v) {
        (NpyData::F32(q), NpyData::F32(k), NpyData::F32(v)) if a.device != Device::Reference => {
            timed_write(
                || attend_in(&q.view(), &k.view(), &v.view(), &opts, a.device),
                (&out, dtype),
                Ticker::start(what, eta),
            )?
        }
        (q, k, v) => {
            let (q, k, v) = (q.into_f64(), k.into_f64(), v.into_f64());
            timed_write(
                || attend_in(&q.view(), &k.view(), &v.view(), &opts, a.device),
                (&out, dtype),
                Ticker::start(what, eta),
            )?
        }
    };
    let [q_shape, k_shape, v_shape] = &shapes;
    // The methods whose f32 kernels flag rows f32 cannot hold and recompute them exactly.
    let recomputes = matches!(
        method,
        MethodKind::Soft | MethodKind::Linear | MethodKind::Performer
    );
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
        "recomputed_rows": recomputes.then_some(res.recomputed.rows.len()),
        "recompute_seconds": recomputes.then_some(res.recomputed.seconds),
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
            "note: {} rows had a denominator f32 cannot hold and were recomputed exactly by the \
             f64 reference ({:.3} s)",
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
                // The f32 kernels' rows f32 cannot hold are recomputed by the reference, so
                // what is left empty is empty there too: --device reference would not help.
                "rows to which every key gives weight 0, in the f64 reference too"
            }
        );
    }
    Ok(())
}

/// The shape an attention call on these headers would have (`[.., N, d]`, `[.., M, d]`,
/// `[.., M, dv]`; the leading axes' product as heads), or `None` when a header has fewer than
/// two axes (the read then reports it).
fn header_shape(h: &[NpyHeader; 3]) -> Option<AttnShape> {
    let last2 = |x: &NpyHeader| {
        let s = &x.shape;
        (s.len() >= 2).then(|| {
            (
                s[..s.len() - 2].iter().product::<usize>(),
                s[s.len() - 2],
                s[s.len() - 1],
            )
        })
    };
    let ((heads, n, d), (_, m, _), (_, _, dv)) = (last2(&h[0])?, last2(&h[1])?, last2(&h[2])?);
    Some(AttnShape {
        batch: 1,
        heads,
        n,
        m,
        d,
        dv,
    })
}

/// Refuse, before reading: work whose files, conversions, output and operator buffers exceed
/// --max-memory (or what is available), and exact attention predicted to run over a minute
/// (unless --allow-slow).
fn check_before_reading(a: &AttendArgs, headers: &[NpyHeader; 3]) -> Result<Option<f64>> {
    let Some(shape) = header_shape(headers) else {
        return Ok(None);
    };
    let files: u64 = headers
        .iter()
        .map(|h| (h.count() as u64).saturating_mul(h.width() as u64))
        .fold(0, u64::saturating_add);
    // The operator's own estimate (its input copies, output and buffers), and the files as
    // read on top of it.
    let method = a.method.with(&Flags {
        p: a.p.unwrap_or(2),
        l: a.l.unwrap_or(2),
        beta: a.beta,
        combine: a.combine,
        gamma: a.gamma,
        scale: a.scale,
        features: a.features,
        planes: None,
        seed: a.common.seed,
    });
    // The method's own options first (a P of 30 is refused as P, not as memory).
    method.check(None)?;
    let work = racelab::validate::work(&method, &shape, a.causal, false, a.device.kernels());
    let need = work.bytes().saturating_add(files);
    racelab::memory::check_need(&work, need, a.max_memory)?;
    if !a.method.quadratic() {
        return Ok(None);
    }
    let secs = racelab::attend::predict_exact_seconds(&method, &shape, a.causal, a.device)?;
    if !a.allow_slow && secs > SLOW_SECONDS {
        anyhow::bail!(
            "invalid parameter `method`: exact {} attention on N = {} queries × {} keys ({} heads) is predicted to take about {} on {} (timed on a {}-token probe; it grows as N²); add --allow-slow to run it anyway, or use a linear-time method such as --method soft",
            a.method.name(),
            shape.n,
            shape.m,
            shape.heads,
            racelab::attend::human_seconds(secs),
            a.device.name(),
            racelab::attend::PROBE_TOKENS
        );
    }
    Ok(Some(secs))
}

/// The outputs of `attend` checked before any work: `--out` and `--save-planes` are new or
/// regular files, neither is an input (`--q --k --v --planes --omega`, by device and inode) nor
/// the other, and their folders take a new file ([`racelab::io::check_output_file`]).
fn check_outputs(a: &AttendArgs, out: &Path) -> Result<()> {
    let f = &a.files;
    let mut inputs = vec![
        ("q", f.q.as_path()),
        ("k", f.k.as_path()),
        ("v", f.v.as_path()),
    ];
    inputs.extend(a.planes.as_deref().map(|p| ("planes", p)));
    inputs.extend(a.omega.as_deref().map(|p| ("omega", p)));
    let planes_out: Vec<(&str, &Path)> = a
        .save_planes
        .as_deref()
        .map(|p| ("save-planes", p))
        .into_iter()
        .collect();
    racelab::io::check_output_file(out, "out", &inputs, &planes_out)?;
    if let Some(sp) = &a.save_planes {
        racelab::io::check_output_file(sp, "save-planes", &inputs, &[("out", out)])?;
    }
    Ok(())
}

/// Exact attention predicted to take longer than this is refused without --allow-slow.
const SLOW_SECONDS: f64 = 60.0;

/// P and L: the --planes file's (a --p or --l that disagrees with it is refused, naming both),
/// else --p and --l (default 2 each).
fn table_counts(a: &AttendArgs, planes: Option<&racelab::Planes>) -> Result<(usize, usize)> {
    let Some(w) = planes else {
        return Ok((a.p.unwrap_or(2), a.l.unwrap_or(2)));
    };
    for (flag, given, has) in [("p", a.p, w.p()), ("l", a.l, w.l())] {
        if let Some(g) = given.filter(|&g| g != has) {
            anyhow::bail!(
                "invalid parameter `{flag}`: --{flag} {g} disagrees with --planes, whose planes have {} = {has}; drop --{flag} or give planes with {} = {g}",
                flag.to_uppercase(),
                flag.to_uppercase()
            );
        }
    }
    Ok((w.p(), w.l()))
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
    if let Some(out) = &a.common.out {
        check_outputs(&a, out)?;
    }
    if let Some(dir) = &a.out_shards {
        racelab::io::check_output_dir(dir, "out-shards")?;
    }
    // A --p or --l that disagrees with the --planes file is refused here, as without MPI.
    let (p, l) = match &a.planes {
        Some(path) => table_counts(&a, Some(&read_planes(path)?))?,
        None => table_counts(&a, None)?,
    };
    let job = racelab::distributed::job::AttendJob {
        q: a.files.q,
        k: a.files.k,
        v: a.files.v,
        params: racelab::RaceParams::new(Bits(p), Tables(l), Beta(a.beta))?
            .with_combine(a.combine)
            .with_causal(a.causal),
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
        use racelab::distributed::Comm;
        // Rank 0 shows the elapsed time of a long job (the ranks share one stderr).
        let what = format!("attend --distributed over {} ranks", comm.size());
        let ticker = (comm.rank() == 0).then(|| Ticker::start(what, None));
        let report = racelab::distributed::job::attend(comm, &job);
        drop(ticker);
        let report = report?;
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
    (out, dtype): (&Path, Dtype),
    ticker: Ticker,
) -> Result<(AttendResult<()>, f64)> {
    let t0 = Instant::now();
    let r = call();
    drop(ticker);
    let r = r?;
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
