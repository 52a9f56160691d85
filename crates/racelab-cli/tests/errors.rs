//! Every bad input gets a clear error naming the argument: from the library (no panic) and
//! from the CLI (non-zero exit, the message on stderr).
mod common;
use common::{qkv, randn_t, tmpdir};
use racelab::attend::attend;
use racelab::io::{npy_bytes, parse_npy, write_npy, Dtype};
use racelab::params::{Beta, Bits, Seed, Tables};
use racelab::{AttendOptions, Method, PlaneSpec, RaceError, Tensor};
use std::path::PathBuf;

fn err(q: &Tensor<f64>, k: &Tensor<f64>, v: &Tensor<f64>, opts: AttendOptions) -> String {
    match attend(q, k, v, &opts) {
        Ok(_) => panic!("expected an error for {opts:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn library_errors_name_the_argument() {
    let (q, k, v) = qkv(6, 4);
    let soft = AttendOptions::default();
    let soft_at = |p: usize, l: usize, beta: f64| {
        AttendOptions::new(Method::soft(Bits(p), Tables(l), Beta(beta), Seed(0)))
    };
    // Shape mismatches.
    let (k5, _, _) = qkv(6, 5);
    assert!(err(&q, &k5, &v, soft.clone()).contains("`k`"));
    let v_short = randn_t(&[5, 3], 4);
    assert!(err(&q, &k, &v_short, soft.clone()).contains("`v`"));
    let q_causal = randn_t(&[4, 4], 5);
    assert!(err(&q_causal, &k, &v, soft.clone().causal(true)).contains("causal"));
    // NaN and Inf.
    let mut qn = q.clone();
    qn.data[7] = f64::NAN;
    let e = err(&qn, &k, &v, soft.clone());
    assert!(
        e.contains("`q`") && e.contains("non-finite") && e.contains("index 7"),
        "{e}"
    );
    let mut vi = v.clone();
    vi.data[0] = f64::INFINITY;
    assert!(err(&q, &k, &vi, soft.clone()).contains("`v`"));
    // Zero vector where an angle is needed.
    let mut kz = k.clone();
    kz.data[8..12].iter_mut().for_each(|x| *x = 0.0);
    let hard = Method::Hard {
        planes: PlaneSpec::Draw {
            p: 2,
            l: 2,
            seed: 0,
        },
    };
    for m in [Method::Angular { gamma: 2.0 }, hard] {
        let e = err(&q, &kz, &v, AttendOptions::new(m));
        assert!(e.contains("row 2") && e.contains("zero vector"), "{e}");
    }
    // P too large, L = 0, beta ≤ 0, gamma ≤ 0.
    assert!(err(&q, &k, &v, soft_at(21, 2, 10.0)).contains("`p`"));
    assert!(err(&q, &k, &v, soft_at(0, 2, 10.0)).contains("`p`"));
    assert!(err(&q, &k, &v, soft_at(2, 0, 10.0)).contains("`l`"));
    for beta in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        assert!(err(&q, &k, &v, soft_at(2, 2, beta)).contains("`beta`"));
    }
    for gamma in [0.0, -2.0] {
        let angular = AttendOptions::new(Method::Angular { gamma });
        assert!(err(&q, &k, &v, angular).contains("`gamma`"));
    }
    // N = 0.
    let (q0, k0, v0) = (
        Tensor::new(vec![0, 4], vec![]).unwrap(),
        Tensor::new(vec![0, 4], vec![]).unwrap(),
        Tensor::new(vec![0, 3], vec![]).unwrap(),
    );
    let e = err(&q0, &k0, &v0, soft.clone());
    assert!(e.contains("empty") && e.contains("N = 0"), "{e}");
}

#[test]
fn malformed_npy_is_an_error_not_a_panic() {
    let good = npy_bytes(&[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], Dtype::F64);
    assert!(parse_npy(&good, "good").is_ok());
    let trunc = &good[..good.len() - 5];
    let e = parse_npy(trunc, "t.npy").unwrap_err().to_string();
    assert!(e.contains("t.npy") && e.contains("truncated"), "{e}");
    let e = parse_npy(b"hello world, not npy", "x.npy")
        .unwrap_err()
        .to_string();
    assert!(e.contains("magic"), "{e}");
    let e = parse_npy(&good[..12], "h.npy").unwrap_err().to_string();
    assert!(e.contains("truncated"), "{e}");
    let int = replace_bytes(&good, b"<f8", b"<i8");
    let e = parse_npy(&int, "i.npy").unwrap_err().to_string();
    assert!(e.contains("unsupported dtype '<i8'"), "{e}");
    let shape = replace_bytes(&good, b"(3, 2)", b"(3, x)");
    assert!(matches!(
        parse_npy(&shape, "s.npy"),
        Err(RaceError::Npy { .. })
    ));
}

/// Replace the first occurrence of `from` (same length as `to`) in a byte string.
fn replace_bytes(b: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let pos = b
        .windows(from.len())
        .position(|w| w == from)
        .expect("pattern present");
    let mut out = b.to_vec();
    out[pos..pos + to.len()].copy_from_slice(to);
    out
}

/// Run `racelab attend` with files (name, shape, data) and extra args; return stderr.
fn cli_fail(tag: &str, files: &[(&str, Vec<usize>, Vec<f64>)], extra: &[&str]) -> String {
    let dir = tmpdir(tag);
    for (name, shape, data) in files {
        write_npy(&dir.join(format!("{name}.npy")), shape, data, Dtype::F64).unwrap();
    }
    let o = common::attend_command(&dir, extra).output().unwrap();
    std::fs::remove_dir_all(&dir).ok();
    assert!(!o.status.success(), "{tag}: expected failure");
    assert_eq!(o.status.code(), Some(2), "{tag}: exit code");
    let s = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(!s.contains("panicked"), "{tag}: panicked: {s}");
    s
}

#[test]
fn cli_bad_inputs_exit_nonzero_with_message() {
    let (q, k, v) = qkv(5, 4);
    let f = |q: &Tensor<f64>, k: &Tensor<f64>, v: &Tensor<f64>| {
        vec![
            ("q", q.shape.clone(), q.data.clone()),
            ("k", k.shape.clone(), k.data.clone()),
            ("v", v.shape.clone(), v.data.clone()),
        ]
    };
    let ok = f(&q, &k, &v);
    let v_bad = randn_t(&[4, 3], 9);
    assert!(cli_fail("shape", &f(&q, &k, &v_bad), &["--method", "soft"]).contains("`v`"));
    let mut qn = q.clone();
    qn.data[3] = f64::NAN;
    assert!(cli_fail("nan", &f(&qn, &k, &v), &["--method", "softmax"]).contains("non-finite"));
    let mut kz = k.clone();
    kz.data[..4].iter_mut().for_each(|x| *x = 0.0);
    assert!(cli_fail("zero", &f(&q, &kz, &v), &["--method", "angular"]).contains("zero vector"));
    assert!(cli_fail("p", &ok, &["--method", "soft", "--p", "30"]).contains("`p`"));
    assert!(cli_fail("l", &ok, &["--method", "hard", "--l", "0"]).contains("`l`"));
    // β, γ and the logit scale take a finite number above 0, refused by their parsers naming the
    // flag in the library's words; a negative number as its own word reaches that parser too.
    for (method, flag, value) in [
        ("soft", "--beta", "-1"),
        ("soft", "--beta", "NaN"),
        ("angular", "--gamma", "-2"),
        ("angular", "--gamma", "0"),
        ("softmax", "--scale", "inf"),
    ] {
        let e = cli_fail("real", &ok, &["--method", method, flag, value]);
        assert!(e.contains(flag) && e.contains("> 0"), "{flag} {value}: {e}");
    }
    let e = cli_fail("beta", &ok, &["--method", "soft", "--beta=-1"]);
    assert!(e.contains("--beta"), "{e}");
    // Method, device and combine rule are parsed by clap, which names the flag and lists the
    // values it takes.
    for (tag, args, values) in [
        ("method", vec!["--method", "magic"], "softmax"),
        (
            "device",
            vec!["--method", "soft", "--device", "tpu"],
            "reference",
        ),
        (
            "combine",
            vec!["--method", "soft", "--combine", "mean"],
            "authors",
        ),
        ("dtype", vec!["--method", "soft", "--dtype", "f16"], "f64"),
    ] {
        let e = cli_fail(tag, &ok, &args);
        assert!(
            e.contains(&format!("--{tag}")) && e.contains(values),
            "{tag}: {e}"
        );
    }
    // One validation on every device: a Performer with no features and a non-positive logit
    // scale are refused on the CPU as on the reference (they once gave all-NaN output and
    // empty rows with exit 0 there).
    for device in ["cpu", "reference"] {
        let dev = ["--device", device];
        let e = cli_fail(
            "features",
            &ok,
            &[&["--method", "performer", "--features", "0"][..], &dev].concat(),
        );
        assert!(e.contains("`features`"), "{device}: {e}");
        for method in ["performer", "softmax"] {
            let e = cli_fail(
                "scale",
                &ok,
                &[&["--method", method, "--scale", "-1"][..], &dev].concat(),
            );
            assert!(e.contains("--scale"), "{device} {method}: {e}");
            // A scale the parser takes but whose logits overflow (they once made NaN rows):
            // refused by the one validation.
            let e = cli_fail(
                "scale",
                &ok,
                &[&["--method", method, "--scale", "1e308"][..], &dev].concat(),
            );
            assert!(
                e.contains("`scale`") && e.contains("logits"),
                "{device} {method}: {e}"
            );
        }
    }
    // Work that cannot fit is refused before allocating, naming P, L, N, the bytes and the
    // fix (here: P = 20, L = 100 is 10^8 features per token, tens of GiB of state).
    let (q3, k3, v3) = qkv(300, 4);
    for device in ["cpu", "reference"] {
        let e = cli_fail(
            "memory",
            &f(&q3, &k3, &v3),
            &[
                "--method", "soft", "--p", "20", "--l", "100", "--device", device,
            ],
        );
        for part in ["P = 20", "L = 100", "N = 300", "bytes", "--max-memory"] {
            assert!(e.contains(part), "{device}: {part} missing: {e}");
        }
    }
    // A budget given on the command line is used, and a bad one is refused.
    let e = cli_fail("budget", &ok, &["--method", "soft", "--max-memory", "1k"]);
    assert!(e.contains("more than --max-memory"), "{e}");
    let e = cli_fail("budget", &ok, &["--method", "soft", "--max-memory", "lots"]);
    assert!(e.contains("--max-memory"), "{e}");
    let empty = vec![
        ("q", vec![0, 4], vec![]),
        ("k", vec![0, 4], vec![]),
        ("v", vec![0, 3], vec![]),
    ];
    assert!(cli_fail("empty", &empty, &["--method", "soft"]).contains("N = 0"));
    // Truncated and unsupported-dtype files.
    let dir = tmpdir("npy");
    write_npy(&dir.join("k.npy"), &k.shape, &k.data, Dtype::F64).unwrap();
    write_npy(&dir.join("v.npy"), &v.shape, &v.data, Dtype::F64).unwrap();
    let bytes = npy_bytes(&q.shape, &q.data, Dtype::F64);
    for (tag, body, want) in [
        ("trunc", bytes[..bytes.len() - 3].to_vec(), "truncated"),
        (
            "dtype",
            replace_bytes(&bytes, b"<f8", b"<i8"),
            "unsupported dtype",
        ),
    ] {
        std::fs::write(dir.join("q.npy"), &body).unwrap();
        let o = common::attend_command(&dir, &["--method", "soft"])
            .output()
            .unwrap();
        let s = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{tag}");
        assert!(s.contains(want) && s.contains("q.npy"), "{tag}: {s}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Checked from the `.npy` headers before any data is read: memory (a q full of NaN is refused
/// for its size, not its values, under a small --max-memory) and exact attention's predicted
/// time (refused without --allow-slow). Conflicting and degenerate flags exit 2 naming the flag.
#[test]
fn cli_checks_before_reading_and_refuses_conflicts() {
    let (q, k, v) = qkv(300, 4);
    let mut qnan = q.clone();
    qnan.data.iter_mut().for_each(|x| *x = f64::NAN);
    let files = |q: &Tensor<f64>| {
        vec![
            ("q", q.shape.clone(), q.data.clone()),
            ("k", k.shape.clone(), k.data.clone()),
            ("v", v.shape.clone(), v.data.clone()),
        ]
    };
    let e = cli_fail(
        "before",
        &files(&qnan),
        &["--method", "soft", "--max-memory", "4k"],
    );
    assert!(
        e.contains("--max-memory") && !e.contains("non-finite"),
        "{e}"
    );
    // 2^19 tokens of exact softmax on the CPU kernels (blocked: little memory): minutes,
    // refused from a timed probe.
    let n = 1 << 19;
    let big = randn_t(&[n, 1], 7);
    let big_files = vec![
        ("q", big.shape.clone(), big.data.clone()),
        ("k", big.shape.clone(), big.data.clone()),
        ("v", big.shape.clone(), big.data.clone()),
    ];
    let e = cli_fail(
        "slow",
        &big_files,
        &["--method", "softmax", "--device", "cpu"],
    );
    assert!(e.contains("--allow-slow") && e.contains("predicted"), "{e}");
    // --planes with a --p or --l that disagrees names both.
    let dir = tmpdir("planes");
    let planes = dir.join("w.npy");
    racelab::io::write_planes(
        &planes,
        &racelab::Planes::gaussian(Bits(2), Tables(2), 4, Seed(1)).unwrap(),
    )
    .unwrap();
    let w = planes.to_str().unwrap();
    for flag in ["--p", "--l"] {
        let e = cli_fail(
            "conflict",
            &files(&q),
            &["--method", "soft", "--planes", w, flag, "3"],
        );
        assert!(
            e.contains(&format!("{flag} 3")) && e.contains("--planes"),
            "{e}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
    // A negative seed is refused by the parser, naming the flag.
    let e = cli_fail("seed", &files(&q), &["--method", "soft", "--seed", "-1"]);
    assert!(e.contains("--seed"), "{e}");
    // bench: N = 0, no (P, L) pair, 0 heads.
    for (args, flag) in [
        (&["--n", "0"][..], "`n`"),
        (&["--p", "", "--l", ""][..], "--p"),
        (&["--heads", "0", "--n", "16"][..], "`heads`"),
    ] {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_racelab"))
            .arg("bench")
            .args(args)
            .output()
            .unwrap();
        let s = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {s}");
        assert!(s.contains(flag) && !s.contains("panicked"), "{args:?}: {s}");
    }
}

/// Constructors that take a caller's buffer refuse a wrong length instead of panicking.
#[test]
fn buffer_constructors_return_errors() {
    let data = [0.0f32; 10];
    let e = racelab::backend::Heads::new(2, 3, 2, &data).unwrap_err();
    assert!(e.to_string().contains("`data`"), "{e}");
    assert!(racelab::backend::Heads::new(1, 5, 2, &data).is_ok());
    let e = racelab::MatRef::new(3, 4, &data[..]).unwrap_err();
    assert!(e.to_string().contains("`data`"), "{e}");
    assert!(racelab::Tensor::new(vec![usize::MAX, 2], vec![0.0f64]).is_err());
}

/// The Performer with no features and a non-positive logit scale are refused by the library's
/// entry on every device (`attend_with`, `attend_in` on f32 rows), not only by the command line.
#[test]
fn every_library_entry_refuses_the_performer_and_scale_rows() {
    use racelab::attend::{attend_in, attend_with};
    use racelab::{Device, FeatureSpec};
    let (q, k, v) = qkv(6, 4);
    let performer = |m: usize, scale: Option<f64>| {
        AttendOptions::new(Method::Performer {
            features: FeatureSpec::Draw { m, seed: 0 },
            scale,
        })
    };
    let softmax = AttendOptions::new(Method::Softmax { scale: Some(-1.0) });
    let (q32, k32, v32) = (
        q.map(|x| x as f32),
        k.map(|x| x as f32),
        v.map(|x| x as f32),
    );
    for device in [Device::Reference, Device::Cpu] {
        for (opts, arg) in [
            (performer(0, None), "`features`"),
            (performer(8, Some(-1.0)), "`scale`"),
            (softmax.clone(), "`scale`"),
        ] {
            let e = attend_with(&q, &k, &v, &opts, device)
                .unwrap_err()
                .to_string();
            assert!(e.contains(arg), "{device:?}: {e}");
            let e = attend_in(&q32.view(), &k32.view(), &v32.view(), &opts, device)
                .unwrap_err()
                .to_string();
            assert!(e.contains(arg), "{device:?} f32: {e}");
        }
    }
}

/// `racelab attend` with `args` in `dir` (q, k, v there); exit code and stderr.
/// `racelab attend --q q.npy --k k.npy --v v.npy` run in `dir`.
/// The reference computes in f64 whatever the files hold: f32 inputs with `--dtype f64` give
/// the f64 answer of the same (f32-valued) inputs, not that answer rounded to f32; NaN or
/// infinite Performer features are refused like NaN planes.
#[test]
fn the_reference_stays_f64_on_f32_files_and_omega_must_be_finite() {
    let dir = tmpdir("ref-f64");
    let (q, k, v) = qkv(24, 4);
    let round = |t: &Tensor<f64>| t.map(|x| x as f32 as f64);
    let (q32, k32, v32) = (round(&q), round(&k), round(&v));
    for (n, t) in [("q", &q32), ("k", &k32), ("v", &v32)] {
        write_npy(&dir.join(format!("{n}.npy")), &t.shape, &t.data, Dtype::F32).unwrap();
    }
    let (code, err) = common::attend_here(
        &dir,
        &[
            "--method",
            "soft",
            "--beta",
            "3",
            "--device",
            "reference",
            "--dtype",
            "f64",
            "--out",
            "o.npy",
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    let got = parse_npy(&std::fs::read(dir.join("o.npy")).unwrap(), "o").unwrap();
    let soft_ref = |beta: f64| {
        attend(
            &q32,
            &k32,
            &v32,
            &AttendOptions::new(Method::soft(Bits(2), Tables(2), Beta(beta), Seed(0))),
        )
        .unwrap()
    };
    let want = soft_ref(3.0);
    let worst = got
        .tensor
        .data
        .iter()
        .zip(&want.o.data)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    assert!(worst < 1e-12, "{worst}");
    assert!(
        got.tensor.data.iter().any(|&x| x != x as f32 as f64),
        "rounded to f32"
    );
    // beta past where 2·beta overflows f64 is refused; at 1e307 no row is zero.
    let (code, err) = common::attend_here(
        &dir,
        &[
            "--method",
            "soft",
            "--beta",
            "1e308",
            "--device",
            "reference",
            "--out",
            "b.npy",
        ],
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("beta") && err.contains("1e307"), "{err}");
    let huge = soft_ref(1e307);
    assert!(
        huge.o.data.chunks(3).all(|r| r.iter().any(|&x| x != 0.0)),
        "a zero row at 1e307"
    );
    let mut w = randn_t(&[8, 4], 9);
    w.data[3] = f64::NAN;
    write_npy(&dir.join("w.npy"), &w.shape, &w.data, Dtype::F64).unwrap();
    for device in ["reference", "cpu"] {
        let (code, err) = common::attend_here(
            &dir,
            &[
                "--method",
                "performer",
                "--omega",
                "w.npy",
                "--device",
                device,
                "--out",
                "p.npy",
            ],
        );
        assert_eq!(code, Some(2), "{err}");
        assert!(
            err.contains("`omega`") && err.contains("non-finite"),
            "{err}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// A fresh folder holding seeded f64 `q`, `k`, `v` of shape `[8, 4]`.
fn small_inputs(tag: &str) -> PathBuf {
    let dir = tmpdir(tag);
    for (name, seed) in [("q", 1), ("k", 2), ("v", 3)] {
        let t = randn_t(&[8, 4], seed);
        write_npy(
            &dir.join(format!("{name}.npy")),
            &t.shape,
            &t.data,
            Dtype::F64,
        )
        .unwrap();
    }
    dir
}

/// `racelab … | head`: a reader that has closed the pipe ends the run by SIGPIPE, as it ends
/// `cat`, never with a panic; what the run wrote before its first line (`--out`) is whole.
#[cfg(unix)]
#[test]
fn a_closed_stdout_pipe_ends_the_run_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let dir = small_inputs("pipe");
    for json in [false, true] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let extra: &[&str] = if json {
            &["--method", "soft", "--json"]
        } else {
            &["--method", "soft"]
        };
        let mut c = common::attend_command(&dir, extra);
        let o = c.stdout(writer).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!err.contains("panicked"), "json {json}: {err}");
        // SIGPIPE is signal 13 on every Unix racelab builds for.
        assert_eq!(
            o.status.signal(),
            Some(13),
            "json {json}: {:?} {err}",
            o.status
        );
        let out = racelab::io::read_npy(&dir.join("o.npy")).unwrap();
        assert_eq!(out.tensor.shape, vec![8, 4], "json {json}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// With `--json`, a refused run prints one JSON object on stdout, `{"error", "argument"}`,
/// naming the flag, whether the library (a value out of range for these inputs) or the
/// command-line parser (a value that is not a number) refused it; exit 2 as without.
#[test]
fn json_errors_are_json_naming_the_flag() {
    let dir = small_inputs("json-errors");
    let cases: [(&[&str], Option<&str>); 4] = [
        // The library: P beyond what can be held.
        (&["--method", "soft", "--p", "21"], Some("--p")),
        // clap: not a number.
        (&["--method", "soft", "--beta", "abc"], Some("--beta")),
        // The library: the memory budget (no one argument: the estimate names P, L and N).
        (
            &["--method", "linear", "--device", "cpu", "--max-memory", "1"],
            None,
        ),
        // A parser that applies the library's check.
        (&["--method", "angular", "--gamma", "0"], Some("--gamma")),
    ];
    for (args, flag) in cases {
        let mut c = common::attend_command(&dir, args);
        let o = c.arg("--json").current_dir(&dir).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let out = String::from_utf8_lossy(&o.stdout);
        let v: serde_json::Value =
            serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"));
        assert!(
            v["error"].as_str().is_some_and(|s| !s.is_empty()),
            "{args:?}: {out}"
        );
        match flag {
            Some(f) => assert_eq!(v["argument"], f, "{args:?}: {out}"),
            None => assert!(v.get("argument").is_some(), "{args:?}: {out}"),
        }
        // The human line is still on stderr.
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("error"),
            "{args:?}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// The README's first `attend` example runs as written (from the checkout) and writes a finite
/// output of the sample's shape.
#[test]
fn the_readme_attend_example_runs() {
    let readme = include_str!("../../../README.md");
    let start = readme
        .find("racelab attend --q experiments/data/minilm/")
        .expect("the README shows an attend run on the bundled sample");
    let end = start + readme[start..].find("```").unwrap();
    let command = readme[start..end].replace("\\\n", " ");
    let mut args: Vec<String> = command
        .split_whitespace()
        .skip(1)
        .map(String::from)
        .collect();
    let out = std::env::temp_dir().join(format!("racelab-readme-{}.npy", std::process::id()));
    let at = args
        .iter()
        .position(|a| a == "--out")
        .expect("--out in the example");
    args[at + 1] = out.to_string_lossy().into_owned();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_racelab"))
        .args(&args)
        .current_dir(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let a = racelab::io::read_npy(&out).unwrap();
    std::fs::remove_file(&out).ok();
    assert_eq!(a.tensor.shape, vec![12, 256, 32]);
    assert!(a.tensor.data.iter().all(|x| x.is_finite()));
}

/// `distributed-model` runs from any folder: its records default to the checkout's.
#[test]
fn distributed_model_runs_from_any_folder() {
    let dir = tmpdir("dist-model");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_racelab"))
        .args(["distributed-model", "--out", "model"])
        .current_dir(&dir)
        .output()
        .unwrap();
    let ok = o.status.success() && dir.join("model/bench/distributed.csv").is_file();
    std::fs::remove_dir_all(&dir).ok();
    assert!(ok, "{}", String::from_utf8_lossy(&o.stderr));
}
