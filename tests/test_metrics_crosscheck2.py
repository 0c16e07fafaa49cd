"""metrics.json's keys that must agree with one another, the second audit's: every order of the top level's number of
tasks (a traceback in the plots before), of the seed ``order_seeds`` names and with the std recorded; ``gamma_search``
agreeing with the gammas and criterion the run records, a list per boundary; a continued model's ``all_classes``
with its parts and their sources. Also ``table``'s kept runs that no longer check, and ``summary``'s wall times no
run takes. Each was read, and shown, silently."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_one_line_error, build_store, die_after_kept_runs, edited_run, invoke, learn

from foal_pipe.protocol import table as engine
from foal_pipe.protocol.ordermeans import mean_std
from foal_pipe.store import write_store

FIX = "re-run `foal-pipe learn --out DIR` (or `dvc repro`) to write it"


def _store(path: Path, names: list[str], rng: np.random.Generator) -> Path:
    y = np.repeat(np.arange(len(names)), 9)
    x = rng.normal(size=(y.size, 8)) + y[:, None] * 0.3
    return write_store(path, (x, y), (x[::3], y[::3]), names, chunk_rows=7, dtype="float64")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Two class orders with --gamma auto and curves; one --gamma auto run; a continued model scored on its first
    store and on one of a class it never learned (unknown rows)."""
    root = tmp_path_factory.mktemp("crosscheck2")
    store = build_store(root / "s.zarr", n_train=600, n_test=240)
    learn(store, root / "orders", "--eval-every", "100", "--order-seeds", "0,1", gamma="auto")
    learn(store, root / "auto", gamma="auto")
    rng = np.random.default_rng(0)
    a = _store(root / "a.zarr", ["cat", "dog", "emu", "fox"], rng)
    b = _store(root / "b.zarr", ["gnu", "dog", "cat"], rng)
    c = _store(root / "c.zarr", ["yak", "cat"], rng)
    first = invoke("learn", "--features", a, "--out", root / "run_a", "--tasks", 2, "--projection-dim", 30, "--gamma", 0.5)
    assert first.exit_code == 0, first.output
    cont = invoke("learn", "--init-model", root / "run_a" / "model.safetensors", "--features", b, "--out",
                  root / "cont", "--tasks", 3, "--eval-features", a, "--eval-features", c)
    assert cont.exit_code == 0, cont.output
    return {"orders": root / "orders", "auto": root / "auto", "cont": root / "cont"}


def _edited(runs: dict[str, Path], name: str, tmp_path: Path, edit) -> Path:
    return edited_run(runs[name], tmp_path / name, edit)


def _refused(run: Path, message: str) -> None:
    """``evaluate`` refuses the run in one line; ``summary`` sets it aside, saying why."""
    assert_one_line_error(invoke("evaluate", "--run", run, "--out", run / "ev"), f"{run / 'metrics.json'}: {message}; {FIX}")
    listed = invoke("summary", run)
    assert listed.exit_code == 1 and "Traceback" not in listed.output, listed.output
    assert f"Warning: skipped: {run / 'metrics.json'}: {message}; {FIX}" in " ".join(listed.output.split())


def _warned(run: Path, warning: str) -> str:
    """``evaluate`` and ``summary`` warn; summary.md's text."""
    result = invoke("evaluate", "--run", run, "--out", run / "ev", "--no-plots")
    assert result.exit_code == 0, result.output
    assert warning in " ".join(result.output.split())
    listed = invoke("summary", run)
    assert listed.exit_code == 0 and warning in " ".join(listed.output.split()), listed.output
    return (run / "ev" / "summary.md").read_text()


def test_an_order_of_fewer_tasks_is_refused_in_one_line_not_a_traceback(runs, tmp_path):
    def edit(m):
        order = m["orders"][1]
        for key in ("accuracy_matrix", "tasks", "gammas_selected"):
            order[key] = order[key][:2]
        order["A_steps"] = order["A_steps"][:2]

    run = _edited(runs, "orders", tmp_path, edit)
    _refused(run, "orders[1]: 'accuracy_matrix' has 2 rows but the top level's has 4 (every order learns the same "
                  "number of tasks)")


@pytest.mark.parametrize(("edit", "message"), [
    (lambda m: m["orders"][1].update(order_seed=5), "orders[1]: 'order_seed' is 5 but 'order_seeds'[1] is 1"),
    (lambda m: m.update(order_seeds=[0, 1, 2]), "'order_seeds' has 3 seeds but 'orders' has 2 entries (one per seed)"),
    (lambda m: (m.update(order_seeds=[0, 0]), m["orders"][1].update(order_seed=0)),
     "order seed 0 appears twice in 'order_seeds' (each class order once)"),
    (lambda m: m["orders"][1].pop("gammas_selected"),
     "orders[1]: gamma is \"auto\" but its 'gammas_selected' is not a list of 4 positive numbers (one per task boundary)"),
], ids=["seed", "count", "twice", "gammas"])
def test_orders_that_contradict_order_seeds_or_gamma_are_refused(runs, tmp_path, edit, message):
    _refused(_edited(runs, "orders", tmp_path, edit), message)


