"""Shared inputs and the path to the `racelab` binary for the command-line comparisons."""

import os
import pathlib
import shutil

import numpy as np
import pytest


def qkv(shape_qk, dv, seed=0, dtype=np.float32, scale=1.0):
    """Seeded standard-normal q, k (``shape_qk``) and v (``shape_qk[:-1] + (dv,)``)."""
    rng = np.random.default_rng(seed)
    q = (scale * rng.standard_normal(shape_qk)).astype(dtype)
    k = (scale * rng.standard_normal(shape_qk)).astype(dtype)
    v = rng.standard_normal(tuple(shape_qk[:-1]) + (dv,)).astype(dtype)
    return q, k, v


@pytest.fixture(scope="module")
def racelab_bin():
    """The command-line binary: $RACELAB_BIN, else the workspace's release build, else PATH."""
    env = os.environ.get("RACELAB_BIN")
    if env:
        assert pathlib.Path(env).is_file(), f"RACELAB_BIN={env} does not exist"
        return env
    built = pathlib.Path(__file__).resolve().parents[2] / "target" / "release" / "racelab"
    if built.is_file():
        return str(built)
    found = shutil.which("racelab")
    if found:
        return found
    pytest.skip("no racelab binary: run `cargo build --release` or set RACELAB_BIN")
