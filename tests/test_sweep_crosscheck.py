"""A hand-edited ``sweep.json`` whose fields contradict each other is refused in one line (counts, gammas, choices) or
shown with its headline numbers recomputed from the matrices and a warning (foal_pipe/report/sweepcheck.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import build_store, invoke

from foal_pipe.errors import FoalPipeError
from foal_pipe.protocol.config import ModelConfig
from foal_pipe.protocol.records import fusion_entry, fusions_report
from foal_pipe.protocol.schema import SweepReport
from foal_pipe.report.readers import read_sweep

COMMON = ["--tasks", "3", "--projection-dim", "24", "--batch-size", "7", "--seed", "5", "--gammas", "0.01,0.1,1,10"]


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """``sweep.json`` of a sweep with heads, of one over two class orders, and of two fusions (built by the sweep's
    own record functions from the two orders' results)."""
    root = tmp_path_factory.mktemp("crosscheck")
    store = build_store(root / "s.zarr", n_train=300, n_test=120)
    out = {}
    for name, extra in (("heads", ["--heads", "ridge,ncm,slda"]), ("orders", ["--order-seeds", "0,1"])):
        result = invoke("sweep", "--features", store, "--out", root / name, *COMMON, *extra)
        assert result.exit_code == 0, result.output
        out[name] = json.loads((root / name / "sweep.json").read_text())
    orders = SweepReport.from_dict(out["orders"], "orders").orders or []
    entries = [fusion_entry(name, o.results, "loo") for name, o in zip(("mean-cls", "last"), orders)]
    out["fusions"] = fusions_report([0.01, 0.1, 1.0, 10.0], entries, "loo", ModelConfig(), {"n_tasks": 3}).to_dict()
    return out


def _read(tmp_path: Path, data: dict, warned: list[str] | None = None) -> SweepReport:
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(data))
    return read_sweep(path, None if warned is None else warned.append)


def _said(warned: list[str]) -> str:
    """The warnings so far, then none."""
    text = "\n".join(warned)
    warned.clear()
    return text


def _edited(swept: dict[str, dict], kind: str, edit) -> dict:
    data = json.loads(json.dumps(swept[kind]))
    edit(data)
    return data


def _result(data: dict, gamma: float) -> dict:
    return next(r for r in data["results"] if r["gamma"] == gamma)


def test_files_sweep_wrote_read_without_a_warning(swept, tmp_path):
    warned: list[str] = []
    for kind in swept:
        _read(tmp_path, swept[kind], warned)
    assert warned == []


