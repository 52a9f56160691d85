"""Send PyTorch tensors to `racelab attend` and load the result back; check racelab's softmax
attention against torch.nn.functional.scaled_dot_product_attention on the same tensors.

    pip install torch numpy
    cargo build --release
    python3 experiments/compare_torch.py            # random [B, H, N, d] tensors
    python3 experiments/compare_torch.py --data experiments/data/minilm --layer 3

Exits non-zero if a difference exceeds the tolerance (f64: 1e-10, f32: 2e-5 relative).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RACELAB = os.environ.get("RACELAB", os.path.join(ROOT, "target", "release", "racelab"))


def racelab_attend(q, k, v, method="softmax", extra=()):
    """Save torch tensors as .npy, run `racelab attend`, return (O as a torch tensor, info)."""
    with tempfile.TemporaryDirectory() as tmp:
        paths = {}
        for name, t in (("q", q), ("k", k), ("v", v)):
            paths[name] = os.path.join(tmp, f"{name}.npy")
            np.save(paths[name], t.detach().cpu().numpy())
        out = os.path.join(tmp, "o.npy")
        cmd = [RACELAB, "attend", "--method", method, "--q", paths["q"], "--k", paths["k"], "--v", paths["v"], "--out", out, "--json", *extra]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise SystemExit(f"racelab failed: {res.stderr.strip()}")
        return torch.from_numpy(np.load(out)), json.loads(res.stdout)


def check(name, got, want, tol):
    scale = want.abs().max().item() or 1.0
    err = (got - want).abs().max().item() / scale
    ok = err <= tol
    print(f"{'ok  ' if ok else 'FAIL'} {name}: max relative difference {err:.2e} (tolerance {tol:.0e})")
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", help="a directory written by extract_qk.py")
    ap.add_argument("--layer", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if not os.path.exists(RACELAB):
        raise SystemExit(f"{RACELAB} not found: run `cargo build --release` first (or set RACELAB)")
    if args.data:
        q, k, v = (torch.from_numpy(np.load(os.path.join(args.data, f"{p}_{args.layer}.npy"))) for p in "qkv")
        q, k, v = q[None], k[None], v[None]  # [1, H, N, dh]
    else:
        g = torch.Generator().manual_seed(args.seed)
        q, k, v = (torch.randn(2, 3, 50, 16, generator=g, dtype=torch.float64) for _ in range(3))
    ok = True
    for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 2e-5)):
        qq, kk, vv = q.to(dtype), k.to(dtype), v.to(dtype)
        for causal in (False, True):
            want = F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal)
            got, info = racelab_attend(qq, kk, vv, "softmax", ["--causal"] if causal else [])
            ok &= check(f"softmax {str(dtype)[6:]} causal={causal} shape={list(qq.shape)}", got.to(dtype), want, tol)
    # The same round trip for soft RACE (no torch counterpart; shows the call).
    o, info = racelab_attend(q.to(torch.float32), k.to(torch.float32), v.to(torch.float32), "soft", ["--p", "3", "--l", "4", "--beta", "8"])
    print(f"soft RACE (P,L,beta)=(3,4,8): output {list(o.shape)}, racelab reported {info['seconds']:.4f} s, empty rows {info['empty_rows']}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
