"""``summary``: a run's read-time fusion named beside its encoder (two fusions of one blocks store read alike); a
``--group`` cell pooling runs of different settings (fusion, activation, seed) named in a warning with the key that
splits it; a ``sweep --heads`` head on the store's features shows D 0, as ``learn --head ncm`` records it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import blocks_store, invoke, make_metrics

from foal_pipe.protocol.schema import LearnMetrics
from foal_pipe.report.grouping import group_cells

COMMON = ("--tasks", 2, "--projection-dim", 16, "--gamma", 0.1, "--seed", 3, "--backend", "numpy")


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """A blocks store (3 blocks of 6 dims, 4 classes) whose stored features are its mean-cls fusion."""
    return blocks_store(tmp_path_factory.mktemp("sumfus") / "b.zarr")


def _learn(store: Path, out: Path, *extra, common=COMMON) -> dict:
    result = invoke("learn", "--features", store, "--out", out, *common, *extra)
    assert result.exit_code == 0, result.output
    return json.loads((out / "metrics.json").read_text())


def _under(output: str, path: Path) -> str:
    """The dim line under a run's row: its dataset, encoder (and fusion) and head."""
    lines = [line.strip() for line in output.splitlines()]
    return lines[next(i for i, line in enumerate(lines) if line.split()[:1] == [str(path)]) + 1]


def test_summary_names_each_runs_fusion_and_a_sweeps_chosen_one(store, tmp_path):
    runs = {name: _learn(store, tmp_path / name, *extra)
            for name, extra in (("last", ("--fusion", "last")), ("mean", ("--fusion", "mean-cls")), ("plain", ()),
                                ("bare", ("--fusion", "last", "--no-fusion-norm")))}
    result = invoke("sweep", "--features", store, "--out", tmp_path / "sw", "--fusions", "last,mean-cls", "--gammas",
                    "0.1,1", "--heads", "ridge,ncm", *COMMON[:4])
    assert result.exit_code == 0, result.output
    shown = invoke("summary", tmp_path)
    assert shown.exit_code == 0, shown.output
    for name in ("last", "mean"):
        assert _under(shown.output, tmp_path / name) == f"synthetic · synthetic-vit-s · {runs[name]['encoder']['fusion']}"
    assert _under(shown.output, tmp_path / "bare") == "synthetic · synthetic-vit-s · last, no norm"
    assert _under(shown.output, tmp_path / "plain") == "synthetic · synthetic-vit-s"  # read as stored: as before
    sweep = json.loads((tmp_path / "sw" / "sweep.json").read_text())
    chosen = sweep["best"]["fusion"]
    assert _under(shown.output, tmp_path / "sw") == f"synthetic · synthetic-vit-s · {chosen} (chosen of 2 fusions)"
    assert f"· head ncm · {chosen}" in shown.output


def test_a_cell_pooling_two_fusions_is_named_with_the_key_that_splits_it(store, tmp_path):
    runs = {fusion: _learn(store, tmp_path / fusion, "--fusion", fusion) for fusion in ("last", "mean-cls")}
    keys = "head,tasks,dataset,encoder,stream,D,gamma"
    pooled = invoke("summary", tmp_path, "--group", keys)
    assert pooled.exit_code == 0, pooled.output
    text = " ".join(pooled.output.split())
    assert ("Warning: the cell head ridge, tasks 2, dataset synthetic, encoder synthetic-vit-s, stream disjoint, D 16, "
            "gamma 0.1 pools runs that differ in fusion (last, mean-cls)") in text
    assert f"split it: --group {keys},fusion" in text
    split = invoke("summary", tmp_path, "--group", f"{keys},fusion")
    assert split.exit_code == 0 and "Warning" not in split.output, split.output
    for fusion, m in runs.items():
        row = next(line.split() for line in split.output.splitlines() if fusion in line.split())
        assert row[-4:] == ["1", *(f"{100 * m[k]:.2f}" for k in ("A_avg", "A_last", "F"))]


def test_a_cell_pooling_two_activations_is_named(store, tmp_path):
    for activation in ("relu", "sigmoid"):
        _learn(store, tmp_path / activation, "--activation", activation)
    result = invoke("summary", tmp_path, "--group", "head,tasks")
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "pools runs that differ in activation (relu, sigmoid)" in text
    assert "split it: --group head,tasks,activation" in text
    assert "Warning" not in invoke("summary", tmp_path, "--group", "head,tasks,activation").output


def test_only_the_class_order_may_differ_silently():
    """Runs differing in their class order and its seed pool quietly; a projection seed of its own is named."""
    orders = [LearnMetrics.from_dict(make_metrics(order_seed=s, tasks=[[2, 0], [1, 3], [4, 5]]), "m") for s in (0, 1)]
    (cell,) = group_cells(orders, ("head", "tasks"))
    assert cell["mixed"] == {} and cell["n"] == 2
    seeds = [LearnMetrics.from_dict(make_metrics(seed=s, order_seed=s), "m") for s in (0, 1)]
    (cell,) = group_cells(seeds, ("head", "tasks"))
    assert cell["mixed"] == {"seed": ["0", "1"]}


def test_a_sweeps_heads_on_features_show_d_0_as_learn_head_ncm_does(store, tmp_path):
    ncm = _learn(store, tmp_path / "ncm", "--head", "ncm", common=("--tasks", 2, "--backend", "numpy"))
    result = invoke("sweep", "--features", store, "--out", tmp_path / "sw", "--gammas", "0.1,1", "--heads",
                    "ridge,ncm,slda", *COMMON[:4])
    assert result.exit_code == 0, result.output
    sweep = json.loads((tmp_path / "sw" / "sweep.json").read_text())
    shown = invoke("summary", tmp_path)
    assert shown.exit_code == 0, shown.output
    lines = [line.strip() for line in shown.output.splitlines()]
    learned = next(line.split() for line in lines if line.split()[:1] == [str(tmp_path / "ncm")])
    assert learned[3] == str(ncm["projection_dim"]) == "0"
    for name, head in sweep["heads"].items():
        row = lines[lines.index(f"· head {name}") - 1].split()
        assert row[3] == ("0" if head["rows"] == "features" else str(sweep["projection_dim"])), (name, row)
    assert {h["rows"] for h in sweep["heads"].values()} == {"features", "activations"}
