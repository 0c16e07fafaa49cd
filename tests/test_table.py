"""``foal-pipe table``: each run equals its separate ``learn``, cells are the mean and std of their runs, the files
are written as one unit and a killed table resumes (published rows beside ours: tests/test_published.py)."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from helpers import assert_clean_error, assert_same_matrix, build_store, invoke

from foal_pipe.protocol import table as engine

FILES = ("table.json", "table.md", "table.csv", "table.tex", "table.png")


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("table")
    return build_store(root / "a.zarr", seed=0), build_store(root / "b.zarr", seed=1, noise=2.0)


def _table(stores, out, *extra, heads="ridge,ncm,slda"):
    args = ["table", *(x for s in stores for x in ("--features", s)), "--heads", heads, "--order-seeds", "0,1",
            "--tasks", "3,4", "--projection-dim", "48", "--batch-size", "10", "--seed", "3", "--backend", "numpy",
            "--out", out, *extra]
    return invoke(*args)


@pytest.fixture(scope="module")
def table24(stores, tmp_path_factory):
    out = tmp_path_factory.mktemp("t24") / "table"
    result = _table(stores, out)
    assert result.exit_code == 0, result.output
    return out


def test_every_run_equals_its_separate_learn(stores, table24, tmp_path):
    doc = json.loads((table24 / "table.json").read_text())
    assert len(doc["runs"]) == 24
    for run in doc["runs"]:
        extra = ["--projection-dim", "48", "--gamma", "auto"] if run["head"] == "ridge" else []
        out = tmp_path / f"{run['head']}-{run['tasks']}-{run['order_seed']}-{run['store'][-6]}"
        result = invoke("learn", "--features", run["store"], "--out", out, "--head", run["head"], "--order-seed",
                        run["order_seed"], "--tasks", run["tasks"], "--batch-size", 10, "--seed", 3, "--backend",
                        "numpy", *extra)
        assert result.exit_code == 0, result.output
        separate = json.loads((out / "metrics.json").read_text())
        assert_same_matrix(run["accuracy_matrix"], separate["accuracy_matrix"])
        for key in ("A_avg", "A_last", "F"):
            assert run[key] == pytest.approx(separate[key], abs=1e-12)
        if run["head"] == "ridge":
            assert run["options"]["gammas_selected"] == separate["gammas_selected"]


def test_cells_are_the_mean_and_population_std_of_their_runs(table24):
    doc = json.loads((table24 / "table.json").read_text())
    assert doc["std_ddof"] == 0
    assert len(doc["cells"]) == 12  # 2 stores x 3 heads x 2 task counts
    for cell in doc["cells"]:
        members = [r for r in doc["runs"]
                   if (r["store"], r["head"], r["tasks"]) == (cell["store"], cell["head"], cell["tasks"])]
        assert [r["order_seed"] for r in members] == [0, 1]
        for key in ("A_avg", "A_last", "F"):
            a, b = (r[key] for r in members)
            mean = (a + b) / 2
            std = ((a - mean) ** 2 / 2 + (b - mean) ** 2 / 2) ** 0.5  # population std of two values, written out
            assert cell[key]["values"] == [a, b]
            assert cell[key]["mean"] == pytest.approx(mean, abs=1e-15)
            assert cell[key]["std"] == pytest.approx(std, abs=1e-15)


def test_md_csv_tex_and_plot_hold_the_cells(table24):
    doc = json.loads((table24 / "table.json").read_text())
    assert sorted(p.name for p in table24.iterdir()) == sorted(FILES)
    md, tex = (table24 / "table.md").read_text(), (table24 / "table.tex").read_text()
    rows = list(csv.DictReader((table24 / "table.csv").open()))
    assert len(rows) == 12 * 3
    for cell in doc["cells"]:
        text = f"{100 * cell['A_last']['mean']:.2f} ± {100 * cell['A_last']['std']:.2f}"
        assert text in md
        assert text.replace("±", r"\pm") in tex
        row = next(r for r in rows if (r["store"], r["head"], int(r["tasks"]), r["metric"])
                   == (cell["store"], cell["head"], cell["tasks"], "A_last"))
        assert float(row["mean"]) == cell["A_last"]["mean"]
    for tasks in (3, 4):  # the best A_last of each store's column is bold
        for store in doc["features"]:
            best = max((c for c in doc["cells"] if c["store"] == store and c["tasks"] == tasks),
                       key=lambda c: c["A_last"]["mean"])
            assert f"**{100 * best['A_last']['mean']:.2f} ± {100 * best['A_last']['std']:.2f}**" in md
    assert r"\toprule" in tex and r"\bottomrule" in tex and r"\mathbf{" in tex
    assert (table24 / "table.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert doc["settings"]["model"]["gamma"] == "auto"  # the default, recorded


def test_same_command_twice_gives_the_same_bytes(stores, table24, tmp_path):
    out = tmp_path / "again"
    assert _table(stores, out).exit_code == 0
    for name in FILES:
        assert (out / name).read_bytes() == (table24 / name).read_bytes(), name


def test_a_killed_table_resumes_its_finished_runs(stores, table24, tmp_path, monkeypatch):
    out = tmp_path / "killed"
    put, calls = engine._Kept.put, []

    def dying(self, key, record):
        put(self, key, record)
        calls.append(key)
        if len(calls) == 7:
            raise KeyboardInterrupt

    monkeypatch.setattr(engine._Kept, "put", dying)
    with pytest.raises(KeyboardInterrupt):
        engine.run_table(list(stores), out, engine.TableConfig(("ridge", "ncm", "slda"), (0, 1), (3, 4)), _settings())
    assert not out.exists()
    kept = out.parent / f".{out.name}.table-runs"
    assert len(list(kept.glob("*.json"))) == 7
    monkeypatch.setattr(engine._Kept, "put", put)
    computed = []
    monkeypatch.setattr(engine._Kept, "put", lambda self, key, record: (computed.append(key), put(self, key, record)))
    result = _table(stores, out)
    assert result.exit_code == 0, result.output
    assert "resumed 7 finished runs" in result.output
    assert len(computed) == 24 - 7
    assert not kept.exists()
    for name in FILES:
        assert (out / name).read_bytes() == (table24 / name).read_bytes(), name


def _settings():
    from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig

    return engine.Settings(StreamConfig(batch_size=10, seed=3), ModelConfig(projection_dim=48, gamma="auto"),
                           EvaluationConfig(), ExecutionConfig(backend="numpy"))


@pytest.mark.parametrize(("extra", "message"), [
    (("--heads", "ridge,lda"), "unknown --heads 'lda'"),
    (("--heads", "ncm,balanced"), "add ridge to --heads or pass a number"),
    (("--tasks", "3,3"), "--tasks lists a value twice"),
    (("--order-seeds", "a"), "--order-seeds 'a' is not a comma-separated list"),
    (("--heads", "ncm,slda", "--activation", "relu"), "drop --activation"),
    (("--gamma", "1", "--select", "gcv"), "--select acts only with --gamma auto"),
    (("--gamma", "1", "--loo-sample", "100"), "--loo-sample acts only with --gamma auto"),
    (("--heads", "ncm,slda", "--loo-sample", "100"), "--loo-sample sets ridge's solver, which ncm, slda do not use"),
])
def test_bad_input_is_one_line_and_writes_nothing(stores, tmp_path, extra, message):
    out = tmp_path / "bad"
    args = [*extra]
    heads = "ridge"
    if "--heads" in args:
        i = args.index("--heads")
        heads = args[i + 1]
        del args[i : i + 2]
    result = invoke("table", "--features", stores[0], "--heads", heads, "--order-seeds", "0", "--tasks", "3",
                    "--out", out, *args)
    assert_clean_error(result, message, out)


def test_a_store_named_twice_is_refused(stores, tmp_path):
    out = tmp_path / "twice"
    result = invoke("table", "--features", stores[0], "--features", stores[0], "--out", out, "--tasks", "3")
    assert_clean_error(result, "--features names a store twice", out)


def test_population_std_is_numpy_ddof0():
    runs = [{"store": "s", "dataset": "d", "encoder": "e", "head": "ncm", "tasks": 2, "n_tasks": 2, "order_seed": s,
             "A_avg": v, "A_last": v, "F": v, "A_auc": None} for s, v in enumerate([0.5, 0.7, 0.9])]
    (cell,) = engine.cells(runs)
    assert cell["A_last"]["std"] == pytest.approx(np.sqrt(((0.2) ** 2 * 2) / 3))
    assert "A_auc" not in cell


@pytest.mark.parametrize("gamma", [("--gamma", "1"), ("--gamma", "auto", "--select", "gcv")])
def test_ridge_from_per_class_sums_equals_its_separate_learn(stores, tmp_path, gamma):
    """Without the leave-one-out pass, ridge's boundaries of every order and task count come from per-class sums
    computed once per store: still each run's separate learn."""
    out = tmp_path / "t"
    result = invoke("table", "--features", stores[1], "--heads", "ridge,balanced", "--order-seeds", "0,2", "--tasks",
                    "3,5", "--projection-dim", "48", "--seed", "3", "--backend", "numpy", "--out", out, *gamma)
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "table.json").read_text())
    for run in doc["runs"]:
        if run["head"] == "ridge":
            extra = list(gamma)
        else:  # balanced at ridge's last-boundary gamma of the same order
            ridge = next(r for r in doc["runs"] if r["head"] == "ridge" and (r["tasks"], r["order_seed"])
                         == (run["tasks"], run["order_seed"]))
            chosen = 1.0 if gamma[1] == "1" else ridge["options"]["gammas_selected"][-1]
            assert run["options"]["gamma"] == chosen
            extra = ["--head", "balanced", "--gamma", repr(chosen)]
        sep = tmp_path / f"{run['head']}-{run['tasks']}-{run['order_seed']}"
        result = invoke("learn", "--features", stores[1], "--order-seed", run["order_seed"], "--tasks", run["tasks"],
                        "--projection-dim", "48", "--seed", "3", "--backend", "numpy", "--out", sep, *extra)
        assert result.exit_code == 0, result.output
        separate = json.loads((sep / "metrics.json").read_text())
        assert_same_matrix(run["accuracy_matrix"], separate["accuracy_matrix"])
        if run["head"] == "ridge" and gamma[1] == "auto":
            assert run["options"]["gammas_selected"] == separate["gammas_selected"]


