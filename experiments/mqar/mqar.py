"""Multi-query associative recall (MQAR, Zoology: Arora et al., 2023) with softmax, soft RACE,
Performer and linear attention in the same slots of a small two-layer model, at matched
recurrent state.

    pip install ./python            # racelab and racelab.torch
    python experiments/mqar/mqar.py            # the default grid (about 45 minutes on 2 cores)
    python experiments/mqar/mqar.py --quick    # a small grid (about 2 minutes)

Task. A sequence lists K key-value pairs ``k_1 v_1 ... k_K v_K`` (K distinct keys out of
``keys`` tokens, values out of ``values`` tokens), then the K keys again in a random order; at
each repeated key the model must output that key's value. Accuracy is the share of those
positions predicted exactly, on a held-out set drawn from its own seed.

Model. Token embedding, then two blocks of pre-norm attention and MLP (``d_model``, one head
of ``d_head = d_model``), then a tied read-out. Queries, keys and values are projections of
the token and the one before it (a token shift: the key of the pair ``k_j v_j`` is visible at
``v_j``'s position, so one attention layer can recall). Every mixer is causal:

- ``softmax``: exact causal softmax attention (no state bound: it keeps every key);
- ``race P L``: soft RACE (racelab's causal CPU kernels through ``racelab.torch``), unit-norm
  queries and keys, ``beta`` fixed or learned as ``exp(log_temp) / sqrt(d_head)`` from the
  same start; state ``L * 2^P * (dv + 1)`` per layer;
- ``performer m``: FAVOR+ positive random features (m of them, redrawn per seed, fixed);
  state ``m * (dv + 1)``;
- ``linear``: ``elu(x) + 1`` features, ``m = d_head``.

Output: ``figures/mqar/mqar.csv`` (one row per model and seed: the state, accuracy, final loss,
learned beta, seconds) and ``mqar.meta.json`` (parameters, seeds, revision, machine, torch and
racelab versions). ``racelab reproduce`` reads them into REPORT.md (claims ``mqar-*``) and
draws ``figures/mqar/accuracy_vs_state.png``; it needs no torch.
"""

import argparse
import csv
import json
import math
import multiprocessing
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import racelab
from racelab.torch import RaceAttention, causal_linear_attention

GRIDS = {
    # Each run trains `steps` steps of `batch` sequences; seeds repeat every model.
    "full": dict(
        pairs=24, keys=64, values=64, d_model=64, steps=300, batch=64, lr=3e-3, eval_n=1024,
        seeds=[0, 1, 2], beta=4.0,
        race=[(2, 1), (2, 2), (3, 1), (2, 4), (4, 1), (3, 4), (5, 1), (4, 4), (6, 1)],
        learned=[(2, 2), (2, 4), (3, 4), (4, 4)],
        performer=[4, 8, 16, 32, 64],
    ),
    "quick": dict(
        pairs=6, keys=16, values=16, d_model=32, steps=150, batch=32, lr=3e-3, eval_n=256,
        seeds=[0, 1, 2], beta=4.0,
        race=[(2, 1), (3, 1)],
        learned=[(2, 1)],
        performer=[4, 8],
    ),
}

FIELDS = ["model", "p", "l", "m_features", "beta_mode", "state_floats", "seed", "accuracy",
          "final_loss", "beta_start", "beta_final", "seconds", "steps"]


def batch_mqar(gen, n, pairs, keys, values):
    """``n`` MQAR sequences (``[n, 3K]`` tokens) and targets (``-100`` where nothing is asked)."""
    k = torch.argsort(torch.rand(n, keys, generator=gen), dim=1)[:, :pairs]
    v = keys + torch.randint(0, values, (n, pairs), generator=gen)
    order = torch.argsort(torch.rand(n, pairs, generator=gen), dim=1)
    ctx = torch.stack([k, v], dim=2).reshape(n, 2 * pairs)
    tokens = torch.cat([ctx, torch.gather(k, 1, order)], dim=1)
    targets = torch.full_like(tokens, -100)
    targets[:, 2 * pairs:] = torch.gather(v, 1, order)
    return tokens, targets


