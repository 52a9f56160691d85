"""racelab.torch: gradients against gradcheck and a plain PyTorch Algorithm 1/2, the module,
the GIL, and bad input."""

import warnings
import math
import threading
import time

import numpy as np
import pytest
import torch

import racelab
from racelab.torch import RaceAttention, plain_race_attention, race_attention
from conftest import qkv


def tensors(shape, dv, seed, dtype=torch.float32, scale=1.0):
    q, k, v = qkv(shape, dv, seed=seed, scale=scale)
    return [torch.tensor(x, dtype=dtype, requires_grad=True) for x in (q, k, v)]


def rel(a, b):
    """Largest absolute difference over the largest magnitude of the reference ``b``."""
    return (a.double() - b.double()).abs().max().item() / b.double().abs().max().item()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("p,l", [(1, 2), (2, 2)])
def test_gradcheck_f64(p, l, causal):
    q, k, v = tensors((2, 9, 5), 3, seed=p + 3 * l, dtype=torch.float64)
    beta = torch.tensor(1.5, dtype=torch.float64, requires_grad=True)
    w = racelab.planes(l, p, 5, seed=1)
    f = lambda q, k, v, beta: race_attention(q, k, v, w, beta, causal=causal)  # noqa: E731
    assert torch.autograd.gradcheck(f, (q, k, v, beta), eps=1e-6, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "shape,dv,p,l",
    [((1, 2, 300, 16), 16, 1, 1), ((2, 2, 1000, 32), 24, 2, 2), ((1, 3, 777, 64), 64, 3, 4), ((513, 8), 5, 4, 2)],
)
def test_kernels_match_plain_pytorch(shape, dv, p, l, causal):
    """Forward within 1e-5 and gradients within 1e-4 of plain autograd (f64, same f32 inputs)."""
    q, k, v = tensors(shape, dv, seed=sum(shape) + p)
    beta = torch.tensor(6.0, requires_grad=True)
    w = racelab.planes(l, p, shape[-1], seed=2)
    w32 = torch.from_numpy(w).float()
    o = race_attention(q, k, v, w, beta, causal=causal)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    b64 = torch.tensor(6.0, dtype=torch.float64, requires_grad=True)
    o64 = plain_race_attention(q64, k64, v64, w32.double(), b64, causal=causal)
    assert o.dtype == torch.float32 and o.shape == o64.shape
    assert rel(o, o64) <= 1e-5
    g = torch.randn(o64.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    got = torch.autograd.grad((o * g.float()).sum(), (q, k, v, beta))
    want = torch.autograd.grad((o64 * g).sum(), (q64, k64, v64, b64))
    for name, a, b in zip(("dq", "dk", "dv"), got[:3], want[:3]):
        assert rel(a, b) <= 1e-4, name
    # dbeta is one sum over every output entry, with cancellation: its error is relative to
    # the sum of its terms' magnitudes, sum |g * dO/dbeta| (dO/dbeta by forward mode, f64).
    _, do_dbeta = torch.func.jvp(
        lambda b: plain_race_attention(q64.detach(), k64.detach(), v64.detach(), w32.double(), b, causal=causal),
        (b64.detach(),),
        (torch.ones((), dtype=torch.float64),),
    )
    terms = (g * do_dbeta).abs().sum().item()
    assert abs(got[3].item() - want[3].item()) <= 1e-4 * terms, (got[3].item(), want[3].item(), terms)


@pytest.mark.parametrize("causal", [False, True])
def test_cached_outputs_are_overwritten(causal):
    """Outputs reuse freed buffers of the same size: every entry must be written again."""
    w = racelab.planes(2, 2, 16, seed=1)
    for seed in (20, 21, 22):
        q, k, v = tensors((2, 300, 16), 16, seed=seed)
        o = race_attention(q, k, v, w, 4.0, causal=causal)
        o64 = plain_race_attention(*(x.detach().double() for x in (q, k, v)), torch.from_numpy(w).float().double(), 4.0, causal=causal)
        assert rel(o, o64) <= 1e-5
        o.sum().backward()
        q64 = q.detach().double().requires_grad_()
        plain_race_attention(q64, k.detach().double(), v.detach().double(), torch.from_numpy(w).float().double(), 4.0, causal=causal).sum().backward()
        assert rel(q.grad, q64.grad) <= 1e-4
        del o, q, k, v
    racelab.empty_cache()


def test_plain_causal_is_independent_of_chunk():
    q, k, v = tensors((2, 100, 8), 4, seed=5, dtype=torch.float64)
    w = torch.from_numpy(racelab.planes(2, 2, 8))
    a = plain_race_attention(q, k, v, w, 3.0, causal=True, chunk=7)
    b = plain_race_attention(q, k, v, w, 3.0, causal=True, chunk=128)
    assert rel(a, b) <= 1e-12


def test_float64_is_the_reference():
    q, k, v = tensors((2, 40, 8), 6, seed=6, dtype=torch.float64)
    w = racelab.planes(3, 2, 8, seed=4)
    for causal in (False, True):
        o = race_attention(q, k, v, w, 2.0, causal=causal)
        ref = racelab.attend(*(x.detach().numpy() for x in (q, k, v)), "soft", p=2, l=3, beta=2.0,
                             causal=causal, planes=w, device="reference")
        assert o.dtype == torch.float64
        np.testing.assert_allclose(o.detach().numpy(), ref, rtol=1e-12, atol=1e-14)


def test_non_contiguous_inputs_are_copied():
    q, k, v = tensors((2, 4, 64, 16), 16, seed=7)
    w = racelab.planes(2, 2, 16)
    qt, kt, vt = (x.detach().transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))
    qs = q.detach().transpose(1, 2).contiguous().transpose(1, 2)
    assert not qs.is_contiguous()
    a = race_attention(q, k, v, w, 5.0)
    b = race_attention(qs, kt, vt, w, 5.0)
    assert torch.equal(a, b)


