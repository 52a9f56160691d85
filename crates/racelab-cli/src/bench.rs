//! `racelab bench`: timings against the machine's measured floors, the long-sum accuracy, the
//! streaming scale mode and the distributed rows.

use crate::args::BenchArgs;
use crate::distributed::mpi_run;
use anyhow::Result;
use racelab::params::{Beta, Bits, RaceParams, Tables};
use serde_json::json;
use std::path::PathBuf;

/// `bench`: the kernels timed against their floors (or `--accuracy`, `--stream`,
/// `--distributed`).
pub fn run(a: BenchArgs) -> Result<()> {
    use racelab::bench;
    if let Some(out) = &a.common.out {
        racelab::io::check_output_dir(out, "out")?;
    }
    // Each step's line on stderr, after the time since the start.
    let t0 = std::time::Instant::now();
    let progress = |m: &str| {
        let s = racelab::attend::human_seconds(t0.elapsed().as_secs_f64());
        crate::progress(&format!("{s}: {m}"))
    };
    if a.p.len() != a.l.len() {
        anyhow::bail!("invalid parameter `p`/`l`: --p and --l are paired and need the same length (got {} and {})", a.p.len(), a.l.len());
    }
    let pl: Vec<(usize, usize)> = a.p.iter().cloned().zip(a.l.iter().cloned()).collect();
    // What every mode needs, checked before any of them measures or allocates.
    if pl.is_empty() {
        anyhow::bail!("invalid parameter `p`: give at least one (P, L) pair, e.g. --p 2 --l 2");
    }
    for &(p, l) in &pl {
        racelab::params::validate_pl(p, l)?;
    }
    if a.n.contains(&0) {
        anyhow::bail!("invalid parameter `n`: N = 0 tokens times nothing; give N ≥ 1");
    }
    if a.heads == 0 || a.d == 0 {
        let flag = if a.heads == 0 { "heads" } else { "d" };
        anyhow::bail!("invalid parameter `{flag}`: --{flag} 0 has nothing to time; give 1 or more");
    }
    racelab::params::validate_beta(a.beta)?;
    if a.accuracy {
        let ns = if a.n.is_empty() {
            vec![1_000_000, 10_000_000, 100_000_000]
        } else {
            a.n.clone()
        };
        let (p, l) = pl[0];
        let rows = bench::accuracy::run(
            &ns,
            [4, 2],
            &RaceParams::new(Bits(p), Tables(l), Beta(a.beta))?,
            a.common.seed,
            &progress,
        )?;
        if a.common.json {
            println!(
                "{}",
                json!({ "accuracy": rows, "provenance": racelab::provenance::Provenance::collect(racelab::cpu::detected_isa().name()) })
            );
        } else {
            println!(
                "causal f32 scan vs f64 recurrence (one head, d=4, dv=2, (P,L)=({p},{l}), beta={})",
                a.beta
            );
            println!(
                "{:>12} {:>16} {:>18} {:>10}",
                "N", "kernel rel err", "naive f32 rel err", "kernel s"
            );
            for r in &rows {
                println!(
                    "{:>12} {:>16.3e} {:>18.3e} {:>10.2}",
                    r.n, r.kernel_rel_err, r.naive_f32_rel_err, r.kernel_seconds
                );
            }
        }
        return Ok(());
    }
    if a.distributed {
        return run_distributed(a, pl[0]);
    }
    if a.weak || a.check {
        anyhow::bail!("invalid parameter `weak`/`check`: they apply to `bench --distributed`; add --distributed (under mpirun)");
    }
    if a.stream {
        let n = a.n.first().copied().unwrap_or(100_000_000);
        let (p, l) = pl[0];
        let spec = racelab::distributed::stream::StreamSpec {
            n,
            heads: a.heads,
            d: a.d,
            p,
            l,
            beta: a.beta as f32,
            seed: a.common.seed,
            causal: a.causal,
        };
        let rep = racelab::distributed::stream::run(spec, &progress)?;
        if a.common.json {
            println!("{}", serde_json::to_string(&rep)?);
        } else {
            println!(
                "streaming {}forward+backward: N = {}, {} heads, d = {}, (P,L) = ({p},{l}): {:.1} s, {:.3e} tokens/s, peak RSS {:.2} GiB",
                if a.causal { "causal " } else { "" },
                rep.n, rep.heads, rep.d, rep.seconds, rep.tokens_per_s, rep.peak_rss_bytes as f64 / (1u64 << 30) as f64
            );
        }
        return Ok(());
    }
    let cfg = bench::BenchConfig {
        ns: if a.n.is_empty() {
            (10..=20).map(|e| 1usize << e).collect()
        } else {
            a.n.clone()
        },
        pl,
        heads: a.heads,
        d: a.d,
        causal: a.causal,
        backward: a.backward,
        reference: a.reference,
        device: a.device,
        beta: a.beta,
        seed: a.common.seed,
        runs: a.runs.max(3),
        ref_budget_s: a.ref_budget,
        causal_ratio: a.causal_ratio,
        row_probe_bytes: bench::ADJACENT_PROBE_BYTES,
        out: Some(a.common.out.clone().unwrap_or_else(|| {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0);
            PathBuf::from(format!("figures/bench/run-{t}"))
        })),
    };
    let rep = bench::run(&cfg, &progress)?;
    if a.common.json {
        println!("{}", serde_json::to_string(&rep)?);
        return Ok(());
    }
    println!("{}", rep.provenance.line());
    println!(
        "measured bandwidth {:.1} GB/s (probes before/after the rows: {:.1}, {:.1}; floors use the larger, or the larger of a row's own probes where it has them), FMA peak {:.0} GFLOP/s ({})",
        rep.bandwidth_gbs,
        rep.bandwidth_probes_gbs[0],
        rep.bandwidth_probes_gbs[1],
        rep.fma_peak_gflops,
        rep.isa
    );
    if let Some(g) = &rep.gpu {
        println!(
            "GPU {}: measured copy bandwidth {:.0} GB/s, FP32 FMA {:.0} GFLOP/s (the race rows' floors){}",
            g.name,
            g.bandwidth_gbs,
            g.fp32_gflops,
            if g.switches.is_empty() {
                String::new()
            } else {
                format!("; {}", g.switches.join(" "))
            }
        );
    }
    println!(
        "{:<10} {:>10} {:>6} {:>7} {:>11} {:>12} {:>10} {:>9} {:>10} {:>10}",
        "method",
        "N",
        "(P,L)",
        "causal",
        "seconds",
        "tokens/s",
        "RSS GiB",
        "x floor",
        "x flops",
        "row probes"
    );
    for r in &rep.rows {
        let pl = match (r.p, r.l) {
            (Some(p), Some(l)) => format!("({p},{l})"),
            _ => "-".into(),
        };
        let xf = r
            .flop_floor_seconds
            .map(|f| format!("{:.2}", r.seconds / f))
            .unwrap_or_default();
        println!(
            "{:<10} {:>10} {:>6} {:>7} {:>11.4e} {:>12.4e} {:>10.2} {:>9.2} {:>10} {:>10}",
            r.method,
            r.n,
            pl,
            if r.causal { "yes" } else { "no" },
            r.seconds,
            r.tokens_per_s,
            r.peak_rss_bytes as f64 / (1u64 << 30) as f64,
            r.ratio_to_floor,
            xf,
            r.bandwidth_probes_gbs
                .map(|[b, a]| format!("{b:.0}/{a:.0}"))
                .unwrap_or_else(|| "-".into())
        );
    }
    for f in &rep.fits {
        println!(
            "fit {}: time ~ N^{:.2} ({} points)",
            f.series, f.exponent, f.points
        );
    }
    for c in &rep.crossovers {
        println!(
            "crossover {} vs exact softmax: {} ({})",
            c.series,
            c.n.map(|n| n.to_string())
                .unwrap_or_else(|| "not reached at measured N".into()),
            c.note
        );
    }
    for c in &rep.causal_ratios {
        let (lo, hi) = c
            .pair_ratios
            .iter()
            .fold((f64::MAX, f64::MIN), |(a, b), &x| (a.min(x), b.max(x)));
        println!(
            "causal / non-causal ({},{}) N = {}: {:.3} (median of the alternated pairs, which span {:.3}–{:.3}; ratio of the rows' medians {:.3})",
            c.p, c.l, c.n, c.median_pair_ratio, lo, hi, c.ratio_of_medians
        );
    }
    for s in &rep.skipped {
        println!("skipped: {s}");
    }
    if let Some(d) = &rep.out_dir {
        println!("wrote {d}/bench.csv, bench.json, time_vs_n.png");
    }
    Ok(())
}

