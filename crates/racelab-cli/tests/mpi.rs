//! The MPI transport end to end: `mpirun` on localhost runs the `racelab` binary of this build
//! (`cargo test --release --features mpi`; Open MPI, oversubscribed past the cores).
//!
//! - `attend --distributed` on 1–4 ranks reproduces the single-process CPU kernels (causal
//!   and not, forward ≤ 1e-5 of the largest entry); `--out-shards` holds the same rows;
//! - `bench --distributed --check` on 3 ranks: forward and gradients against one process
//!   (the backward's suffix scan and all-reduces over MPI);
//! - ranks started with different β all exit with an error naming it; a rank whose inputs are
//!   refused ends the job with `MPI_Abort` and a non-zero exit, never a hang.
//!
//! Without the `mpi` feature the tests are reported as ignored ("skipped: no MPI"); with it,
//! a missing `mpirun` fails them with what to install.

use racelab::io::{read_npy, write_npy, Dtype};
use racelab::params::{Beta, Bits, Seed, Tables};
use racelab::rng::SeededRng;
use racelab::{AttendOptions, Device, Method};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Open MPI's `mpirun` is on the path (a build with the `mpi` feature needs it to test).
fn check_mpirun() {
    let v = Command::new("mpirun").arg("--version").output();
    let ok = v.map(|o| String::from_utf8_lossy(&o.stdout).contains("Open MPI"));
    assert!(
        matches!(ok, Ok(true)),
        "no Open MPI mpirun on the path: apt-get install libopenmpi-dev openmpi-bin"
    );
}

