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
    by = {(s["model"], s["p"], s["l"], s["m_features"], s["beta_mode"]): s
          for s in mqar.specs(g, mqar.validated_betas())}
    race = by[("race", 3, 4, 32, "fixed")]
    assert mqar.state_floats(race, g["d_model"]) == 4 * 8 * (g["d_model"] + 1)
    assert mqar.state_floats(by[("performer", "", "", 32, "")], g["d_model"]) == 32 * (g["d_model"] + 1)
    assert mqar.state_floats(by[("softmax", "", "", "", "")], g["d_model"]) == ""


def test_beta_starts_fixed_and_learned_at_the_validated_beta_and_at_the_authors():
    g = mqar.GRIDS["full"]
    validated = mqar.validated_betas()
    race = [s for s in mqar.specs(g, validated) if s["model"] == "race"]
    for s in race:
        if s["beta_mode"] == "learned-authors":
            assert abs(s["beta_start"] - g["d_model"] ** -0.5) < 1e-12
        else:
            assert s["beta_start"] == validated[(s["p"], s["l"])]
    assert {s["beta_mode"] for s in race} == {"fixed", "learned", "learned-authors"}


def test_log_temp_trains_on_its_own_learning_rate():
    g = dict(mqar.GRIDS["quick"], steps=1)
    spec = [s for s in mqar.specs(g, mqar.validated_betas()) if s["beta_mode"] == "learned"][0]
    seen = {}
    real = mqar.torch.optim.AdamW

    def spy(groups, **kw):
        seen["groups"] = [dict(gr) for gr in groups]  # as asked, before any schedule
        return real(groups, **kw)

    mqar.torch.optim.AdamW = spy
    try:
        mqar.train(spec, dict(lr=3e-3, performer_scale=""), g, 0, 1)
    finally:
        mqar.torch.optim.AdamW = real
    temp = [gr for gr in seen["groups"] if gr.get("lr") == g["beta_lr"]]
    assert len(temp) == 1 and len(temp[0]["params"]) == 2 and temp[0]["weight_decay"] == 0.0


def test_choose_takes_the_best_validation_accuracy_then_the_lower_loss():
    rs = [dict(val_accuracy=0.5, val_loss=1.0), dict(val_accuracy=0.7, val_loss=2.0),
          dict(val_accuracy=0.7, val_loss=1.5), dict(val_accuracy=0.6, val_loss=0.1)]
    assert mqar.choose(rs) is rs[2]
    assert mqar.choose(rs[:2]) is rs[1]


def test_quick_grid_writes_rows_with_provenance(tmp_path):
    rows = mqar.main(["--quick", "--out", str(tmp_path)])
    g = mqar.GRIDS["quick"]
    expected = len(mqar.specs(g, mqar.validated_betas())) * len(g["seeds"])
    with open(tmp_path / "mqar.csv") as f:
        read = list(csv.DictReader(f))
    assert len(rows) == len(read) == expected
    assert set(read[0]) == set(mqar.FIELDS)
    for r in read:
        assert 0.0 <= float(r["accuracy"]) <= 1.0
        if r["beta_mode"] == "learned":
            assert all(float(b) > 0 for b in r["beta_final"].split(";"))
    with open(tmp_path / "mqar_sweep.csv") as f:
        sweep = list(csv.DictReader(f))
    # One chosen setting per model, and the chosen row is the first seed's result.
    assert sum(int(r["chosen"]) for r in sweep) == len(mqar.specs(g, mqar.validated_betas()))
    meta = json.loads((tmp_path / "mqar.meta.json").read_text())
    assert meta["grid"] == "quick" and meta["seeds"] == g["seeds"] and meta["revision"]
