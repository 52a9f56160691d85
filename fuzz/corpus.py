#!/usr/bin/env python3
"""The fuzz corpora as one file each (`fuzz/corpus/<target>.pack`: for every input, its
length as 4 little-endian bytes, then its bytes), so the repository holds one file per target, not
thousands. `cargo test` replays the packs (tests/fuzz_corpus.rs).

    python3 fuzz/corpus.py unpack   # packs -> fuzz/corpus/<target>/ (for cargo fuzz run)
    python3 fuzz/corpus.py pack     # fuzz/corpus/<target>/ (after cargo fuzz cmin) -> packs
"""
import hashlib
import pathlib
import struct
import sys

HERE = pathlib.Path(__file__).resolve().parent / "corpus"
TARGETS = ["config"]


def pack():
    for t in TARGETS:
        files = sorted((HERE / t).iterdir())
        with open(HERE / f"{t}.pack", "wb") as out:
            for f in files:
                data = f.read_bytes()
                out.write(struct.pack("<I", len(data)) + data)
        print(f"{t}: {len(files)} inputs packed")


def unpack():
    for t in TARGETS:
        blob = (HERE / f"{t}.pack").read_bytes()
        d = HERE / t
        d.mkdir(exist_ok=True)
        i = n = 0
        while i < len(blob):
            (size,) = struct.unpack_from("<I", blob, i)
            data = blob[i + 4 : i + 4 + size]
            (d / hashlib.sha1(data).hexdigest()).write_bytes(data)
            i += 4 + size
            n += 1
        print(f"{t}: {n} inputs in {d}")


if __name__ == "__main__":
    {"pack": pack, "unpack": unpack}[sys.argv[1] if len(sys.argv) > 1 else ""]()
