"""Soft RACE attention for PyTorch.

- ``race_attention(q, k, v, planes, beta, causal=False, combine="paper")``: a
  ``torch.autograd.Function`` with gradients in ``q``, ``k``, ``v`` and ``beta``. float32
  tensors run racelab's production CPU kernels (forward and backward, the forward's saved
  values kept for the backward); float64 tensors run the f64 log-domain reference (exact at
  any beta; quadratic in N, for checking and ``gradcheck``).
- ``RaceAttention``: an ``nn.Module`` holding the planes as a buffer, with beta fixed or
  learnable in the authors' parametrisation ``beta = exp(log_temp) / sqrt(d_head)``.
- ``plain_race_attention``: Algorithm 1 and 2 written in plain PyTorch (autograd does the
  backward; causal as chunked linear attention), the baseline the tests and the benchmark
  compare with.

Inputs are ``[N, d]``, ``[H, N, d]`` or ``[B, H, N, d]`` (non-contiguous tensors are copied).
CUDA tensors raise ``ValueError``: this build has no GPU path tested from PyTorch. The
authors' combine rule has no kernel and no backward, and is refused here (``racelab.attend``
computes its forward on the reference).
"""

import math

import warnings

import numpy as np
import torch
from torch import nn

from . import _racelab
from . import planes as _draw_planes

__all__ = ["race_attention", "RaceAttention", "plain_race_attention", "causal_linear_attention"]


def _check(q, k, v, planes, combine):
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"invalid parameter `{name}`: expected a torch.Tensor, got {type(x).__name__}")
        if x.is_cuda or x.device.type != "cpu":
            raise ValueError(
                f"invalid parameter `{name}`: tensors on {x.device} are not supported; racelab's "
                "PyTorch path runs on the CPU (move them with .cpu())"
            )
        if x.dim() not in (2, 3, 4):
            raise ValueError(
                f"shape error in `{name}`: got {list(x.shape)}; give [N, d], [H, N, d] or [B, H, N, d]"
            )
    if len({q.dtype, k.dtype, v.dtype}) != 1 or q.dtype not in (torch.float32, torch.float64):
        raise ValueError(
            f"invalid parameter `q/k/v`: dtypes {q.dtype}, {k.dtype}, {v.dtype}; give all three "
            "as torch.float32 (CPU kernels) or torch.float64 (f64 reference)"
        )
    if q.dim() != k.dim() or q.dim() != v.dim() or q.shape[:-2] != k.shape[:-2] or k.shape[:-1] != v.shape[:-1]:
        raise ValueError(
            f"shape error in `q/k/v`: q {list(q.shape)}, k {list(k.shape)}, v {list(v.shape)}; "
            "they must share leading dimensions, and k and v their token count"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"shape error in `k`: k has d = {k.shape[-1]} but q has d = {q.shape[-1]}; q and k "
            "must share the last dimension"
        )
    # As the command line words them (`racelab attend` refuses the same inputs).
    for name, x in (("q", q), ("k", k)):
        if x.shape[-2] == 0:
            raise ValueError(f"`{name}` is empty: N = 0 tokens; give at least one row")
    for name, x in (("q", q), ("v", v)):
        if x.shape[-1] == 0:
            raise ValueError(f"`{name}` is empty: feature dimension is 0")
    if q.numel() == 0:
        raise ValueError("`q` is empty: batch or head dimension is 0")
    if combine != "paper":
        if combine == "authors":
            raise ValueError(
                "invalid parameter `combine`: the authors' combine rule has no kernel and no "
                "backward; use combine=\"paper\" (racelab.attend(..., combine=\"authors\", "
                "device=\"reference\") computes its forward)"
            )
        raise ValueError(f"invalid parameter `combine`: `{combine}` is not a combine rule; use `paper`")
    if isinstance(planes, torch.Tensor):
        if planes.requires_grad:
            _warn_planes_once()
        planes = planes.detach().cpu().double().numpy()
    w = np.ascontiguousarray(np.asarray(planes, dtype=np.float64))
    if w.ndim != 3:
        raise ValueError(f"shape error in `planes`: got {list(w.shape)}; give [L, P, d] (racelab.planes)")
    return w


_planes_warned = False


def _warn_planes_once():
    """The planes are fixed hash planes: they get no gradient. Say so once per process."""
    global _planes_warned
    if not _planes_warned:
        _planes_warned = True
        warnings.warn(
            "racelab: `planes` requires a gradient, but soft RACE's hash planes are fixed and get "
            "none; pass planes.detach() (or learn beta, or the projections feeding q and k)",
            UserWarning,
            stacklevel=4,
        )


