"""A head's refusal of a class's rows (fecam: a class of one training row) names the class as the store names it, in
``learn --head``, ``sweep --heads`` and a continued model alike, before any row is read."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import assert_clean_error, invoke

from foal_pipe.store import write_store


def _store(path: Path, counts: dict[str, int], seed: int) -> Path:
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(len(counts)), list(counts.values()))
    yt = np.arange(len(counts))
    return write_store(path, (rng.normal(size=(y.size, 5)).astype(np.float32), y),
                       (rng.normal(size=(yt.size, 5)).astype(np.float32), yt), list(counts))


MESSAGE = "class 'dog' has 1 by its task's end"


@pytest.mark.parametrize("command", [("learn", "--head", "fecam"), ("sweep", "--heads", "ridge,fecam")])
def test_a_class_of_one_row_is_named(tmp_path, command):
    store = _store(tmp_path / "s.zarr", {"cat": 10, "dog": 1, "emu": 10}, 0)
    out = tmp_path / "out"
    assert_clean_error(invoke(*command, "--features", store, "--out", out, "--tasks", "1"), MESSAGE, out)


def test_a_continued_models_new_class_of_one_row_is_named(tmp_path):
    first = _store(tmp_path / "a.zarr", {"ant": 10, "bee": 10}, 1)
    second = _store(tmp_path / "b.zarr", {"bee": 1, "cow": 10, "dog": 1}, 2)
    assert invoke("learn", "--features", first, "--out", tmp_path / "m", "--head", "fecam", "--tasks", "1").exit_code == 0
    out = tmp_path / "next"
    result = invoke("learn", "--init-model", tmp_path / "m" / "model.safetensors", "--features", second, "--out", out,
                    "--tasks", "1")
    assert_clean_error(result, MESSAGE, out)


def test_a_known_class_of_one_new_row_continues(tmp_path):
    first = _store(tmp_path / "a.zarr", {"ant": 10, "bee": 10}, 1)
    second = _store(tmp_path / "b.zarr", {"bee": 1, "cow": 10}, 2)
    assert invoke("learn", "--features", first, "--out", tmp_path / "m", "--head", "fecam", "--tasks", "1").exit_code == 0
    result = invoke("learn", "--init-model", tmp_path / "m" / "model.safetensors", "--features", second,
                    "--out", tmp_path / "next", "--tasks", "1")
    assert result.exit_code == 0, result.output
