//! The `.npy` and API fuzzers' corpora (`fuzz/corpus/npy.pack`, `fuzz/corpus/attend.pack`
//! in this crate: every input the fuzzer kept, as a 4-byte little-endian length and the bytes;
//! `fuzz/corpus.py` packs and unpacks them), replayed on stable as a normal test: every input
//! reaches the same entry points as `cargo +nightly fuzz run` (the `.npy` parser; `attend_array`,
//! the backend contract and `Planes` through `fuzz/harness/attend.rs`) and gets an answer, an
//! error or a value, without a panic. A regression fails here without nightly.
use std::path::Path;

#[path = "../fuzz/pack.rs"]
mod pack;

fn corpus(name: &str) -> Vec<Vec<u8>> {
    pack::read(&Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("fuzz/corpus/{name}.pack")))
}

#[test]
fn the_npy_corpus_replays_without_a_panic() {
    let files = corpus("npy");
    assert!(files.len() >= 10, "only {} npy inputs", files.len());
    let mut parsed = 0;
    for (i, bytes) in files.iter().enumerate() {
        let a = racelab_core::io::parse_npy(bytes, "corpus.npy");
        let b = racelab_core::io::parse_npy_native(bytes, "corpus.npy");
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
