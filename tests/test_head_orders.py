"""Every head takes ``--order-seeds``: the orders, from one read of the store, equal separate ``--order-seed`` runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import build_store, invoke

from foal_pipe.protocol.rowcache import GroupedRows

SEEDS = (0, 3, 7)
COMMON = ["--tasks", "4", "--batch-size", "7", "--seed", "5", "--backend", "numpy"]
HEAD_ARGS = {"ncm": [], "slda": ["--shrinkage", "0.25"], "fecam": [], "balanced": ["--projection-dim", "24"],
             "dual": ["--projection-dim", "24"]}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_store(tmp_path_factory.mktemp("head-orders") / "s.zarr")


def _run(*args) -> dict:
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    return result


def _metrics(out: Path, name: str = "metrics.json") -> dict:
    return json.loads((out / name).read_text())


@pytest.mark.parametrize("head", list(HEAD_ARGS))
def test_head_orders_equal_separate_order_seed_runs(store, tmp_path, head, monkeypatch):
    from foal_pipe.protocol import walk

    reads = []  # every read of a split into a row cache
    monkeypatch.setattr(walk, "GroupedRows", lambda *a, **k: reads.append(a[0]) or GroupedRows(*a, **k))
    args = [*COMMON, "--head", head, *HEAD_ARGS[head]]
    _run("learn", "--features", store, "--out", tmp_path / "many", *args, "--order-seeds", ",".join(map(str, SEEDS)))
    assert len(reads) == 2  # the train split once and the test split once, for every order
    monkeypatch.undo()
    many = _metrics(tmp_path / "many")
    assert many["head"] == head and [o["order_seed"] for o in many["orders"]] == list(SEEDS)
    assert len({json.dumps(o["tasks"]) for o in many["orders"]}) == len(SEEDS)  # the orders differ
    for entry in many["orders"]:
        s = entry["order_seed"]
        _run("learn", "--features", store, "--out", tmp_path / f"one-{s}", *args, "--order-seed", s)
        one = _metrics(tmp_path / f"one-{s}")
        assert entry["tasks"] == one["tasks"]
        assert entry["accuracy_matrix"] == one["accuracy_matrix"]  # the same rows in the same order: equal
        assert (entry["A_avg"], entry["A_last"], entry["F"]) == (one["A_avg"], one["A_last"], one["F"])
    for key in ("A_avg", "A_last", "F"):
        values = np.array([o[key] for o in many["orders"]])
        assert many["mean"][key] == pytest.approx(values.mean(), abs=1e-15)
        assert many["std"][key] == pytest.approx(values.std(), abs=1e-15)
    first = tmp_path / f"one-{SEEDS[0]}" / "model.safetensors"
    assert (tmp_path / "many" / "model.safetensors").read_bytes() == first.read_bytes()  # the first order's model


def test_sweep_heads_with_order_seeds_equal_each_orders_sweep(store, tmp_path):
    args = ["sweep", "--features", store, *COMMON, "--projection-dim", "24", "--gammas", "0.1,1,10",
            "--heads", "ridge,ncm,slda"]
    _run(*args, "--out", tmp_path / "many", "--order-seeds", ",".join(map(str, SEEDS)))
    many = _metrics(tmp_path / "many", "sweep.json")
    singles = {}
    for s in SEEDS:
        _run(*args, "--out", tmp_path / f"one-{s}", "--order-seed", s)
        singles[s] = _metrics(tmp_path / f"one-{s}", "sweep.json")
    for entry in many["orders"]:
        one = singles[entry["order_seed"]]
        assert entry["tasks"] == one["tasks"]
        for got, expected in zip(entry["results"], one["results"], strict=True):  # ridge's sums: rows in other blocks
            assert got["accuracy_matrix"] == expected["accuracy_matrix"]
            for key in ("gcv", "loo_accuracy", "loo_mse"):
                np.testing.assert_allclose(got[key], expected[key], rtol=1e-12, atol=0)
        assert entry["heads"] == one["heads"]  # every head of every order equals that order's own sweep
    for name, head in many["heads"].items():
        per_order = [singles[s]["heads"][name] for s in SEEDS]
        for key in ("A_avg", "A_last", "F"):
            values = np.array([h[key] for h in per_order])
            assert head[key] == pytest.approx(values.mean(), abs=1e-15)
            assert head["std"][key] == pytest.approx(values.std(), abs=1e-15)
        expected = np.mean([np.concatenate(h["accuracy_matrix"]) for h in per_order], axis=0)
        np.testing.assert_allclose(np.concatenate(head["accuracy_matrix"]), expected, rtol=0, atol=1e-15)
    assert many["heads"]["ridge"]["options"]["gammas"] == [singles[s]["best_gamma"] for s in SEEDS]
    ncm_loo = np.mean([singles[s]["heads"]["ncm"]["loo_accuracy"] for s in SEEDS])
    assert many["heads"]["ncm"]["loo_accuracy"] == pytest.approx(ncm_loo, abs=1e-15)
    assert many["best_head_test"] == max(many["heads"], key=lambda h: many["heads"][h]["A_avg"])


def test_a_head_on_cos_rows_takes_order_seeds(store, tmp_path):
    """``--activation cos`` (random Fourier features, whose bias ridge's model file cannot hold) is refused for ridge
    only: a head on those rows takes ``--order-seeds`` as it takes ``--order-seed`` (the orders pick the head's
    settings check through the table ``learn`` uses; before, they refused every head with ridge's message)."""
    args = [*COMMON, "--head", "slda", "--projection-dim", "24", "--activation", "cos", "--head-rows", "activations"]
    _run("learn", "--features", store, "--out", tmp_path / "many", *args, "--order-seeds", "0,3")
    _run("learn", "--features", store, "--out", tmp_path / "one", *args, "--order-seed", "3")
    many, one = _metrics(tmp_path / "many"), _metrics(tmp_path / "one")
    assert many["orders"][1]["accuracy_matrix"] == one["accuracy_matrix"]
    ridge = invoke("learn", "--features", store, "--out", tmp_path / "ridge", *COMMON, "--projection-dim", "24",
                   "--activation", "cos", "--order-seeds", "0,3")
    assert ridge.exit_code != 0 and "projection bias" in ridge.output