/// `mpirun` over `apps` (each: ranks and the racelab arguments), bounded by a timeout.
fn mpirun(apps: &[(usize, Vec<String>)]) -> Output {
    let mut cmd = Command::new("timeout");
    cmd.args([
        "300",
        "mpirun",
        "--allow-run-as-root",
        "--oversubscribe",
        "--bind-to",
        "none",
    ]);
    for (i, (np, args)) in apps.iter().enumerate() {
        if i > 0 {
            cmd.arg(":");
        }
        cmd.args(["-np", &np.to_string(), env!("CARGO_BIN_EXE_racelab")]);
        cmd.args(args);
    }
    cmd.env("RAYON_NUM_THREADS", "1");
    let out = cmd.output().expect("mpirun runs");
    assert_ne!(
        out.status.code(),
        Some(124),
        "mpirun timed out: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("racelab-mpi-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// q, k, v `[3, n, 16 | 8]` f32 files in `d`.
fn inputs(d: &Path, n: usize) -> [PathBuf; 3] {
    ["q", "k", "v"].map(|name| {
        let cols = if name == "v" { 8 } else { 16 };
        let seed = name.as_bytes()[0] as u64;
        let x = SeededRng::new(seed, 1).normals(3 * n * cols);
        let path = d.join(format!("{name}.npy"));
        write_npy(&path, &[3, n, cols], &x, Dtype::F32).unwrap();
        path
    })
}

fn attend_args(f: &[PathBuf; 3], causal: bool, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = [
        "attend",
        "--method",
        "soft",
        "--device",
        "cpu",
        "--distributed",
        "--p",
        "3",
        "--l",
        "2",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for (flag, p) in ["--q", "--k", "--v"].iter().zip(f) {
        a.push(flag.to_string());
        a.push(p.display().to_string());
    }
    if causal {
        a.push("--causal".into());
    }
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

fn rel(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    a.iter()
        .zip(b)
        .fold(0.0f64, |m, (x, y)| m.max((x - y).abs()))
        / scale
}

#[test]
#[cfg_attr(
    not(feature = "mpi"),
    ignore = "skipped: no MPI (cargo test --release --features mpi)"
)]
fn attend_distributed_reproduces_one_process() {
    check_mpirun();
    let d = dir("attend");
    let f = inputs(&d, 1001);
    let [q, k, v] = f.clone().map(|p| read_npy(&p).unwrap().tensor);
    for causal in [false, true] {
        let soft = Method::soft(
            Bits(3),
            Tables(2),
            Beta(racelab::params::DEFAULT_BETA),
            Seed(0),
        );
        let opts = AttendOptions::new(soft).causal(causal);
        let want = racelab::attend::attend_with(&q, &k, &v, &opts, Device::Cpu)
            .unwrap()
            .o;
        for ranks in 1..=4 {
            let out = d.join(format!("o-{causal}-{ranks}.npy"));
            let o = mpirun(&[(
                ranks,
                attend_args(&f, causal, &["--out", out.to_str().unwrap()]),
            )]);
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            let got = read_npy(&out).unwrap().tensor;
            assert_eq!(got.shape, want.shape);
            let e = rel(&got.data, &want.data);
            assert!(e <= 1e-5, "causal={causal} ranks={ranks}: {e:.2e}");
        }
        // The shards hold the rows of --out, in order.
        let shards = d.join(format!("shards-{causal}"));
        let o = mpirun(&[(
            3,
            attend_args(&f, causal, &["--out-shards", shards.to_str().unwrap()]),
        )]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let whole = read_npy(&d.join(format!("o-{causal}-3.npy")))
            .unwrap()
            .tensor;
        let manifest: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(shards.join("shards.json")).unwrap())
                .unwrap();
        for s in manifest["shards"].as_array().unwrap() {
            let part = read_npy(&shards.join(s["file"].as_str().unwrap()))
                .unwrap()
                .tensor;
            let (a, b) = (
                s["tokens"][0].as_u64().unwrap() as usize,
                s["tokens"][1].as_u64().unwrap() as usize,
            );
            assert_eq!(part.shape, vec![3, b - a, 8]);
            for h in 0..3 {
                let want = &whole.data[(h * 1001 + a) * 8..(h * 1001 + b) * 8];
                assert_eq!(&part.data[h * (b - a) * 8..(h + 1) * (b - a) * 8], want);
            }
        }
    }
}

#[test]
#[cfg_attr(
    not(feature = "mpi"),
    ignore = "skipped: no MPI (cargo test --release --features mpi)"
)]
fn bench_distributed_check_gradients_over_mpi() {
    check_mpirun();
    for causal in ["", "--causal"] {
        let mut args: Vec<String> =
            "bench --distributed --check --json --n 3000 --heads 2 --d 32 --p 2 --l 2 --runs 1"
                .split(' ')
                .map(String::from)
                .collect();
        if !causal.is_empty() {
            args.push(causal.into());
        }
        let o = mpirun(&[(3, args)]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let row: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(row["ranks"], 3);
        let c: Vec<f64> = row["check"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        assert!(c[0] <= 1e-5, "{causal}: forward {:.2e}", c[0]);
        assert!(
            c[1..].iter().all(|&x| x <= 1e-4),
            "{causal}: gradients {c:?}"
        );
        assert_eq!(row["collectives_per_layer"], 3);
    }
}

#[test]
#[cfg_attr(
    not(feature = "mpi"),
    ignore = "skipped: no MPI (cargo test --release --features mpi)"
)]
fn ranks_started_with_different_arguments_all_exit_with_an_error() {
    check_mpirun();
    let d = dir("disagree");
    let f = inputs(&d, 300);
    let out = d.join("o.npy");
    let out = ["--out", out.to_str().unwrap()];
    let a = [&out[..], &["--beta", "1"]].concat();
    let b = [&out[..], &["--beta", "2"]].concat();
    let o = mpirun(&[
        (1, attend_args(&f, true, &a)),
        (1, attend_args(&f, true, &b)),
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        err.matches("disagree on beta (from 1 to 2)").count(),
        2,
        "{err}"
    );
}

#[test]
#[cfg_attr(
    not(feature = "mpi"),
    ignore = "skipped: no MPI (cargo test --release --features mpi)"
)]
fn a_rank_with_bad_inputs_ends_the_job() {
    check_mpirun();
    let d = dir("abort");
    let f = inputs(&d, 300);
    // A NaN in the last rank's slice of q.
    let mut q = read_npy(&f[0]).unwrap().tensor;
    q.data[290 * 16 + 3] = f64::NAN;
    write_npy(&f[0], &q.shape, &q.data, Dtype::F32).unwrap();
    let out = d.join("o.npy");
    let o = mpirun(&[(3, attend_args(&f, false, &["--out", out.to_str().unwrap()]))]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("rank 2 of 3, ending the job with MPI_Abort") && err.contains("non-finite"),
        "{err}"
    );
}