class Performer(nn.Module):
    """FAVOR+ positive random features ``exp(w^T x - |x|^2 / 2)`` (``m`` fixed draws)."""

    def __init__(self, d, m, seed):
        super().__init__()
        g = torch.Generator().manual_seed(10_000 + seed)
        self.register_buffer("w", torch.randn(m, d, generator=g))
        self.scale = d ** -0.25

    def features(self, x, is_query):
        x = x * self.scale
        z = x @ self.w.T - 0.5 * x.square().sum(-1, keepdim=True)
        # A constant per query row, or one for all keys, cancels in the ratio.
        shift = z.amax(-1, keepdim=True) if is_query else z.amax(dim=(-2, -1), keepdim=True)
        return torch.exp(z - shift.detach()) + 1e-6

    def forward(self, q, k, v):
        return causal_linear_attention(self.features(q, True), self.features(k, False), v, chunk=q.shape[-2])


class Linear(nn.Module):
    def forward(self, q, k, v):
        return causal_linear_attention(F.elu(q) + 1, F.elu(k) + 1, v, chunk=q.shape[-2])


class Softmax(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class Race(nn.Module):
    """Soft RACE on unit-norm queries and keys (the angular hash sees directions)."""

    def __init__(self, d, p, l, beta, learn, seed):
        super().__init__()
        self.attn = RaceAttention(d, p=p, l=l, beta=beta, learn_beta=learn, causal=True, seed=seed)

    def forward(self, q, k, v):
        return self.attn(F.normalize(q, dim=-1), F.normalize(k, dim=-1), v)


class Block(nn.Module):
    def __init__(self, d, mixer):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(2 * d, 3 * d)
        self.mixer = mixer
        self.out = nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x):
        h = self.norm1(x)
        prev = F.pad(h, (0, 0, 1, 0))[:, :-1]
        q, k, v = self.qkv(torch.cat([h, prev], dim=-1)).chunk(3, dim=-1)
        o = self.mixer(q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1).contiguous()).squeeze(1)
        x = x + self.out(o)
        return x + self.mlp(self.norm2(x))


class Model(nn.Module):
    def __init__(self, vocab, d, mixers):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, m) for m in mixers)
        self.norm = nn.LayerNorm(d)

    def forward(self, tokens):
        x = self.emb(tokens)
        for b in self.blocks:
            x = b(x)
        return self.norm(x) @ self.emb.weight.T


def mixers(spec, g, seed):
    d = g["d_model"]
    kind = spec["model"]
    out = []
    for layer in range(2):
        s = 1000 * seed + layer
        if kind == "softmax":
            out.append(Softmax())
        elif kind == "linear":
            out.append(Linear())
        elif kind == "performer":
            out.append(Performer(d, spec["m_features"], s))
        else:
            out.append(Race(d, spec["p"], spec["l"], g["beta"], spec["beta_mode"] == "learned", s))
    return out


def state_floats(spec, dv):
    """Recurrent state per layer: features × (dv + 1); softmax keeps every key (none)."""
    if spec["model"] == "softmax":
        return ""
    return spec["m_features"] * (dv + 1)


def specs(g):
    d = g["d_model"]
    out = [dict(model="softmax", p="", l="", m_features="", beta_mode="")]
    out.append(dict(model="linear", p="", l="", m_features=d, beta_mode=""))
    out += [dict(model="performer", p="", l="", m_features=m, beta_mode="") for m in g["performer"]]
    out += [dict(model="race", p=p, l=l, m_features=l << p, beta_mode="fixed") for p, l in g["race"]]
    out += [dict(model="race", p=p, l=l, m_features=l << p, beta_mode="learned") for p, l in g["learned"]]
    return out