REFUSED = [
    ("heads", lambda d: _result(d, 0.1).update(gcv=_result(d, 0.1)["gcv"][:2]),
     "results[gamma 0.1]: 'gcv' has 2 entries but the sweep has 3 task boundaries"),
    ("heads", lambda d: _result(d, 1.0).update(loo_mse=[]), "results[gamma 1]: 'loo_mse' has 0 entries"),
    ("heads", lambda d: _result(d, 0.1).update(accuracy_matrix=_result(d, 0.1)["accuracy_matrix"][:2]),
     "results[gamma 0.1]: 'accuracy_matrix' has 2 rows but the sweep has 3 tasks"),
    ("heads", lambda d: d.update(n_tasks=5), "'n_tasks' is 5 but 'accuracy_matrix' of results[0] has 3 rows"),
    ("heads", lambda d: d.update(results=d["results"] + [d["results"][1]]), "'results' holds gamma 0.1 twice"),
    ("heads", lambda d: d.update(gammas=[0.02, 0.2, 2, 20]),
     "'gammas' (0.02, 0.2, 2, 20) should list the gammas of 'results' (0.01, 0.1, 1, 10)"),
    ("heads", lambda d: d.update(best_gamma=10.0), "'best_gamma' is 10 but LOO MSE at the last task boundary chooses 1"),
    ("heads", lambda d: d.update(best_gamma_test=0.01), "'best_gamma_test' is 0.01 but test A_avg chooses"),
    ("heads", lambda d: d.update(best_gamma_at_grid_edge=True), "'best_gamma_at_grid_edge' is true but best_gamma 1 is not"),
    ("heads", lambda d: d["selections"][0].update(gammas_selected=[1e6] * 3),
     "selections['loo'] chose gamma 1e+06 at boundary 1 but its recorded values choose"),
    ("heads", lambda d: d["selections"][0].update(at_edge=[True]), "selections[0]: 'at_edge' has 1 entries"),
    ("heads", lambda d: d.update(selections=d["selections"] + [d["selections"][0]]),
     "'selections' holds criterion 'loo' twice"),
    ("heads", lambda d: d["leave_one_out"].update(sample_eps=[]), "leave_one_out: 'sample_eps' has 0 entries"),
    ("heads", lambda d: d["heads"]["ncm"].update(accuracy_matrix=d["heads"]["ncm"]["accuracy_matrix"][:2]),
     "heads['ncm']: 'accuracy_matrix' has 2 rows"),
    ("heads", lambda d: d.update(best_head="fecam"), "'best_head' 'fecam' is not one of 'heads' (ridge, ncm, slda)"),
    ("heads", lambda d: d.update(best_head_selected_by="banana"), "'best_head_selected_by' 'banana' is not a criterion"),
    ("heads", lambda d: d["heads"]["ridge"]["options"].update(gamma=10.0), "heads['ridge'] has gamma 10 but best_gamma is 1"),
    ("orders", lambda d: d.update(orders=d["orders"][:1]), "'orders' has 1 entries but 'order_seeds' lists 2 seeds"),
    ("orders", lambda d: d["orders"][1].update(order_seed=7), "the seeds of 'orders' (0, 7) should be 'order_seeds' (0, 1)"),
    ("orders", lambda d: d["orders"][1].update(results=d["orders"][1]["results"][:2]),
     "orders[1] has results for gammas 0.01, 0.1 but 'results' for 0.01, 0.1, 1, 10"),
    ("orders", lambda d: d["orders"][1]["results"][0].update(gcv=[1.0]), "orders[1]: results[gamma 0.01]: 'gcv' has 1 entries"),
    ("fusions", lambda d: d["fusions"][1].update(fusion="mean-cls"), "'fusions' lists fusion 'mean-cls' twice"),
    ("fusions", lambda d: d["fusions"][1]["results"][0].update(loo_accuracy=[0.5]),
     "fusions[1]: results[gamma 0.01]: 'loo_accuracy' has 1 entries"),
    ("fusions", lambda d: d.update(results=d["fusions"][1]["results"]) if d["best"]["fusion"] == "mean-cls"
     else d.update(results=d["fusions"][0]["results"]), "'results' should be those of the chosen fusion"),
    ("fusions", lambda d: d["best"].update(selected_by="gcv"),
     "'best' says it was selected by 'gcv' but the sweep's rule is 'loo'"),
]


@pytest.mark.parametrize(("kind", "edit", "message"), REFUSED, ids=[m[:40] for _, _, m in REFUSED])
def test_a_contradiction_is_refused_in_one_line(swept, tmp_path, kind, edit, message):
    with pytest.raises(FoalPipeError) as info:
        _read(tmp_path, _edited(swept, kind, edit))
    text = str(info.value)
    assert message in text and "\n" not in text
    assert text.startswith(str(tmp_path / "sweep.json")) and text.endswith("re-run `foal-pipe sweep --out DIR` to write it")


def _other(choices: list[str], chosen: str) -> str:
    return next(c for c in choices if c != chosen)


def test_a_head_chosen_against_the_recorded_values_is_refused(swept, tmp_path):
    data = swept["heads"]
    best = data["best_head"]
    wrong = _other(["ncm", "ridge"], best)
    with pytest.raises(FoalPipeError, match=f"'best_head' is '{wrong}' but LOO acc over the heads chooses '{best}'"):
        _read(tmp_path, _edited(swept, "heads", lambda d: d.update(best_head=wrong)))
    oracle = data["best_head_test"]
    wrong = _other(["ncm", "ridge", "slda"], oracle)
    with pytest.raises(FoalPipeError, match=f"'best_head_test' is '{wrong}' but test A_avg over the heads chooses '{oracle}'"):
        _read(tmp_path, _edited(swept, "heads", lambda d: d.update(best_head_test=wrong)))


