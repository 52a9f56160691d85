"""The MQAR study: its data, and the quick grid end to end (CSV and provenance)."""

import csv
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mqar  # noqa: E402


def test_batches_ask_for_each_keys_value():
    tokens, targets = mqar.batch_mqar(torch.Generator().manual_seed(0), 5, pairs=4, keys=10, values=7)
    assert tokens.shape == (5, 12) and targets.shape == (5, 12)
    for t, y in zip(tokens.tolist(), targets.tolist()):
        pairs = dict(zip(t[0:8:2], t[1:8:2]))
        assert len(pairs) == 4 and all(k < 10 <= v < 17 for k, v in pairs.items())
        assert sorted(t[8:]) == sorted(pairs)
        assert y[:8] == [-100] * 8
        assert y[8:] == [pairs[k] for k in t[8:]]


def test_state_sizes_match_the_formula():
    g = mqar.GRIDS["full"]
    by = {(s["model"], s["p"], s["l"], s["m_features"], s["beta_mode"]): s for s in mqar.specs(g)}
    race = by[("race", 3, 4, 32, "fixed")]
    assert mqar.state_floats(race, g["d_model"]) == 4 * 8 * (g["d_model"] + 1)
    assert mqar.state_floats(by[("performer", "", "", 32, "")], g["d_model"]) == 32 * (g["d_model"] + 1)
    assert mqar.state_floats(by[("softmax", "", "", "", "")], g["d_model"]) == ""


def test_quick_grid_writes_rows_with_provenance(tmp_path):
    rows = mqar.main(["--quick", "--out", str(tmp_path)])
    g = mqar.GRIDS["quick"]
    expected = len(mqar.specs(g)) * len(g["seeds"])
    with open(tmp_path / "mqar.csv") as f:
        read = list(csv.DictReader(f))
    assert len(rows) == len(read) == expected
    assert set(read[0]) == set(mqar.FIELDS)
    for r in read:
        assert 0.0 <= float(r["accuracy"]) <= 1.0
        if r["beta_mode"] == "learned":
            assert all(float(b) > 0 for b in r["beta_final"].split(";"))
    meta = json.loads((tmp_path / "mqar.meta.json").read_text())
    assert meta["grid"] == "quick" and meta["seeds"] == g["seeds"] and meta["revision"]
