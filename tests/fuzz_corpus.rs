//! The config fuzzer's corpus (`fuzz/corpus/config.pack`: every input the fuzzer kept, as a
//! 4-byte little-endian length and the bytes; `fuzz/corpus.py` packs and unpacks it), replayed
//! on stable as a normal test: every input reaches every experiment's config parser, as under
//! `cargo +nightly fuzz run config`, and gets a config or an error naming it, without a panic.
//! (The `.npy` and API fuzzers' corpora replay in `crates/racelab-core/tests/fuzz_corpus.rs`.)
use std::path::Path;

#[path = "../crates/racelab-core/fuzz/pack.rs"]
mod pack;

fn corpus(name: &str) -> Vec<Vec<u8>> {
    pack::read(&Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("fuzz/corpus/{name}.pack")))
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
