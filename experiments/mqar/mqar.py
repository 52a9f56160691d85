"""Multi-query associative recall (MQAR, Zoology: Arora et al., 2023) with softmax, soft RACE,
Performer and linear attention in the same slots of a small two-layer model, at matched
recurrent state.

    pip install ./python            # racelab and racelab.torch
    python experiments/mqar/mqar.py            # the default grid (about 50 minutes on 2 cores)
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
  queries and keys; state ``L * 2^P * (dv + 1)`` per layer. Three β modes:
  ``fixed`` at the β the fixed-input trade-off study validated for that (P, L)
  (``beta_chosen`` in ``figures/tradeoff.csv``); ``learned`` from that same β; and
  ``learned-authors`` from the authors' start ``1 / sqrt(d_head)``. A learned β is
  ``exp(log_temp) / sqrt(d_head)``, and ``log_temp`` trains on its own learning rate
  (``beta_lr``, no weight decay) so that it can move;
- ``performer m``: FAVOR+ positive random features (m of them, redrawn per seed, fixed) on
  ``x * s * d^-1/4``, its feature scale ``s`` chosen on validation; state ``m * (dv + 1)``;
- ``linear``: ``elu(x) + 1`` features, ``m = d_head``.

Tuning, the same for every model (as Zoology does): on the first seed, each model trains at
every learning rate of ``lrs`` and keeps the one with the best accuracy on a validation set
(its own draw, disjoint from the test set); Performer then tries each other scale of
``performer_scales`` at that learning rate and keeps the best. The other seeds train at the
chosen setting. Every row of the results is then scored on the test set, never used to choose.

Output: ``figures/mqar/mqar.csv`` (one row per model and seed at its chosen setting: the state,
learning rate, Performer scale, validation and test accuracy, final loss, β start and end per
layer with ``dlog2_beta = log2(β_end / β_start)``, seconds), ``mqar_sweep.csv`` (every
tuning run on the first seed and its validation accuracy) and ``mqar.meta.json``
(parameters, the validated β, seeds, revision, machine, torch and racelab versions). ``racelab reproduce`` reads them into REPORT.md (claims ``mqar-*``) and
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
    # Each run trains `steps` steps of `batch` sequences; seeds repeat every model. The
    # learning rates and Performer's scales are tuned on the first seed (see above). The
    # full grid leaves out the 4-feature states (L·2^P = m = 4), where every bounded model
    # sits near chance on 24 pairs, to keep the tuned retrain within about 50 minutes.
    "full": dict(
        pairs=24, keys=64, values=64, d_model=64, steps=300, batch=64, eval_n=1024, val_n=512,
        seeds=[0, 1, 2], lrs=[3e-3, 1e-2], beta_lr=5e-2, performer_scales=[1.0, 0.5, 2.0],
        race=[(2, 2), (3, 1), (2, 4), (4, 1), (3, 4), (5, 1), (4, 4), (6, 1)],
        learned=[(2, 2), (2, 4), (3, 4), (4, 4)],
        performer=[8, 16, 32, 64],
    ),
    "quick": dict(
        pairs=6, keys=16, values=16, d_model=32, steps=100, batch=32, eval_n=256, val_n=128,
        seeds=[0, 1, 2], lrs=[3e-3, 1e-2], beta_lr=5e-2, performer_scales=[1.0, 2.0],
        race=[(2, 1), (3, 1)],
        learned=[(2, 1)],
        performer=[4, 8],
    ),
}

FIELDS = ["model", "p", "l", "m_features", "beta_mode", "state_floats", "seed", "lr",
          "performer_scale", "val_accuracy", "accuracy", "final_loss", "beta_start", "beta_final",
          "dlog2_beta", "seconds", "steps"]
SWEEP_FIELDS = ["model", "p", "l", "m_features", "beta_mode", "seed", "lr", "performer_scale",
                "val_accuracy", "val_loss", "chosen"]

# The validated β per (P, L): the trade-off study's choice on fixed unit-norm inputs.
TRADEOFF = Path(__file__).resolve().parents[2] / "figures" / "tradeoff.csv"


def validated_betas(path=TRADEOFF):
    """``beta_chosen`` per (P, L) from the trade-off study's CSV."""
    if not path.is_file():
        raise SystemExit(f"{path} is missing: run `racelab reproduce` (its tradeoff step) first")
    with open(path) as f:
        return {(int(r["p"]), int(r["l"])): float(r["beta_chosen"]) for r in csv.DictReader(f)}


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

    def __init__(self, d, m, seed, scale=1.0):
        super().__init__()
        g = torch.Generator().manual_seed(10_000 + seed)
        self.register_buffer("w", torch.randn(m, d, generator=g))
        self.scale = scale * d ** -0.25

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


