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

const CLAIMS: [&str; 24] = [
    "phi-factorisation",
    "rank-sharp",
    "rank-lr-loose",
    "lemma10-counterexample",
    "lemma10-repair",
    "bias-slope",
    "bias-bounded",
    "bias-quadrature",
    "combine-different",
    "fig3-powers",
    "variance-l",
    "variance-n",
    "theorem2-fit",
    "theorem2-vf",
    "theorem2-terms",
    "tradeoff-matched",
    "tradeoff-front",
    "linear-time",
    // The real-data section (bundled MiniLM sample).
    "fig3-real-powers",
    "real-race-error",
    "real-tanh-saturation",
    "theorem2-fit-real",
    "tradeoff-matched-real",
    "combine-different-real",
];

#[test]
fn reproduce_quick_writes_every_claim_row() {
    let out = tmp("reproduce");
    let o = Command::new(env!("CARGO_BIN_EXE_racelab"))
        .args(["reproduce", "--quick", "--json", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "reproduce failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let report = std::fs::read_to_string(out.join("REPORT.md")).expect("REPORT.md written");
    for id in CLAIMS.iter() {
        let line = report
            .lines()
            .find(|l| l.starts_with(&format!("| `{id}` |")))
            .unwrap_or_else(|| panic!("REPORT.md has no row for claim `{id}`"));
        assert!(
            line.contains("**holds**")
                || line.contains("**fails**")
                || line.contains("**holds with a caveat**"),
            "claim `{id}` has no verdict: {line}"
        );
        let cells: Vec<&str> = line.split(" | ").collect();
        assert!(
            cells.len() >= 5 && cells[3].chars().any(|c| c.is_ascii_digit()),
            "claim `{id}` has no measured value: {line}"
        );
    }
    for l in report.lines().filter(|l| l.starts_with("![")) {
        let path = l.split("](").nth(1).unwrap().trim_end_matches(')');
        assert!(out.join(path).exists(), "embedded figure {path} missing");
        let svg = out.join(path.replace(".png", ".svg"));
        assert!(svg.exists(), "SVG twin {} missing", svg.display());
    }
    assert!(report.contains("git revision"), "provenance missing");
    let js: serde_json::Value =
        serde_json::from_slice(&o.stdout).expect("--json prints one JSON object");
    assert!(js["claims"]
        .as_array()
        .map(|a| a.len() >= 18)
        .unwrap_or(false));
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
