//! Sequence-parallel soft RACE (`racelab_dist`) against the single-process CPU
//! kernels, with ranks as threads of this process (the same algorithm and collectives as
//! over MPI; `crates/racelab-cli/tests/mpi.rs` runs the MPI transport through `mpirun`).
//!
//! - 1 rank is the single-process kernels bit for bit;
//! - 2, 3 and 4 ranks (and splits with empty ranks) agree with them within the backend
//!   tolerances: forward ≤ 1e-5, gradients ≤ 1e-4 of each tensor's largest entry, dβ ≤ 1e-4
//!   relative; the differences between rank counts (f32 block sums split at other places)
//!   are measured, printed and bounded by the same tolerances;
//! - ranks that disagree on an argument, or one rank whose inputs are refused, give every
//!   rank an error naming it; rows f32 cannot hold are refused on every rank.

#[path = "../../racelab-core/tests/common/mod.rs"]
mod common;

use common::rel;
use racelab_core::backend::{Backend, Heads, PlanesF32, RaceParams, SoftGrads};
use racelab_core::cpu::CpuRace;
use racelab_core::hashing::Planes;
use racelab_core::params::Combine;
use racelab_core::params::{Beta, Bits, Seed, Tables};
use racelab_core::rng::SeededRng;
use racelab_core::{RaceError, Result};
use racelab_dist::job::assemble;
use racelab_dist::{slice_of, thread_group, Distributed};

fn data(len: usize, seed: u64) -> Vec<f32> {
    SeededRng::new(seed, 7)
        .normals(len)
        .iter()
        .map(|&x| x as f32)
        .collect()
}

#[derive(Clone)]
struct Case {
    heads: usize,
    n: usize,
    d: usize,
    dv: usize,
    params: RaceParams,
    planes: PlanesF32,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
}

fn case(p: usize, l: usize, causal: bool, n: usize, beta: f64) -> Case {
    let (heads, d, dv) = (2, 16, 8);
    let planes = Planes::gaussian(Bits(p), Tables(l), d, Seed(11)).unwrap();
    Case {
        heads,
        n,
        d,
        dv,
        params: RaceParams::new(Bits(p), Tables(l), Beta(beta))
            .unwrap()
            .with_combine(Combine::Paper)
            .with_causal(causal),
        planes: PlanesF32::from_planes(&planes),
        q: data(heads * n * d, 1),
        k: data(heads * n * d, 2),
        v: data(heads * n * dv, 3),
        g: data(heads * n * dv, 4),
    }
}

/// Rows `a..b` of every head of `[heads, n, cols]`.
fn rows(x: &[f32], heads: usize, n: usize, cols: usize, (a, b): (usize, usize)) -> Vec<f32> {
    (0..heads)
        .flat_map(|h| x[(h * n + a) * cols..(h * n + b) * cols].iter().copied())
        .collect()
}

/// One rank's output and gradients.
type RankResult = (Vec<f32>, SoftGrads);

/// One result per rank: forward+backward of its slice, or the error.
type RankOut = Result<RankResult>;

