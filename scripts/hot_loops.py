#!/usr/bin/env python3
"""The hottest inner loops of a racelab run, from its compiled code: per loop the share of
the samples, instructions per iteration, loads, stores and vector FMAs.

    scripts/hot_loops.py [--top N] [--out DIR] -- BINARY ARGS...

Records the run with `perf record` (user-mode cycles, or the user-mode clock where the
machine has no PMU), disassembles the functions hit
(objdump, Intel syntax), finds each function's loops (a backward branch to an address in the
same function closes one; the innermost loop holding a sample gets it) and prints the top N
loops by samples. A "load" is an instruction other than a store whose operand reads memory
(`[...]`, including broadcasts and the memory operand of an FMA); a store writes `[...]`.
Where every kernel is an instance of one generic frame, the loop's function is named by its
mangled symbol and address, so two binaries are compared loop by loop by these counts and
by the instructions themselves (`--out` writes each loop's listing).
"""
import collections
import os
import re
import subprocess
import sys
import tempfile


# User-mode cycles where the machine has a PMU; a VM without one samples the user-mode clock.
def _has_pmu():
    r = subprocess.run(["perf", "stat", "-e", "cycles:u", "-x,", "true"], capture_output=True,
                       text=True)
    return r.stderr.split(",")[0].strip().isdigit()


EVENT = "cycles:u" if _has_pmu() else "cpu-clock:u"


def perf_ips(binary, args, data):
    """Samples per (symbol, offset): the binary is position-independent, so an instruction is
    named by its function's (mangled, unique) symbol and its offset, not by the run's address."""
    subprocess.run(["perf", "record", "-q", "-e", EVENT, "-o", data, "--", binary, *args],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out = subprocess.run(["perf", "script", "-i", data, "-F", "ip,sym,symoff,dso", "--no-demangle"],
                         check=True, capture_output=True, text=True).stdout
    ips = collections.Counter()
    base = os.path.basename(binary)
    for line in out.splitlines():
        m = re.match(r"^\s*[0-9a-f]+\s+(\S+)\+0x([0-9a-f]+)\s+\((.*)\)", line)
        if m and os.path.basename(m.group(3)) == base:
            ips[(m.group(1), int(m.group(2), 16))] += 1
    return ips


def symbols(binary):
    """(start, end, mangled name) of every function symbol."""
    out = subprocess.run(["nm", "-S", "--defined-only", binary], capture_output=True, text=True,
                         check=True).stdout
    syms = []
    for line in out.splitlines():
        p = line.split()
        if len(p) == 4 and p[2] in "tTwW":
            a, s = int(p[0], 16), int(p[1], 16)
            if s:
                syms.append((a, a + s, p[3]))
    syms.sort()
    return syms


INSN = re.compile(r"^\s*([0-9a-f]+):\s+(?:[0-9a-f]{2} )+\s*(\S.*)$")


def disassemble(binary, start, end):
    out = subprocess.run(["objdump", "-d", "-M", "intel", "--no-show-raw-insn",
                          f"--start-address={start:#x}", f"--stop-address={end:#x}", binary],
                         capture_output=True, text=True, check=True).stdout
    insns = []
    for line in out.splitlines():
        m = re.match(r"^\s*([0-9a-f]+):\s+(\S.*)$", line)
        if m:
            insns.append((int(m.group(1), 16), m.group(2).split("#")[0].strip()))
    return insns


def classify(text):
    """(loads, stores, fma) of one Intel-syntax instruction: a memory source operand is a load,
    a memory destination a store (both for a read-modify-write)."""
    op, _, rest = text.partition(" ")
    ops = [o for o in rest.split(",") if o.strip()]
    if op.startswith(("lea", "nop", "prefetch", "j", "call")) or not ops:
        return False, False, False
    first_mem = "[" in ops[0]
    plain_move = op.startswith(("mov", "vmov"))
    store = first_mem and not op.startswith(("cmp", "test", "vcmp", "vptest"))
    load = any("[" in o for o in ops[1:]) or (first_mem and not plain_move)
    fma = op.startswith(("vfmadd", "vfnmadd", "vfmsub", "vfnmsub"))
    return load, store, fma


def demangle(names):
    """Readable names (llvm-cxxfilt; a build with `-C symbol-mangling-version=v0` names each
    instance of a generic frame by its kernel), or the mangled ones where it is missing."""
    names = sorted(set(names))
    try:
        out = subprocess.run(["llvm-cxxfilt"], input="\n".join(names), capture_output=True,
                             text=True, check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return {}
    return dict(zip(names, out))


def loops(insns):
    """(head, tail) address pairs of the backward branches."""
    addrs = {a for a, _ in insns}
    out = []
    for a, t in insns:
        m = re.match(r"^j\w+\s+([0-9a-f]+)", t)
        if m:
            target = int(m.group(1), 16)
            if target <= a and target in addrs:
                out.append((target, a))
    return out


def main():
    argv = sys.argv[1:]
    top, outdir = 8, None
    while argv and argv[0] != "--":
        if argv[0] == "--top":
            top = int(argv[1]); argv = argv[2:]
        elif argv[0] == "--out":
            outdir = argv[1]; argv = argv[2:]
        else:
            sys.exit(__doc__)
    binary, args = argv[1], argv[2:]
    with tempfile.TemporaryDirectory() as tmp:
        ips = perf_ips(binary, args, os.path.join(tmp, "perf.data"))
    total = sum(ips.values())
    syms = {name: (a, e, name) for a, e, name in symbols(binary)}
    by_sym = collections.defaultdict(collections.Counter)
    for (name, off), n in ips.items():
        if name in syms:
            by_sym[syms[name]][syms[name][0] + off] += n
    rows = []
    for (s, e, name), hits in sorted(by_sym.items(), key=lambda kv: -sum(kv[1].values()))[:40]:
        insns = disassemble(binary, s, e)
        ls = loops(insns)
        for ip, n in hits.items():
            inner = [l for l in ls if l[0] <= ip <= l[1]]
            key = min(inner, key=lambda l: l[1] - l[0]) if inner else None
            rows.append((name, s, key, n, insns))
    agg = collections.defaultdict(int)
    listing = {}
    for name, s, key, n, insns in rows:
        agg[(name, s, key)] += n
        listing[(name, s, key)] = insns
    names = demangle([k[0] for k in agg])
    print(f"{total} user samples of {os.path.basename(binary)} {' '.join(args)}")
    print("share | insns | loads | stores | fma | function @ loop")
    for k, n in sorted(agg.items(), key=lambda kv: -kv[1])[:top]:
        name, s, key = k
        name = names.get(name, name)
        if key is None:
            print(f"{100 * n / total:5.1f}% | (not in a loop) | {name[:70]}")
            continue
        body = [(a, t) for a, t in listing[k] if key[0] <= a <= key[1]]
        c = [classify(t) for _, t in body]
        loads, stores, fmas = (sum(x[i] for x in c) for i in range(3))
        print(f"{100 * n / total:5.1f}% | {len(body):5} | {loads:5} | {stores:6} | {fmas:3} | "
              f"{name[:90]} @ {key[0]:#x}-{key[1]:#x}")
        if outdir:
            os.makedirs(outdir, exist_ok=True)
            with open(os.path.join(outdir, f"{key[0]:x}.s"), "w") as f:
                f.write(f"# {name}\n" + "\n".join(f"{a:x}: {t}" for a, t in body) + "\n")


if __name__ == "__main__":
    main()