def train(spec, g, seed, threads):
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    vocab = g["keys"] + g["values"]
    model = Model(vocab, g["d_model"], mixers(spec, g, seed))
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    other = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=g["lr"], betas=(0.9, 0.98))
    steps = g["steps"]
    warm = max(1, steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps))))
    gen = torch.Generator().manual_seed(seed)
    t0 = time.perf_counter()
    loss = torch.tensor(float("nan"))
    for _ in range(steps):
        tokens, targets = batch_mqar(gen, g["batch"], g["pairs"], g["keys"], g["values"])
        loss = F.cross_entropy(model(tokens).flatten(0, 1), targets.flatten(), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    seconds = time.perf_counter() - t0
    # Held-out sequences from a seed no training batch uses.
    eval_gen = torch.Generator().manual_seed(1_000_000 + seed)
    tokens, targets = batch_mqar(eval_gen, g["eval_n"], g["pairs"], g["keys"], g["values"])
    with torch.no_grad():
        pred = model(tokens).argmax(-1)
    asked = targets != -100
    acc = (pred[asked] == targets[asked]).float().mean().item()
    betas = [float(b.mixer.attn.beta.detach()) for b in model.blocks if isinstance(b.mixer, Race)]
    return dict(accuracy=acc, final_loss=float(loss.detach()), seconds=round(seconds, 2),
                beta_start=g["beta"] if betas else "",
                beta_final=";".join(f"{b:.4g}" for b in betas) if betas else "")


def worker_init(threads):
    """A worker of the pool: its own share of the cores for torch and for racelab's kernels."""
    os.environ["RAYON_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)


def run_one(job):
    spec, g, seed, threads = job
    return train(spec, g, seed, threads)


def revision():
    root = Path(__file__).resolve().parents[2]
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "python",
                                "experiments/mqar"], capture_output=True, text=True).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the small grid (about 2 minutes)")
    ap.add_argument("--out", default="figures/mqar", help="output folder")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="threads in all")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                    help="runs trained at once, each with threads/jobs threads")
    ap.add_argument("--seeds", type=int, nargs="+", help="override the grid's seeds")
    args = ap.parse_args(argv)
    grid = "quick" if args.quick else "full"
    g = dict(GRIDS[grid])
    if args.seeds:
        g["seeds"] = args.seeds
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = dict(experiment="mqar", grid=grid, params={k: v for k, v in g.items()},
                seeds=g["seeds"], revision=revision(), machine=cpu_model(), cores=os.cpu_count(),
                threads=args.threads, jobs=args.jobs, torch=torch.__version__, racelab=racelab.__version__,
                python=platform.python_version(),
                command=" ".join(["python", "experiments/mqar/mqar.py"] + (argv if argv is not None else sys.argv[1:])))
    t0 = time.perf_counter()
    rows = []
    path = out / "mqar.csv"
    tmp = out / "mqar.csv.partial"
    runs = [(spec, seed) for spec in specs(g) for seed in g["seeds"]]
    threads = max(1, args.threads // args.jobs)
    ctx = multiprocessing.get_context("spawn")
    with open(tmp, "w", newline="") as f, ctx.Pool(args.jobs, initializer=worker_init, initargs=(threads,)) as pool:
        wr = csv.DictWriter(f, fieldnames=FIELDS)
        wr.writeheader()
        for (spec, seed), res in zip(runs, pool.imap(run_one, [(s, g, seed, threads) for s, seed in runs])):
            r = dict(spec, seed=seed, steps=g["steps"], state_floats=state_floats(spec, g["d_model"]))
            r.update(res)
            rows.append(r)
            wr.writerow({k: r.get(k, "") for k in FIELDS})
            f.flush()
            tag = spec["model"] + (f" P={spec['p']} L={spec['l']} {spec['beta_mode']}" if spec["model"] == "race"
                                   else f" m={spec['m_features']}" if spec["m_features"] != "" else "")
            print(f"{tag:32} seed {seed}: accuracy {r['accuracy']:.3f}  loss {r['final_loss']:.3f}  "
                  f"{r['seconds']:.1f} s" + (f"  beta {r['beta_final']}" if r["beta_final"] else ""), flush=True)
    tmp.replace(path)
    meta["seconds"] = round(time.perf_counter() - t0, 1)
    (out / "mqar.meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"wrote {path} and {out / 'mqar.meta.json'} ({meta['seconds']} s)")
    return rows


if __name__ == "__main__":
    main()
