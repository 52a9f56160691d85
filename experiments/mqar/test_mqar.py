"""The MQAR study: its data, and the quick grid end to end (CSV and provenance)."""

import csv
import json
import math
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


def fake_runs(accuracy):
    """A ``train_batch`` whose validation accuracy is ``accuracy(lr, scale)``."""
    def train_batch(jobs):
        return [dict(st, val_accuracy=accuracy(st["lr"], st["performer_scale"]), val_loss=1.0) for _, st in jobs]
    return train_batch


def test_a_grid_whose_choice_is_on_an_edge_grows_until_it_is_interior():
    g = mqar.GRIDS["full"]
    spec = dict(model="performer", m_features=8)
    # Best at lr = 1e-1 and scale 1/128: above and below the starting windows.
    peak = lambda lr, s: -abs(math.log10(lr) + 1) - abs(math.log2(s) + 7)
    s = mqar.Search(spec, g)
    mqar.tune([s], fake_runs(peak))
    best = s.chosen()
    assert (best["lr"], best["performer_scale"]) == (1e-1, 2.0 ** -7)
    assert s.grid("lr") == [3e-3, 1e-2, 3e-2, 1e-1, 3e-1]
    # The scale ladder ends at 1/128: that choice stays on the edge and is reported.
    assert s.grid("performer_scale")[0] == 2.0 ** -7 and s.edge() == "scale low"
    # Every setting of the final grid trained once.
    assert sorted((r["lr"], r["performer_scale"]) for r in s.results) == sorted(
        (st["lr"], st["performer_scale"]) for st in s.settings())
    rows = mqar.sweep_rows([spec], [s], 0)
    chosen = [r for r in rows if r["chosen"]]
    assert len(chosen) == 1 and chosen[0]["edge"] == "scale low"
    assert chosen[0]["lr_grid"] == "0.003;0.01;0.03;0.1;0.3"
    assert max(r["round"] for r in rows) >= 2


def test_an_interior_choice_does_not_grow_the_grid_and_is_not_an_edge():
    g = mqar.GRIDS["full"]
    s = mqar.Search(dict(model="race", m_features=8), g)
    mqar.tune([s], fake_runs(lambda lr, _: -abs(math.log10(lr) + 2)))
    assert s.grid("lr") == g["lrs"] and len(s.results) == 3
    assert s.chosen()["lr"] == 1e-2 and s.edge() == ""
    # Without widening, an edge choice is reported as one.
    s = mqar.Search(dict(model="race", m_features=8), g)
    mqar.tune([s], fake_runs(lambda lr, _: lr), widen=False)
    assert s.chosen()["lr"] == 3e-2 and s.edge() == "lr high"


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
    # One chosen setting per model, and the chosen row is the first seed's result; every
    # model tried at least three learning rates, Performer every scale with each.
    assert sum(int(r["chosen"]) for r in sweep) == len(mqar.specs(g, mqar.validated_betas()))
    for r in sweep:
        assert len(r["lr_grid"].split(";")) >= 3
        if r["model"] == "performer":
            assert len(r["scale_grid"].split(";")) >= 3
    for r in read:
        assert r["edge"] == [s["edge"] for s in sweep if int(s["chosen"]) and s["model"] == r["model"]
                             and s["p"] == r["p"] and s["l"] == r["l"] and s["m_features"] == r["m_features"]
                             and s["beta_mode"] == r["beta_mode"]][0]
    meta = json.loads((tmp_path / "mqar.meta.json").read_text())
    assert meta["grid"] == "quick" and meta["seeds"] == g["seeds"] and meta["revision"]


def test_a_run_that_diverges_is_a_result_that_is_never_chosen():
    g = dict(mqar.GRIDS["quick"], steps=5)
    spec = [s for s in mqar.specs(g, mqar.validated_betas()) if s["beta_mode"] == "fixed"][0]
    res = mqar.train(spec, dict(lr=1e6, performer_scale=""), g, 0, 1)
    assert res["diverged"] == 1 and res["val_accuracy"] == 0.0 and res["val_loss"] == math.inf
    ok = dict(val_accuracy=0.0, val_loss=3.0)
    assert mqar.choose([res, ok]) is ok
