//! The workspace's crates (`crates/racelab-core`, the operators and kernels; `crates/racelab-dist`
//! above it, sequence parallelism on the core's partial kernels; the lab above both; the
//! command line, `crates/racelab-cli`, on top) are layered by the compiler: a crate cannot
//! name one above it. Within each crate, what
//! the compiler cannot see is checked here.
//!
//! Each crate's files form a graph without circles: file `a` points at file `b` when `a` names
//! an item of `b` (a `use`, a re-export, or a path written inline as `crate::…`, `super::…`,
//! `self::…`). `mod b;` declarations are not arrows (a parent holds its children; it does not
//! use them), and neither are unit-test modules (`#[cfg(test)] mod … { … }`, and the files
//! `tests.rs` and `tests/` of `src/` that `#[cfg(test)] mod tests;` declares), which may reach
//! anywhere. A path is resolved to the longest module prefix that is a file.
//!
//! A second test keeps the base of the house free of upward arrows: the files that take plain
//! values (`memory`, `provenance`, `params`, `hashing`, `rng`, `error`, `stats`, `tensor`)
//! name nothing above them, the backend contract (`backend/`) names none of its backends, and
//! the kernels (`cpu/`) do not name the experiment, bench, distributed or front-end rooms. A
//! third keeps every Rust file of the workspace (sources, tests, examples, benches) at most 800
//! lines.

mod source_text;

use source_text::code_only;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module path (`["cpu", "soft", "forward"]`) and the file it lives in.
struct Module {
    path: Vec<String>,
    file: PathBuf,
}

/// The `.rs` files under `dir` (with `src/bin` unless `skip_bin`).
fn rust_files(dir: &Path, skip_bin: bool) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                if !(skip_bin && p.file_name().unwrap() == "bin") {
                    stack.push(p);
                }
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out
}

/// The crate's modules, without unit-test files (`tests.rs`, or anything under a `tests/`
/// folder of `src/`, declared `#[cfg(test)] mod tests;`), which may reach anywhere, as inline
/// test modules do.
fn modules(src: &Path) -> Vec<Module> {
    rust_files(src, true)
        .into_iter()
        .filter(|p| {
            let rel = p.strip_prefix(src).unwrap();
            !(rel.file_name().is_some_and(|f| f == "tests.rs")
                || rel.parent().is_some_and(|d| d.iter().any(|c| c == "tests")))
        })
        .map(|p| {
            let rel = p.strip_prefix(src).unwrap();
            let mut path: Vec<String> = rel
                .iter()
                .map(|s| s.to_string_lossy().trim_end_matches(".rs").to_string())
                .collect();
            let last = path.last().unwrap().clone();
            if last == "mod" || last == "lib" {
                path.pop();
            }
            Module { path, file: p }
        })
        .collect()
}

