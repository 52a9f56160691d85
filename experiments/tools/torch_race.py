"""A lean PyTorch autograd implementation of non-causal soft RACE, timed at the paper shape,
as the comparison point for `racelab bench` (issue: 'at N = 2^18 at least 15x faster than a
lean PyTorch autograd implementation on the same machine').

    pip install torch
    python3 experiments/tools/torch_race.py --n 262144 --p 2 --l 2 --threads 2
    THP_MEM_ALLOC_ENABLE=1 python3 experiments/tools/torch_race.py ...   # same, on huge pages
    python3 experiments/tools/torch_race.py --device cuda --n 1048576    # on a GPU (gpu-check.sh)

With its default allocator PyTorch spends most of this run faulting in fresh 4 KiB pages
for the intermediates it allocates every step; THP_MEM_ALLOC_ENABLE=1 puts its CPU
allocator on transparent huge pages (3-4x faster on this lab's machine). racelab's bench
allocates its tensors on huge pages, so that is the like-for-like comparison.

Same operator as racelab's Algorithm 1: u = tanh(W x), phi = softmax(beta * u @ corners^T),
A = sum_j phi(k_j), B = sum_j phi(k_j) v_j^T, O = (phi(q) B) / (phi(q) A) averaged over
tables. Forward + backward of loss = sum(O * G) with respect to Q, K, V and beta.
"""
import argparse
import itertools
import time

import torch


def race(q, k, v, w, corners, beta):
    # q, k: [H, N, d]; v: [H, N, dv]; w: [L, P, d]; corners: [R, P]
    uq = torch.tanh(torch.einsum("hnd,lpd->hlnp", q, w))
    uk = torch.tanh(torch.einsum("hnd,lpd->hlnp", k, w))
    pq = torch.softmax(beta * uq @ corners.T, dim=-1)  # [H, L, N, R]
    pk = torch.softmax(beta * uk @ corners.T, dim=-1)
    a = pk.sum(dim=2)  # [H, L, R]
    b = torch.einsum("hlnr,hnc->hlrc", pk, v)  # [H, L, R, dv]
    num = torch.einsum("hlnr,hlrc->hnc", pq, b)
    den = torch.einsum("hlnr,hlr->hn", pq, a)
    return num / den[..., None]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1 << 18)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--p", type=int, default=2)
    ap.add_argument("--l", type=int, default=2)
    ap.add_argument("--beta", type=float, default=8.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    g = torch.Generator().manual_seed(0)
    shape = (args.heads, args.n, args.d)
    q, k, v, gr = ((torch.rand(shape, generator=g) * 2 - 1).to(dev) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(True)
    beta = torch.tensor(args.beta, device=dev, requires_grad=True)
    w = torch.randn(args.l, args.p, args.d, generator=g).to(dev)
    corners = torch.tensor(list(itertools.product([-1.0, 1.0], repeat=args.p)), device=dev)
    times = []
    for _ in range(args.runs + 1):
        for t in (q, k, v, beta):
            t.grad = None
        sync()
        t0 = time.perf_counter()
        o = race(q, k, v, w, corners, beta)
        (o * gr).sum().backward()
        sync()
        times.append(time.perf_counter() - t0)
    times = sorted(times[1:])
    where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"threads={args.threads}"
    print(f"torch {torch.__version__} soft RACE fwd+bwd N={args.n} heads={args.heads} d={args.d} (P,L)=({args.p},{args.l}) {where}: median {times[len(times) // 2]:.4f} s over {args.runs} runs")


if __name__ == "__main__":
    main()