def test_module_fixed_and_learned_beta():
    d = 16
    fixed = RaceAttention(d, p=2, l=3, beta=4.0, seed=3)
    learned = RaceAttention(d, p=2, l=3, beta=4.0, learn_beta=True, seed=3)
    assert [n for n, _ in fixed.named_parameters()] == []
    assert [n for n, _ in learned.named_parameters()] == ["log_temp"]
    assert math.isclose(float(learned.beta.detach()), 4.0, rel_tol=1e-6)
    assert math.isclose(float(learned.log_temp.detach()), math.log(4.0 * math.sqrt(d)), rel_tol=1e-6)
    np.testing.assert_array_equal(fixed.planes.numpy(), racelab.planes(3, 2, d, seed=3))
    q, k, v = tensors((1, 2, 50, d), 8, seed=8)
    np.testing.assert_allclose(fixed(q, k, v).detach(), learned(q, k, v).detach(), rtol=1e-6, atol=1e-7)
    learned(q, k, v).square().sum().backward()
    # d loss / d log_temp = d loss / d beta * beta (chain rule through exp), checked in f64.
    b = torch.tensor(4.0, dtype=torch.float64, requires_grad=True)
    o64 = plain_race_attention(*(x.detach().double() for x in (q, k, v)), fixed.planes.float().double(), b)
    (dbeta,) = torch.autograd.grad(o64.square().sum(), (b,))
    assert math.isclose(learned.log_temp.grad.item(), dbeta.item() * 4.0, rel_tol=1e-3)
    assert "learn_beta=True" in repr(learned)