/// `code` without its `#[cfg(test)]` items (the attribute, then everything to the end of the
/// item's braces or its `;`).
fn without_tests(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at..];
        let (brace, semi) = (after.find('{'), after.find(';'));
        let end = match (brace, semi) {
            (Some(b), Some(s)) if s < b => s + 1,
            (Some(b), _) => {
                let mut depth = 0usize;
                let mut end = after.len();
                for (k, ch) in after[b..].char_indices() {
                    match ch {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = b + k + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                end
            }
            (None, Some(s)) => s + 1,
            (None, None) => after.len(),
        };
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// Expand a `use` tree (`crate::cpu::{gemm::{self, Mat}, simd::Isa}`) into its paths.
fn expand(tree: &str, prefix: &[String], out: &mut Vec<Vec<String>>) {
    let tree = tree.trim();
    if tree.is_empty() {
        return;
    }
    // Split at the first top-level `{`.
    if let Some(open) = tree.find('{') {
        let head: Vec<String> = tree[..open]
            .split("::")
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect();
        let close = tree.rfind('}').unwrap_or(tree.len());
        let inner = &tree[open + 1..close];
        let mut base = prefix.to_vec();
        base.extend(head);
        let mut depth = 0usize;
        let mut start = 0;
        for (k, ch) in inner.char_indices() {
            match ch {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    expand(&inner[start..k], &base, out);
                    start = k + 1;
                }
                _ => {}
            }
        }
        expand(&inner[start..], &base, out);
    } else {
        let simple = tree.split(" as ").next().unwrap();
        let mut path = prefix.to_vec();
        for s in simple.split("::").map(str::trim).filter(|s| !s.is_empty()) {
            if s != "self" || path.is_empty() {
                path.push(s.to_string());
            }
        }
        out.push(path);
    }
}

/// The depth of inline modules (`mod x { … }`) at each byte of `code`.
fn inline_depth(code: &str) -> Vec<u8> {
    let mut depth = vec![0u8; code.len() + 1];
    let mut from = 0;
    while let Some(at) = find_word(&code[from..], "mod").map(|k| from + k) {
        from = at + 3;
        let rest = &code[from..];
        let name_len = rest
            .trim_start()
            .find(|c: char| !(c.is_alphanumeric() || c == '_'));
        let Some(name_len) = name_len else { break };
        let lead = rest.len() - rest.trim_start().len();
        let after = rest[lead + name_len..].trim_start();
        if !after.starts_with('{') {
            continue;
        }
        let open = from + lead + name_len + (rest[lead + name_len..].len() - after.len());
        let mut d = 0usize;
        for (k, ch) in code[open..].char_indices() {
            match ch {
                '{' => d += 1,
                '}' => {
                    d -= 1;
                    if d == 0 {
                        depth[open..open + k + 1].iter_mut().for_each(|x| *x += 1);
                        break;
                    }
                }
                _ => {}
            }
        }
    }
    depth
}

/// Every path a file's code names (`crate`/`super`/`self`-rooted ones only), with the
/// leading `super`s that only leave an inline module dropped (so they name the file's own
/// module).
fn named_paths(code: &str) -> Vec<Vec<String>> {
    let depth = inline_depth(code);
    let mut found: Vec<(usize, Vec<String>)> = Vec::new();
    let mut masked = String::with_capacity(code.len());
    // `use` items, their trees expanded; the rest of the text is searched for inline paths.
    let mut from = 0;
    while let Some(at) = find_word(&code[from..], "use").map(|k| from + k) {
        masked.push_str(&code[from..at]);
        let end = code[at..].find(';').map_or(code.len(), |k| at + k);
        let mut paths = Vec::new();
        expand(&code[at + 3..end], &[], &mut paths);
        found.extend(paths.into_iter().map(|p| (at, p)));
        masked.push_str(&" ".repeat(end - at));
        from = end;
    }
    masked.push_str(&code[from..]);
    let bytes = masked.as_bytes();
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut i = 0;
    while i < bytes.len() {
        if (i == 0 || !word(bytes[i - 1])) && bytes[i].is_ascii_alphabetic() {
            let mut j = i;
            let mut segs = Vec::new();
            let mut start = i;
            while j < bytes.len() {
                if word(bytes[j]) {
                    j += 1;
                } else if bytes[j] == b':' && bytes.get(j + 1) == Some(&b':') {
                    segs.push(masked[start..j].to_string());
                    j += 2;
                    start = j;
                } else {
                    break;
                }
            }
            if j > start {
                segs.push(masked[start..j].to_string());
            }
            if segs.len() > 1 {
                found.push((i, segs));
            }
            i = j.max(i + 1);
        } else {
            i += 1;
        }
    }
    found
        .into_iter()
        .filter(|(_, p)| {
            matches!(
                p.first().map(String::as_str),
                Some("crate" | "super" | "self")
            )
        })
        .map(|(at, mut p)| {
            let mut d = depth[at];
            while d > 0 && p.first().map(String::as_str) == Some("super") {
                p.remove(0);
                d -= 1;
            }
            if d < depth[at] && p.first().map(String::as_str) != Some("super") {
                p.insert(0, "self".to_string());
            }
            p
        })
        .collect()
}

fn find_word(text: &str, word: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(k) = text[from..].find(word) {
        let at = from + k;
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        let ok = |c: Option<char>| c.is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
        if ok(before) && after.is_some_and(char::is_whitespace) {
            return Some(at);
        }
        from = at + word.len();
    }
    None
}

/// The module a path names: `crate`/`super`/`self` resolved against `here`, then the longest
/// prefix that is a module of `known`.
fn resolve(path: &[String], here: &[String], known: &BTreeSet<Vec<String>>) -> Option<Vec<String>> {
    let mut abs: Vec<String> = Vec::new();
    let mut segs = path.iter().peekable();
    match segs.peek().map(|s| s.as_str()) {
        Some("crate") => {
            segs.next();
        }
        Some("self") => {
            segs.next();
            abs = here.to_vec();
        }
        Some("super") => {
            abs = here.to_vec();
            // `super` in `a/b.rs` (module a::b) and in `a/mod.rs` (module a) alike: one
            // segment up.
            while segs.peek().map(|s| s.as_str()) == Some("super") {
                segs.next();
                abs.pop();
            }
        }
        _ => return None,
    }
    abs.extend(segs.cloned());
    (0..=abs.len())
        .rev()
        .map(|k| abs[..k].to_vec())
        .find(|p| known.contains(p))
}

type Graph = BTreeMap<String, BTreeSet<String>>;

fn name(path: &[String]) -> String {
    if path.is_empty() {
        "lib".to_string()
    } else {
        path.join("::")
    }
}

/// The `src/` of each crate: the core's, the distributed crate's, the lab's and the command
/// line's.
fn sources() -> [PathBuf; 4] {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    [
        root.join("crates/racelab-core/src"),
        root.join("crates/racelab-dist/src"),
        root.join("src"),
        root.join("crates/racelab-cli/src"),
    ]
}

/// The core's file graph (where the layered rooms live).
fn graph() -> Graph {
    graph_of(&sources()[0])
}

fn graph_of(src: &Path) -> Graph {
    let mods = modules(src);
    let known: BTreeSet<Vec<String>> = mods.iter().map(|m| m.path.clone()).collect();
    let mut g = Graph::new();
    for m in &mods {
        let text = std::fs::read_to_string(&m.file).unwrap();
        let code = without_tests(&code_only(&text));
        let from = name(&m.path);
        let to = g.entry(from.clone()).or_default();
        for p in named_paths(&code) {
            if let Some(target) = resolve(&p, &m.path, &known) {
                let t = name(&target);
                if t != from {
                    to.insert(t);
                }
            }
        }
    }
    g
}

/// Strongly connected components with more than one file (Tarjan).
fn circles(g: &Graph) -> Vec<Vec<String>> {
    struct St<'a> {
        g: &'a Graph,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        on: BTreeSet<&'a str>,
        stack: Vec<&'a str>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut St<'a>, v: &'a str) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        s.on.insert(v);
        let g = s.g;
        for w in g.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if s.on.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            loop {
                let w = s.stack.pop().unwrap();
                s.on.remove(w);
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                s.out.push(comp);
            }
        }
    }
    let mut s = St {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        on: BTreeSet::new(),
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in g.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out
}

