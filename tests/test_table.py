"""``foal-pipe table``: each run equals its separate ``learn``, cells are the mean and std of their runs, the files
are written as one unit and a killed table resumes (published rows beside ours: tests/test_published.py)."""

from __future__ import annotations

import csv
import json
import re

import numpy as np
import pytest
from helpers import assert_clean_error, assert_same_matrix, build_store, die_after_kept_runs, invoke

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
    put = engine._Kept.put
    die_after_kept_runs(monkeypatch, 7)
    with pytest.raises(KeyboardInterrupt):
        engine.run_table(list(stores), out, engine.TableConfig(("ridge", "ncm", "slda"), (0, 1), (3, 4)), _settings())
    assert not out.exists()
    kept = out.parent / f".{out.name}.table-runs"
    assert len(list(kept.glob("*.json"))) == 7
    monkeypatch.setattr(engine._Kept, "put", put)
    computed = []
    monkeypatch.setattr(engine._Kept, "put",
                        lambda self, key, record, *said: (computed.append(key), put(self, key, record, *said)))
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
    (("--gamma", "1", "--loo-sample", "100"), "--loo-sample acts only with a leave-one-out --select"),
    (("--heads", "ncm,slda", "--loo-sample", "100"), "--loo-sample sets ridge's solver, which ncm, slda do not use"),
    (("--order-seeds", "-1"), "--order-seeds must be a non-negative integer, got -1; pass e.g. --order-seeds 0"),
    (("--heads", "ncm", "--projection-dim", "20"), "ncm works on the store's features, without a projection or gamma, "
                                                   "so --projection-dim would be ignored"),
    (("--heads", "cosine", "--projection-dim", "20"), "so --projection-dim would be ignored"),
    (("--heads", "slda", "--activation", "relu"), "so --activation would be ignored; drop --activation"),
    (("--heads", "ncm,dual", "--activation", "relu"),  # dual applies its own: it ran, --activation ignored
     "ncm, dual work on the store's features or apply their own activations to the projected rows, so --activation "
     "would be ignored; drop --activation or add a head that uses it (ridge, balanced) to --heads"),
    (("--tasks", ""), "--tasks is empty; write e.g. 5,10"),
    (("--tasks", "x"), "--tasks 'x' is not a comma-separated list of integers; write e.g. 5,10"),
    (("--tasks", "2.5"), "write e.g. 5,10"),
    (("--heads", "ridge,ncm", "--projection-dim", "20", "--activation", "cos"),
     "--activation cos draws a projection bias that ridge's model file does not hold"),
    (("--heads", "ncm", "--seed", "5"), "--seed draws only the projection and ridge's leave-one-out sample"),
    (("--heads", "ridge", "--gamma", "1", "--projection-dim", "0", "--seed", "5"), "drop --seed"),
    (("--gamma", "1", "--gamma-grid", "1,10"), "--gamma-grid acts only with --gamma auto"),
    (("--heads", "ncm", "--gamma-grid", "1,10"), "--gamma-grid sets ridge's solver, which ncm does not use"),
    (("--heads", "ncm", "--select", "gcv"), "--select sets ridge's solver, which ncm does not use"),
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
    if message.startswith(("unknown --heads", "--order-seeds 'a'", "--tasks is empty", "--tasks 'x'", "write e.g.")):  # usage
        assert result.exit_code == 2 and message in result.output and not out.exists(), result.output
    else:
        assert_clean_error(result, message, out)
    assert set(re.findall(r"(--[a-z][a-z-]*)", result.output)) <= _table_flags() | {"--help"}, result.output  # table's own


def _table_flags() -> set[str]:
    import typer.main

    from foal_pipe.cli import app

    command = typer.main.get_command(app).commands["table"]  # type: ignore[attr-defined]
    return {flag for p in command.params for flag in p.opts}


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


def _classes_store(path, n_classes, per_class=12, single=None):
    """A store of ``n_classes`` separable classes of ``per_class`` training rows (class ``single``: one row)."""
    from foal_pipe.store import write_store

    def rows(counts, seed):
        rng = np.random.default_rng(seed)
        y = np.repeat(np.arange(n_classes), counts)
        return (rng.normal(size=(y.size, 6)) + 3 * y[:, None]).astype(np.float32), y

    train = [1 if c == single else per_class for c in range(n_classes)]
    return write_store(path, rows(train, 0), rows([6] * n_classes, 1), [f"k{c}" for c in range(n_classes)])


def _counting_puts(monkeypatch):
    calls = []
    put = engine._Kept.put
    monkeypatch.setattr(engine._Kept, "put",
                        lambda self, key, record, *said: (calls.append(key), put(self, key, record, *said)))
    return calls


def test_a_store_whose_task_count_is_refused_stops_the_table_before_any_run(stores, tmp_path, monkeypatch):
    """``--tasks 6`` fits the first store (12 classes), not the second (5): refused naming the second, before the
    first store's runs (nothing computed, no resume folder)."""
    small = _classes_store(tmp_path / "small.zarr", 5)
    out = tmp_path / "t"
    calls = _counting_puts(monkeypatch)
    result = invoke("table", "--features", stores[0], "--features", small, "--tasks", "6", "--order-seeds", "0",
                    "--projection-dim", "16", "--out", out)
    assert_clean_error(result, f"{small}: --tasks 6 is larger than the number of classes (5)", out)
    assert calls == []
    assert not (tmp_path / ".t.table-runs").exists()