def test_training_step_reduces_loss():
    torch.manual_seed(0)
    layer = RaceAttention(8, p=2, l=2, beta=2.0, learn_beta=True, causal=True)
    proj = torch.nn.Linear(8, 24)
    opt = torch.optim.Adam(list(layer.parameters()) + list(proj.parameters()), lr=1e-2)
    x = torch.randn(4, 1, 32, 8)
    target = torch.roll(x, 1, dims=2)
    losses = []
    for _ in range(30):
        q, k, v = proj(x).split(8, dim=-1)
        loss = (layer(q, k, v) - target).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_gil_is_released_while_kernels_run():
    q, k, v = tensors((1, 1 << 17, 64), 64, seed=9)
    w = racelab.planes(4, 3, 64)
    span = {}

    def work():
        span["start"] = time.perf_counter()
        with torch.no_grad():
            race_attention(q, k, v, w, 3.0)
        span["end"] = time.perf_counter()

    ticks = []
    t = threading.Thread(target=work)
    t.start()
    while t.is_alive():
        ticks.append(time.perf_counter())
    t.join()
    lo, hi = span["start"], span["end"]
    mid = [x for x in ticks if lo + 0.25 * (hi - lo) < x < hi - 0.25 * (hi - lo)]
    assert hi - lo > 0.005, "the call was too short to observe"
    assert len(mid) > 10, f"the main thread ran {len(mid)} times in the middle of a {hi - lo:.3f} s call"


def test_bad_input_raises_value_error():
    q, k, v = tensors((1, 2, 20, 8), 4, seed=10)
    w = racelab.planes(2, 2, 8)
    cases = [
        (lambda: race_attention(q, k, v, w, 1.0, combine="authors"), "`combine`"),
        (lambda: race_attention(q, k, v, w, 1.0, combine="mean"), "`combine`"),
        (lambda: race_attention(q, k, v.double(), w, 1.0), "`q/k/v`"),
        (lambda: race_attention(q.long(), k.long(), v.long(), w, 1.0), "`q/k/v`"),
        (lambda: race_attention(q, k[..., :6], v, w, 1.0), "k has d = 6 but q has d = 8"),
        (lambda: race_attention(q[..., :0, :], k[..., :0, :], v[..., :0, :], w, 1.0), "`q` is empty: N = 0"),
        (lambda: race_attention(q, k, v[..., :0], w, 1.0), "`v` is empty"),
        (lambda: race_attention(q[..., :0], k[..., :0], v, w, 1.0), "`q` is empty"),
        (lambda: race_attention(q, k, v, racelab.planes(2, 2, 9), 1.0), "planes have d = 9"),
        (lambda: race_attention(q, k, v, w[0], 1.0), "`planes`"),
        (lambda: race_attention(q, k, v, w, -1.0), "`beta`"),
        (lambda: race_attention(q, k, v, w, float("inf")), "`beta`"),
        (lambda: race_attention(q, k, v, w, torch.ones(2)), "`beta`"),
        (lambda: race_attention(q.detach().clone().fill_(float("nan")), k, v, w, 1.0), "`q`"),
        (lambda: race_attention(q[0, 0], k, v, w, 1.0), "`q/k/v`"),
        (lambda: race_attention(q, k, v, np.zeros((100, 20, 8)), 1.0), "memory"),
        (lambda: race_attention(q.to("meta"), k, v, w, 1.0), "`q`"),
        (lambda: race_attention(q.numpy(force=True), k, v, w, 1.0), "`q`"),
        (lambda: RaceAttention(8, beta=0.0), "`beta`"),
        # Planes too large for memory are refused before they are allocated (they aborted).
        (lambda: RaceAttention(d_head=8, p=2, l=10**12), "smaller l, p or d"),
    ]
    for i, (call, needle) in enumerate(cases):
        with pytest.raises(ValueError) as err:
            call()
        assert needle in str(err.value), (i, str(err.value))


def test_planes_that_require_a_gradient_warn_once():
    q, k, v = tensors((1, 2, 20, 8), 4, seed=11)
    w = torch.from_numpy(racelab.planes(2, 2, 8)).requires_grad_(True)
    racelab.torch._planes_warned = False
    with pytest.warns(UserWarning, match="planes.*get none"):
        race_attention(q, k, v, w, 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        race_attention(q, k, v, w, 1.0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the CUDA-tensor error cannot be observed")
def test_cuda_tensors_are_refused():
    q, k, v = tensors((1, 2, 20, 8), 4, seed=11)
    with pytest.raises(ValueError, match="cpu"):
        race_attention(q.cuda(), k.cuda(), v.cuda(), racelab.planes(2, 2, 8), 1.0)
