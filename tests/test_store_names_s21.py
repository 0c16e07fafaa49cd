"""Class names with a lone surrogate (JSON's ``"\\ud800"``): a store took them, and `evaluate` then stopped with a
traceback writing its CSV (and `predict` would have). They are refused when a store is written and when one is
opened; a path's undecodable bytes (surrogates U+DC80-U+DCFF, written back as bytes) still pass."""

from __future__ import annotations

import json

import numpy as np
import pytest

from foal_pipe.errors import FoalPipeError
from foal_pipe.store import open_store, write_store


def _rows(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    y = np.arange(20) % 2
    return np.random.default_rng(seed).normal(size=(20, 3)), y


def test_a_lone_surrogate_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(FoalPipeError, match=r"class name 'b\\ud800' holds a lone surrogate") as info:
        write_store(tmp_path / "s.zarr", _rows(), _rows(1), ["a", "b\ud800"])
    assert "\n" not in str(info.value) and not list(tmp_path.iterdir())


def test_a_store_whose_names_were_edited_to_one_is_refused_when_opened(tmp_path):
    store = write_store(tmp_path / "s.zarr", _rows(), _rows(1), ["a", "b"])
    meta = store / "zarr.json"
    data = json.loads(meta.read_text())
    data["attributes"]["classes"] = ["a", "b\ud800"]
    meta.write_text(json.dumps(data))
    with pytest.raises(FoalPipeError, match="attribute 'classes' holds 'b\\\\ud800', a name with a lone surrogate"):
        open_store(store)


def test_a_name_of_undecodable_bytes_is_kept(tmp_path):
    name = b"\xffx".decode("utf-8", "surrogateescape")
    store = write_store(tmp_path / "s.zarr", _rows(), _rows(1), ["a", name])
    assert open_store(store).classes == ("a", name)