def test_fecam_one_row_class_is_refused_before_any_run(stores, tmp_path, monkeypatch):
    """fecam's covariance needs two training rows per class by its task's end: a store with a class of one row is
    refused up front, named, not after the stores before it have run."""
    thin = _classes_store(tmp_path / "thin.zarr", 4, single=2)
    out = tmp_path / "t"
    calls = _counting_puts(monkeypatch)
    result = invoke("table", "--features", stores[0], "--features", thin, "--heads", "ridge,fecam", "--tasks", "2",
                    "--order-seeds", "0", "--projection-dim", "16", "--out", out)
    assert_clean_error(result, f"{thin}: fecam needs at least 2 training rows per class for a covariance; class 'k2'", out)
    assert "drop fecam from --heads" in result.output
    assert calls == []


def test_default_tasks_fall_back_as_learns_and_are_recorded(tmp_path):
    """Without ``--tasks`` a 5-class store runs 5 tasks, as ``learn`` without ``--tasks`` does (a typed count too
    large stays refused: the test above)."""
    small = _classes_store(tmp_path / "small.zarr", 5)
    out = tmp_path / "t"
    result = invoke("table", "--features", small, "--heads", "ridge", "--order-seeds", "0", "--projection-dim", "16",
                    "--out", out)
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "table.json").read_text())
    assert doc["tasks"] == [5] and [r["tasks"] for r in doc["runs"]] == [5]
    result = invoke("learn", "--features", small, "--order-seed", "0", "--projection-dim", "16", "--gamma", "auto",
                    "--out", tmp_path / "learn")
    assert result.exit_code == 0, result.output
    separate = json.loads((tmp_path / "learn" / "metrics.json").read_text())
    assert separate["n_tasks"] == doc["runs"][0]["n_tasks"] == 5
    assert_same_matrix(doc["runs"][0]["accuracy_matrix"], separate["accuracy_matrix"])


def test_stores_of_the_same_folder_name_get_distinct_columns(tmp_path):
    x = build_store(tmp_path / "x" / "s.zarr", seed=0)
    y = build_store(tmp_path / "y" / "s.zarr", seed=1)
    out = tmp_path / "t"
    result = invoke("table", "--features", x, "--features", y, "--heads", "ncm", "--order-seeds", "0", "--tasks", "3",
                    "--out", out)
    assert result.exit_code == 0, result.output
    assert "| head | x/s A_last | x/s A_avg | y/s A_last | y/s A_avg |" in (out / "table.md").read_text()
    assert r"\multicolumn{2}{c}{x/s} & \multicolumn{2}{c}{y/s}" in (out / "table.tex").read_text()
    assert "x/s" in result.output and "y/s" in result.output


def test_store_labels_are_folder_names_unless_two_share_one():
    from foal_pipe.report.resultstable import store_labels

    assert store_labels(["data/a.zarr", "data/b.zarr", "c"]) == {"data/a.zarr": "a", "data/b.zarr": "b", "c": "c"}
    assert store_labels(["s.zarr", "x/s.zarr", "q/y/s.zarr", "r/y/s.zarr"]) == {
        "s.zarr": "s", "x/s.zarr": "x/s", "q/y/s.zarr": "q/y/s", "r/y/s.zarr": "r/y/s"}


def test_help_lists_every_registered_head_and_speaks_of_the_table():
    from foal_pipe.heads import HEADS

    result = invoke("table", "--help")
    assert result.exit_code == 0, result.output
    text = " ".join(re.sub(r"[│╭╮╰╯─]", " ", result.output).split())
    heads = text[text.index("--heads"):text.index("--order-seeds")]
    assert all(name in heads for name in HEADS), heads
    assert "ncm, slda, fecam, cosine on the store's features" in heads
    for option, stop in (("--loo-sample", "--projection-dim"), ("--activation", "--seed")):
        help_text = text[text.index(option + " <"):text.index(stop + " <")]
        assert "sweep" not in help_text and "--head-rows" not in help_text, help_text
    assert "Default: 4096" in text


def test_gamma_grid_is_learns_recorded_and_its_edge_warning_names_table_options(stores, tmp_path):
    """``--gamma-grid`` as ``learn``'s: recorded, every run's chosen gammas and matrix those of ``learn --gamma-grid``;
    a choice on the grid's edge is warned about, naming only the table's options."""
    out = tmp_path / "t"
    extra = ("--projection-dim", "48", "--seed", "3", "--backend", "numpy", "--gamma-grid", "1e3,1e4")
    result = invoke("table", "--features", stores[0], "--heads", "ridge", "--order-seeds", "0", "--tasks", "3",
                    "--out", out, *extra)
    assert result.exit_code == 0, result.output
    assert "extend --gamma-grid" in result.output
    assert set(re.findall(r"(--[a-z][a-z-]*)", result.output)) <= _table_flags(), result.output
    doc = json.loads((out / "table.json").read_text())
    assert doc["settings"]["model"]["gamma_grid"] == [1e3, 1e4]
    (run,) = doc["runs"]
    result = invoke("learn", "--features", stores[0], "--order-seed", "0", "--tasks", "3", "--gamma", "auto",
                    "--out", tmp_path / "learn", *extra)
    assert result.exit_code == 0, result.output
    separate = json.loads((tmp_path / "learn" / "metrics.json").read_text())
    assert run["options"]["gammas_selected"] == separate["gammas_selected"]
    assert_same_matrix(run["accuracy_matrix"], separate["accuracy_matrix"])