def test_sampled_leave_one_out_shares_nested_boundaries_and_equals_separate_learns(stores, tmp_path, monkeypatch):
    """``--gamma auto`` on a true sample (16 of the rows seen): ridge's boundaries come from the per-class sums; a
    2-task boundary is the 4-task boundary after the same classes, solved once (4 gamma paths per order, not 6); every
    run still equals its separate ``learn``."""
    from foal_pipe.protocol.solvers import ManyGammas

    starts = []
    original = ManyGammas.start
    monkeypatch.setattr(ManyGammas, "start", lambda self, st, k, *factored: starts.append(k) or original(self, st, k, *factored))
    out = tmp_path / "t"
    extra = ("--projection-dim", "48", "--seed", "3", "--backend", "numpy", "--loo-sample", "16")
    result = invoke("table", "--features", stores[0], "--heads", "ridge", "--order-seeds", "0,1", "--tasks", "2,4",
                    "--out", out, *extra)
    assert result.exit_code == 0, result.output
    assert len(starts) == 2 * 4
    monkeypatch.setattr(ManyGammas, "start", original)
    doc = json.loads((out / "table.json").read_text())
    for run in doc["runs"]:
        sep = tmp_path / f"{run['tasks']}-{run['order_seed']}"
        result = invoke("learn", "--features", stores[0], "--order-seed", run["order_seed"], "--tasks", run["tasks"],
                        "--out", sep, "--gamma", "auto", *extra)
        assert result.exit_code == 0, result.output
        separate = json.loads((sep / "metrics.json").read_text())
        assert max(separate["gamma_search"]["sample_eps"]) > 0  # a true sample
        assert run["options"]["gammas_selected"] == separate["gammas_selected"]
        assert_same_matrix(run["accuracy_matrix"], separate["accuracy_matrix"])
