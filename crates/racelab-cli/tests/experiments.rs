//! The experiment pipeline end to end: `racelab reproduce --quick` writes REPORT.md with
//! every claim row and a verdict, every figure it embeds exists, and the contract JSON of
//! `rank` and `lemma10` has its documented shape.
use std::path::PathBuf;
use std::process::Command;

fn tmp(tag: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("racelab-exp-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    p
}

/// `(id, verdict)` of every claim row of a REPORT.md.
fn claim_rows(report: &str) -> Vec<(String, String)> {
    report
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let id = l[3..].split('`').next().unwrap_or("").to_string();
            let cells: Vec<&str> = l.split(" | ").collect();
            let last = cells.last().copied().unwrap_or("");
            // "**unstable (2/3 hold)**" names the verdict "unstable".
            let verdict = last
                .strip_prefix("**")
                .and_then(|v| v.split("**").next())
                .map(|v| v.split(" (").next().unwrap_or(v))
                .unwrap_or("")
                .to_string();
            (id, verdict)
        })
        .collect()
}

#[test]
fn reproduce_quick_writes_every_claim_row() {
    let out = tmp("reproduce");
    let o = Command::new(env!("CARGO_BIN_EXE_racelab"))
        .args(["reproduce", "--quick", "--seeds", "2", "--json", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "reproduce failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let report = std::fs::read_to_string(out.join("REPORT.md")).expect("REPORT.md written");
    let rows = claim_rows(&report);
    // Every row carries a verdict from the documented set and a measured value.
    for (id, verdict) in &rows {
        assert!(
            racelab::experiments::verdict::VERDICTS.contains(&verdict.as_str()),
            "claim `{id}` has verdict `{verdict}`, not one of {:?}",
            racelab::experiments::verdict::VERDICTS
        );
        let line = report
            .lines()
            .find(|l| l.starts_with(&format!("| `{id}` |")))
            .unwrap();
        let cells: Vec<&str> = line.split(" | ").collect();
        assert!(
            cells.len() >= 6 && cells[4].chars().any(|c| c.is_ascii_digit()),
            "claim `{id}` has no measured value: {line}"
        );
    }
    // The same claim ids as the committed report, in the same order.
    let committed = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../figures/REPORT.md"),
    )
    .expect("figures/REPORT.md is committed");
    let ids = |r: &[(String, String)]| r.iter().map(|x| x.0.clone()).collect::<Vec<_>>();
    assert_eq!(
        ids(&rows),
        ids(&claim_rows(&committed)),
        "a quick run's claim ids differ from the committed report's"
    );
    // Every stated claim is measured (a `-real` row shares its base's statement).
    let specs = racelab::experiments::verdict::specs().unwrap();
    for id in specs.keys() {
        assert!(
            rows.iter().any(|r| &r.0 == id),
            "claim `{id}` is stated in experiments/claims.toml but never measured"
        );
    }
    for l in report.lines().filter(|l| l.starts_with("![")) {
        let path = l.split("](").nth(1).unwrap().trim_end_matches(')');
        assert!(out.join(path).exists(), "embedded figure {path} missing");
        let svg = out.join(path.replace(".png", ".svg"));
        assert!(svg.exists(), "SVG twin {} missing", svg.display());
    }
    assert!(report.contains("git revision"), "provenance missing");
    // The machine-readable twin: one object per claim, the revision and the claims' hash.
    let twin: serde_json::Value = serde_json::from_slice(
        &std::fs::read(out.join("claims.json")).expect("claims.json written"),
    )
    .unwrap();
    assert_eq!(
        twin["claims_sha256"].as_str().map(str::len),
        Some(64),
        "claims_sha256"
    );
    assert!(twin["revision"].is_string());
    let objs = twin["claims"].as_array().expect("claims");
    assert_eq!(objs.len(), rows.len());
    for c in objs {
        for key in [
            "id",
            "kind",
            "verdict",
            "seeds_total",
            "seeds_agree",
            "value",
            "threshold",
            "se",
            "borderline",
            "correction",
        ] {
            assert!(c.get(key).is_some(), "claims.json object lacks {key}: {c}");
        }
        let total = c["seeds_total"].as_u64().unwrap();
        match c["kind"].as_str() {
            // Empirical claims measured in this run are replicated at both master seeds.
            Some("empirical") if c["provenance"].is_null() => assert_eq!(total, 2, "{c}"),
            // Read from committed training runs: one test pools the training seeds (at least
            // 5), named with the rows' own revision; no per-seed verdicts to agree.
            Some("empirical") => {
                assert!(total >= 5, "{c}");
                assert_eq!(
                    c["training_seeds"].as_array().map(Vec::len),
                    Some(total as usize)
                );
                assert!(
                    c["revision"].is_string() && c["seeds_agree"].is_null(),
                    "{c}"
                );
            }
            _ => assert_eq!(total, 1, "{c}"),
        }
    }
    assert!(out.join("seeds/1").is_dir(), "the second seed's outputs");
    let js: serde_json::Value =
        serde_json::from_slice(&o.stdout).expect("--json prints one JSON object");
    assert_eq!(
        js["claims"].as_array().map(|a| a.len()),
        Some(rows.len()),
        "the JSON and the report list different claims"
    );
    std::fs::remove_dir_all(&out).ok();
}

#[test]
fn theorem_json_has_limit_slopes() {
    let out = tmp("theorem");
    std::fs::create_dir_all(&out).unwrap();
    let cfg = out.join("small.toml");
    let table = "d = 8\ndv = 4\nps = [1, 2]\nls = [1, 4]\nbetas = [1.0, 8.0]\nns = [32, 64]\nspread = 0.5\ndelta = 0.1\nseeds = 4\nsampling_beta = 8.0\nn_theta = 64\nlimit_n = 32\nlimit_betas = [0.5, 1.0, 2.0, 4.0, 8.0]\nlimit_seeds = 2\nlimit_clusters = 2\nlimit_noise = 0.6\ncalibrate_from_l = 4\nfit_split_beta = 4.0\nfit_split_p = 2\nsampling_from_l = 1\nform_split_beta = 2.0\nform_split_p = 2\ntied_fit_from_beta = 4.0\nexplicit_seeds = 1\n";
    std::fs::write(&cfg, format!("[quick]\n{table}\n[full]\n{table}")).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_racelab"))
        .args(["theorem", "--quick", "--json", "--config"])
        .arg(&cfg)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let js: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rows = js["limit_slopes"].as_array().expect("limit_slopes");
    assert!(!rows.is_empty());
    for r in rows {
        for key in ["inputs", "p", "beta_min", "beta_max", "slope"] {
            assert!(!r[key].is_null(), "limit_slopes row lacks {key}: {r}");
        }
        assert!(r["beta_min"].as_f64() < r["beta_max"].as_f64(), "{r}");
    }
    for fam in ["clustered", "tied"] {
        assert!(rows.iter().any(|r| r["inputs"] == fam), "no {fam} slope");
    }
    std::fs::remove_dir_all(&out).ok();
}

#[test]
fn rank_and_lemma10_json_contract() {
    let out = tmp("json");
    let o = Command::new(env!("CARGO_BIN_EXE_racelab"))
        .args(["rank", "--quick", "--json", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let js: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rows = js["rows"].as_array().expect("rows");
    assert!(!rows.is_empty());
    for r in rows {
        for key in ["kind", "p", "l", "n", "rank", "lr", "sharp_bound"] {
            assert!(!r[key].is_null(), "rank row lacks {key}: {r}");
        }
        if r["kind"] == "soft" {
            assert_eq!(
                r["rank"], r["sharp_bound"],
                "soft rank must equal L(R-1)+1: {r}"
            );
        }
    }
    let o = Command::new(env!("CARGO_BIN_EXE_racelab"))
        .args(["lemma10", "--quick", "--json", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let js: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let max_shat = js["max_shat"].as_f64().unwrap();
    assert!(max_shat < 0.373, "max Ŝ = {max_shat}");
    for r in js["rows"].as_array().unwrap() {
        assert!(r["e_norm_over_n"].as_f64().unwrap() > 0.627, "{r}");
    }
    std::fs::remove_dir_all(&out).ok();
}

#[test]
fn bad_config_is_a_clear_error() {
    let out = tmp("cfg");
    std::fs::create_dir_all(&out).unwrap();
    let cfg = out.join("bad.toml");
    std::fs::write(&cfg, "[quick]\nps = [1, 2]\n").unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_racelab"))
        .args(["bias", "--quick", "--config"])
        .arg(&cfg)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("bad config") && e.contains("bad.toml"), "{e}");
    std::fs::remove_dir_all(&out).ok();
}

#[test]
fn real_data_directory_errors_are_clear() {
    use racelab::experiments::real::RealData;
    let dir = tmp("realbad");
    std::fs::create_dir_all(&dir).unwrap();
    let e = RealData::open(&dir).unwrap_err().to_string();
    assert!(e.contains("meta.json"), "{e}");
    std::fs::write(dir.join("meta.json"), "{ not json").unwrap();
    assert!(RealData::open(&dir)
        .unwrap_err()
        .to_string()
        .contains("not JSON"));
    std::fs::write(
        dir.join("meta.json"),
        r#"{"layers": [0], "heads": 2, "head_dim": 3, "tokens": 4, "softmax_scale": 0.5}"#,
    )
    .unwrap();
    let rd = RealData::open(&dir).unwrap();
    // A q_0.npy whose shape disagrees with meta.json.
    racelab::io::write_npy(
        &dir.join("q_0.npy"),
        &[2, 5, 3],
        &[0.5; 30],
        racelab::io::Dtype::F32,
    )
    .unwrap();
    let e = rd.head(0, 0).unwrap_err().to_string();
    assert!(e.contains("q_0.npy") && e.contains("disagrees"), "{e}");
    assert!(rd.head(0, 7).unwrap_err().to_string().contains("`head`"));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bundled_real_sample_is_present_and_valid() {
    use racelab::experiments::real::{bundled, RealData};
    let dir = bundled().expect("experiments/data/minilm is committed");
    let rd = RealData::open(&dir).unwrap();
    assert!(rd.tokens <= 512 && rd.layers.len() >= 2);
    for &l in &rd.layers {
        for h in [0, rd.heads - 1] {
            let (q, k, v) = rd.head(l, h).unwrap();
            assert_eq!(
                (q.rows, q.cols, k.rows, v.cols),
                (rd.tokens, rd.head_dim, rd.tokens, rd.head_dim)
            );
        }
    }
    let size: u64 = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    assert!(
        size < 5_000_000,
        "bundled sample is {size} bytes (limit 5 MB)"
    );
}

/// Every file below `dir` with its bytes.
fn snapshot(dir: &std::path::Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push((p.clone(), std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

/// `reproduce` interrupted at a step (SIGINT, then SIGTERM, at steps chosen from a printed
/// seed) exits 130 or 143 saying what it kept; the output folder, which held an earlier
/// run's report and figures, holds exactly those, and no staging folder is left beside it.
/// A single experiment stops the same way.
#[test]
fn an_interrupted_run_leaves_the_previous_run_whole() {
    let steps = [
        "rank", "lemma10", "limit", "bias", "combine", "fig3", "variance",
    ];
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    println!("interrupt seed {seed}");
    let root = tmp("interrupt");
    let out = root.join("figs");
    std::fs::create_dir_all(out.join("mqar")).unwrap();
    for (f, text) in [
        ("REPORT.md", "an earlier run's report"),
        ("claims.json", "{}"),
        ("lemma10_counterexample.csv", "earlier"),
        ("bias.csv", "earlier"),
        ("mqar/mqar.csv", "earlier"),
    ] {
        std::fs::write(out.join(f), text).unwrap();
    }
    let before = snapshot(&out);
    for (k, (sig, code)) in [("INT", 130), ("TERM", 143)].into_iter().enumerate() {
        let step = steps[(seed as usize + 3 * k) % steps.len()];
        let o = Command::new(env!("CARGO_BIN_EXE_racelab"))
            .args(["reproduce", "--quick", "--out"])
            .arg(&out)
            .env("RACELAB_TEST_INTERRUPT", format!("{step}:{sig}"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(code), "SIG{sig} at {step}: {err}");
        assert!(
            err.contains("interrupted") && err.contains("unchanged"),
            "{err}"
        );
        assert_eq!(
            snapshot(&out),
            before,
            "SIG{sig} at {step}: the folder changed"
        );
        let left: Vec<_> = std::fs::read_dir(&root).unwrap().flatten().collect();
        assert_eq!(
            left.len(),
            1,
            "SIG{sig} at {step}: {left:?} beside the output"
        );
    }
    let o = Command::new(env!("CARGO_BIN_EXE_racelab"))
        .args(["bias", "--quick", "--out"])
        .arg(&out)
        .env("RACELAB_TEST_INTERRUPT", "bias:INT")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(130));
    assert_eq!(snapshot(&out), before);
    std::fs::remove_dir_all(&root).ok();
}