def mixers(spec, setting, g, seed):
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
            out.append(Performer(d, spec["m_features"], s, setting["performer_scale"]))
        else:
            out.append(Race(d, spec["p"], spec["l"], spec["beta_start"], spec["beta_mode"] != "fixed", s))
    return out


def state_floats(spec, dv):
    """Recurrent state per layer: features × (dv + 1); softmax keeps every key (none)."""
    if spec["model"] == "softmax":
        return ""
    return spec["m_features"] * (dv + 1)


def specs(g, validated):
    """Every model of the grid; soft RACE's with its β mode and start (``validated``: the
    trade-off study's β per (P, L))."""
    d = g["d_model"]
    none = dict(p="", l="", beta_mode="", beta_start="")
    out = [dict(none, model="softmax", m_features="")]
    out.append(dict(none, model="linear", m_features=d))
    out += [dict(none, model="performer", m_features=m) for m in g["performer"]]

    def race(p, l, mode, start):
        return dict(model="race", p=p, l=l, m_features=l << p, beta_mode=mode, beta_start=start)

    def checked(p, l):
        if (p, l) not in validated:
            raise SystemExit(f"the trade-off study has no validated β for (P, L) = ({p}, {l})")
        return validated[(p, l)]

    out += [race(p, l, "fixed", checked(p, l)) for p, l in g["race"]]
    out += [race(p, l, "learned", checked(p, l)) for p, l in g["learned"]]
    out += [race(p, l, "learned-authors", 1 / math.sqrt(d)) for p, l in g["learned"]]
    return out


def first_settings(spec, g):
    """The first tuning stage: every learning rate (Performer at its first scale)."""
    scale = g["performer_scales"][0] if spec["model"] == "performer" else ""
    return [dict(lr=lr, performer_scale=scale) for lr in g["lrs"]]


def second_settings(spec, g, best):
    """The second stage: Performer's other scales at the chosen learning rate."""
    if spec["model"] != "performer":
        return []
    return [dict(lr=best["lr"], performer_scale=s) for s in g["performer_scales"][1:]]


def choose(results):
    """The setting with the best validation accuracy (ties: the lower validation loss, then
    the earlier setting)."""
    return max(enumerate(results), key=lambda ir: (ir[1]["val_accuracy"], -ir[1]["val_loss"], -ir[0]))[1]


def accuracy_and_loss(model, gen, n, g):
    """Exact-match accuracy and cross-entropy on ``n`` fresh sequences from ``gen``."""
    tokens, targets = batch_mqar(gen, n, g["pairs"], g["keys"], g["values"])
    with torch.no_grad():
        logits = model(tokens)
    asked = targets != -100
    acc = (logits.argmax(-1)[asked] == targets[asked]).float().mean().item()
    loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100).item()
    return acc, loss


def train(spec, setting, g, seed, threads):
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    vocab = g["keys"] + g["values"]
    model = Model(vocab, g["d_model"], mixers(spec, setting, g, seed))
    named = list(model.named_parameters())
    temp = [p for n, p in named if n.endswith("log_temp")]
    decay = [p for n, p in named if p.dim() >= 2]
    other = [p for n, p in named if p.dim() < 2 and not n.endswith("log_temp")]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}]
    if temp:
        groups.append({"params": temp, "weight_decay": 0.0, "lr": g["beta_lr"]})
    opt = torch.optim.AdamW(groups, lr=setting["lr"], betas=(0.9, 0.98))
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
    # Validation (to choose a setting) and test (to report) sequences come from seeds that no
    # training batch uses, and from each other.
    model.eval()
    val_acc, val_loss = accuracy_and_loss(model, torch.Generator().manual_seed(2_000_000 + seed), g["val_n"], g)
    acc, _ = accuracy_and_loss(model, torch.Generator().manual_seed(1_000_000 + seed), g["eval_n"], g)
    betas = [float(b.mixer.attn.beta.detach()) for b in model.blocks if isinstance(b.mixer, Race)]
    start = spec["beta_start"]
    return dict(setting, val_accuracy=val_acc, val_loss=val_loss, accuracy=acc,
                final_loss=float(loss.detach()), seconds=round(seconds, 2),
                beta_start=f"{start:.6g}" if betas else "",
                beta_final=";".join(f"{b:.4g}" for b in betas) if betas else "",
                dlog2_beta=";".join(f"{math.log2(b / start):+.3f}" for b in betas) if betas else "")


