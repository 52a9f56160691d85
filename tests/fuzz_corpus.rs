//! The fuzz corpora (`fuzz/corpus/npy.pack`, `fuzz/corpus/config.pack`: every input the
//! fuzzer kept, as a 4-byte little-endian length and the bytes; `fuzz/corpus.py` packs and
//! unpacks them), replayed on stable as a normal test: every input reaches the same readers as
//! `cargo +nightly fuzz run` (the `.npy` parser, every experiment's config parser) and gets an
//! answer, an error or a value, without a panic. A regression in a reader fails here without
//! nightly.
use std::path::Path;

fn corpus(name: &str) -> Vec<Vec<u8>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("fuzz/corpus/{name}.pack"));
    let blob = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut inputs = Vec::new();
    let mut i = 0;
    while i < blob.len() {
        let len = u32::from_le_bytes(blob[i..i + 4].try_into().unwrap()) as usize;
        inputs.push(blob[i + 4..i + 4 + len].to_vec());
        i += 4 + len;
    }
    inputs
}

#[test]
fn the_npy_corpus_replays_without_a_panic() {
    let files = corpus("npy");
    assert!(files.len() >= 10, "only {} npy inputs", files.len());
    let mut parsed = 0;
    for (i, bytes) in files.iter().enumerate() {
        let a = racelab::io::parse_npy(bytes, "corpus.npy");
        let b = racelab::io::parse_npy_native(bytes, "corpus.npy");
        assert_eq!(a.is_ok(), b.is_ok(), "input {i}");
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
    for bytes in &files {
        if let Ok(text) = std::str::from_utf8(bytes) {
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

#[path = "../fuzz/harness/attend.rs"]
mod attend_harness;

/// The API fuzzer's corpus (`fuzz/corpus/attend.pack`) through the same harness: every input
/// an error or a finite result, and the corpus reaches both, past every entry point.
#[test]
fn the_attend_corpus_replays_without_a_panic() {
    use attend_harness::Outcome;
    let files = corpus("attend");
    assert!(files.len() >= 10, "only {} attend inputs", files.len());
    let mut seen = [0usize; 3];
    for bytes in &files {
        let i = match attend_harness::run(bytes) {
            Outcome::Ran => 0,
            Outcome::Refused => 1,
            Outcome::Skipped => 2,
        };
        seen[i] += 1;
    }
    println!(
        "{} inputs: {} ran, {} refused, {} past the caps",
        files.len(),
        seen[0],
        seen[1],
        seen[2]
    );
    assert!(
        seen[0] > 0 && seen[1] > 0,
        "ran {}, refused {}",
        seen[0],
        seen[1]
    );
}
