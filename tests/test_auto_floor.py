"""`learn --gamma auto` where the sums cannot resolve the grid's least gammas (float32 sums on digits): it chooses among
the gammas above their resolution, records where it cut the search, and says so; a grid entirely below it is refused.

Before, the default grid's 1e-4 refused every `learn --gamma auto --dtype float32` on digits and on the benchmarks'
20,000 x 256 store, naming `--gamma-grid`.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import assert_clean_error, invoke

from foal_pipe.core.gammasearch import search_grid
from foal_pipe.protocol.config import ModelConfig
from foal_pipe.store import write_store


def auto(store, out, *args):
    result = invoke("learn", "--features", store, "--out", out, "--tasks", 5, "--backend", "numpy", "--projection-dim",
                    200, "--gamma", "auto", *args)
    return result, (json.loads((out / "metrics.json").read_text()) if result.exit_code == 0 else None)


def test_gcv_chooses_above_the_float32_floor_as_float64_ranks_those_gammas(tmp_path, digits):
    """GCV evaluates every refined point, so the float32 run's choice at each boundary must be the float64 run's best
    among the points above that boundary's floor (the two sums' GCV agree to float32's rounding, far below the
    curve's changes between neighbouring points)."""
    result32, m32 = auto(digits, tmp_path / "f32", "--select", "gcv", "--dtype", "float32")
    assert result32.exit_code == 0, result32.output
    result64, m64 = auto(digits, tmp_path / "f64", "--select", "gcv")
    assert result64.exit_code == 0, result64.output
    s32, s64 = m32["gamma_search"], m64["gamma_search"]
    assert "resolution_floor" not in s64 and "evaluated" not in s64  # float64 resolves the whole grid: as before
    floors = s32["resolution_floor"]
    assert len(floors) == 5 and all(f is not None and f > 1e-4 for f in floors)
    fine = np.asarray(s64["gammas"])
    np.testing.assert_array_equal(fine, search_grid(ModelConfig().gamma_grid))
    for k, floor in enumerate(floors):
        above = np.flatnonzero(fine > floor)
        assert s32["evaluated"][k] == above.tolist()  # every point above the floor, none at or below it
        chosen = s32["gammas_selected"][k]
        assert chosen > floor and chosen in fine[above]
        curve = np.asarray(s64["values"][k], dtype=float)[above]
        assert curve[np.flatnonzero(fine[above] == chosen)[0]] <= curve.min() * (1 + 1e-6)
    # the continued choices are the float64 run's wherever its own lie above the floor
    for k, floor in enumerate(floors):
        if s64["gammas_selected"][k] > floor:
            assert s32["gammas_selected"][k] == s64["gammas_selected"][k]


def test_a_choice_at_the_floor_is_said_and_flagged(tmp_path, digits):
    """A grid whose least usable point wins: the choice is flagged at the edge and the warning names the floor and
    float64, not `--gamma-grid`'s edge (which was left out)."""
    result, m = auto(digits, tmp_path / "edge", "--dtype", "float32", "--gamma-grid", "1e-4,1e-3,1e-2,0.1,0.2")
    assert result.exit_code == 0, result.output
    search = m["gamma_search"]
    floors, chosen = search["resolution_floor"], search["gammas_selected"]
    least = [min(g for g in search["gammas"] if g > f) for f in floors]
    at_floor = [k for k in range(5) if chosen[k] == least[k]]
    assert all(search["at_edge"][k] for k in at_floor)
    assert m["gammas_at_grid_edge"] == search["at_edge"]
    assert at_floor  # digits at D = 200 gain from the least gammas: every boundary takes the least it can
    assert "the least gamma its float32 Gram sums resolve" in result.output
    assert f"at {len(at_floor)} of 5 task boundaries" in result.output
    assert "--dtype float64 resolves them" in result.output and "extend --gamma-grid" not in result.output
    assert all(c > f for c, f in zip(chosen, floors, strict=True))
    # the record reads back: evaluate takes the run
    evaluated = invoke("evaluate", "--run", tmp_path / "edge", "--out", tmp_path / "report", "--no-plots")
    assert evaluated.exit_code == 0, evaluated.output


def test_a_grid_wholly_below_the_floor_is_refused(tmp_path, digits):
    """Refused naming the task, its resolution and that later tasks may need more (following the first version's
    "use gammas above 0.019" was refused again at the next boundary, above 0.0375: an audit)."""
    result, _ = auto(digits, tmp_path / "low", "--dtype", "float32", "--gamma-grid", "1e-6,1e-5")
    assert_clean_error(result, "every gamma of --gamma-grid (up to 1e-05) lies at or below the resolution of the float32 "
                               "Gram sums at task 1", tmp_path / "low")
    assert "extend --gamma-grid above it (a later task's sums, over more rows, may need larger gammas) or --dtype " \
           "float64" in " ".join(result.output.split())
    # above task 1's floor (0.043 since the products' rounding is measured: digits' sums err 2.2 units RMS), below
    # task 3's (0.074)
    later, _ = auto(digits, tmp_path / "later", "--dtype", "float32", "--gamma-grid", "0.05,0.06", "--per-decade", 0)
    assert_clean_error(later, "lies at or below the resolution of the float32 Gram sums at task 3", tmp_path / "later")