fn describe(g: &Graph, comp: &[String]) -> String {
    let set: BTreeSet<&String> = comp.iter().collect();
    let mut lines = Vec::new();
    for a in comp {
        for b in g.get(a).into_iter().flatten() {
            if set.contains(b) {
                lines.push(format!("    {a} -> {b}"));
            }
        }
    }
    lines.join("\n")
}

#[test]
fn no_file_of_any_crate_is_in_an_import_circle() {
    for src in sources() {
        let g = graph_of(&src);
        let found = circles(&g);
        let text: Vec<String> = found
            .iter()
            .map(|c| format!("  {} files: {}\n{}", c.len(), c.join(", "), describe(&g, c)))
            .collect();
        assert!(
            found.is_empty(),
            "import circles among the files of {} ({}):\n{}",
            src.display(),
            found.len(),
            text.join("\n")
        );
    }
}

/// The rooms each base room may name (its own children are always allowed).
const LAYERS: &[(&str, &[&str])] = &[
    ("error", &[]),
    ("rng", &["error"]),
    ("stats", &["error"]),
    ("tensor", &["error"]),
    ("params", &["error", "rng", "tensor"]),
    // Planes are checked against the memory budget before they are drawn.
    ("hashing", &["error", "rng", "tensor", "params", "memory"]),
    ("provenance", &["error"]),
    ("memory", &["error", "provenance"]),
    ("method", &["error", "rng", "tensor", "params", "hashing"]),
    (
        "validate",
        &["error", "tensor", "params", "hashing", "memory", "method"],
    ),
    // What the soft-RACE backends share, below them: they are siblings above it.
    (
        "shared",
        &[
            "error",
            "tensor",
            "params",
            "hashing",
            "memory",
            "backend",
            "reference",
        ],
    ),
    // The CUDA backend names no other backend but the reference's exact routines (through
    // `shared`).
    (
        "cuda",
        &[
            "error",
            "rng",
            "tensor",
            "params",
            "hashing",
            "provenance",
            "memory",
            "method",
            "validate",
            "backend",
            "shared",
        ],
    ),
    // The backend contract: backends depend on it, never the reverse.
    (
        "backend",
        &[
            "error",
            "rng",
            "stats",
            "tensor",
            "params",
            "hashing",
            "provenance",
            "memory",
            "method",
            "validate",
        ],
    ),
];

