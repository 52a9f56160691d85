//! A generated walk over the command line's argument space. The subcommands and their flags
//! come from the binary's own `--help`, so a new flag is walked without editing this file. Each
//! flag is given degenerate values (0, 1, empty, negative, NaN, infinity, 10^12, 2^64, 1e308) on
//! top of a small invocation of its subcommand that works (for `attend`: once per method and
//! device), and each boolean flag is set alone. Every run must end in exit 0 or in exit 2 with
//! the flag named on stderr; never a panic, an abort or another signal. The values no flag takes
//! (empty, a negative number, NaN, infinity) must be refused. A run still going after a few
//! seconds has accepted its value and is stopped there. An `attend` that exits 0 has its output
//! read back: every value must be finite. Every output flag is also given paths that are not
//! racelab's to replace (a device, a FIFO, an input, a symbolic link, a folder where a file is
//! written), which must be refused and left as they were.
mod common;
use common::randn_t;
use racelab::io::{read_npy, write_npy, Dtype};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Values every flag must refuse.
const REFUSED: [&str; 4] = ["", "-1", "NaN", "inf"];
/// Values a flag may take (or refuse, naming itself).
const MAY_TAKE: [&str; 5] = ["0", "1", "1000000000000", "18446744073709551616", "1e308"];
/// Flags that take a path or a free-form string, where "-1", "NaN" or "inf" are names a user
/// may give; they must still refuse an empty value.
const STRING_FLAGS: [&str; 12] = [
    "q",
    "k",
    "v",
    "planes",
    "omega",
    "save-planes",
    "out",
    "out-shards",
    "config",
    "data",
    "node",
    "runs@distributed-model",
];
/// Output flags: `Some(true)` for a file (`--out` of attend and bound, `--save-planes`),
/// `Some(false)` for a folder (every other `--out`, `--out-shards`).
fn output_kind(flag: &str, sub: &str) -> Option<bool> {
    match (flag, sub) {
        ("save-planes", _) | ("out", "attend" | "bound") => Some(true),
        ("out", _) | ("out-shards", _) => Some(false),
        _ => None,
    }
}

/// The output paths that must not be replaced, as (path, refused as a file, refused as a
/// folder): a device, a FIFO, an input file, a symbolic link to a file, an existing folder.
fn special_outputs(dir: &Path) -> Vec<(String, bool, bool)> {
    let fifo = dir.join("fifo");
    let made = Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .map(|s| s.success());
    assert!(matches!(made, Ok(true)), "mkfifo {fifo:?}");
    std::fs::write(dir.join("target.npy"), b"not racelab's").unwrap();
    std::os::unix::fs::symlink(dir.join("target.npy"), dir.join("link.npy")).unwrap();
    std::fs::create_dir_all(dir.join("adir")).unwrap();
    let p = |n: &str| dir.join(n).to_string_lossy().into_owned();
    vec![
        ("/dev/null".into(), true, true),
        (p("fifo"), true, true),
        (p("q.npy"), true, true),
        (p("link.npy"), true, true),
        (p("adir"), true, false),
    ]
}

/// How long a run that may accept its value is watched before it is stopped.
const WATCH: Duration = Duration::from_secs(2);
/// How long a run that must refuse its value may take to do so.
const REFUSE_WITHIN: Duration = Duration::from_secs(60);

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_racelab")
}

fn help(args: &[&str]) -> String {
    let o = Command::new(bin())
        .args(args)
        .arg("--help")
        .output()
        .unwrap();
    assert!(o.status.success(), "racelab {args:?} --help failed");
    String::from_utf8(o.stdout).unwrap()
}

/// The subcommands `racelab --help` lists.
fn subcommands() -> Vec<String> {
    let h = help(&[]);
    let after = h.split("Commands:").nth(1).expect("a Commands section");
    after
        .lines()
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(String::from)
        .collect()
}

/// One flag from a subcommand's `--help`: its name and whether it takes a value.
#[derive(Clone, Debug)]
struct Flag {
    name: String,
    takes_value: bool,
    possible: Vec<String>,
}