@pytest.mark.parametrize("key", ["A_avg", "A_auc"])
def test_a_std_the_orders_contradict_is_recomputed_with_a_warning(runs, tmp_path, key):
    run = _edited(runs, "orders", tmp_path, lambda m: m["std"].update({key: 0.5}))
    stored = json.loads((runs["orders"] / "metrics.json").read_text())
    true = mean_std([o[key] for o in stored["orders"]])[1]
    text = _warned(run, f"std of {key} in metrics.json is 0.500000 but its orders give {true:.6f} (shown)")
    assert f"{100 * stored[key]:.2f} ± {100 * true:.2f}" in text and "± 50.00" not in text
    assert json.loads((run / "ev" / "scores.json").read_text())[key] == stored[key]


@pytest.mark.parametrize(("edit", "message"), [
    (lambda m: m.update(gammas_selected=[1e-5, *m["gammas_selected"][1:]]),
     "'gammas_selected' differs from 'gamma_search.gammas_selected' (the gammas its search chose)"),
    (lambda m: m.update(selected_by="gcv"),
     "'selected_by' is 'gcv' but 'gamma_search.criterion' is 'loo_accuracy' (the criterion that chose the gammas)"),
    (lambda m: m["gamma_search"].update(at_edge=m["gamma_search"]["at_edge"][:2]),
     "'gamma_search.at_edge' has 2 entries but 'accuracy_matrix' has 4 rows (one per task boundary)"),
    (lambda m: m["gamma_search"].update(values=m["gamma_search"]["values"][:3], evaluated=m["gamma_search"]["evaluated"][:3]),
     "'gamma_search.values' has 3 entries but 'accuracy_matrix' has 4 rows (one per task boundary)"),
    (lambda m: m["gamma_search"].update(sample_eps=[0.0]),
     "'gamma_search.sample_eps' has 1 entries but 'accuracy_matrix' has 4 rows (one per task boundary)"),
    (lambda m: m.update(gammas_at_grid_edge=[False]),
     "'gammas_at_grid_edge' has 1 entries but 'accuracy_matrix' has 4 rows (one per task)"),
], ids=["gammas", "criterion", "at_edge", "values", "sample_eps", "grid_edge"])
def test_a_gamma_search_that_contradicts_the_run_is_refused(runs, tmp_path, edit, message):
    _refused(_edited(runs, "auto", tmp_path, edit), message)


def _parts(m: dict) -> list[dict]:
    return m["continuation"]["all_classes"]["tasks"]


def _every_class_line(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("Every class seen"))


def test_the_continued_run_has_unknown_rows_and_reads_without_a_warning(runs):
    m = json.loads((runs["cont"] / "metrics.json").read_text())
    assert [p["task"] for p in _parts(m)] == ["T1", "T2", "T3", "eval", "eval"]
    assert m["continuation"]["eval_features"][1]["unknown_class_rows"] > 0
    result = invoke("evaluate", "--run", runs["cont"], "--out", runs["cont"].parent / "ev-cont", "--no-plots")
    assert result.exit_code == 0 and "Warning" not in result.output, result.output


def test_an_all_classes_a_last_its_parts_contradict_is_recomputed(runs, tmp_path):
    run = _edited(runs, "cont", tmp_path, lambda m: m["continuation"]["all_classes"].update(A_last=0.99, n_test=7))
    m = json.loads((runs["cont"] / "metrics.json").read_text())
    everything = m["continuation"]["all_classes"]
    text = _warned(run, f"all_classes A_last in metrics.json is 0.990000 but its parts give {everything['A_last']:.6f} (shown)")
    assert f"all_classes n_test in metrics.json is 7 but its parts add up to {everything['n_test']} (shown)" in text
    assert f"{100 * everything['A_last']:.2f} on {everything['n_test']:,} test rows" in _every_class_line(text)


@pytest.mark.parametrize("part", [1, 4])
def test_a_part_its_source_contradicts_is_recomputed(runs, tmp_path, part):
    """T2's accuracy is the matrix's last row's; the second eval store's is its correct rows over its known rows."""
    run = _edited(runs, "cont", tmp_path, lambda m: _parts(m)[part].update(accuracy=0.5))
    m = json.loads((runs["cont"] / "metrics.json").read_text())
    true = _parts(m)[part]["accuracy"]
    if part == 1:
        assert true == m["accuracy_matrix"][-1][1]
    else:
        score = m["continuation"]["eval_features"][1]
        assert true == pytest.approx(score["accuracy"] * score["n_test"] / (score["n_test"] - score["unknown_class_rows"]))
    text = _warned(run, f"in metrics.json is 0.500000 but {'the accuracy matrix' if part == 1 else 'its'}")
    line = _every_class_line(text)
    assert f"{100 * m['continuation']['all_classes']['A_last']:.2f} on" in line and f"{100 * true:.2f}" in line
    assert "all_classes A_last in metrics.json is" not in text  # the stored A_last is the true parts'