def test_an_order_or_fusion_choice_against_its_results_is_refused(swept, tmp_path):
    own = swept["orders"]["orders"][1]["best_gamma"]
    wrong = 0.01 if own != 0.01 else 10.0
    with pytest.raises(FoalPipeError, match=f"'orders\\[1\\].best_gamma' is {wrong:g} but LOO MSE at the last task boundary "
                                            f"chooses {own:g}"):
        _read(tmp_path, _edited(swept, "orders", lambda d: d["orders"][1].update(best_gamma=wrong)))
    own = swept["fusions"]["fusions"][1]["best_gamma"]
    wrong = 0.01 if own != 0.01 else 10.0
    with pytest.raises(FoalPipeError, match=f"'fusions\\[1\\].best_gamma' is {wrong:g} but LOO MSE"):
        _read(tmp_path, _edited(swept, "fusions", lambda d: d["fusions"][1].update(best_gamma=wrong)))
    best = swept["fusions"]["best_test"]
    other = _other(["mean-cls", "last"], best["fusion"])
    with pytest.raises(FoalPipeError, match=f"'best_test' is \\({other}, gamma 0.1\\) but test over every fusion's results "
                                            f"chooses \\({best['fusion']}, gamma {best['gamma']:g}\\)"):
        _read(tmp_path, _edited(swept, "fusions", lambda d: d["best_test"].update(fusion=other, gamma=0.1)))


def test_a_headline_number_its_matrix_contradicts_is_shown_recomputed(swept, tmp_path):
    warned: list[str] = []
    true = _result(swept["heads"], 0.1)["A_avg"]
    sweep = _read(tmp_path, _edited(swept, "heads", lambda d: _result(d, 0.1).update(A_avg=0.99)), warned)
    assert next(r for r in sweep.results if r.gamma == 0.1).A_avg == pytest.approx(true, abs=1e-12)
    assert f"results[gamma 0.1]: A_avg is 0.990000 but its accuracy matrix gives {true:.6f} (shown)" in _said(warned)
    true = swept["heads"]["heads"]["ncm"]["A_last"]
    sweep = _read(tmp_path, _edited(swept, "heads", lambda d: d["heads"]["ncm"].update(A_last=0.01)), warned)
    assert (sweep.heads or {})["ncm"].A_last == pytest.approx(true, abs=1e-12)
    assert "heads['ncm']: A_last is 0.010000" in _said(warned)
    steps = swept["heads"]["selections"][0]["A_steps"]
    sweep = _read(tmp_path, _edited(swept, "heads", lambda d: d["selections"][0].update(A_steps=steps[:1])), warned)
    assert (sweep.selections or [])[0].A_steps == pytest.approx(steps, abs=1e-12)
    assert "selections['loo']: A_steps disagrees with its accuracy matrix" in _said(warned)


def test_the_means_over_orders_are_checked_against_the_orders(swept, tmp_path):
    warned: list[str] = []
    true = _result(swept["orders"], 1.0)
    sweep = _read(tmp_path, _edited(swept, "orders", lambda d: _result(d, 1.0).update(A_avg=0.95)), warned)
    assert next(r for r in sweep.results if r.gamma == 1.0).A_avg == pytest.approx(true["A_avg"], abs=1e-12)
    assert f"A_avg is 0.950000 but the mean over its orders is {true['A_avg']:.6f} (shown)" in _said(warned)
    sweep = _read(tmp_path, _edited(swept, "orders", lambda d: _result(d, 1.0)["std"].update(F=0.3)), warned)
    assert (next(r for r in sweep.results if r.gamma == 1.0).std or {})["F"] == pytest.approx(true["std"]["F"], abs=1e-12)
    assert "std of F is 0.300000 but over its orders it is" in _said(warned)


def test_summary_refuses_a_contradicting_sweep_and_shows_a_recomputed_one(swept, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "sweep.json").write_text(json.dumps(_edited(swept, "heads", lambda d: d.update(best_gamma=10.0))))
    result = invoke("summary", bad)
    assert result.exit_code != 0
    assert "'best_gamma' is 10 but LOO MSE at the last task boundary chooses 1" in result.output
    lied = tmp_path / "lied"
    lied.mkdir()
    true = _result(swept["heads"], 1.0)["A_avg"]
    (lied / "sweep.json").write_text(json.dumps(_edited(swept, "heads", lambda d: _result(d, 1.0).update(A_avg=0.99))))
    result = invoke("summary", lied)
    assert result.exit_code == 0, result.output
    assert f"{100 * true:.2f}" in result.output and "99.00" not in result.output
    assert "A_avg is 0.990000 but its accuracy matrix gives" in result.output