/// Rooms the kernels (`cpu`) must not name.
const ABOVE_KERNELS: &[&str] = &[
    "experiments",
    "bench",
    "distributed",
    "attend",
    "op",
    "plot",
    "io",
];

#[test]
fn the_base_and_the_kernels_name_nothing_above_them() {
    let g = graph();
    let room = |m: &str| m.split("::").next().unwrap().to_string();
    let mut wrong = Vec::new();
    for (from, tos) in &g {
        let r = room(from);
        for to in tos {
            let t = room(to);
            if t == r {
                continue;
            }
            if let Some((_, allowed)) = LAYERS.iter().find(|(n, _)| *n == r) {
                if !allowed.contains(&t.as_str()) {
                    wrong.push(format!("{from} -> {to}"));
                }
            }
            if r == "cpu" && ABOVE_KERNELS.contains(&t.as_str()) {
                wrong.push(format!("{from} -> {to}"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "upward arrows ({}):\n  {}",
        wrong.len(),
        wrong.join("\n  ")
    );
}

/// The soft map is made only by its checked constructors (`SoftMap::new`,
/// `SoftMap::for_params`, in the core's `src/shared/map.rs`): no struct literal elsewhere (the
/// kernels included) skips the β and combine-rule checks.
#[test]
fn no_soft_map_literal_outside_its_constructors() {
    let allowed = sources()[0].join("shared").join("map.rs");
    let found: Vec<String> = sources()
        .iter()
        .flat_map(|src| rust_files(src, false))
        .filter(|p| *p != allowed)
        .filter(|p| code_only(&std::fs::read_to_string(p).unwrap()).contains("SoftMap {"))
        .map(|p| p.display().to_string())
        .collect();
    assert!(
        found.is_empty(),
        "SoftMap literals in: {}",
        found.join(", ")
    );
}

/// No Rust file of the workspace (the command line, tests, examples, benches, the Python
/// bindings and the fuzz targets included) is longer than this many lines.
const MAX_LINES: usize = 800;

#[test]
fn no_rust_file_of_the_workspace_is_over_800_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dirs = [
        "src",
        "tests",
        "examples",
        "benches",
        "fuzz",
        "python/src",
        "crates/racelab-core/src",
        "crates/racelab-core/tests",
        "crates/racelab-core/examples",
        "crates/racelab-core/fuzz",
        "crates/racelab-dist/src",
        "crates/racelab-dist/tests",
        "crates/racelab-cli/src",
        "crates/racelab-cli/tests",
    ];
    let files: Vec<PathBuf> = dirs
        .iter()
        .map(|d| root.join(d))
        .filter(|d| d.is_dir())
        .flat_map(|d| rust_files(&d, false))
        .filter(|p| !p.components().any(|c| c.as_os_str() == "target"))
        .collect();
    // The walk reaches every crate's sources and tests.
    for f in [
        "crates/racelab-core/src/cpu/mod.rs",
        "crates/racelab-dist/src/stream.rs",
        "src/experiments/mod.rs",
        "crates/racelab-cli/tests/errors.rs",
        "tests/module_graph.rs",
    ] {
        assert!(files.contains(&root.join(f)), "{f} not walked");
    }
    let long: Vec<String> = files
        .into_iter()
        .filter_map(|p| {
            let n = std::fs::read_to_string(&p).unwrap().lines().count();
            let name = p.strip_prefix(root).unwrap().display().to_string();
            (n > MAX_LINES).then(|| format!("{name} ({n} lines)"))
        })
        .collect();
    assert!(
        long.is_empty(),
        "files over {MAX_LINES} lines: {}",
        long.join(", ")
    );
}

#[test]
fn the_graph_reader_sees_use_trees_inline_paths_and_skips_tests_and_strings() {
    let code = code_only(
        "use crate::a::{b::{self, X}, c::Y as Z};\n\
         // use crate::never;\n\
         fn f() { let s = \"crate::in_string::x\"; crate::d::e(); super::g::h(); let c = '{'; }\n\
         mod sealed { impl T for super::Own {} }\n\
         #[cfg(test)]\nmod tests { use crate::test_only::x; }\n",
    );
    let mut paths = named_paths(&without_tests(&code));
    paths.sort();
    let want: Vec<Vec<String>> = [
        "crate::a::b",
        "crate::a::b::X",
        "crate::a::c::Y",
        "crate::d::e",
        "self::Own",
        "super::g::h",
    ]
    .iter()
    .map(|s| s.split("::").map(String::from).collect())
    .collect();
    assert_eq!(paths, want);
    // A circle of two is found; a chain is not.
    let mut g = Graph::new();
    g.entry("a".into()).or_default().insert("b".into());
    g.entry("b".into()).or_default().insert("c".into());
    assert!(circles(&g).is_empty());
    g.entry("c".into()).or_default().insert("a".into());
    assert_eq!(
        circles(&g),
        vec![vec!["a".to_string(), "b".into(), "c".into()]]
    );
}

/// The rooms whose code handles measured values: the experiments and their verdicts, the
/// analysis, the benchmarks and the bound.
const MEASURING: [&str; 4] = ["experiments", "analysis", "bench", "bound"];

/// Where a line of code could pass over a NaN: `fold` with `f64::max`/`f64::min` (or a
/// `.max`/`.min` closure, or starting at ±∞), `min_by`/`max_by`, `partial_cmp`, a float sort.
/// The NaN-propagating forms live in `src/stats.rs` (`max_all`, `nan_max`, `argmin`,
/// `sort_by_float`, …).
fn swallows_nan(line: &str) -> bool {
    let folds = line.contains("fold(")
        && (line.contains(".max(") || line.contains(".min(") || line.contains("INFINITY"))
        && !(line.contains("nan_max") || line.contains("nan_min"));
    folds
        || [
            "f64::max",
            "f64::min",
            ".min_by(",
            ".max_by(",
            ".sort_by(",
            ".sort_unstable_by(",
            "partial_cmp",
        ]
        .iter()
        .any(|p| line.contains(p))
}

#[test]
fn no_measured_value_is_folded_or_sorted_past_a_nan_outside_stats() {
    let mut hits = Vec::new();
    for (src, room) in sources()
        .iter()
        .flat_map(|src| MEASURING.map(|room| (src, room)))
        .filter(|(src, room)| src.join(room).is_dir())
    {
        for p in rust_files(&src.join(room), false) {
            let code = code_only(&std::fs::read_to_string(&p).unwrap());
            for (i, line) in code.lines().enumerate() {
                if swallows_nan(line) {
                    let name = p.strip_prefix(src).unwrap().display();
                    hits.push(format!("{name}:{}: {}", i + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        hits.is_empty(),
        "use the NaN-propagating helpers of the core's src/stats.rs:\n{}",
        hits.join("\n")
    );
    // The lint sees what it is for.
    assert!(swallows_nan(
        "let m = xs.iter().cloned().fold(0.0, f64::max);"
    ));
    assert!(swallows_nan(".fold(0.0f64, |m, x| m.max(x.abs()))"));
    assert!(swallows_nan("v.sort_by(|a, b| a.partial_cmp(b).unwrap());"));
    assert!(!swallows_nan(
        "let m = crate::stats::max_all(xs.iter().cloned());"
    ));
}
