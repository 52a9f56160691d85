#!/usr/bin/env python3
"""The fuzz corpora as one file each (`crates/racelab-core/fuzz/corpus/<target>.pack`: for every input, its
length as 4 little-endian bytes, then its bytes), so the repository holds one file per target, not
thousands. `cargo test` replays the packs (crates/racelab-core/tests/fuzz_corpus.rs).

    python3 crates/racelab-core/fuzz/corpus.py unpack   # packs -> corpus/<target>/ (for cargo fuzz run)
    python3 crates/racelab-core/fuzz/corpus.py pack     # corpus/<target>/ (after cargo fuzz cmin) -> packs
"""
import hashlib
import pathlib
import struct
import sys

HERE = pathlib.Path(__file__).resolve().parent / "corpus"
TARGETS = ["npy", "attend"]


def pack(here=HERE, targets=TARGETS):
    for t in targets:
        files = sorted((here / t).iterdir())
        with open(here / f"{t}.pack", "wb") as out:
            for f in files:
                data = f.read_bytes()
                out.write(struct.pack("<I", len(data)) + data)
        print(f"{t}: {len(files)} inputs packed")


def unpack(here=HERE, targets=TARGETS):
    for t in targets:
        blob = (here / f"{t}.pack").read_bytes()
        d = here / t
        d.mkdir(exist_ok=True)
        i = n = 0
        while i < len(blob):
            (size,) = struct.unpack_from("<I", blob, i)
            data = blob[i + 4 : i + 4 + size]
            (d / hashlib.sha1(data).hexdigest()).write_bytes(data)
            i += 4 + size
            n += 1
        print(f"{t}: {n} inputs in {d}")


def main(here=HERE, targets=TARGETS):
    {"pack": pack, "unpack": unpack}[sys.argv[1] if len(sys.argv) > 1 else ""](here, targets)


if __name__ == "__main__":
    main()