def _heads(x):
    """``[..., n, c]`` as a contiguous ``[heads, n, c]`` tensor (a view when already contiguous)."""
    return x.detach().reshape(-1, x.shape[-2], x.shape[-1]).contiguous()


def _beta_value(beta):
    if isinstance(beta, torch.Tensor):
        if beta.numel() != 1:
            raise ValueError(f"invalid parameter `beta`: a tensor of {beta.numel()} values; give one")
        return float(beta.detach().cpu().reshape(()))
    if isinstance(beta, bool) or not isinstance(beta, (int, float, np.floating, np.integer)):
        raise ValueError(f"invalid parameter `beta`: {beta!r} is not a number")
    return float(beta)


class _SoftRace(torch.autograd.Function):
    """Soft RACE on the CPU: f32 production kernels, or the f64 reference for float64."""

    @staticmethod
    def forward(ctx, q, k, v, beta_t, planes, beta, causal):
        q3, k3, v3 = _heads(q), _heads(k), _heads(v)
        if q.dtype == torch.float32:
            o, saved = _racelab.soft_forward(q3.numpy(), k3.numpy(), v3.numpy(), planes, beta, causal)
            ctx.saved = saved
        else:
            o = _racelab.soft_forward_f64(q3.numpy(), k3.numpy(), v3.numpy(), planes, beta, causal, "paper")
        o = torch.from_numpy(o)
        ctx.save_for_backward(q3, k3, v3, o)
        ctx.shapes = (q.shape, k.shape, v.shape)
        ctx.planes, ctx.beta, ctx.causal = planes, beta, causal
        ctx.beta_like = (beta_t.dtype, beta_t.shape)
        return o.reshape(*q.shape[:-1], v.shape[-1])

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        q3, k3, v3, o = ctx.saved_tensors
        g3 = g.detach().reshape(o.shape).to(o.dtype).contiguous()
        if o.dtype == torch.float32:
            dq, dk, dv, dbeta = _racelab.soft_backward(
                ctx.saved, q3.numpy(), k3.numpy(), v3.numpy(), o.numpy(), g3.numpy()
            )
        else:
            dq, dk, dv, dbeta = _racelab.soft_backward_f64(
                q3.numpy(), k3.numpy(), v3.numpy(), g3.numpy(), ctx.planes, ctx.beta, ctx.causal
            )
        qs, ks, vs = ctx.shapes
        grads = [torch.from_numpy(dq).reshape(qs), torch.from_numpy(dk).reshape(ks), torch.from_numpy(dv).reshape(vs)]
        dtype, shape = ctx.beta_like
        dbeta_t = torch.tensor(dbeta, dtype=dtype).reshape(shape) if ctx.needs_input_grad[3] else None
        return grads[0], grads[1], grads[2], dbeta_t, None, None, None


def race_attention(q, k, v, planes, beta, causal=False, combine="paper"):
    """Soft RACE attention ``O = sum_l phi_l(q)^T B_l / sum_l phi_l(q)^T A_l`` (Algorithm 1,
    or causal Algorithm 2), differentiable in ``q``, ``k``, ``v`` and ``beta``.

    ``q``, ``k``: ``[..., N, d]``; ``v``: ``[..., N, dv]``; ``planes``: ``[L, P, d]`` (tensor or
    array; ``racelab.planes``); ``beta``: a float or a one-element tensor (it gets a gradient
    when it requires one). float32 runs the CPU kernels, float64 the f64 reference.
    """
    w = _check(q, k, v, planes, combine)
    b = _beta_value(beta)
    beta_t = beta if isinstance(beta, torch.Tensor) else torch.tensor(b, dtype=q.dtype)
    return _SoftRace.apply(q, k, v, beta_t, w, b, bool(causal))


