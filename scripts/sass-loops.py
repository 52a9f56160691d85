#!/usr/bin/env python3
"""Instruction counts of race.cu's loops, from the real CUDA compiler, on a machine with no GPU.

An Nsight Compute profile on the H200 (docs/performance.md) found the tiled backward passes issue-bound at about
5,100 warp instructions per token; this script is how the culprit was found without the card:
a product loop issuing about 140 instructions per step for 20 FMAs. It compiles race.cu for
sm_90 with NVRTC (ctypes, no Rust), disassembles the cubin with nvdisasm (with line info),
and lists each loop (a backward branch) of the chosen kernels: its size in instructions, the
race.cu lines it covers and its most common opcodes. A tight product loop shows mostly FFMA
and LDS; a loop heavy in IMAD/ISETP/BRA/BSSY or S2R (address-space conversions) is overhead.

Needs, from PyPI (no CUDA toolkit): `nvidia-cuda-nvrtc` (libnvrtc.so.N) and
`nvidia-cuda-nvdisasm` (the nvdisasm binary; `pip download --no-deps nvidia-cuda-nvdisasm`
and unzip the wheel if pip cannot install it). Paths: --nvrtc and --nvdisasm, or found in the
Python site-packages (nvidia/*/lib, nvidia/*/bin).

Usage:
  scripts/sass-loops.py [--kernel race_bwd_q_tile ...] [--min 20] [-D PROD_SPREAD=64] [--bf16]
"""
import argparse
import collections
import ctypes
import glob
import os
import re
import site
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def find(patterns):
    roots = site.getsitepackages() + [site.getusersitepackages()]
    for root in roots:
        for pat in patterns:
            hits = sorted(glob.glob(os.path.join(root, pat)))
            if hits:
                return hits[-1]
    return None


def compile_cubin(nvrtc, src, opts):
    lib = ctypes.CDLL(nvrtc)
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), src, b"race.cu", 0, None, None) != 0:
        sys.exit("nvrtcCreateProgram failed")
    arr = (ctypes.c_char_p * len(opts))(*opts)
    rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
    n = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetProgramLog(prog, log)
    if rc != 0:
        sys.exit("NVRTC rejects race.cu:\n" + log.value.decode())
    lib.nvrtcGetCUBINSize(prog, ctypes.byref(n))
    cubin = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetCUBIN(prog, cubin)
    return cubin.raw, log.value.decode()


def parse(sass, kernel):
    """(address, race.cu line, instruction) of one kernel, and its labels' addresses."""
    lines = sass.split("\n")
    try:
        start = lines.index(f".text.{kernel}:")
    except ValueError:
        sys.exit(f"no kernel {kernel} in the cubin")
    ins, labels, pending, cur = [], {}, [], None
    for l in lines[start + 1:]:
        if l.startswith(".text."):
            break
        m = re.match(r'\s*//## File ".*", line (\d+)', l)
        if m:
            cur = int(m.group(1))
            continue
        m = re.match(r"^(\.L_x_\d+):", l)
        if m:
            pending.append(m.group(1))
            continue
        m = re.match(r"\s*/\*([0-9a-f]+)\*/\s+(.*?)\s*;", l)
        if m:
            addr = int(m.group(1), 16)
            for p in pending:
                labels[p] = addr
            pending = []
            ins.append((addr, cur, m.group(2)))
    return ins, labels


def opcode(text):
    t = text.split()
    if t and t[0].startswith("@"):
        t = t[1:]
    return t[0].split(".")[0] if t else "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kernel", action="append", help="kernel name (default: the tiled passes)")
    ap.add_argument("--min", type=int, default=20, help="smallest loop shown (instructions)")
    ap.add_argument("-D", action="append", default=[], help="a race.cu macro, e.g. PROD_SPREAD=64")
    ap.add_argument("--bf16", action="store_true", help="the bf16-input build")
    ap.add_argument("--nvrtc", default=os.environ.get("RACELAB_NVRTC"))
    ap.add_argument("--nvdisasm")
    a = ap.parse_args()
    nvrtc = a.nvrtc or find(["nvidia/*/lib/libnvrtc.so.*[0-9]", "nvidia/cuda_nvrtc/lib/libnvrtc.so*"])
    nvdisasm = a.nvdisasm or find(["nvidia/*/bin/nvdisasm", "nvidia/cuda_nvdisasm/bin/nvdisasm"])
    if not nvrtc or not nvdisasm:
        sys.exit(f"need NVRTC ({nvrtc}) and nvdisasm ({nvdisasm}): see this script's docstring")
    src = open(os.path.join(ROOT, "crates/racelab-core/src/cuda/race.cu"), "rb").read()
    opts = [b"-arch=sm_90", b"-lineinfo", b"--ptxas-options=-v"] + [f"-D{d}".encode() for d in a.D]
    if a.bf16:
        opts.append(b"-DRACE_BF16")
    cubin, log = compile_cubin(nvrtc, src, opts)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([nvdisasm, "-g", f.name], capture_output=True, text=True, check=True).stdout
    kernels = a.kernel or ["race_partial_tile_m16", "race_fwd_tile", "race_bwd_q_tile", "race_bwd_k_tile"]
    regs = dict(re.findall(r"Compiling entry function '(\w+)'.*?Used (\d+) registers", log, re.S))
    for k in kernels:
        ins, labels = parse(sass, k)
        print(f"{k}: {len(ins)} instructions, {regs.get(k, '?')} registers")
        loops = []
        for addr, _, text in ins:
            m = re.search(r"BRA.*`\((\.L_x_\d+)\)", text)
            if m and m.group(1) in labels and labels[m.group(1)] <= addr:
                loops.append((labels[m.group(1)], addr))
        for lo, hi in sorted(loops):
            body = [x for x in ins if lo <= x[0] <= hi]
            if len(body) < a.min:
                continue
            lines = sorted({x[1] for x in body if x[1]})
            span = f"{lines[0]}-{lines[-1]}" if lines else "?"
            ops = collections.Counter(opcode(x[2]) for x in body).most_common(6)
            ffma = sum(1 for x in body if opcode(x[2]) == "FFMA")
            print(f"  loop {lo:05x}-{hi:05x}: {len(body):5d} instr, {ffma:4d} FFMA, race.cu lines {span}; "
                  + ", ".join(f"{o} {n}" for o, n in ops))


if __name__ == "__main__":
    main()
