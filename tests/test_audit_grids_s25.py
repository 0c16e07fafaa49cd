"""Audit (stop 25): gamma grids and selection inputs through the Python API (``learn``/``sweep`` with ModelConfig and
SweepConfig). The CLI refuses a duplicated gamma and reads its lists into tuples of floats; the API reaches the same
runs with any sequence the caller has, so each case here must be the CLI's run or a one-line FoalPipeError, never a
raw TypeError/ValueError and never a file that the package's own readers then refuse."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import cluster_store

from foal_pipe.errors import FoalPipeError
from foal_pipe.protocol import LearnSettings, SweepSettings, learn, sweep
from foal_pipe.protocol.config import ModelConfig, StreamConfig, SweepConfig

STREAM = StreamConfig(tasks=3)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cluster_store(tmp_path_factory.mktemp("grids") / "s.zarr", n_classes=6, dim=12, n_test=90, chunk_rows=64,
                         seed=3, n_train=240)


def _learn(store: Path, out: Path, **model) -> dict:
    learn(store, out, LearnSettings(stream=STREAM, model=ModelConfig(projection_dim=24, gamma="auto", **model)))
    return json.loads((out / "metrics.json").read_text())


def _sweep(store: Path, out: Path, per_decade=8, **config) -> dict:
    sweep(store, out, SweepSettings(stream=STREAM, model=ModelConfig(projection_dim=24, per_decade=per_decade),
                                    sweep=SweepConfig(per_decade=per_decade, **config)))
    return json.loads((out / "sweep.json").read_text())


def _no_outputs(out: Path) -> None:
    assert not out.exists() or not any(out.iterdir()), sorted(p.name for p in out.iterdir())
    assert not list(out.parent.glob(f".{out.name}.tmp-*"))


def test_api_sweep_refuses_a_gamma_listed_twice(store, tmp_path):
    """`sweep --gammas 1,10,1` is refused ("lists 1 twice"); SweepConfig(gammas=(1, 10, 1)) ran and wrote a sweep.json
    whose `results` hold gamma 1 twice, which `summary` skips and `evaluate --sweep` refuses as a file to re-run.
    Fix: foal_pipe/protocol/commands.py run_sweep (and the --order-seeds path in protocol/orders.py): refuse repeated
    gammas as cli/options.floats does, before any work."""
    out = tmp_path / "sw"
    with pytest.raises(FoalPipeError, match="twice|more than once|repeat|duplicate"):
        _sweep(store, out, gammas=(1.0, 10.0, 1.0))
    _no_outputs(out)


@pytest.mark.parametrize("grid", [np.array([0.1, 10.0]), np.logspace(-4, 8, 13)],
                         ids=["ndarray2", "ndarray13"])
def test_api_learn_takes_any_sequence_of_gammas_as_the_tuple(store, tmp_path, grid):
    """ModelConfig(gamma_grid=np.logspace(...)) ended in a raw ValueError ("operands could not be broadcast", or "truth
    value of an array ... is ambiguous") from protocol/headruns.check_head_options, which compares the field with the
    default by `!=`. AnalyticClassifier(gamma_grid=ndarray) takes the same array. Expected: the run of the equal
    tuple (or a one-line FoalPipeError). Fix: ModelConfig.__post_init__ reads gamma_grid into a tuple of floats
    (checked as cli/options.floats does), so every later comparison and record sees what the CLI gives."""
    try:
        got = _learn(store, tmp_path / "a", gamma_grid=grid)
    except FoalPipeError:
        return
    want = _learn(store, tmp_path / "b", gamma_grid=tuple(float(g) for g in grid))
    assert got["gamma_grid"] == want["gamma_grid"] == [float(g) for g in grid]
    assert got["gammas_selected"] == want["gammas_selected"]


@pytest.mark.parametrize("gammas", [np.array([0.1, 1.0, 10.0]), 5.0], ids=["ndarray", "scalar"])
def test_api_sweep_gammas_of_another_type_is_the_tuples_run_or_refused(store, tmp_path, gammas):
    """SweepConfig(gammas=ndarray) raised ValueError (`if not sweep.gammas` in protocol/commands.run_sweep);
    gammas=5.0 a TypeError ('float' object is not iterable). Expected: the tuple's run, or one FoalPipeError line."""
    try:
        got = _sweep(store, tmp_path / "a", gammas=gammas)
    except FoalPipeError:
        return
    want = _sweep(store, tmp_path / "b", gammas=tuple(float(g) for g in np.atleast_1d(gammas)))
    assert got["gammas"] == want["gammas"] and got["best_gamma"] == want["best_gamma"]


def test_api_learn_scalar_gamma_grid_is_refused_in_one_line(store, tmp_path):
    """ModelConfig(gamma="auto", gamma_grid=5.0): a raw TypeError ('float' object is not iterable).
    AnalyticClassifier refuses the same value with "gamma_grid must be a sequence of gammas"."""
    with pytest.raises(FoalPipeError, match="gamma_grid"):
        _learn(store, tmp_path / "a", gamma_grid=5.0)


def test_api_learn_numpy_integer_per_decade_writes_its_metrics(store, tmp_path):
    """core/gammasearch.search_grid accepts np.integer per_decade on purpose, and AnalyticClassifier saves it as an
    int; learn(ModelConfig(per_decade=np.int64(2))) ran the whole walk and then died in write_json with "TypeError:
    Object of type int64 is not JSON serializable" (a traceback after all the work). Expected: the metrics of
    per_decade=2. Fix: record int(per_decade) in the gamma_search record (protocol/criteria or metricsparts), or
    normalise the field in ModelConfig.__post_init__ (SweepConfig's too: sweep fails the same way)."""
    got = _learn(store, tmp_path / "a", per_decade=np.int64(2))
    want = _learn(store, tmp_path / "b", per_decade=2)
    assert got["gamma_search"] == want["gamma_search"]
    assert got["gamma_search"]["per_decade"] == 2


def test_api_sweep_numpy_integer_per_decade_writes_its_report(store, tmp_path):
    """The same in sweep: SweepConfig(per_decade=np.int64(2)) (with ModelConfig's equal) ended in the JSON TypeError."""
    got = _sweep(store, tmp_path / "a", per_decade=np.int64(2), gammas=(0.1, 10.0))
    want = _sweep(store, tmp_path / "b", per_decade=2, gammas=(0.1, 10.0))
    assert got["selections"] == want["selections"]
