"""Time racelab.torch.race_attention against plain PyTorch, forward + backward, at the paper
shape (4 heads, d = 128, (P, L) = (2, 2), beta = 10), N = 2^14 ... 2^20 tokens per head.

    python python/bench/bench_torch.py                      # both allocator settings, N = 2^14..2^20
    python python/bench/bench_torch.py --log2n 14 16 --runs 3 --out /tmp/t.csv

Each (allocator setting, implementation, N) runs in its own child process with the same
environment, so both implementations see the same allocator settings, a fresh heap, and an
out-of-memory failure ends one row, not the run. A child's address space is capped at the
memory available when the run starts (`RLIMIT_AS`), so running out of memory is a clean
`RuntimeError` recorded as "out of memory", not the kernel's OOM killer.

Allocator settings: PyTorch's default CPU allocator, and `THP_MEM_ALLOC_ENABLE=1` (its
allocations advised onto transparent huge pages; racelab's kernels advise their own buffers
either way). The machine's transparent-huge-page mode is recorded with every row: with THP
set to `never`, the second setting cannot take effect.

Timing: one warm-up call, then the median of `--runs` calls of forward + backward of
``loss = sum(O * G)`` for a fixed random ``G``, with gradients in q, k, v and beta; the
binding's overhead (reshapes, the numpy views, the output tensors) is inside the timing.
Rows go to a CSV with the revision, machine, torch version and thread count.
"""

import argparse
import csv
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

SETTINGS = {"default": {}, "thp": {"THP_MEM_ALLOC_ENABLE": "1"}}
FIELDS = [
    "allocator", "thp_mode", "isa", "impl", "causal", "n", "heads", "d", "p", "l", "beta", "threads",
    "seconds_median", "seconds_min", "runs", "peak_rss_gib", "status",
]


def child(args):
    """Time one implementation at one N; print one JSON line."""
    import torch

    import racelab
    from racelab.torch import plain_race_attention, race_attention

    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(args.seed)
    shape = (1, args.heads, args.n, args.d)
    q, k, v, g = (torch.randn(shape, generator=gen) for _ in range(4))
    for x in (q, k, v):
        x.requires_grad_()
    beta = torch.tensor(args.beta, requires_grad=True)
    w = racelab.planes(args.l, args.p, args.d, seed=args.seed)
    wt = torch.from_numpy(w).float()
    causal = args.causal == "causal"

    def step():
        for x in (q, k, v, beta):
            x.grad = None
        if args.impl == "racelab":
            o = race_attention(q, k, v, w, beta, causal=causal)
        else:
            o = plain_race_attention(q, k, v, wt, beta, causal=causal)
        o.backward(g)

    times = []
    for i in range(args.runs + 1):
        t0 = time.perf_counter()
        step()
        if i > 0:
            times.append(time.perf_counter() - t0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(json.dumps({"seconds_median": statistics.median(times), "seconds_min": min(times),
                      "peak_rss_gib": round(peak, 3)}))


def available_bytes():
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def thp_mode():
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
        return text[text.index("[") + 1: text.index("]")]
    except (OSError, ValueError):
        return "unknown"


def revision():
    try:
        root = Path(__file__).resolve().parents[2]
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain"],
                               capture_output=True, text=True).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def cpu_model():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def run_one(args, setting, impl, causal, n, limit):
    env = dict(os.environ, **SETTINGS[setting])
    cmd = [sys.executable, __file__, "--child", "--impl", impl, "--causal", causal, "--n", str(n),
           "--heads", str(args.heads), "--d", str(args.d), "--p", str(args.p), "--l", str(args.l),
           "--beta", str(args.beta), "--threads", str(args.threads), "--runs", str(args.runs),
           "--seed", str(args.seed)]

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    run = subprocess.run(cmd, env=env, capture_output=True, text=True, preexec_fn=cap)
    import racelab

    # The machine's level (racelab's detection), for every row: PyTorch's kernels run on it too.
    row = {"allocator": setting, "thp_mode": thp_mode(), "isa": racelab.cpu_isa(), "impl": impl, "causal": causal, "n": n,
           "heads": args.heads, "d": args.d, "p": args.p, "l": args.l, "beta": args.beta,
           "threads": args.threads, "runs": args.runs}
    if run.returncode == 0:
        row.update(json.loads(run.stdout.strip().splitlines()[-1]))
        row["status"] = "ok"
    else:
        err = run.stderr.strip().splitlines()[-1] if run.stderr.strip() else f"exit {run.returncode}"
        oom = any(s in run.stderr for s in ("can't allocate memory", "MemoryError", "out of memory",
                                            "too large for memory", "std::bad_alloc"))
        row["status"] = "out of memory" if oom else f"failed: {err[:120]}"
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--log2n", type=int, nargs="+", default=list(range(14, 21)))
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--p", type=int, default=2)
    ap.add_argument("--l", type=int, default=2)
    ap.add_argument("--beta", type=float, default=10.0)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--allocators", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    ap.add_argument("--causal", nargs="+", default=["non-causal", "causal"],
                    choices=["non-causal", "causal"])
    ap.add_argument("--out", default="figures/bench/torch/bench_torch.csv")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--impl", default="racelab", choices=["racelab", "plain"])
    ap.add_argument("--n", type=int, default=1 << 14)
    args = ap.parse_args()
    if args.child:
        args.causal = args.causal[0] if isinstance(args.causal, list) else args.causal
        return child(args)

    import torch

    limit = available_bytes()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    import racelab

    meta = {"revision": revision(), "machine": cpu_model(), "isa": racelab.cpu_isa(),
            "cores": os.cpu_count(),
            "memory_available_gib": round(limit / 2**30, 2), "address_space_cap_gib": round(limit / 2**30, 2),
            "thp_mode": thp_mode(), "torch": torch.__version__, "python": platform.python_version(),
            "threads": args.threads, "seed": args.seed, "runs": args.runs,
            "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:])}
    out.with_suffix(".meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(json.dumps(meta))
    rows = []
    with open(out, "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=FIELDS)
        wr.writeheader()
        for setting in args.allocators:
            for causal in args.causal:
                for e in args.log2n:
                    for impl in ("racelab", "plain"):
                        row = run_one(args, setting, impl, causal, 1 << e, limit)
                        rows.append(row)
                        wr.writerow({k: row.get(k, "") for k in FIELDS})
                        f.flush()
                        t = row.get("seconds_median")
                        print(f"{setting:8} {causal:10} 2^{e:<2} {impl:8} "
                              + (f"{t:9.3f} s  peak {row['peak_rss_gib']:.2f} GiB" if t else row["status"]),
                              flush=True)
    print("\nplain / racelab (same allocator setting, same causal form):")
    for r in rows:
        if r["impl"] != "racelab":
            continue
        p = next(x for x in rows if x["impl"] == "plain" and all(x[k] == r[k] for k in ("allocator", "causal", "n")))
        ratio = (p["seconds_median"] / r["seconds_median"]) if "seconds_median" in p and "seconds_median" in r else None
        print(f"{r['allocator']:8} {r['causal']:10} N={r['n']:>8}: "
              + (f"{ratio:6.2f}x" if ratio else f"plain {p['status']}, racelab {r['status']}"))


if __name__ == "__main__":
    main()
