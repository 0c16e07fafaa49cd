"""Audit of `sweep` against separate `learn` runs over combinations of its options (session 25).

The promise audited (docs/gamma.md, docs/heads.md, docs/orders.md, docs/fusion.md, `sweep --help`): one `sweep` over a
gamma grid, with `--heads`, `--order-seeds`, `--fusions`, `--loo-sample`, `--no-loo` and `--select`, reports for every
gamma / head / class order / fusion the numbers (accuracy matrix, A_avg, A_last, F, the refined search's chosen
gammas) of the corresponding `learn --gamma G`, `learn --head H`, `learn --order-seed S`, `learn --fusion F` and
`learn --gamma auto` runs, records the settings that reproduce them, and writes the same bytes twice.

Checked by hand on small stores (2-5 orders, 3-5 gammas, D = 16-40), comparing sweep.json with metrics.json:
orders x heads x --select loo_accuracy/test/gcv x --loo-sample (one pass and per-order walks, --max-memory routes);
--no-loo x heads x orders; fusions (mean-cls, last, block:K, mean:A-B, concat:A-B) x heads x --select x --loo-sample
x --no-fusion-norm x --drop-last x --dtype float32 x --activation relu; --drop-remainder, --stream si-blurry,
--class-order FILE / pilot / pilot:SEED, --activation cos, --backend torch, unsorted --gammas, one-gamma grids,
--loo-sample 1-3, a one-row class, --shrinkage oas, fecam's a1/a2, dual's --compensation and --gamma-comp; the
fusions' and heads' overall choices and tie rules; per-order leave_one_out records; means over orders.

No fault was found: every number matched its separate run to the bit (LOO MSE and GCV of the one-pass order route
to the last bits, as docs/orders.md states). tests/test_routes_fuzz_s22.py already fuzzes most of these routes; it
leaves out --dtype float32 with balanced and dual, concat fusions, --class-order pilot, --activation cos and the
dual/slda/fecam options, so the tests below pin those combinations (each passes now and compares real values).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import blocks_store, build_store, invoke

ACCURACY = ("accuracy_matrix", "A_avg", "A_last", "F")
GRID = "0.1,1,10"


def _run(command: str, store: Path, out: Path, *args: str) -> dict:
    result = invoke(command, "--features", store, "--out", out, "--backend", "numpy", "--seed", "3", *args)
    assert result.exit_code == 0, result.output
    return json.loads((out / ("sweep.json" if command == "sweep" else "metrics.json")).read_text())


def _same(got: dict, expected: dict, where: str, keys=ACCURACY) -> None:
    """Equal values under ``keys`` (the accuracy keys present in both; others, such as slda's absent
    leave-one-out accuracy, may be absent from both)."""
    assert all(key in got and key in expected for key in ACCURACY if key in keys), where
    for key in keys:
        assert got.get(key) == expected.get(key), f"{where}: {key} {got.get(key)} != {expected.get(key)}"


def _selection(report: dict, criterion: str) -> dict:
    return next(s for s in report["selections"] if s["criterion"] == criterion)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    return build_store(tmp_path_factory.mktemp("store") / "s.zarr", n_train=360, n_test=120)


def test_float32_orders_with_balanced_and_dual_options_equal_each_learn(store, tmp_path):
    """`sweep --dtype float32 --order-seeds 0,1 --heads ridge,balanced,dual --compensation 0.5 --gamma-comp 2`: every
    order's ridge results equal `learn --dtype float32 --gamma G --order-seed S`, and its balanced and dual entries
    equal `learn --head H --dtype float32` at the options the entry records (dual's compensation and gamma_comp)."""
    common = ("--tasks", "3", "--projection-dim", "24", "--dtype", "float32")
    report = _run("sweep", store, tmp_path / "sweep", *common, "--gammas", GRID, "--order-seeds", "0,1", "--heads",
                  "ridge,balanced,dual", "--compensation", "0.5", "--gamma-comp", "2", "--loo-sample", "40")
    assert report["heads"]["dual"]["options"]["gamma_comps"] == [2.0, 2.0]
    for i, seed in enumerate((0, 1)):
        order = report["orders"][i]
        for j, gamma in enumerate(GRID.split(",")):
            learned = _run("learn", store, tmp_path / f"g{seed}{j}", *common, "--gamma", gamma, "--order-seed", str(seed))
            _same(order["results"][j], learned, f"order {seed} gamma {gamma}")
        balanced, dual = order["heads"]["balanced"], order["heads"]["dual"]
        assert dual["options"] == {"compensation": 0.5, "gamma": balanced["options"]["gamma"], "gamma_comp": 2.0}
        learned = _run("learn", store, tmp_path / f"b{seed}", *common, "--head", "balanced", "--gamma",
                       str(balanced["options"]["gamma"]), "--order-seed", str(seed))
        _same(balanced, learned, f"order {seed} balanced")
        learned = _run("learn", store, tmp_path / f"d{seed}", *common, "--head", "dual", "--gamma",
                       str(dual["options"]["gamma"]), "--compensation", "0.5", "--gamma-comp", "2", "--order-seed",
                       str(seed))
        _same(dual, learned, f"order {seed} dual")


def test_concat_fusions_with_heads_and_a_sample_equal_learn_gamma_auto_and_learn_head(tmp_path):
    """`sweep --fusions concat:1-2,concat:2-3 --heads ridge,ncm,balanced --select loo_accuracy --loo-sample 25`: each
    fusion's refined selections (every criterion) equal `learn --fusion F --gamma auto --select C` with the same
    sample, and its ncm and balanced entries equal `learn --head H --fusion F`; the same bytes twice."""
    blocks = blocks_store(tmp_path / "b.zarr")
    args = ("--tasks", "2", "--projection-dim", "16", "--gammas", GRID, "--fusions", "concat:1-2,concat:2-3", "--heads",
            "ridge,ncm,balanced", "--select", "loo_accuracy", "--loo-sample", "25")
    report = _run("sweep", blocks, tmp_path / "sweep", *args)
    again = _run("sweep", blocks, tmp_path / "again", *args)
    assert again == report
    assert (tmp_path / "sweep" / "sweep.json").read_bytes() == (tmp_path / "again" / "sweep.json").read_bytes()
    for entry in report["fusions"]:
        fusion = entry["fusion"]
        for selection in entry["selections"]:
            name = selection["criterion"]
            sample = ("--loo-sample", "25") if name != "gcv" else ()
            learned = _run("learn", blocks, tmp_path / f"{fusion}-{name}", "--tasks", "2", "--projection-dim", "16",
                           "--fusion", fusion, "--gamma", "auto", "--gamma-grid", GRID, "--select", name, *sample)
            _same(selection, learned, f"{fusion} {name}", (*ACCURACY, "gammas_selected"))
        learned = _run("learn", blocks, tmp_path / f"{fusion}-ncm", "--tasks", "2", "--fusion", fusion, "--head", "ncm")
        _same(entry["heads"]["ncm"], learned, f"{fusion} ncm")
        learned = _run("learn", blocks, tmp_path / f"{fusion}-bal", "--tasks", "2", "--projection-dim", "16", "--fusion",
                       fusion, "--head", "balanced", "--gamma", str(entry["heads"]["balanced"]["options"]["gamma"]))
        _same(entry["heads"]["balanced"], learned, f"{fusion} balanced")


@pytest.mark.parametrize("order", ["pilot", "pilot:7"])
def test_pilot_class_order_with_heads_and_a_sample_equals_each_learn(store, tmp_path, order):
    """`sweep --class-order pilot --heads ridge,ncm,balanced --select loo_accuracy --loo-sample 40`: the per-gamma
    results, every criterion's selection and the heads equal the separate `learn --class-order pilot` runs."""
    common = ("--class-order", order, "--tasks", "3")
    report = _run("sweep", store, tmp_path / "sweep", *common, "--projection-dim", "24", "--gammas", GRID, "--heads",
                  "ridge,ncm,balanced", "--select", "loo_accuracy", "--loo-sample", "40")
    for j, gamma in enumerate(GRID.split(",")):
        learned = _run("learn", store, tmp_path / f"g{j}", *common, "--projection-dim", "24", "--gamma", gamma)
        _same(report["results"][j], learned, f"gamma {gamma}")
        assert learned["tasks"] == report["tasks"]
    for name in ("loo_accuracy", "loo", "gcv"):
        sample = ("--loo-sample", "40") if name != "gcv" else ()
        learned = _run("learn", store, tmp_path / name, *common, "--projection-dim", "24", "--gamma", "auto",
                       "--gamma-grid", GRID, "--select", name, *sample)
        _same(_selection(report, name), learned, name, (*ACCURACY, "gammas_selected"))
    learned = _run("learn", store, tmp_path / "ncm", *common, "--head", "ncm")
    _same(report["heads"]["ncm"], learned, "ncm")
    learned = _run("learn", store, tmp_path / "bal", *common, "--projection-dim", "24", "--head", "balanced", "--gamma",
                   str(report["heads"]["balanced"]["options"]["gamma"]))
    _same(report["heads"]["balanced"], learned, "balanced")


def test_cos_orders_equal_each_orders_sweep_and_balanced_equals_learn(store, tmp_path):
    """`sweep --activation cos --order-seeds 0,1 --heads ridge,balanced,slda` (ridge's learn refuses cos; sweep takes
    it): each order's results, leave-one-out figures and heads equal `sweep --order-seed S` with the same options, and
    balanced equals `learn --head balanced --activation cos --gamma G --order-seed S`."""
    common = ("--tasks", "3", "--projection-dim", "24", "--activation", "cos", "--gammas", GRID, "--heads",
              "ridge,balanced,slda", "--loo-sample", "40")
    report = _run("sweep", store, tmp_path / "all", *common, "--order-seeds", "0,1")
    assert report["activation"] == "cos"
    for i, seed in enumerate((0, 1)):
        order, alone = report["orders"][i], _run("sweep", store, tmp_path / f"s{seed}", *common, "--order-seed", str(seed))
        assert order["best_gamma"] == alone["best_gamma"]
        for mine, theirs in zip(order["results"], alone["results"], strict=True):
            _same(mine, theirs, f"order {seed} gamma {mine['gamma']}", (*ACCURACY, "loo_accuracy"))
        for name, head in order["heads"].items():
            _same(head, alone["heads"][name], f"order {seed} {name}", (*ACCURACY, "loo_accuracy", "options"))
        learned = _run("learn", store, tmp_path / f"b{seed}", "--tasks", "3", "--projection-dim", "24", "--activation",
                       "cos", "--head", "balanced", "--gamma", str(order["heads"]["balanced"]["options"]["gamma"]),
                       "--order-seed", str(seed))
        _same(order["heads"]["balanced"], learned, f"order {seed} balanced")
