"""Independent numpy implementation of racelab's estimators, for golden-file tests.

Writes small inputs, planes, Performer features and every method's output (non-causal and
causal) as .npy under tests/data/golden/. The Rust reference must match these to 1e-12.

Written from the maths of section 1 of the design notes only, in the most literal form (explicit N x M kernels,
the direct 2^P-way softmax for soft features, itertools corner order), so it shares no
code or shortcuts with the Rust side.

    pip install numpy && python3 experiments/tools/golden.py
"""
import itertools
import os

import numpy as np

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "golden")
rng = np.random.default_rng(20261130)
B, H, N, D, DV = 1, 2, 7, 5, 3
P, L, BETA, GAMMA, M_FEAT = 3, 4, 3.0, 2.5, 16

q = rng.standard_normal((B, H, N, D))
k = rng.standard_normal((B, H, N, D))
v = rng.standard_normal((B, H, N, DV))
planes = rng.standard_normal((L, P, D))
omega = rng.standard_normal((M_FEAT, D))
corners = np.array(list(itertools.product([-1, 1], repeat=P)), dtype=float)  # R x P


def kernel_attend(s, vv, causal):
    if causal:
        s = np.tril(s)
    den = s.sum(1, keepdims=True)
    num = s @ vv
    out = np.where(den == 0, 0.0, num / np.where(den == 0, 1.0, den))
    return out


def softmax_attn(qq, kk, vv, causal):
    logits = qq @ kk.T / np.sqrt(qq.shape[1])
    if causal:
        logits = np.where(np.tril(np.ones_like(logits)) > 0, logits, -np.inf)
    logits = logits - logits.max(1, keepdims=True)
    w = np.exp(logits)
    return (w @ vv) / w.sum(1, keepdims=True)


def angular_attn(qq, kk, vv, causal):
    qn = qq / np.linalg.norm(qq, axis=1, keepdims=True)
    kn = kk / np.linalg.norm(kk, axis=1, keepdims=True)
    kap = 1 - np.arccos(np.clip(qn @ kn.T, -1, 1)) / np.pi
    return kernel_attend(kap ** GAMMA, vv, causal)


def soft_phi(x, w):
    u = np.tanh(x @ w.T)  # N x P
    logits = BETA * u @ corners.T  # N x R
    logits -= logits.max(1, keepdims=True)
    e = np.exp(logits)
    return e / e.sum(1, keepdims=True)


def hard_code(x, w):
    bits = (x @ w.T >= 0).astype(int)  # N x P
    return bits @ (2 ** np.arange(P - 1, -1, -1))


def soft_attn(qq, kk, vv, causal):
    s = sum(soft_phi(qq, planes[l]) @ soft_phi(kk, planes[l]).T for l in range(L)) / L
    return kernel_attend(s, vv, causal)


def soft_authors(qq, kk, vv, causal):
    n = qq.shape[0]
    out = np.zeros((n, vv.shape[1]))
    for l in range(L):
        fq, fk = soft_phi(qq, planes[l]), soft_phi(kk, planes[l])
        for i in range(n):
            m = i + 1 if causal else kk.shape[0]
            a = fk[:m].sum(0)
            b = fk[:m].T @ vv[:m]
            out[i] += (fq[i] / (a + 1e-6)) @ b
    return out


def hard_attn(qq, kk, vv, causal):
    s = sum((hard_code(qq, planes[l])[:, None] == hard_code(kk, planes[l])[None, :]).astype(float) for l in range(L)) / L
    return kernel_attend(s, vv, causal)


def feat_attend(fq, fk, vv, causal):
    return kernel_attend(fq @ fk.T, vv, causal)


def linear_attn(qq, kk, vv, causal):
    elu1 = lambda x: np.where(x > 0, x + 1, np.exp(x))
    return feat_attend(elu1(qq), elu1(kk), vv, causal)


def performer_attn(qq, kk, vv, causal):
    c = (1 / np.sqrt(qq.shape[1])) ** 0.5
    f = lambda x: np.exp((c * x) @ omega.T - 0.5 * ((c * x) ** 2).sum(1, keepdims=True)) / np.sqrt(M_FEAT)
    return feat_attend(f(qq), f(kk), vv, causal)


METHODS = {
    "softmax": softmax_attn,
    "angular": angular_attn,
    "hard": hard_attn,
    "soft": soft_attn,
    "soft_authors": soft_authors,
    "linear": linear_attn,
    "performer": performer_attn,
}

os.makedirs(OUT, exist_ok=True)
for name, arr in [("q", q), ("k", k), ("v", v), ("planes", planes), ("omega", omega)]:
    np.save(os.path.join(OUT, f"{name}.npy"), arr)
for name, fn in METHODS.items():
    for causal in (False, True):
        o = np.stack([np.stack([fn(q[b, h], k[b, h], v[b, h], causal) for h in range(H)]) for b in range(B)])
        np.save(os.path.join(OUT, f"out_{name}_{'causal' if causal else 'full'}.npy"), o)
with open(os.path.join(OUT, "PARAMS.txt"), "w") as fh:
    fh.write(f"B={B} H={H} N={N} d={D} dv={DV} P={P} L={L} beta={BETA} gamma={GAMMA} m={M_FEAT} seed=20261130 numpy={np.__version__}\n")
print("wrote", sorted(os.listdir(OUT)))