/// Forward+backward over ranks with token counts `lens`; `tweak(rank, params, q)` may change a
/// rank's arguments. Returns each rank's result.
fn run_ranks(
    c: &Case,
    lens: &[usize],
    tweak: impl Fn(usize, &mut RaceParams, &mut Vec<f32>) + Sync,
) -> Vec<RankOut> {
    assert_eq!(lens.iter().sum::<usize>(), c.n);
    let starts: Vec<usize> = lens
        .iter()
        .scan(0, |s, &n| {
            let a = *s;
            *s += n;
            Some(a)
        })
        .collect();
    std::thread::scope(|s| {
        let handles: Vec<_> = thread_group(lens.len())
            .into_iter()
            .enumerate()
            .map(|(r, comm)| {
                let (tweak, range) = (&tweak, (starts[r], starts[r] + lens[r]));
                s.spawn(move || {
                    let (h, n) = (c.heads, c.n);
                    let mut q = rows(&c.q, h, n, c.d, range);
                    let (k, v, g) = (
                        rows(&c.k, h, n, c.d, range),
                        rows(&c.v, h, n, c.dv, range),
                        rows(&c.g, h, n, c.dv, range),
                    );
                    let mut params = c.params;
                    tweak(r, &mut params, &mut q);
                    let nr = range.1 - range.0;
                    let dist = Distributed::new(comm);
                    dist.forward_backward(
                        &params,
                        &c.planes,
                        Heads::new(h, nr, c.d, &q).unwrap(),
                        Heads::new(h, nr, c.d, &k).unwrap(),
                        Heads::new(h, nr, c.dv, &v).unwrap(),
                        Heads::new(h, nr, c.dv, &g).unwrap(),
                    )
                    .map(|(f, gr)| (f.o, gr))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// The ranks' results joined: `o`, `dq`, `dk`, `dv` and `dβ` (every rank must hold the same).
fn joined(c: &Case, lens: &[usize], outs: Vec<RankOut>) -> [Vec<f32>; 4] {
    let outs: Vec<RankResult> = outs.into_iter().map(|o| o.unwrap()).collect();
    let db = outs[0].1.dbeta;
    assert!(
        outs.iter().all(|o| o.1.dbeta == db),
        "ranks disagree on dbeta"
    );
    let pick =
        |f: &dyn Fn(&RankResult) -> Vec<f32>| -> Vec<Vec<f32>> { outs.iter().map(f).collect() };
    [
        assemble(&pick(&|o| o.0.clone()), lens, c.heads, c.dv),
        assemble(&pick(&|o| o.1.dq.clone()), lens, c.heads, c.d),
        assemble(&pick(&|o| o.1.dk.clone()), lens, c.heads, c.d),
        assemble(&pick(&|o| o.1.dv.clone()), lens, c.heads, c.dv),
    ]
}

fn single(c: &Case) -> ([Vec<f32>; 4], f64) {
    let (f, g) = CpuRace::detected()
        .forward_backward(
            &c.params,
            &c.planes,
            Heads::new(c.heads, c.n, c.d, &c.q).unwrap(),
            Heads::new(c.heads, c.n, c.d, &c.k).unwrap(),
            Heads::new(c.heads, c.n, c.dv, &c.v).unwrap(),
            Heads::new(c.heads, c.n, c.dv, &c.g).unwrap(),
        )
        .unwrap();
    ([f.o, g.dq, g.dk, g.dv], g.dbeta)
}

fn dbeta_of(outs: &[RankOut]) -> f64 {
    outs[0].as_ref().unwrap().1.dbeta
}

/// Errors of a distributed result against the single process: forward, dq, dk, dv, dβ.
fn errors(got: &[Vec<f32>; 4], gdb: f64, want: &[Vec<f32>; 4], wdb: f64) -> [f64; 5] {
    [
        rel(&got[0], &want[0]),
        rel(&got[1], &want[1]),
        rel(&got[2], &want[2]),
        rel(&got[3], &want[3]),
        (gdb - wdb).abs() / wdb.abs().max(1e-12),
    ]
}

fn within(tag: &str, e: [f64; 5]) {
    assert!(e[0] <= 1e-5, "{tag}: forward {:.2e}", e[0]);
    for (name, x) in ["dq", "dk", "dv", "dbeta"].iter().zip(&e[1..]) {
        assert!(*x <= 1e-4, "{tag}: {name} {x:.2e}");
    }
}

#[test]
fn one_rank_is_the_single_process_kernels_bit_for_bit() {
    for causal in [false, true] {
        for (p, l) in [(2, 2), (3, 4)] {
            let c = case(p, l, causal, 700, 1.0);
            let (want, wdb) = single(&c);
            let outs = run_ranks(&c, &[c.n], |_, _, _| {});
            let db = dbeta_of(&outs);
            let got = joined(&c, &[c.n], outs);
            assert_eq!(got, want, "P={p} L={l} causal={causal}");
            assert_eq!(db, wdb);
        }
    }
}

#[test]
fn ranks_agree_with_the_single_process_kernels() {
    let mut worst_between = [0.0f64; 5];
    for causal in [false, true] {
        for (p, l) in [(1, 1), (2, 2), (3, 4), (5, 1)] {
            let c = case(p, l, causal, 1001, 1.0);
            let (want, wdb) = single(&c);
            let mut by_ranks: Vec<([Vec<f32>; 4], f64)> = Vec::new();
            for ranks in 1..=4 {
                let lens: Vec<usize> = (0..ranks)
                    .map(|r| {
                        let (a, b) = slice_of(c.n, ranks, r);
                        b - a
                    })
                    .collect();
                let outs = run_ranks(&c, &lens, |_, _, _| {});
                let db = dbeta_of(&outs);
                let got = joined(&c, &lens, outs);
                let e = errors(&got, db, &want, wdb);
                within(&format!("P={p} L={l} causal={causal} ranks={ranks}"), e);
                by_ranks.push((got, db));
            }
            for a in 0..by_ranks.len() {
                for b in a + 1..by_ranks.len() {
                    let e = errors(&by_ranks[a].0, by_ranks[a].1, &by_ranks[b].0, by_ranks[b].1);
                    for (w, x) in worst_between.iter_mut().zip(e) {
                        *w = w.max(x);
                    }
                }
            }
        }
    }
    println!(
        "largest difference between rank counts 1..4: forward {:.2e}, dq {:.2e}, dk {:.2e}, dv {:.2e}, dbeta {:.2e}",
        worst_between[0], worst_between[1], worst_between[2], worst_between[3], worst_between[4]
    );
    within("between rank counts", worst_between);
}

#[test]
fn empty_and_unequal_slices_agree() {
    for causal in [false, true] {
        let c = case(2, 2, causal, 600, 1.0);
        let (want, wdb) = single(&c);
        for lens in [
            vec![0, 600],
            vec![600, 0],
            vec![0, 250, 0, 350],
            vec![1, 598, 1],
            vec![300, 0, 300],
        ] {
            let outs = run_ranks(&c, &lens, |_, _, _| {});
            let db = dbeta_of(&outs);
            let got = joined(&c, &lens, outs);
            within(
                &format!("causal={causal} lens={lens:?}"),
                errors(&got, db, &want, wdb),
            );
        }
        // More ranks than tokens.
        let c = case(2, 2, causal, 3, 1.0);
        let (want, wdb) = single(&c);
        let lens = [1, 1, 1, 0];
        let outs = run_ranks(&c, &lens, |_, _, _| {});
        let db = dbeta_of(&outs);
        within(
            "3 tokens on 4 ranks",
            errors(&joined(&c, &lens, outs), db, &want, wdb),
        );
    }
}

fn message(r: &RankOut) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn ranks_that_disagree_all_get_an_error_naming_the_argument() {
    let c = case(2, 2, true, 300, 1.0);
    let lens = [100, 100, 100];
    let outs = run_ranks(&c, &lens, |r, p, _| {
        if r == 1 {
            *p = RaceParams::new(Bits(p.p()), Tables(p.l()), Beta(2.0))
                .unwrap()
                .with_causal(p.causal())
        }
    });
    for o in &outs {
        let m = message(o);
        assert!(
            m.contains("disagree on beta") && m.contains("from 1 to 2"),
            "{m}"
        );
    }
    let outs = run_ranks(&c, &lens, |r, p, _| {
        if r == 2 {
            *p = RaceParams::new(Bits(p.p()), Tables(3), Beta(p.beta()))
                .unwrap()
                .with_causal(p.causal())
        }
    });
    // Rank 2's planes no longer match its L: its own check refuses, the others name it.
    assert!(
        message(&outs[2]).contains("planes"),
        "{}",
        message(&outs[2])
    );
    for o in &outs[..2] {
        let m = message(o);
        assert!(
            m.contains("disagree on L") || m.contains("rank(s) 2 refused"),
            "{m}"
        );
    }
    let outs = run_ranks(&c, &lens, |r, p, _| {
        if r == 0 {
            *p = p.with_causal(false)
        }
    });
    assert!(outs
        .iter()
        .all(|o| message(o).contains("disagree on causal")));
}

#[test]
fn a_refused_rank_is_named_to_every_other_rank() {
    let c = case(2, 2, false, 300, 1.0);
    let outs = run_ranks(&c, &[100, 100, 100], |r, _, q| {
        if r == 2 {
            q[5] = f32::NAN
        }
    });
    assert!(
        matches!(outs[2], Err(RaceError::NonFinite { .. })),
        "{}",
        message(&outs[2])
    );
    for o in &outs[..2] {
        assert!(
            message(o).contains("rank(s) 2 refused their inputs"),
            "{}",
            message(o)
        );
    }
}

#[test]
fn rows_f32_cannot_hold_are_refused_on_every_rank() {
    for causal in [false, true] {
        // Keys around one direction u, queries around −u: every query's bucket is empty of
        // keys, and at beta = 10^4 its weights are far below f32's range.
        let mut c = case(3, 4, causal, 400, 1e4);
        let u = data(c.d, 9);
        for (i, x) in c.k.iter_mut().enumerate() {
            *x = u[i % c.d] + 0.01 * *x;
        }
        for (i, x) in c.q.iter_mut().enumerate() {
            *x = -u[i % c.d] + 0.01 * *x;
        }
        // The single process flags and recomputes rows here; otherwise this test tests nothing.
        let f = CpuRace::detected()
            .forward(
                &c.params,
                &c.planes,
                Heads::new(c.heads, c.n, c.d, &c.q).unwrap(),
                Heads::new(c.heads, c.n, c.d, &c.k).unwrap(),
                Heads::new(c.heads, c.n, c.dv, &c.v).unwrap(),
            )
            .unwrap();
        assert!(
            !f.recomputed.rows.is_empty(),
            "no flagged rows at beta = 1e4"
        );
        let outs = run_ranks(&c, &[200, 200], |_, _, _| {});
        for o in &outs {
            let m = message(o);
            assert!(
                m.contains("below f32's floor at beta = 10000") && m.contains("one process"),
                "{m}"
            );
        }
    }
}

/// `f` on each of `size` ranks as threads of this process; the ranks' results in rank order.
fn on_thread_ranks<T: Send>(
    size: usize,
    f: impl Fn(racelab_dist::ThreadComm) -> T + Sync,
) -> Vec<T> {
    std::thread::scope(|s| {
        let f = &f;
        let hs: Vec<_> = thread_group(size)
            .into_iter()
            .map(|comm| s.spawn(move || f(comm)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// The collectives' share of a distributed run is a share: the slowest rank's seconds inside
/// the collectives (waits included) never exceed the slowest rank's seconds, for the timed
/// forward+backward (`bench --distributed`) and the streaming mode, causal or not, with ranks
/// that take turns on the cores (3 ranks as threads).
#[test]
fn the_collectives_share_is_at_most_the_whole() {
    use racelab_dist::{bench, stream};
    for causal in [false, true] {
        let rows = on_thread_ranks(3, |comm| {
            let spec = bench::Spec {
                n: 3000,
                weak: false,
                heads: 2,
                d: 8,
                p: 2,
                l: 2,
                beta: 4.0,
                seed: 1,
                causal,
                runs: 3,
                check: false,
            };
            bench::run(comm, &spec)
        });
        for r in rows {
            let r = r.unwrap();
            assert!(
                r.collective_seconds <= r.seconds && (0.0..=1.0).contains(&r.collective_share),
                "causal {causal}: {} s in collectives of {} s ({})",
                r.collective_seconds,
                r.seconds,
                r.collective_share
            );
        }
        let reports = on_thread_ranks(3, |comm| {
            let spec = stream::StreamSpec {
                n: 5000,
                heads: 2,
                d: 8,
                p: 2,
                l: 2,
                beta: 4.0,
                seed: 1,
                causal,
            };
            stream::run_on(&comm, spec, &|_| {})
        });
        for r in reports {
            let r = r.unwrap();
            assert!(
                r.collective_seconds <= r.seconds,
                "stream causal {causal}: {} s in collectives of {} s",
                r.collective_seconds,
                r.seconds
            );
        }
    }
}