fn flags(sub: &str) -> Vec<Flag> {
    let h = help(&[sub]);
    let mut out: Vec<Flag> = Vec::new();
    for line in h.lines() {
        let indent = line.len() - line.trim_start().len();
        let t = line.trim_start();
        if indent <= 6 && t.starts_with('-') {
            let words: Vec<&str> = t.split_whitespace().collect();
            let Some(i) = words.iter().position(|w| w.starts_with("--")) else {
                continue;
            };
            let name = words[i].trim_start_matches("--").trim_end_matches(',');
            if name == "help" || name == "version" {
                continue;
            }
            out.push(Flag {
                name: name.to_string(),
                takes_value: words.get(i + 1).is_some_and(|w| w.starts_with('<')),
                possible: Vec::new(),
            });
        } else if let (Some(f), Some(v)) = (out.last_mut(), t.strip_prefix("- ")) {
            // `Possible values:` as a list, one `- name: help` per line.
            if let Some((name, _)) = v.split_once(':') {
                f.possible.push(name.to_string());
            }
        } else if let (Some(f), Some(rest)) = (out.last_mut(), t.split("[possible values: ").nth(1))
        {
            let vals = rest.trim_end().trim_end_matches(']');
            f.possible = vals.split(", ").map(String::from).collect();
        }
    }
    out
}

/// One run of the walk.
struct Case {
    label: String,
    args: Vec<String>,
    flag: String,
    must_refuse: bool,
    /// Other arguments a refusal may name instead of the flag (an input whose values put the
    /// logits past f32 is refused naming `scale`, the fix it suggests).
    also: &'static [&'static str],
}

/// Value-range variants of an input file: (suffix, how the values are made, must refuse).
/// Near f32's largest value and in its subnormals a method must run to finite outputs or
/// refuse naming the input; a NaN anywhere must be refused.
const VALUE_CASES: [(&str, f64, bool); 3] = [
    ("max", 3e38, false),
    ("tiny", 1e-40, false),
    ("nan", f64::NAN, true),
];

/// Write `NAME-SUFFIX.npy` for each of [`VALUE_CASES`]: the input scaled so its largest entry
/// is the case's value (f32), or with one entry NaN.
fn value_files(dir: &Path, name: &str, t: &racelab::Tensor<f64>) {
    let top = t.data.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    for (suffix, value, _) in VALUE_CASES {
        let data: Vec<f64> = if value.is_nan() {
            let mut d = t.data.clone();
            let mid = d.len() / 2;
            d[mid] = f64::NAN;
            d
        } else {
            t.data.iter().map(|x| x / top * value).collect()
        };
        write_npy(
            &dir.join(format!("{name}-{suffix}.npy")),
            &t.shape,
            &data,
            Dtype::F32,
        )
        .unwrap();
    }
}

/// The baseline invocation of `sub` (for `attend`: one per method and device), its arguments
/// as (flag, value) pairs so that the walked flag replaces its own.
fn baselines(
    sub: &str,
    dir: &Path,
    methods: &[String],
    devices: &[String],
) -> Vec<Vec<(String, Option<String>)>> {
    let p = |s: &str| dir.join(s).to_string_lossy().into_owned();
    let kv = |pairs: &[(&str, Option<String>)]| -> Vec<(String, Option<String>)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    };
    let s = |x: &str| Some(x.to_string());
    match sub {
        "attend" => methods
            .iter()
            .flat_map(|m| devices.iter().map(move |d| (m, d)))
            .map(|(m, d)| {
                kv(&[
                    ("q", Some(p("q.npy"))),
                    ("k", Some(p("k.npy"))),
                    ("v", Some(p("v.npy"))),
                    ("method", s(m)),
                    ("device", s(d)),
                    // Relative: each run has a folder of its own, where its output is read back.
                    ("out", s("o.npy")),
                ])
            })
            .collect(),
        "bench" => vec![kv(&[
            ("n", s("64")),
            ("p", s("2")),
            ("l", s("2")),
            ("heads", s("1")),
            ("d", s("4")),
            ("runs", s("3")),
            ("out", Some(p("bench"))),
        ])],
        "distributed-model" => {
            let runs =
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/bench/distributed.jsonl");
            vec![kv(&[
                ("runs", Some(runs.to_string_lossy().into_owned())),
                ("out", Some(p("model"))),
            ])]
        }
        // The random rows are not unit rows: the baseline normalises them.
        "bound" => vec![kv(&[
            ("q", Some(p("q.npy"))),
            ("k", Some(p("k.npy"))),
            ("v", Some(p("v.npy"))),
            ("p", s("2")),
            ("beta", s("4")),
            ("normalize", None),
            ("out", s("rows.csv")),
        ])],
        "reproduce" => vec![kv(&[("quick", None), ("out", Some(p("repro")))])],
        // fig3 and the experiments.
        _ => vec![kv(&[("quick", None), ("out", Some(p(sub)))])],
    }
}

