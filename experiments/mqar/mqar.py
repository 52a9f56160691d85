"""Multi-query associative recall (MQAR, Zoology: Arora et al., 2023) with softmax, soft RACE,
Performer and linear attention in the same slots of a small two-layer model, at matched
recurrent state.

    pip install ./python            # racelab and racelab.torch
    python experiments/mqar/mqar.py            # the default grid (about 45 minutes on 2 cores)
    python experiments/mqar/mqar.py --quick    # a small grid (about 15 seconds)

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
every setting of its grid and keeps the one with the best accuracy on a validation set (its
own draw, disjoint from the test set). The grid is a window on a ladder per tuned variable:
the learning rate (``LR_LADDER``, starting from ``lrs``) for every model, and jointly with it
Performer's feature scale (``SCALE_LADDER``, starting from ``performer_scales``). Where the
chosen value of a variable is at its window's edge, the window grows by the next ladder rung
on that side and the new settings train (every combination with the other variable's
window), until every chosen value is interior or the ladder ends; a setting still on an edge
is reported as such (``edge``). The other seeds train at the chosen setting. Every row of the
results is then scored on the test set, never used to choose.

Output: ``figures/mqar/mqar.csv`` (one row per model and seed at its chosen setting: the state,
learning rate, Performer scale, whether that setting sits on its grid's edge, validation and
test accuracy, final loss, β start and end per layer with ``dlog2_beta = log2(β_end /
β_start)``, seconds), ``mqar_sweep.csv`` (every tuning run on the first seed: its setting,
the round that trained it, its validation accuracy, the final grid, and the choice) and ``mqar.meta.json``
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

# The ladders the tuning grids are windows on (half-decade steps of the learning rate, octaves
# of Performer's feature scale, down to 1/128: small scales keep the positive features
# exp(wᵀx − |x|²/2) from being swamped by a few large ones).
LR_LADDER = [3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1]
SCALE_LADDER = [2.0 ** e for e in range(-7, 3)]

GRIDS = {
    # Each run trains `steps` steps of `batch` sequences; seeds repeat every model. `lrs` and
    # `performer_scales` are the starting windows of the tuning grids (contiguous rungs of the
    # ladders above), grown while a chosen value sits on an edge (see above). The full grid
    # leaves out the 4-feature states (L·2^P = m = 4), where every bounded model sits near
    # floor on 24 pairs (docs/mqar.md), to keep the tuned retrain well within an hour.
    "full": dict(
        pairs=24, keys=64, values=64, d_model=64, steps=300, batch=64, eval_n=1024, val_n=512,
        seeds=[0, 1, 2, 3, 4], lrs=[3e-3, 1e-2, 3e-2], beta_lr=5e-2,
        performer_scales=[0.0625, 0.125, 0.25],
        race=[(2, 2), (3, 1), (2, 4), (4, 1), (3, 4), (5, 1), (4, 4), (6, 1)],
        learned=[(2, 2), (2, 4), (3, 4), (4, 4)],
        performer=[8, 16, 32, 64],
    ),
    "quick": dict(
        pairs=4, keys=16, values=16, d_model=32, steps=60, batch=32, eval_n=256, val_n=128,
        seeds=[0, 1, 2], lrs=[3e-3, 1e-2, 3e-2], beta_lr=5e-2, performer_scales=[0.5, 1.0, 2.0],
        race=[(2, 1), (3, 1)],
        learned=[(2, 1)],
        performer=[4],
    ),
}

FIELDS = ["model", "p", "l", "m_features", "beta_mode", "state_floats", "seed", "lr",
          "performer_scale", "edge", "val_accuracy", "accuracy", "final_loss", "beta_start", "beta_final",
          "dlog2_beta", "seconds", "steps", "diverged"]
SWEEP_FIELDS = ["model", "p", "l", "m_features", "beta_mode", "seed", "round", "lr",
                "performer_scale", "val_accuracy", "val_loss", "diverged", "lr_grid", "scale_grid",
                "chosen", "edge"]

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


class Search:
    """One model's tuning grid on the first seed: the product of a window on each tuned
    variable's ladder (the learning rate; Performer's feature scale jointly with it).

    ``pending()`` lists the grid's settings not yet trained; ``add`` records a result;
    ``widen()`` grows a window by one rung on each side where the chosen value sits on that
    edge and the ladder goes on (it says whether it grew); ``edge()`` names the chosen values
    still on an edge (``""``: every one interior)."""

    def __init__(self, spec, g, ladders=None):
        ladders = ladders or dict(lr=LR_LADDER, performer_scale=SCALE_LADDER)
        start = dict(lr=g["lrs"])
        if spec["model"] == "performer":
            start["performer_scale"] = g["performer_scales"]
        self.ladders, self.window = {}, {}
        for name, values in start.items():
            ladder = ladders[name]
            idx = [ladder.index(v) for v in values]
            if idx != list(range(idx[0], idx[0] + len(idx))):
                raise SystemExit(f"{name} grid {values} is not a run of consecutive rungs of {ladder}")
            self.ladders[name], self.window[name] = ladder, [idx[0], idx[-1]]
        self.results, self.round = [], 0

    def grid(self, name):
        lo, hi = self.window[name]
        return self.ladders[name][lo:hi + 1]

    def settings(self):
        scales = self.grid("performer_scale") if "performer_scale" in self.window else [""]
        return [dict(lr=lr, performer_scale=s) for lr in self.grid("lr") for s in scales]

    def pending(self):
        done = [(r["lr"], r["performer_scale"]) for r in self.results]
        return [st for st in self.settings() if (st["lr"], st["performer_scale"]) not in done]

    def add(self, setting, result):
        self.results.append(dict(result, **setting, round=self.round))

    def chosen(self):
        return choose(self.results)

    def _position(self, name):
        """The chosen value's rung, and its window's ends."""
        rung = self.ladders[name].index(self.chosen()[name])
        return rung, self.window[name]

    def widen(self):
        grew = False
        for name in self.window:
            rung, (lo, hi) = self._position(name)
            if rung == lo and lo > 0:
                self.window[name][0] -= 1
                grew = True
            if rung == hi and hi < len(self.ladders[name]) - 1:
                self.window[name][1] += 1
                grew = True
        self.round += grew
        return grew

    def edge(self):
        out = []
        for name in self.window:
            rung, (lo, hi) = self._position(name)
            label = "lr" if name == "lr" else "scale"
            if rung == lo:
                out.append(f"{label} low")
            if rung == hi:
                out.append(f"{label} high")
        return ";".join(out)


def choose(results):
    """The setting with the best validation accuracy (ties: the lower validation loss, a
    non-finite one last, then the earlier setting)."""
    def key(ir):
        i, r = ir
        loss = r["val_loss"] if math.isfinite(r["val_loss"]) else math.inf
        return r["val_accuracy"], -loss, -i
    return max(enumerate(results), key=key)[1]


def tune(searches, train_batch, widen=True):
    """Train every pending setting of every search (``train_batch`` takes ``(index, setting)``
    pairs and returns their results in order), then widen the grids whose choice is on an
    edge, round after round, until no grid grows."""
    while True:
        jobs = [(i, st) for i, s in enumerate(searches) for st in s.pending()]
        if not jobs:
            return
        for (i, st), res in zip(jobs, train_batch(jobs)):
            searches[i].add(st, res)
        if not widen:
            return
        for s in searches:
            s.widen()


def sweep_rows(models, searches, seed):
    """Every tuning run with its model, the final grid, and whether it was chosen (the chosen
    row also says which of its values sit on an edge of that grid)."""
    rows = []
    for sp, s in zip(models, searches):
        best = s.chosen()
        grids = dict(lr_grid=";".join(f"{v:g}" for v in s.grid("lr")),
                     scale_grid=";".join(f"{v:g}" for v in s.grid("performer_scale"))
                     if "performer_scale" in s.window else "")
        for r in s.results:
            rows.append(dict(sp, seed=seed, **r, **grids, chosen=int(r is best),
                             edge=s.edge() if r is best else ""))
    return rows


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
    diverged = False
    for _ in range(steps):
        tokens, targets = batch_mqar(gen, g["batch"], g["pairs"], g["keys"], g["values"])
        try:
            loss = F.cross_entropy(model(tokens).flatten(0, 1), targets.flatten(), ignore_index=-100)
        except ValueError as e:
            # Weights too large to stay finite inside the model: racelab refuses the queries.
            if "non-finite" not in str(e):
                raise
            diverged = True
            break
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        # A learning rate too high for the model: a non-finite loss or weight ends the run
        # (as does a forward pass racelab refuses above); it is a result, not an error.
        if not torch.isfinite(loss) or not all(torch.isfinite(p).all() for p in model.parameters()):
            diverged = True
            break
    seconds = time.perf_counter() - t0
    if diverged:
        return dict(setting, val_accuracy=0.0, val_loss=math.inf, accuracy=0.0, final_loss=math.nan,
                    seconds=round(seconds, 2), diverged=1, beta_start="", beta_final="", dlog2_beta="")
    # Validation (to choose a setting) and test (to report) sequences come from seeds that no
    # training batch uses, and from each other.
    model.eval()
    val_acc, val_loss = accuracy_and_loss(model, torch.Generator().manual_seed(2_000_000 + seed), g["val_n"], g)
    acc, _ = accuracy_and_loss(model, torch.Generator().manual_seed(1_000_000 + seed), g["eval_n"], g)
    betas = [float(b.mixer.attn.beta.detach()) for b in model.blocks if isinstance(b.mixer, Race)]
    start = spec["beta_start"]
    return dict(setting, val_accuracy=val_acc, val_loss=val_loss, accuracy=acc,
                final_loss=float(loss.detach()), seconds=round(seconds, 2), diverged=0,
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
    ap.add_argument("--quick", action="store_true", help="the small grid (about 15 seconds)")
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
                selection="lr (jointly with Performer's scale) by validation accuracy on the first seed; "
                          "a grid whose choice is on an edge grows by a rung on that side and reruns",
                lr_ladder=LR_LADDER, scale_ladder=SCALE_LADDER,
                seeds=g["seeds"], revision=revision(), machine=cpu_model(), cores=os.cpu_count(),
                threads=args.threads, jobs=args.jobs, torch=torch.__version__, racelab=racelab.__version__,
                python=platform.python_version(),
                command=" ".join(["python", "experiments/mqar/mqar.py"] + (argv if argv is not None else sys.argv[1:])))
    t0 = time.perf_counter()
    threads = max(1, args.threads // args.jobs)
    models = specs(g, validated)
    first = g["seeds"][0]

    def train_all(pool, jobs):
        """Train ``(spec, setting, seed)`` jobs on the pool, logging each as it ends; the
        costliest (soft RACE, larger states) start first, so that a round ends together."""
        order = sorted(range(len(jobs)), key=lambda j: (jobs[j][0]["model"] == "race", jobs[j][0]["m_features"] or 0),
                       reverse=True)
        out = pool.imap(run_one, [(jobs[j][0], jobs[j][1], g, jobs[j][2], threads) for j in order])
        results = [None] * len(jobs)
        for j, res in zip(order, out):
            sp, st, seed = jobs[j]
            results[j] = res
            print(f"{tag(sp, st):44} seed {seed}: val {res['val_accuracy']:.3f}  test {res['accuracy']:.3f}  "
                  f"{res['seconds']:.1f} s" + (f"  beta {res['beta_final']}" if res["beta_final"] else "")
                  + ("  diverged" if res["diverged"] else ""), flush=True)
        return results

    ctx = multiprocessing.get_context("spawn")
    searches = [Search(sp, g) for sp in models]
    with ctx.Pool(args.jobs, initializer=worker_init, initargs=(threads,)) as pool:
        # The tuning grids on the first seed, grown round by round while a choice is on an edge.
        tune(searches, lambda jobs: train_all(pool, [(models[i], st, first) for i, st in jobs]))
        chosen = {i: s.chosen() for i, s in enumerate(searches)}
        # The other seeds at the chosen setting.
        jobs = [(i, seed) for i in range(len(models)) for seed in g["seeds"][1:]]
        setting = {i: dict(lr=chosen[i]["lr"], performer_scale=chosen[i]["performer_scale"]) for i in chosen}
        rest = train_all(pool, [(models[i], setting[i], seed) for i, seed in jobs])
    by_seed = {(i, first): chosen[i] for i in chosen}
    by_seed.update({(i, seed): res for (i, seed), res in zip(jobs, rest)})
    rows = []
    for i, sp in enumerate(models):
        for seed in g["seeds"]:
            r = dict(sp, seed=seed, steps=g["steps"], state_floats=state_floats(sp, g["d_model"]),
                     edge=searches[i].edge())
            r.update(by_seed[(i, seed)])
            rows.append(r)
    write_csv(out / "mqar.csv", FIELDS, rows)
    write_csv(out / "mqar_sweep.csv", SWEEP_FIELDS, sweep_rows(models, searches, first))
    meta["tuning"] = {tag(models[i], setting[i]): searches[i].edge() or "interior" for i in chosen}
    path = out / "mqar.csv"
    meta["seconds"] = round(time.perf_counter() - t0, 1)
    (out / "mqar.meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"wrote {path} and {out / 'mqar.meta.json'} ({meta['seconds']} s)")
    return rows


if __name__ == "__main__":
    main()