def test_sweep_still_refuses_a_listed_gamma_below_the_floor(tmp_path, digits):
    """sweep reports every listed gamma's accuracy, so it cannot leave one out: it refuses, naming one that runs."""
    result = invoke("sweep", "--features", digits, "--out", tmp_path / "sw", "--tasks", 5, "--projection-dim", 200,
                    "--dtype", "float32", "--gammas", "1e-4,1,10", "--no-loo")
    assert_clean_error(result, "below the resolution of the Gram sums", tmp_path / "sw")


@pytest.mark.parametrize("args", [("--gamma-grid", "1e-2,0.1"), ("--select", "gcv", "--gamma-grid", "1e-3,0.1",
                                                                  "--per-decade", 0)])
def test_one_point_left_above_the_floor_is_an_edge_too(tmp_path, digits, args):
    """Where the floor leaves a single point, it is chosen, flagged at the edge and warned of at every boundary where
    it happens (an audit: `Search.edge` takes no single point for an edge, so none was flagged, nor warned of)."""
    result, m = auto(digits, tmp_path / "one", "--dtype", "float32", *args)
    assert result.exit_code == 0, result.output
    search = m["gamma_search"]
    single = [k for k, e in enumerate(search["evaluated"]) if len(e) == 1] if "evaluated" in search else []
    floors = search["resolution_floor"]
    at_least = [k for k in range(5) if floors[k] is not None
                and search["gammas_selected"][k] == min(g for g in search["gammas"] if g > floors[k])]
    assert at_least and (single or "evaluated" not in search)
    assert all(search["at_edge"][k] for k in at_least)
    assert f"at {len(at_least)} of 5 task boundaries" in " ".join(result.output.split())
    assert "the least gamma its float32 Gram sums resolve" in result.output


def test_each_edge_is_said_apart(tmp_path, digits):
    """Boundaries at the grid's two ends are counted and named apart (one line named only the last end)."""
    from foal_pipe.protocol.learnkinds import auto_edges_warning
    from foal_pipe.protocol.schema import LearnMetrics

    _, m = auto(digits, tmp_path / "r", "--gamma-grid", "1e-4,1e8")
    m = {**m, "gammas_selected": [1e-4, 1e8, 1e-4, 1e-4, 1e8], "gammas_at_grid_edge": [True] * 5}
    m["gamma_search"] = {**m["gamma_search"], "gammas_selected": m["gammas_selected"]}
    lines = auto_edges_warning(LearnMetrics.parse_dict(m, "metrics.json")).splitlines()
    assert lines == ["warning: --gamma auto chose 0.0001, the smallest of --gamma-grid (0.0001 .. 1e+08), at 3 of 5 task "
                     "boundaries; a better gamma may lie beyond the grid: extend --gamma-grid",
                     "warning: --gamma auto chose 1e+08, the largest of --gamma-grid (0.0001 .. 1e+08), at 2 of 5 task "
                     "boundaries; a better gamma may lie beyond the grid: extend --gamma-grid"]


def test_a_continued_float32_model_warns_at_the_floor(tmp_path, digits):
    """`learn --init-model` keeps choosing: its choices at the floor (or a grid edge) are warned of as learn's are."""
    from foal_pipe.store import read_split

    X, y, names = read_split(digits, "train")
    Xt, yt, _ = read_split(digits, "test")
    parts = {}
    for name, keep in (("A", lambda v: v < 5), ("B", lambda v: v >= 5)):
        parts[name] = write_store(tmp_path / f"{name}.zarr", (X[keep(y)], y[keep(y)]), (Xt[keep(yt)], yt[keep(yt)]), names,
                                  chunk_rows=256)
    first, _ = auto(parts["A"], tmp_path / "a", "--dtype", "float32", "--select", "gcv")
    assert first.exit_code == 0, first.output
    result = invoke("learn", "--init-model", tmp_path / "a" / "model.safetensors", "--features", parts["B"], "--out",
                    tmp_path / "ab", "--tasks", 5, "--backend", "numpy")
    assert result.exit_code == 0, result.output
    m = json.loads((tmp_path / "ab" / "metrics.json").read_text())
    flagged = sum(m["gammas_at_grid_edge"])
    assert flagged and m["gamma_search"]["resolution_floor"]
    assert f"at {flagged} of 5 task boundaries" in " ".join(result.output.split())