fn render(base: &[(String, Option<String>)], flag: &str, value: Option<&str>) -> Vec<String> {
    let mut args = Vec::new();
    let mut placed = false;
    for (k, v) in base {
        if k == flag {
            placed = true;
            push_flag(&mut args, k, value);
        } else {
            push_flag(&mut args, k, v.as_deref());
        }
    }
    if !placed {
        push_flag(&mut args, flag, value);
    }
    args
}

fn push_flag(args: &mut Vec<String>, k: &str, v: Option<&str>) {
    args.push(format!("--{k}"));
    if let Some(v) = v {
        args.push(v.to_string());
    }
}

/// How a run ended: 0 refused (exit 2), 1 ran to exit 0, 2 stopped while running, 3 other.
fn outcome(code: Option<Option<i32>>) -> usize {
    match code {
        Some(Some(2)) => 0,
        Some(Some(0)) => 1,
        None => 2,
        _ => 3,
    }
}

/// How the run ended ([`outcome`]) and why it broke the walk's rule, or `None` when it kept it.
fn judge(c: &Case, cwd: &Path) -> (usize, Option<String>) {
    std::fs::create_dir_all(cwd).unwrap();
    let mut child = Command::new(bin())
        .args(&c.args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        use std::io::Read;
        let mut r = stderr;
        let _ = r.read_to_string(&mut s);
        s
    });
    let limit = if c.must_refuse { REFUSE_WITHIN } else { WATCH };
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let err = reader.join().unwrap();
    let how = outcome(status.map(|s| s.code()));
    (how, verdict(c, cwd, status, &err, limit))
}

fn verdict(
    c: &Case,
    cwd: &Path,
    status: Option<std::process::ExitStatus>,
    err: &str,
    limit: Duration,
) -> Option<String> {
    let tail = || {
        err.chars()
            .rev()
            .take(400)
            .collect::<String>()
            .chars()
            .rev()
            .collect::<String>()
    };
    if err.contains("panicked") {
        return Some(format!("{}: panicked: {}", c.label, tail()));
    }
    let Some(st) = status else {
        return c
            .must_refuse
            .then(|| format!("{}: still running after {limit:?} (accepted)", c.label));
    };
    match st.code() {
        Some(0) if c.must_refuse => Some(format!("{}: accepted (exit 0)", c.label)),
        Some(0) => non_finite_output(&cwd.join("o.npy")).map(|e| format!("{}: {e}", c.label)),
        Some(2) => {
            let mut names = vec![
                format!("--{}", c.flag),
                format!("`{}`", c.flag),
                format!("`{}`", c.flag.replace('-', "_")),
            ];
            names.extend(c.also.iter().map(|a| format!("`{a}`")));
            (!names.iter().any(|n| err.contains(n.as_str()))).then(|| {
                format!(
                    "{}: exit 2 without naming --{}: {}",
                    c.label,
                    c.flag,
                    tail()
                )
            })
        }
        Some(code) => Some(format!("{}: exit {code}: {}", c.label, tail())),
        None => Some(format!("{}: killed by a signal: {}", c.label, tail())),
    }
}

/// Whether an `attend` output that exit 0 left behind holds a value that is not finite.
fn non_finite_output(path: &Path) -> Option<String> {
    if !path.is_file() {
        return None;
    }
    match read_npy(path) {
        Ok(a) => {
            let bad = a.tensor.data.iter().filter(|x| !x.is_finite()).count();
            (bad > 0).then(|| format!("exit 0 with {bad} non-finite outputs"))
        }
        Err(e) => Some(format!("exit 0 with an unreadable output: {e}")),
    }
}

