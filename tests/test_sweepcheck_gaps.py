"""What ``sweep.json``'s check (foal_pipe/report/sweepcheck.py) let through before: a stored NaN where a number is
recomputed (``abs(nan - x) > tol`` is false), per-order head options (``gammas``, ``gamma_comps``) and each order's
ridge head that contradict ``orders``, and ``leave_one_out`` and ``selections`` whose rows, bounds, grid or
choices are not what ``sweep`` writes. Each is edited into a real sweep and shown by ``summary`` or ``evaluate``."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from helpers import assert_one_line_error, invoke, runner, three_class_store

from foal_pipe.cli import app

COMMON = ("--tasks", "3", "--projection-dim", "8", "--batch-size", "4", "--seed", "5", "--backend", "numpy")
SWEEPS = {
    "orders": ("--order-seeds", "0,1,2", "--heads", "ridge,ncm,balanced,dual", "--loo-sample", "7",
               "--gammas", "0.01,0.1,1,10"),
    "sampled": ("--loo-sample", "12", "--gammas", "0.01,0.1,1,10"),
}


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A sweep of three class orders with heads (every order's gamma for balanced and dual) and one whose
    leave-one-out scores a sample (12 of the rows seen: a bound above 0 at the last two boundaries), on 30 rows."""
    root = tmp_path_factory.mktemp("gaps")
    store = three_class_store(root / "t.zarr")
    out = {"store": store}
    for name, extra in SWEEPS.items():
        result = invoke("sweep", "--features", store, "--out", root / name, *COMMON, *extra)
        assert result.exit_code == 0, result.output
        out[name] = root / name
    return out


def _edited(swept: dict[str, Path], kind: str, tmp_path: Path, edit) -> Path:
    """A copy of sweep ``kind``'s folder with ``edit`` applied to its sweep.json."""
    folder = tmp_path / f"{kind}-edited"
    shutil.copytree(swept[kind], folder)
    data = json.loads((folder / "sweep.json").read_text())
    edit(data)
    (folder / "sweep.json").write_text(json.dumps(data))
    return folder


def _summary(folder: Path):
    return runner.invoke(app, ["summary", str(folder)], env={"COLUMNS": "250"})


def test_the_sweeps_as_written_pass(swept):
    data = json.loads((swept["orders"] / "sweep.json").read_text())
    assert data["heads"]["dual"]["options"]["gamma_comps"] == [o["heads"]["dual"]["options"]["gamma_comp"]
                                                               for o in data["orders"]]
    loo = json.loads((swept["sampled"] / "sweep.json").read_text())["leave_one_out"]
    assert loo["sample_rows"] == [10, 12, 12] and loo["sample_eps"][0] == 0 < loo["sample_eps"][-1]
    for kind in SWEEPS:
        result = _summary(swept[kind])
        assert result.exit_code == 0, result.output
        assert "warning" not in result.output and "Error" not in result.output, result.output


def test_a_stored_nan_is_shown_recomputed_with_a_warning(swept, tmp_path):
    """Before: F = NaN passed without a word and summary showed nan."""
    data = json.loads((swept["sampled"] / "sweep.json").read_text())
    gamma = data["best_gamma"]
    true = next(r for r in data["results"] if r["gamma"] == gamma)["F"]
    folder = _edited(swept, "sampled", tmp_path, lambda d: next(r for r in d["results"] if r["gamma"] == gamma)
                     .update(F=math.nan))
    result = _summary(folder)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert f"results[gamma {gamma:g}]: F is nan but its accuracy matrix gives {true:.6f} (shown)" in text, text
    row = next(line for line in result.output.splitlines() if "sampled-edited" in line and "*" in line)
    assert f"{100 * true:.2f}" in row and "nan" not in row.split("sampled-edited")[1], result.output


def test_a_nan_std_over_the_orders_is_shown_recomputed(swept, tmp_path):
    data = json.loads((swept["orders"] / "sweep.json").read_text())
    true = data["results"][0]["std"]["F"]
    folder = _edited(swept, "orders", tmp_path, lambda d: d["results"][0]["std"].update(F=math.nan))
    result = _summary(folder)
    assert result.exit_code == 0, result.output
    assert f"results[gamma 0.01]: std of F is nan but over its orders it is {true:.6f} (shown)" in " ".join(
        result.output.split())


def _dual_comps(d):
    d["heads"]["dual"]["options"]["gamma_comps"] = d["heads"]["dual"]["options"]["gamma_comps"][:2]


def _balanced_gamma(d):
    d["heads"]["balanced"]["options"]["gammas"][1] = 0.5


