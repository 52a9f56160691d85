"""The numpy API: planes and attend against the f64 reference, the command line, and bad input."""

import re
import subprocess

import numpy as np
import pytest

import racelab
from conftest import qkv


def algorithm1(q, k, v, w, beta, causal):
    """Soft RACE in plain numpy, f64 (independent of the library's reference)."""
    l, p, _ = w.shape
    corners = 2.0 * ((np.arange(1 << p)[:, None] >> np.arange(p)[None, :]) & 1) - 1.0

    def phi(x):
        u = np.tanh(np.einsum("nd,lpd->nlp", x, w))
        z = beta * np.einsum("nlp,rp->nlr", u, corners)
        z = np.exp(z - z.max(-1, keepdims=True))
        return (z / z.sum(-1, keepdims=True)).reshape(len(x), -1)

    fq, fk = phi(q), phi(k)
    s = fq @ fk.T
    if causal:
        s = np.tril(s)
    return (s @ v) / s.sum(-1, keepdims=True)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("p,l", [(1, 1), (2, 2), (3, 4)])
def test_soft_reference_is_algorithm1(p, l, causal):
    q, k, v = qkv((40, 8), 5, seed=p * 10 + l, dtype=np.float64)
    w = racelab.planes(l, p, 8, seed=7)
    o = racelab.attend(q, k, v, "soft", p=p, l=l, beta=3.0, causal=causal, planes=w, device="reference")
    assert o.dtype == np.float64
    np.testing.assert_allclose(o, algorithm1(q, k, v, w, 3.0, causal), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("method", ["softmax", "angular", "hard", "soft", "linear", "performer"])
@pytest.mark.parametrize("causal", [False, True])
def test_cpu_kernels_match_reference(method, causal):
    q, k, v = qkv((2, 3, 70, 16), 12, seed=1)
    if method == "linear":  # linear attention needs positive scores: elu(x) + 1 features
        q, k = np.abs(q), np.abs(k)
    ref = racelab.attend(q, k, v, method, causal=causal, device="reference", seed=4)
    cpu = racelab.attend(q, k, v, method, causal=causal, device="cpu", seed=4)
    assert cpu.shape == (2, 3, 70, 12) and cpu.dtype == np.float32
    scale = np.abs(ref).max()
    assert np.abs(cpu - ref).max() <= 1e-5 * scale, method


@pytest.mark.parametrize("shape", [(33, 8), (3, 33, 8), (2, 3, 33, 8)])
def test_shapes_and_dtypes(shape):
    for dtype in (np.float32, np.float64):
        q, k, v = qkv(shape, 4, dtype=dtype)
        o = racelab.attend(q, k, v)
        assert o.shape == shape[:-1] + (4,) and o.dtype == dtype


def test_planes_are_the_seeded_ones():
    q, k, v = qkv((3, 50, 16), 8, seed=2)
    a = racelab.attend(q, k, v, p=3, l=5, seed=11)
    b = racelab.attend(q, k, v, p=3, l=5, planes=racelab.planes(5, 3, 16, seed=11))
    np.testing.assert_array_equal(a, b)
    w = racelab.planes(5, 3, 16, seed=11)
    assert w.shape == (5, 3, 16) and w.dtype == np.float64
    np.testing.assert_array_equal(w, racelab.planes(5, 3, 16, seed=11))
    assert not np.array_equal(w, racelab.planes(5, 3, 16, seed=12))


def test_matches_the_command_line(tmp_path, racelab_bin):
    q, k, v = qkv((2, 60, 16), 8, seed=5)
    for name, x in (("q", q), ("k", k), ("v", v)):
        np.save(tmp_path / f"{name}.npy", x)
    for device in ("cpu", "reference"):
        out, saved = tmp_path / f"o-{device}.npy", tmp_path / f"w-{device}.npy"
        subprocess.run(
            [racelab_bin, "attend", "--q", str(tmp_path / "q.npy"), "--k", str(tmp_path / "k.npy"),
             "--v", str(tmp_path / "v.npy"), "--method", "soft", "--p", "3", "--l", "2",
             "--beta", "4", "--causal", "--device", device, "--seed", "9", "--out", str(out),
             "--save-planes", str(saved)],
            check=True, capture_output=True,
        )
        o = racelab.attend(q, k, v, "soft", p=3, l=2, beta=4.0, causal=True, device=device, seed=9)
        np.testing.assert_array_equal(o, np.load(out))
        np.testing.assert_array_equal(racelab.planes(2, 3, 16, seed=9), np.load(saved))


@pytest.mark.parametrize(
    "kwargs,flags",
    [
        (dict(p=0), ["--p", "0"]),
        (dict(l=0), ["--l", "0"]),
        (dict(beta=-1.0), ["--beta", "-1"]),
        (dict(p=21), ["--p", "21"]),
        (dict(p=20, l=100, device="cpu"), ["--p", "20", "--l", "100", "--device", "cpu"]),
        (dict(combine="authors", device="cpu"), ["--combine", "authors", "--device", "cpu"]),
        (dict(method="hard", device="cuda"), ["--method", "hard", "--device", "cuda"]),
    ],
)
def test_errors_match_the_command_line(tmp_path, racelab_bin, kwargs, flags):
    q, k, v = qkv((30, 8), 4)
    for name, x in (("q", q), ("k", k), ("v", v)):
        np.save(tmp_path / f"{name}.npy", x)
    with pytest.raises(ValueError) as err:
        racelab.attend(q, k, v, **kwargs)
    args = [racelab_bin, "attend", "--q", str(tmp_path / "q.npy"), "--k", str(tmp_path / "k.npy"),
            "--v", str(tmp_path / "v.npy"), "--out", str(tmp_path / "o.npy")]
    if "method" not in kwargs:
        args += ["--method", "soft"]
    run = subprocess.run(args + flags, capture_output=True, text=True)
    assert run.returncode != 0
    # The same message, each in its front end's words: the command line's `--max-memory`,
    # `--device reference`, `--p 2` are Python's `max_memory=`, `device="reference"`, `p=2`.
    # Both are brought to one neutral form (`max_memory`, `device reference`, `p 2`).
    assert "--" not in str(err.value), str(err.value)
    def neutral(s):
        s = re.sub(r"--([a-z][a-z-]*)", lambda m: m.group(1).replace("-", "_"), s)
        s = re.sub(r'\b(\w+)="([^"]*)"', r"\1 \2", s)
        s = re.sub(r"\b(\w+)=(?=[-\d.])", r"\1 ", s)
        s = re.sub(r"\b(\w+)=", r"\1", s)
        # The command line checks memory before reading its files, so its estimate counts
        # the files as read too: the same refusal, about a different number of bytes.
        return re.sub(r"needs about [^)]*\)", "needs about …)", s)
    assert neutral(str(err.value)) in neutral(run.stderr), (str(err.value), run.stderr)


def test_bad_input_raises_value_error():
    q, k, v = qkv((30, 8), 4)
    cases = [
        (dict(q=q.astype(np.int64)), "`q`"),
        (dict(v=v[:20]), "`v`"),
        (dict(k=k[:, :6]), "`k`"),
        (dict(q=np.where(np.arange(8) == 3, np.nan, q).astype(np.float32)), "`q` contains a non-finite"),
        (dict(q=np.zeros((2, 2, 2, 30, 8), np.float32)), "`q`"),
        (dict(method="nope"), "`method`"),
        (dict(device="gpu"), "`device`"),
        (dict(combine="mean"), "`combine`"),
        (dict(beta=float("nan")), "`beta`"),
        (dict(beta="10"), "`beta`"),
        (dict(p=-1), "`p`"),
        (dict(planes=np.zeros((2, 2), np.float64)), "`planes`"),
        (dict(planes=racelab.planes(2, 2, 9)), "`planes`"),
        (dict(causal=True, k=k[:20], v=v[:20]), "`q/k`"),
        (dict(max_memory=1000), "max_memory="),
        # The one validation reaches the Python entry on every device.
        (dict(method="performer", features=0, device="cpu"), "`features`"),
        (dict(method="performer", features=0, device="reference"), "`features`"),
        (dict(method="performer", scale=-1.0, device="cpu"), "`scale`"),
        (dict(method="softmax", scale=-1.0, device="reference"), "`scale`"),
        # Logits past the kernels' type (they made NaN rows): refused by the same validation.
        (dict(method="softmax", scale=1e39, device="cpu"), "`scale`"),
        (dict(method="performer", scale=1e308, device="reference"), "`scale`"),
        (dict(q=q[:0], k=k[:0], v=v[:0]), "`q` is empty"),
    ]
    for change, needle in cases:
        args = dict(q=q, k=k, v=v)
        args.update({key: val for key, val in change.items() if key in args})
        kw = {key: val for key, val in change.items() if key not in ("q", "k", "v")}
        with pytest.raises(ValueError) as err:
            racelab.attend(args["q"], args["k"], args["v"], **kw)
        assert needle in str(err.value), (change.keys(), str(err.value))


def test_cuda_without_a_device_is_a_clear_error():
    if racelab.cuda_available():
        pytest.skip("a CUDA device is present; the no-device error cannot be observed")
    q, k, v = qkv((30, 8), 4)
    with pytest.raises(ValueError, match="(?i)cuda"):
        racelab.attend(q, k, v, device="cuda")


def test_planes_too_large_for_memory_are_refused_before_allocation():
    # 10^9 × 4 × 10^4 f64 planes (320 TB): a clear error naming l, p and d, not an abort.
    with pytest.raises(ValueError) as err:
        racelab.planes(10**9, 4, 10**4)
    assert "planes [L, P, d]" in str(err.value) and "smaller l, p or d" in str(err.value), str(err.value)
    # A product that overflows 64 bits is refused the same way.
    with pytest.raises(ValueError):
        racelab.planes(2**62, 4, 2**10)