#[test]
fn every_flag_of_every_subcommand_refuses_degenerate_values_by_name() {
    let dir = std::env::temp_dir().join(format!("racelab-walk-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (name, shape, seed) in [("q", [8, 4], 1), ("k", [8, 4], 2), ("v", [8, 3], 3)] {
        let t = randn_t(&shape, seed);
        write_npy(
            &dir.join(format!("{name}.npy")),
            &t.shape,
            &t.data,
            Dtype::F32,
        )
        .unwrap();
        value_files(&dir, name, &t);
    }
    let special = special_outputs(&dir);
    let subs = subcommands();
    for expected in [
        "attend",
        "bench",
        "bound",
        "reproduce",
        "distributed-model",
        "fig3",
        "theorem",
    ] {
        assert!(
            subs.iter().any(|s| s == expected),
            "{expected} not in {subs:?}"
        );
    }
    let mut cases = Vec::new();
    for sub in &subs {
        let fl = flags(sub);
        assert!(!fl.is_empty(), "{sub}: no flags parsed from --help");
        let possible = |name: &str| -> Vec<String> {
            fl.iter()
                .find(|f| f.name == name)
                .map(|f| f.possible.clone())
                .unwrap_or_default()
        };
        let methods = possible("method");
        // The devices this machine runs everywhere (a missing GPU is its own refusal).
        let devices: Vec<String> = possible("device")
            .into_iter()
            .filter(|d| d != "cuda")
            .collect();
        if sub == "attend" {
            assert!(methods.len() >= 6, "attend's methods: {methods:?}");
            assert!(devices.len() >= 2, "attend's devices: {devices:?}");
        }
        for base in baselines(sub, &dir, &methods, &devices) {
            let mut add_also = |flag: &str,
                                value: Option<&str>,
                                must_refuse: bool,
                                also: &'static [&'static str]| {
                let args = [vec![sub.clone()], render(&base, flag, value)].concat();
                cases.push(Case {
                    label: format!("racelab {}", args.join(" ")),
                    args,
                    flag: flag.to_string(),
                    must_refuse,
                    also,
                });
            };
            // The value-range cases: each input file of attend and bound replaced by its
            // near-largest, subnormal and NaN variants.
            if sub == "attend" || sub == "bound" {
                for name in ["q", "k", "v"] {
                    for (suffix, _, must_refuse) in VALUE_CASES {
                        let file = dir.join(format!("{name}-{suffix}.npy"));
                        let file = file.to_string_lossy().into_owned();
                        add_also(name, Some(&file), must_refuse, &["scale"]);
                    }
                }
            }
            let mut add = |flag: &str, value: Option<&str>, must_refuse: bool| {
                add_also(flag, value, must_refuse, &[])
            };
            for f in &fl {
                if !f.takes_value {
                    add(&f.name, None, false);
                    continue;
                }
                let is_string = STRING_FLAGS
                    .iter()
                    .any(|s| *s == f.name || *s == format!("{}@{sub}", f.name));
                for v in REFUSED {
                    add(&f.name, Some(v), v.is_empty() || !is_string);
                }
                for v in MAY_TAKE {
                    add(&f.name, Some(v), false);
                }
                if let Some(is_file) = output_kind(&f.name, sub) {
                    for (v, as_file, as_dir) in &special {
                        add(&f.name, Some(v), if is_file { *as_file } else { *as_dir });
                    }
                }
            }
        }
    }
    let total = cases.len();
    let queue = Mutex::new(cases.into_iter().enumerate().collect::<Vec<_>>());
    let failures = Mutex::new(Vec::new());
    let outcomes = Mutex::new([0usize; 4]);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| loop {
                let Some((i, c)) = queue.lock().unwrap().pop() else {
                    break;
                };
                // Each run in a folder of its own: relative outputs ("0", "1") stay apart.
                let (how, failure) = judge(&c, &dir.join(format!("run-{i}")));
                outcomes.lock().unwrap()[how] += 1;
                if let Some(f) = failure {
                    failures.lock().unwrap().push(f);
                }
            });
        }
    });
    // Nothing racelab did not write was replaced.
    let kept = [
        std::fs::metadata("/dev/null")
            .map(|m| !m.is_file())
            .unwrap_or(false),
        std::fs::symlink_metadata(dir.join("fifo"))
            .map(|m| !m.is_file())
            .unwrap_or(false),
        std::fs::read(dir.join("target.npy")).ok().as_deref() == Some(&b"not racelab's"[..]),
        std::fs::symlink_metadata(dir.join("link.npy"))
            .map(|m| m.file_type().is_symlink())
            .unwrap_or(false),
        read_npy(&dir.join("q.npy")).is_ok(),
    ];
    std::fs::remove_dir_all(&dir).ok();
    assert!(
        kept.iter().all(|&k| k),
        "special outputs replaced: {kept:?}"
    );
    let mut failures = failures.into_inner().unwrap();
    failures.sort();
    assert!(
        failures.is_empty(),
        "{} of {total} runs broke the rule:\n{}",
        failures.len(),
        failures.join("\n")
    );
    let [refused, ran, stopped, _] = outcomes.into_inner().unwrap();
    println!(
        "{total} runs kept the rule: {refused} refused naming the flag, {ran} ran to exit 0, \
         {stopped} still running after {WATCH:?} (stopped)"
    );
}
