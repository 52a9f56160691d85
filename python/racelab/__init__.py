"""racelab from Python: RACE attention (soft angular LSH, arXiv:2510.04008) on numpy arrays.

- ``planes(l, p, d, seed=0)``: the hash planes ``racelab`` draws, ``[L, P, d]`` float64;
- ``attend(q, k, v, method="soft", ...)``: any operator of ``racelab attend`` (softmax,
  angular, hard, soft, linear, performer) on any device (``reference``, ``cpu``, ``cuda``),
  on ``[N, d]``, ``[H, N, d]`` or ``[B, H, N, d]`` float32/float64 arrays;
- ``racelab.torch``: ``race_attention`` (a ``torch.autograd.Function`` over the f32 CPU kernels,
  float64 through the f64 reference) and the ``RaceAttention`` module.

Soft RACE computes ``O_i = sum_l phi_l(q_i)^T B_l / sum_l phi_l(q_i)^T A_l`` with
``phi_l(x)_r = softmax_r(beta * tanh(W_l x)^T c_r)`` over the ``R = 2^P`` sign corners ``c_r``,
``A_l = sum_j phi_l(k_j)`` and ``B_l = sum_j phi_l(k_j) v_j^T`` (over ``j <= i`` when causal).

Bad input raises ``ValueError`` with the message the command line prints.
"""

import numpy as np

from . import _racelab

__version__ = _racelab.__version__

__all__ = ["planes", "attend", "cuda_available", "cpu_isa", "empty_cache", "__version__"]


def empty_cache():
    """Free the output buffers and saved contexts racelab keeps for reuse (its caching
    allocator: a training step's outputs reuse the freed buffers of the same size)."""
    _racelab.empty_cache()


def cpu_isa():
    """The level the CPU kernels run at here: ``"avx512f"``, ``"avx2+fma"`` or ``"scalar"``
    (``RACELAB_ISA`` lowers it; on aarch64 ``"scalar"``, where the native-width passes run on
    NEON, its baseline)."""
    return _racelab.cpu_isa()


def cuda_available():
    """Whether this build has the CUDA backend and a device is present."""
    return _racelab.cuda_available()


def planes(l, p, d, seed=0):
    """The ``[L, P, d]`` standard-normal hash planes that ``racelab`` draws for ``seed``."""
    return _racelab.planes(_count("l", l), _count("p", p), _count("d", d), _count("seed", seed))


def _count(name, x):
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 0:
        raise ValueError(f"invalid parameter `{name}`: {x!r} is not a non-negative integer")
    return int(x)


def _float_array(name, x):
    """``x`` as a C-contiguous float64 array, remembering its float dtype."""
    a = np.asarray(x)
    if a.dtype not in (np.float32, np.float64):
        raise ValueError(
            f"invalid parameter `{name}`: dtype {a.dtype} is not supported; "
            f"use float32 or float64 (e.g. {name}.astype(np.float32))"
        )
    return np.ascontiguousarray(a, dtype=np.float64), a.dtype


def attend(
    q,
    k,
    v,
    method="soft",
    p=2,
    l=2,
    beta=10.0,
    causal=False,
    planes=None,
    combine="paper",
    device="cpu",
    seed=0,
    *,
    gamma=2.0,
    scale=None,
    features=256,
    max_memory=None,
    return_info=False,
):
    """Run one operator as ``racelab attend`` does, on the same planes, kernels and checks.

    ``q``, ``k``: ``[..., N, d]``; ``v``: ``[..., N, dv]`` (``[N, d]``, ``[H, N, d]`` or
    ``[B, H, N, d]``), float32 or float64. The result has ``q``'s dtype and ``v``'s leading
    dimensions. ``device="cpu"`` and ``"cuda"`` compute in float32, ``"reference"`` in
    float64. ``planes`` (``[L, P, d]``) replaces the planes drawn from ``seed``. With
    ``return_info`` the result is ``(o, {"empty_rows": …, "recomputed_rows": …})``.
    """
    q64, qdtype = _float_array("q", q)
    k64, _ = _float_array("k", k)
    v64, _ = _float_array("v", v)
    w = None
    if planes is not None:
        w, _ = _float_array("planes", planes)
        if w.ndim != 3:
            raise ValueError(
                f"shape error in `planes`: got {list(w.shape)}; give [L, P, d] (racelab.planes)"
            )
    for name, x in (("beta", beta), ("gamma", gamma)):
        if isinstance(x, bool) or not isinstance(x, (int, float, np.floating, np.integer)):
            raise ValueError(f"invalid parameter `{name}`: {x!r} is not a number")
    o, empty, recomputed = _racelab.attend(
        q64,
        k64,
        v64,
        str(method),
        _count("p", p),
        _count("l", l),
        float(beta),
        bool(causal),
        w,
        str(combine),
        str(device),
        _count("seed", seed),
        float(gamma),
        None if scale is None else float(scale),
        _count("features", features),
        None if max_memory is None else _count("max_memory", max_memory),
    )
    o = o.astype(qdtype, copy=False)
    if return_info:
        return o, {"empty_rows": empty, "recomputed_rows": recomputed}
    return o