def worker_init(threads):
    """A worker of the pool: its own share of the cores for torch and for racelab's kernels."""
    os.environ["RAYON_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)


def run_one(job):
    spec, setting, g, seed, threads = job
    return train(spec, setting, g, seed, threads)


def tag(spec, setting):
    """A run's name in the log."""
    t = spec["model"]
    if spec["model"] == "race":
        t += f" P={spec['p']} L={spec['l']} {spec['beta_mode']}"
    elif spec["m_features"] != "":
        t += f" m={spec['m_features']}"
    t += f" lr={setting['lr']:g}"
    if setting["performer_scale"] != "":
        t += f" s={setting['performer_scale']:g}"
    return t


def write_csv(path, fields, rows):
    """Write ``rows`` atomically (a partial file, then a rename)."""
    tmp = path.with_name(path.name + ".partial")
    with open(tmp, "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        wr.writeheader()
        for r in rows:
            wr.writerow({k: r.get(k, "") for k in fields})
    tmp.replace(path)


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
    validated = validated_betas()
    meta = dict(experiment="mqar", grid=grid, params={k: v for k, v in g.items()},
                validated_beta={f"{p},{l}": b for (p, l), b in sorted(validated.items())
                                if (p, l) in set(map(tuple, g["race"] + g["learned"]))},
                validated_beta_source="figures/tradeoff.csv (beta_chosen)",
                selection="lr (then Performer's scale) by validation accuracy on the first seed",
                seeds=g["seeds"], revision=revision(), machine=cpu_model(), cores=os.cpu_count(),
                threads=args.threads, jobs=args.jobs, torch=torch.__version__, racelab=racelab.__version__,
                python=platform.python_version(),
                command=" ".join(["python", "experiments/mqar/mqar.py"] + (argv if argv is not None else sys.argv[1:])))
    t0 = time.perf_counter()
    threads = max(1, args.threads // args.jobs)
    models = specs(g, validated)
    first = g["seeds"][0]

    def train_all(pool, jobs):
        """Train ``(spec, setting, seed)`` jobs on the pool, logging each as it ends."""
        out = pool.imap(run_one, [(sp, st, g, seed, threads) for sp, st, seed in jobs])
        results = []
        for (sp, st, seed), res in zip(jobs, out):
            results.append(res)
            print(f"{tag(sp, st):44} seed {seed}: val {res['val_accuracy']:.3f}  test {res['accuracy']:.3f}  "
                  f"{res['seconds']:.1f} s" + (f"  beta {res['beta_final']}" if res["beta_final"] else ""),
                  flush=True)
        return results

    ctx = multiprocessing.get_context("spawn")
    sweep = {i: [] for i in range(len(models))}
    with ctx.Pool(args.jobs, initializer=worker_init, initargs=(threads,)) as pool:
        # Stage 1: every learning rate on the first seed.
        jobs = [(i, st) for i, sp in enumerate(models) for st in first_settings(sp, g)]
        for (i, _), res in zip(jobs, train_all(pool, [(models[i], st, first) for i, st in jobs])):
            sweep[i].append(res)
        # Stage 2: Performer's other scales at its chosen learning rate.
        jobs = [(i, st) for i, sp in enumerate(models) for st in second_settings(sp, g, choose(sweep[i]))]
        for (i, _), res in zip(jobs, train_all(pool, [(models[i], st, first) for i, st in jobs])):
            sweep[i].append(res)
        chosen = {i: choose(sweep[i]) for i in sweep}
        # The other seeds at the chosen setting.
        jobs = [(i, seed) for i in range(len(models)) for seed in g["seeds"][1:]]
        setting = {i: dict(lr=chosen[i]["lr"], performer_scale=chosen[i]["performer_scale"]) for i in chosen}
        rest = train_all(pool, [(models[i], setting[i], seed) for i, seed in jobs])
    by_seed = {(i, first): chosen[i] for i in chosen}
    by_seed.update({(i, seed): res for (i, seed), res in zip(jobs, rest)})
    rows = []
    for i, sp in enumerate(models):
        for seed in g["seeds"]:
            r = dict(sp, seed=seed, steps=g["steps"], state_floats=state_floats(sp, g["d_model"]))
            r.update(by_seed[(i, seed)])
            rows.append(r)
    write_csv(out / "mqar.csv", FIELDS, rows)
    write_csv(out / "mqar_sweep.csv", SWEEP_FIELDS,
              [dict(models[i], seed=first, chosen=int(res is chosen[i]), **res) for i in sweep for res in sweep[i]])
    path = out / "mqar.csv"
    meta["seconds"] = round(time.perf_counter() - t0, 1)
    (out / "mqar.meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"wrote {path} and {out / 'mqar.meta.json'} ({meta['seconds']} s)")
    return rows


if __name__ == "__main__":
    main()