class RaceAttention(nn.Module):
    """Soft RACE attention over ``[B, H, N, d_head]`` queries, keys and values.

    The ``[L, P, d_head]`` planes (``racelab.planes(l, p, d_head, seed)``) are a buffer. With
    ``learn_beta`` the inverse temperature is learned in the authors' parametrisation
    ``beta = exp(log_temp) / sqrt(d_head)``, starting from ``beta``.
    """

    def __init__(self, d_head, p=2, l=2, beta=10.0, learn_beta=False, causal=False, seed=0):
        super().__init__()
        if not (isinstance(beta, (int, float)) and math.isfinite(beta) and beta > 0):
            raise ValueError(f"invalid parameter `beta`: {beta!r}; use a finite value > 0")
        self.d_head, self.p, self.l, self.causal = d_head, p, l, bool(causal)
        self.register_buffer("planes", torch.from_numpy(_draw_planes(l, p, d_head, seed)))
        if learn_beta:
            self.log_temp = nn.Parameter(torch.tensor(math.log(beta * math.sqrt(d_head))))
        else:
            self.register_buffer("fixed_beta", torch.tensor(float(beta), dtype=torch.float64))

    @property
    def beta(self):
        """The inverse temperature now (a tensor; learnable or fixed)."""
        if hasattr(self, "log_temp"):
            return torch.exp(self.log_temp) / math.sqrt(self.d_head)
        return self.fixed_beta

    def forward(self, q, k, v):
        beta = self.beta
        if isinstance(beta, torch.Tensor):
            beta = beta.to(q.dtype)
        return race_attention(q, k, v, self.planes, beta, causal=self.causal)

    def extra_repr(self):
        learn = hasattr(self, "log_temp")
        return f"d_head={self.d_head}, p={self.p}, l={self.l}, learn_beta={learn}, causal={self.causal}"


def _corners(p, dtype):
    """The ``2^P`` sign corners ``c_r`` in ``{-1, +1}^P`` (bit ``b`` of ``r`` set: ``+1``)."""
    r = torch.arange(1 << p)
    bits = (r[:, None] >> torch.arange(p)[None, :]) & 1
    return (2 * bits - 1).to(dtype)


def _features(x, planes, beta):
    """``phi(x)``: ``[..., N, L*R]``, ``softmax_r(beta * tanh(W_l x)^T c_r)`` per table."""
    l, p, _ = planes.shape
    u = torch.tanh(torch.einsum("...nd,lpd->...nlp", x, planes))
    logits = beta * torch.einsum("...nlp,rp->...nlr", u, _corners(p, x.dtype))
    return torch.softmax(logits, dim=-1).flatten(-2)


def plain_race_attention(q, k, v, planes, beta, causal=False, chunk=64):
    """Algorithm 1 (or causal Algorithm 2) in plain PyTorch; autograd gives the backward.

    Non-causal: ``A = sum_j phi(k_j)``, ``B = phi(K)^T V``, ``O = phi(Q) B / phi(Q) A``. Causal:
    chunked linear attention, the masked intra-chunk product plus the state entering each
    chunk (an exclusive cumulative sum over chunks), never an ``N x L*R x dv`` tensor.
    """
    if not isinstance(planes, torch.Tensor):
        planes = torch.as_tensor(np.asarray(planes))
    planes = planes.to(q.dtype)
    fq, fk = _features(q, planes, beta), _features(k, planes, beta)
    if not causal:
        num = fq @ (fk.transpose(-1, -2) @ v)
        den = fq @ fk.sum(-2).unsqueeze(-1)
        return num / den
    return causal_linear_attention(fq, fk, v, chunk)


def causal_linear_attention(fq, fk, v, chunk=64):
    """``O_i = sum_{j<=i} (fq_i . fk_j) v_j / sum_{j<=i} fq_i . fk_j`` for non-negative features
    ``fq``, ``fk`` (``[..., N, m]``) and values ``v`` (``[..., N, dv]``), as chunked linear
    attention: the masked product inside each chunk of ``chunk`` tokens plus the state
    ``[sum fk v^T | sum fk]`` entering it (an exclusive cumulative sum over chunks)."""
    n = fq.shape[-2]
    pad = (-n) % chunk
    if pad:
        # Padded keys sit after every real query, so the causal mask hides them.
        fq = torch.nn.functional.pad(fq, (0, 0, 0, pad))
        fk = torch.nn.functional.pad(fk, (0, 0, 0, pad))
        v = torch.nn.functional.pad(v, (0, 0, 0, pad))
    c = (n + pad) // chunk
    fq = fq.unflatten(-2, (c, chunk))
    fk = fk.unflatten(-2, (c, chunk))
    ve = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1).unflatten(-2, (c, chunk))
    state = fk.transpose(-1, -2) @ ve  # [..., c, LR, dv+1]
    entering = torch.cumsum(state, dim=-3) - state
    mask = torch.ones(chunk, chunk, dtype=torch.bool).tril()
    scores = (fq @ fk.transpose(-1, -2)).masked_fill(~mask, 0.0)
    out = scores @ ve + fq @ entering
    out = out.flatten(-3, -2)[..., :n, :]
    return out[..., :-1] / out[..., -1:]
