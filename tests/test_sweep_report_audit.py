"""Sweep audit (reports): what `summary`, `evaluate`, timings.json and the messages of `sweep` say.

Before: `summary` showed a `sweep --order-seeds`' means without their std; `--order-seeds` wrote a timings.json of
`total` alone and printed an empty step list ("13 gammas in 0.8 s:  ->"); a one-pass `--order-seeds` said the
uneven split's note once per order; `--gammas 1,1e-3000` said "lists 0"; a sampled sweep's choice read "by
leave-one-out MSE on the training rows seen" in summary.md and "by LOO MSE" in `summary`.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from helpers import assert_one_line_error, build_store, invoke, runner

from foal_pipe.cli import app

SWEEP = ("--tasks", 4, "--projection-dim", 24, "--seed", 3, "--backend", "numpy", "--gammas", "0.1,1,10")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return build_store(tmp_path_factory.mktemp("store") / "s.zarr", n_train=300, n_test=120)


def _sweep(store, out, *extra):
    result = invoke("sweep", "--features", store, "--out", out, *SWEEP, *extra)
    assert result.exit_code == 0, result.output
    return result, json.loads((out / "sweep.json").read_text())


def _summary(*paths):
    result = runner.invoke(app, ["summary", *map(str, paths)], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    return result.output


def _spread(values):
    return f"{100 * np.mean(values):.2f} ± {100 * np.std(values):.2f}"


def test_summary_shows_a_sweep_of_many_orders_as_mean_and_std(store, tmp_path):
    _, report = _sweep(store, tmp_path / "sw", "--order-seeds", "0,1,2", "--heads", "ridge,ncm")
    out = _summary(tmp_path / "sw")
    gamma = report["best_gamma"]
    at = [next(r for r in o["results"] if r["gamma"] == gamma) for o in report["orders"]]
    cells = [_spread([r[key] for r in at]) for key in ("A_avg", "A_last", "F")]
    assert re.search(rf"{gamma:g}\*\s+" + r"\s+".join(map(re.escape, cells)), out), out
    assert "3 class orders" in out
    ncm = [o["heads"]["ncm"] for o in report["orders"]]
    assert re.search(r"\s+".join(re.escape(_spread([h[key] for h in ncm])) for key in ("A_avg", "A_last", "F")), out), out
    single = tmp_path / "one"
    _sweep(store, single)
    assert "±" not in _summary(single)  # one order: its numbers alone


@pytest.mark.parametrize("extra", [(), ("--loo-sample", 0)], ids=["one-pass", "walk-per-order"])
def test_order_seeds_timings_hold_the_steps(store, tmp_path, extra):
    result, _ = _sweep(store, tmp_path / "sw", "--order-seeds", "0,1", *extra)
    timings = json.loads((tmp_path / "sw" / "timings.json").read_text())
    steps = {k: v for k, v in timings.items() if k not in ("total", "of")}
    assert {"read", "solve", "test"} <= set(steps), timings
    assert all(v >= 0 for v in steps.values()) and sum(steps.values()) <= timings["total"] + 0.001 * len(steps)
    text = " ".join(result.output.split())
    assert re.search(r"3 gammas in [\d.]+ s: \w", text) and " s: ->" not in text and "s:  ->" not in text, text


@pytest.mark.parametrize("command, extra", [("sweep", ()), ("sweep", ("--loo-sample", 0)), ("learn", ())],
                         ids=["sweep-one-pass", "sweep-walks", "learn-one-pass"])
def test_the_uneven_split_is_noted_once(store, tmp_path, command, extra):
    """12 classes into 5 tasks: the same sizes in every order, so one note."""
    args = (*SWEEP, *extra) if command == "sweep" else (*SWEEP[:-2], *extra)
    result = invoke(command, "--features", store, "--out", tmp_path / "o", *args, "--tasks", 5, "--order-seeds", "0,1")
    assert result.exit_code == 0, result.output
    assert result.output.count("do not split evenly") == 1, result.output


def test_orders_that_drop_other_classes_each_name_their_seed(store, tmp_path):
    result = invoke("sweep", "--features", store, "--out", tmp_path / "o", *SWEEP, "--tasks", 5, "--drop-remainder",
                    "--order-seeds", "0,1")
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert text.count("--drop-remainder drops 2 classes") == 2, text
    assert "order seed 0: warning:" in text and "order seed 1: warning:" in text, text


@pytest.mark.parametrize("token, read", [("1e-3000", "0"), ("1e999", "inf")])
@pytest.mark.parametrize("command, option", [("sweep", "--gammas"), ("learn", "--gamma-grid")])
def test_a_bad_gamma_is_named_as_typed(store, tmp_path, command, option, token, read):
    auto = ("--gamma", "auto") if command == "learn" else ()
    result = invoke(command, "--features", store, "--out", tmp_path / "o", *auto, option, f"1,{token}")
    assert_one_line_error(result, f"{option} lists {token} (read as {read}); a gamma is a positive number")


def test_a_sampled_sweep_says_so(store, tmp_path):
    common = ("--tasks", 4, "--projection-dim", 24, "--seed", 3, "--backend", "numpy")
    assert invoke("learn", "--features", store, "--out", tmp_path / "run", *common).exit_code == 0
    _, report = _sweep(store, tmp_path / "run-sweep", "--loo-sample", 40)
    loo = report["leave_one_out"]
    assert loo["exact"] is False
    rows = loo["sample_rows"][-1]
    result = invoke("evaluate", "--run", tmp_path / "run", "--no-plots")
    assert result.exit_code == 0, result.output
    md = " ".join((tmp_path / "run" / "eval" / "summary.md").read_text().split())
    assert "by sampled leave-one-out MSE on the training rows seen" in md, md
    assert f"{rows:,} training rows scored at the last task boundary (`--loo-sample 40`)" in md, md
    assert f"by sampled LOO MSE of {rows:,} rows" in " ".join(_summary(tmp_path / "run-sweep").split())
    _sweep(store, tmp_path / "run-sweep", "--loo-sample", 0)  # every row: exact, no "sampled"
    assert invoke("evaluate", "--run", tmp_path / "run", "--no-plots").exit_code == 0
    exact = (tmp_path / "run" / "eval" / "summary.md").read_text()
    assert "by leave-one-out MSE on the training rows seen" in exact and "was sampled" not in exact
    assert "by LOO MSE)" in _summary(tmp_path / "run-sweep") and "by sampled" not in _summary(tmp_path / "run-sweep")
