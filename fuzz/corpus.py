#!/usr/bin/env python3
"""The config fuzzer's corpus as one file (`fuzz/corpus/config.pack`, in the format of
`crates/racelab-core/fuzz/corpus.py`, which packs and unpacks it here). `cargo test` replays
the pack (tests/fuzz_corpus.rs).

    python3 fuzz/corpus.py unpack   # config.pack -> fuzz/corpus/config/ (for cargo fuzz run)
    python3 fuzz/corpus.py pack     # fuzz/corpus/config/ (after cargo fuzz cmin) -> config.pack
"""
import pathlib
import runpy

HERE = pathlib.Path(__file__).resolve().parent
core = runpy.run_path(str(HERE.parent / "crates/racelab-core/fuzz/corpus.py"))

if __name__ == "__main__":
    core["main"](HERE / "corpus", ["config"])