/// `bench --distributed`: the in-memory timing ([`racelab::distributed::bench`]) or, with
/// --stream, the streaming run over ranks; rank 0 prints the row.
fn run_distributed(a: BenchArgs, (p, l): (usize, usize)) -> Result<()> {
    use racelab::distributed::job::JobError;
    let spec = racelab::distributed::bench::Spec {
        n: a.n
            .first()
            .copied()
            .unwrap_or(if a.stream { 1_000_000_000 } else { 1 << 18 }),
        weak: a.weak,
        heads: a.heads,
        d: a.d,
        p,
        l,
        beta: a.beta,
        seed: a.common.seed,
        causal: a.causal,
        runs: a.runs,
        check: a.check,
    };
    if a.stream && (a.weak || a.check) {
        anyhow::bail!(
            "invalid parameter `stream`: the streaming run takes neither --weak nor --check"
        );
    }
    let (out, json) = (a.common.out.clone(), a.common.json);
    mpi_run(|comm| {
        use racelab::distributed::Comm;
        let rank = comm.rank();
        let (line, text) = if a.stream {
            let show = |m: &str| {
                if rank == 0 {
                    crate::progress(m)
                }
            };
            let stream = racelab::distributed::stream::StreamSpec {
                n: spec.n,
                heads: spec.heads,
                d: spec.d,
                p,
                l,
                beta: spec.beta as f32,
                seed: spec.seed,
                causal: spec.causal,
            };
            let rep = racelab::distributed::stream::run_on(comm, stream, &show)?;
            (serde_json::to_string(&rep).unwrap_or_default(), format!(
                "streaming {}forward+backward over {} ({}): N = {}, {} heads, d = {}, (P,L) = ({p},{l}): {:.1} s ({:.1}% in collectives), {:.3e} tokens/s, peak RSS per rank {:?} MiB",
                if rep.causal { "causal " } else { "" }, rep.ranks, rep.transport, rep.n, rep.heads, rep.d, rep.seconds,
                100.0 * rep.collective_seconds / rep.seconds, rep.tokens_per_s,
                rep.peak_rss_bytes_per_rank.iter().map(|b| b >> 20).collect::<Vec<_>>()
            ))
        } else {
            let row = racelab::distributed::bench::run(comm, &spec)?;
            (
                serde_json::to_string(&row).unwrap_or_default(),
                row.to_string(),
            )
        };
        if rank != 0 {
            return Ok(None);
        }
        if let Some(path) = &out {
            racelab::io::write_atomic(path, format!("{line}\n").as_bytes())
                .map_err(JobError::from)?;
        }
        Ok(Some(if json { line } else { text }))
    })
}
