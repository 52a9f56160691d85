//! What racelab writes: a full disk fails before the work and keeps the earlier output, and
//! an output never replaces what racelab did not write (an input, a device, another output).
mod common;
use common::randn_t;
use common::{attend_here, attend_relative, qkv, tmpdir};
use racelab::attend::attend_in;
use racelab::io::{parse_npy, read_npy_native, write_npy, Dtype, NpyData};
use racelab::params::{Beta, Bits, Seed, Tables};
use racelab::{AttendOptions, Device, Method, Tensor};

/// A new folder `name` holding `q.npy`, `k.npy`, `v.npy` ([2, 16, 4] of seed 4, f64).
fn qkv_dir(name: &str) -> std::path::PathBuf {
    let dir = tmpdir(name);
    let (q, k, v) = qkv(16, 4);
    for (n, t) in [("q", &q), ("k", &k), ("v", &v)] {
        write_npy(&dir.join(format!("{n}.npy")), &t.shape, &t.data, Dtype::F64).unwrap();
    }
    dir
}

/// A disk that takes no more (the file-size limit `RLIMIT_FSIZE` of the child, so a write past
/// 1 MiB fails with `EFBIG` as a full disk fails with `ENOSPC`, with no device or mount): the
/// 5 MB planes of `--save-planes` at L = 20,000 fail at once as an I/O error naming the file,
/// before the work, so the earlier `--out` (small enough to be written) keeps its contents and
/// no temporary is left beside either.
#[test]
fn a_full_disk_fails_before_the_work_and_keeps_the_old_output() {
    use std::os::unix::process::CommandExt;
    let dir = qkv_dir("full-disk");
    std::fs::write(dir.join("o.npy"), b"the earlier output").unwrap();
    let mut c = attend_relative(&dir);
    c.args([
        "--method", "soft", "--p", "2", "--l", "20000", "--out", "o.npy",
    ])
    .args(["--save-planes", "w.npy"]);
    // SAFETY: between fork and exec the closure calls only `setrlimit` and `signal`, which are
    // async-signal-safe, and touches no memory of the parent's.
    unsafe {
        c.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: 1 << 20,
                rlim_max: 1 << 20,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // A write past the limit then fails with EFBIG instead of killing the process.
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            Ok(())
        });
    }
    let o = c.output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("I/O error") && err.contains("w.npy"), "{err}");
    assert_eq!(
        std::fs::read(dir.join("o.npy")).unwrap(),
        b"the earlier output"
    );
    assert!(!dir.join("w.npy").exists());
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.contains(".tmp-"))
        .collect();
    assert!(left.is_empty(), "temporaries left: {left:?}");
    std::fs::remove_dir_all(&dir).ok();
}

/// An output never replaces what racelab did not write: a device, an input (by name, by
/// another spelling, by a hard link), the other output, a folder, a FIFO, a symbolic link; a
/// folder that does not take a new file is refused before the work; the planes are written
/// before it.
#[test]
fn outputs_never_replace_what_racelab_did_not_write() {
    let dir = qkv_dir("outputs");
    let q_bytes = std::fs::read(dir.join("q.npy")).unwrap();
    std::fs::hard_link(dir.join("q.npy"), dir.join("q-link.npy")).unwrap();
    std::fs::create_dir_all(dir.join("adir")).unwrap();
    std::fs::write(dir.join("target.npy"), b"kept").unwrap();
    std::os::unix::fs::symlink(dir.join("target.npy"), dir.join("sym.npy")).unwrap();
    assert!(std::process::Command::new("mkfifo")
        .arg(dir.join("fifo"))
        .status()
        .unwrap()
        .success());
    let soft = ["--method", "soft"];
    for (args, flag, words) in [
        (&["--out", "/dev/null"][..], "`out`", "not a regular file"),
        (&["--out", "q.npy"], "`out`", "same file as the input --q"),
        (&["--out", "./q.npy"], "`out`", "same file as the input --q"),
        (
            &["--out", "q-link.npy"],
            "`out`",
            "same file as the input --q",
        ),
        (&["--out", "adir"], "`out`", "is a folder"),
        (&["--out", "fifo"], "`out`", "not a regular file"),
        (&["--out", "sym.npy"], "`out`", "symbolic link"),
        (&["--out", "nowhere/o.npy"], "`out`", "does not exist"),
        (
            &["--out", "o.npy", "--save-planes", "o.npy"],
            "`out`",
            "--save-planes",
        ),
        (
            &["--out", "o.npy", "--save-planes", "k.npy"],
            "`save-planes`",
            "the input --k",
        ),
    ] {
        let (code, err) = attend_here(&dir, &[&soft[..], args].concat());
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(err.contains(flag) && err.contains(words), "{args:?}: {err}");
    }
    assert!(!dir.join("o.npy").exists());
    // Nothing was replaced.
    assert_eq!(std::fs::read(dir.join("q.npy")).unwrap(), q_bytes);
    assert_eq!(std::fs::read(dir.join("target.npy")).unwrap(), b"kept");
    assert!(std::fs::symlink_metadata(dir.join("sym.npy"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(!std::fs::metadata("/dev/null").unwrap().is_file());
    // The planes are written before the work, and they are the ones used.
    let (code, err) = attend_here(
        &dir,
        &[&soft[..], &["--out", "o1.npy", "--save-planes", "w.npy"]].concat(),
    );
    assert_eq!(code, Some(0), "{err}");
    let (code, err) = attend_here(
        &dir,
        &[&soft[..], &["--out", "o2.npy", "--planes", "w.npy"]].concat(),
    );
    assert_eq!(code, Some(0), "{err}");
    let (a, b) = (
        parse_npy(&std::fs::read(dir.join("o1.npy")).unwrap(), "o1").unwrap(),
        parse_npy(&std::fs::read(dir.join("o2.npy")).unwrap(), "o2").unwrap(),
    );
    assert_eq!(a.tensor.data, b.tensor.data);
    // An experiment's --out folder: an existing file there is refused before any work.
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_racelab"))
        .args(["bias", "--quick", "--out"])
        .arg(dir.join("q.npy"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("`out`") && err.contains("not a folder"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// `racelab attend` on f32 files writes f32, the library's own f32 output.
#[test]
fn the_command_line_keeps_f32_files_f32() {
    let dir = tmpdir("f32");
    let t = randn_t(&[2, 24, 8], 9).map(|x| x as f32);
    for name in ["q", "k", "v"] {
        write_npy(
            &dir.join(format!("{name}.npy")),
            &t.shape,
            &t.data,
            Dtype::F32,
        )
        .unwrap();
    }
    let out = dir.join("o.npy");
    let args = [
        "--method", "soft", "--p", "2", "--l", "3", "--beta", "6", "--causal", "--device", "cpu",
    ];
    let status = common::attend_command(&dir, &args).output().unwrap();
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let o = match read_npy_native(&out).unwrap() {
        NpyData::F32(o) => o,
        NpyData::F64(_) => panic!("an f32 call wrote f64"),
    };
    let lib: Tensor<f32> = attend_in(
        &t.view(),
        &t.view(),
        &t.view(),
        &AttendOptions::new(Method::soft(Bits(2), Tables(3), Beta(6.0), Seed(0))).causal(true),
        Device::Cpu,
    )
    .unwrap()
    .o;
    assert_eq!(o, lib, "the command line's f32 output is the library's");
    std::fs::remove_dir_all(&dir).ok();
}