def _order_ridge(d):
    """Both the order's ridge head and the top level's list of it say gamma 10: not orders[1]'s best gamma."""
    d["orders"][1]["heads"]["ridge"]["options"]["gamma"] = 10.0
    d["heads"]["ridge"]["options"]["gammas"][1] = 10.0


def _sample_eps(d):
    d["leave_one_out"]["sample_eps"][-1] = 0.5
    for s in d["selections"]:
        if "sample_eps" in s:
            s["sample_eps"][-1] = 0.5


def _nan_eps(d):
    d["leave_one_out"]["sample_eps"][-1] = math.nan
    for s in d["selections"]:
        if "sample_eps" in s:
            s["sample_eps"][-1] = math.nan


def _rows(d):
    d["leave_one_out"]["sample_rows"][-1] = 11
    for s in d["selections"]:
        if "sample_rows" in s:
            s["sample_rows"][-1] = 11


def _grid(d):
    d["selections"][0]["gammas"][3] *= 1.01


def _unchosen(d):
    """At boundary 1 no value (as where infinite) and a gamma none of its points."""
    s = d["selections"][1]
    s["values"][0] = [None] * len(s["values"][0])
    s["gammas_selected"][0] = 0.123


REFUSED = [
    ("orders", _dual_comps, "heads['dual']: option 'gamma_comps' is [1.0, 1.0] but should list one gamma_comp per class "
                            "order (3, those of 'orders')"),
    ("orders", _balanced_gamma, "heads['balanced']: option 'gammas'[1] is 0.5 but orders[1].heads['balanced'] has gamma"),
    ("orders", _order_ridge, "orders[1].heads['ridge'] has gamma 10 but orders[1].best_gamma is"),
    ("sampled", lambda d: d["leave_one_out"].update(exact=True),
     "leave_one_out: 'exact' is true but 'sample_eps'"),
    ("sampled", _sample_eps, "leave_one_out: 'sample_eps' at boundary 3 is 0.5 but 12 rows of a sample give"),
    ("sampled", _nan_eps, "leave_one_out: 'sample_eps' at boundary 3 is nan"),
    ("sampled", _rows, "leave_one_out: 'sample_rows' at boundary 3 is 11 but 'loo_sample' 12 (0: every row seen) scores "
                       "12 of the 30 rows seen ('n_train_seen')"),
    ("sampled", lambda d: d["selections"][0]["sample_rows"].__setitem__(-1, 11),
     "selections['loo']: 'sample_rows' is [10, 12, 11] but should be [10, 12, 12], as 'leave_one_out' has"),
    ("sampled", lambda d: d["selections"][1].update(loo_sample=12), "selections['gcv']: 'loo_sample' is 12 but should be none"),
    ("sampled", _grid, "selections['loo']: 'gammas' (25 points) should be the 25 points of 'per_decade' 8 over 'gammas' "
                       "(0.01 .. 10)"),
    ("sampled", lambda d: d["selections"][0].update(per_decade=3),
     "selections['loo']: 'gammas' (25 points) should be the 10 points of 'per_decade' 3"),
    ("sampled", _unchosen, "selections['gcv'] chose gamma 0.123 at boundary 1, not one of its points"),
]


@pytest.mark.parametrize(("kind", "edit", "message"), REFUSED, ids=[e.__name__.strip("_") if e.__name__ != "<lambda>"
                                                                    else m[:30] for _, e, m in REFUSED])
def test_summary_refuses_the_contradiction_in_one_line(swept, tmp_path, kind, edit, message):
    folder = _edited(swept, kind, tmp_path, edit)
    result = _summary(folder)
    assert_one_line_error(result, str(folder / "sweep.json"), message, "re-run `foal-pipe sweep --out DIR` to write it",
                          after_notes=True)


def test_evaluate_refuses_per_order_options_that_contradict_the_orders(swept, tmp_path):
    run = tmp_path / "run"
    result = invoke("learn", "--features", swept["store"], "--out", run, *COMMON, "--order-seeds", "0,1,2", "--gamma", 1)
    assert result.exit_code == 0, result.output
    ok = invoke("evaluate", "--run", run, "--sweep", swept["orders"], "--no-plots", "--out", tmp_path / "ok")
    assert ok.exit_code == 0, ok.output
    folder = _edited(swept, "orders", tmp_path, _balanced_gamma)
    result = invoke("evaluate", "--run", run, "--sweep", folder, "--no-plots", "--out", tmp_path / "bad")
    assert_one_line_error(result, "heads['balanced']: option 'gammas'[1] is 0.5 but orders[1].heads['balanced'] has gamma",
                          after_notes=True)
