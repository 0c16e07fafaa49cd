"""``foal_pipe.sweep`` (the library's entry) refuses learn's settings it would ignore: ModelConfig's gamma, gamma_grid,
select and engine, a per_decade unlike SweepConfig's, and EvaluationConfig's eval_every (each ran as if unset)."""

from __future__ import annotations

import pytest
from helpers import build_store

from foal_pipe.errors import FoalPipeError
from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, SweepConfig
from foal_pipe.protocol.entry import SweepSettings, sweep

CASES = {
    "gamma": (dict(model=ModelConfig(gamma=0.5)), "ModelConfig.gamma and gamma_grid are learn's"),
    "gamma_grid": (dict(model=ModelConfig(gamma_grid=(0.1, 1.0, 10.0))), "ModelConfig.gamma and gamma_grid are learn's"),
    "select": (dict(model=ModelConfig(select="gcv")), "ModelConfig.select is learn --gamma auto's"),
    "per_decade": (dict(model=ModelConfig(per_decade=2)), "ModelConfig.per_decade differs from it"),
    "engine": (dict(model=ModelConfig(engine="rls")), "ModelConfig.engine is learn's"),
    "eval_every": (dict(evaluation=EvaluationConfig(eval_every=100)), "EvaluationConfig.eval_every is learn's"),
}


@pytest.mark.parametrize("case", CASES)
def test_learns_settings_are_refused_not_ignored(case, tmp_path):
    given, message = CASES[case]
    settings = SweepSettings(sweep=SweepConfig(gammas=(0.1, 1.0)), execution=ExecutionConfig(backend="numpy"), **given)
    with pytest.raises(FoalPipeError, match=message):
        sweep(tmp_path / "no-store.zarr", tmp_path / "out", settings, log=lambda _: None)
    assert not (tmp_path / "out").exists()


def test_per_decade_given_to_both_runs(tmp_path):
    store = build_store(tmp_path / "a.zarr")
    settings = SweepSettings(sweep=SweepConfig(gammas=(0.1, 1.0), per_decade=2), model=ModelConfig(projection_dim=20,
                             per_decade=2), execution=ExecutionConfig(backend="numpy"))
    done = sweep(store, tmp_path / "out", settings, log=lambda _: None)
    assert {s.per_decade for s in done.report.selections} == {2}
