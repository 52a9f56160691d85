//! The fuzz corpora (`fuzz/corpus/npy`, `fuzz/corpus/config`), replayed on stable as a normal
//! test: every input the fuzzer kept reaches the same readers as `cargo +nightly fuzz run`
//! (the `.npy` parser, every experiment's config parser) and gets an answer, an error or a
//! value, without a panic. A regression in a reader fails here without nightly.
use std::path::{Path, PathBuf};

fn corpus(name: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(name);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
}

#[test]
fn the_npy_corpus_replays_without_a_panic() {
    let files = corpus("npy");
    assert!(files.len() >= 10, "only {} npy inputs", files.len());
    let mut parsed = 0;
    for f in &files {
        let bytes = std::fs::read(f).unwrap();
        let a = racelab::io::parse_npy(&bytes, "corpus.npy");
        let b = racelab::io::parse_npy_native(&bytes, "corpus.npy");
        assert_eq!(a.is_ok(), b.is_ok(), "{}", f.display());
        parsed += a.is_ok() as usize;
    }
    // The corpus holds both: files the reader accepts and files it refuses.
    assert!(
        parsed > 0 && parsed < files.len(),
        "{parsed} of {} parsed",
        files.len()
    );
}

#[test]
fn the_config_corpus_replays_without_a_panic() {
    let files = corpus("config");
    assert!(files.len() >= 10, "only {} config inputs", files.len());
    for f in &files {
        let bytes = std::fs::read(f).unwrap();
        if let Ok(text) = std::str::from_utf8(&bytes) {
            for (name, r) in racelab::experiments::registry::parse_configs(text) {
                if let Err(e) = r {
                    // An error names the config it was reading.
                    assert!(e.to_string().contains(name), "{name}: {e}");
                }
            }
        }
    }
}

#[test]
fn the_built_in_configs_parse() {
    for name in [
        "bias", "rank", "limit", "causal", "fig3", "lemma10", "variance", "tradeoff", "combine",
        "authors", "theorem",
    ] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("experiments/{name}.toml"));
        let text = std::fs::read_to_string(&path).unwrap();
        let ok: Vec<&str> = racelab::experiments::registry::parse_configs(&text)
            .into_iter()
            .filter(|(_, r)| r.is_ok())
            .map(|(n, _)| n)
            .collect();
        assert!(
            ok.contains(&name),
            "{name}.toml does not parse as its own config: {ok:?}"
        );
    }
}
