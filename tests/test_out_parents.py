"""A run refused after its output was checked leaves no folders behind: the check probes the nearest existing
ancestor of ``--out`` and the parents are made only when the outputs are written."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import assert_clean_error, invoke

from foal_pipe.store import write_store


@pytest.fixture
def store(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    y, yt = np.repeat(np.arange(3), 12), np.repeat(np.arange(3), 4)
    return write_store(tmp_path / "s.zarr", ((rng.normal(size=(y.size, 5)) + y[:, None]).astype(np.float32), y),
                       ((rng.normal(size=(yt.size, 5)) + yt[:, None]).astype(np.float32), yt), ["a", "b", "c"])


REFUSED_IN_THE_WALK = ("--gamma", "1e-300", "--projection-dim", "40", "--tasks", "3")


@pytest.mark.parametrize("command", ["learn", "sweep"])
def test_a_refusal_after_the_check_leaves_no_parent_folders(store, tmp_path, command):
    out = tmp_path / "new" / "deeper" / "run"
    extra = REFUSED_IN_THE_WALK if command == "learn" else ("--gammas", "1e-300", "--projection-dim", "40", "--tasks", "3")
    result = invoke(command, "--features", store, "--out", out, *extra)
    assert_clean_error(result, "below the resolution", out)
    assert not (tmp_path / "new").exists()


def test_the_parents_are_made_when_the_outputs_are_written(store, tmp_path):
    out = tmp_path / "new" / "deeper" / "run"
    result = invoke("learn", "--features", store, "--out", out, "--tasks", "3", "--projection-dim", "40")
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["metrics.json", "model.safetensors", "timings.json"]


def test_predict_refused_leaves_no_parent_folders(store, tmp_path):
    model = tmp_path / "m"
    assert invoke("learn", "--features", store, "--out", model, "--tasks", "3", "--projection-dim", "40").exit_code == 0
    other = write_store(tmp_path / "wide.zarr", (np.zeros((3, 7), np.float32), np.arange(3)),
                        (np.zeros((3, 7), np.float32), np.arange(3)), ["a", "b", "c"])
    out = tmp_path / "new" / "deeper" / "p.csv"
    result = invoke("predict", "--model", model / "model.safetensors", "--features", other, "--out", out)
    assert_clean_error(result, "7", out)
    assert not (tmp_path / "new").exists()