@pytest.mark.parametrize(("edit", "message"), [
    (lambda m: _parts(m)[0].update(n_test=_parts(m)[0]["n_test"] + 1), "the parts T1 ... T3 of 'all_classes' count"),
    (lambda m: m["continuation"]["eval_features"][1].update(unknown_class_rows=10**6),
     "eval_features[1]: 'unknown_class_rows' is 1000000 but the store has"),
    (lambda m: m["continuation"]["task_names"][1].__setitem__(0, m["continuation"]["task_names"][0][0]),
     "'task_names' names class"),
    (lambda m: _parts(m)[3].update(features="elsewhere.zarr"),
     "all_classes.tasks[3] scores 'elsewhere.zarr', which 'eval_features' does not name"),
    (lambda m: _parts(m)[4].update(n_test=_parts(m)[4]["n_test"] + 3), "all_classes.tasks[4] counts"),
    (lambda m: _parts(m).pop(2), "'all_classes.tasks' should be the parts T1 ... T3 (one per task) then 'eval' parts"),
], ids=["own_rows", "unknown", "twice", "store", "eval_rows", "parts"])
def test_all_classes_parts_that_contradict_the_run_are_refused(runs, tmp_path, edit, message):
    run = _edited(runs, "cont", tmp_path, edit)
    result = invoke("evaluate", "--run", run, "--out", run / "ev")
    assert_one_line_error(result, f"{run / 'metrics.json'}: {message}", FIX)


# --- table's kept runs --------------------------------------------------------------------------------------------

CONFIG = engine.TableConfig(("ridge", "ncm"), (0, 1), (2,))


def _settings():
    from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig

    return engine.Settings(StreamConfig(batch_size=10, seed=3), ModelConfig(projection_dim=24, gamma="auto"),
                           EvaluationConfig(), ExecutionConfig(backend="numpy"))


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("whole")
    store = build_store(root / "a.zarr", n_train=300, n_test=120, seed=0)
    return store, engine.run_table([store], root / "t", CONFIG, _settings(), log=lambda _: None)


EDITS = {
    "A_avg": lambda r: r.update(A_avg=0.99),
    "F": lambda r: r.update(F=0.5),
    "n_tasks": lambda r: r.update(n_tasks=5),
    "matrix rows": lambda r: r.update(accuracy_matrix=r["accuracy_matrix"][:1], n_tasks=1, A_avg=r["accuracy_matrix"][0][0],
                                      A_last=r["accuracy_matrix"][0][0], F=0.0),
    "matrix over 1": lambda r: r["accuracy_matrix"][0].__setitem__(0, 7.0),
    "dataset": lambda r: r.update(store="other.zarr", dataset="cifar100"),
    "options": lambda r: r["options"].update(gamma=1000.0),
    "n_classes": lambda r: r.update(n_classes=3),
    "n_test": lambda r: r.update(n_test=5),
    "A_auc": lambda r: r.update(A_auc=0.5),
}


@pytest.mark.parametrize("edit", EDITS)
def test_a_kept_run_that_does_not_check_is_run_again(whole, tmp_path, monkeypatch, edit):
    store, table = whole
    out = tmp_path / "t"
    put = engine._Kept.put
    die_after_kept_runs(monkeypatch, 3)
    with pytest.raises(KeyboardInterrupt):
        engine.run_table([store], out, CONFIG, _settings(), log=lambda _: None)
    monkeypatch.setattr(engine._Kept, "put", put)
    files = sorted((out.parent / f".{out.name}.table-runs").glob("*.json"))
    head = "ncm" if edit in ("n_tasks", "matrix rows") else "ridge"  # ridge's gammas, one per task, tell those
    kept = next(f for f in files if json.loads(f.read_text())["head"] == head)
    record = json.loads(kept.read_text())
    EDITS[edit](record)
    kept.write_text(json.dumps(record))
    said: list[str] = []
    again = engine.run_table([store], out, CONFIG, _settings(), log=said.append)
    assert "resumed 2 finished runs of an interrupted table" in said, said
    assert any(line.startswith("ignored 1 kept run in ") for line in said), said
    assert again["runs"] == table["runs"] and again["cells"] == table["cells"]


# --- summary's wall times -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("total", [-5.0, math.nan, math.inf, 1e12])
def test_a_wall_time_no_run_takes_is_not_shown(runs, tmp_path, total):
    from foal_pipe.report.discovery import RunSummary
    from foal_pipe.report.readers import read_metrics

    run = tmp_path / "auto"
    shutil.copytree(runs["auto"], run)
    timings = json.loads((run / "timings.json").read_text())
    assert RunSummary(run, metrics=read_metrics(run)).seconds == timings["total"]
    (run / "timings.json").write_text(json.dumps({**timings, "total": total}))
    assert RunSummary(run, metrics=read_metrics(run)).seconds is None
    listed = invoke("summary", run)
    assert listed.exit_code == 0, listed.output
    shown = {"-5.0", "nan", "inf", "1000000000000", "1e+12"}
    assert not any(word in shown for word in listed.output.split()), listed.output
