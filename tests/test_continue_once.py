"""``learn --init-model`` reads the new store's identities once and learns the store it checked: the rows shown new
are the rows recorded in the continued model, and a store replaced between the check and the walk is refused."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers import assert_clean_error, invoke, make_image_tree

from foal_pipe.model.modelfile import read_model
from foal_pipe.protocol import continuation, newrows, outputs
from foal_pipe.store.manifest import data_identities

RUN = ("--tasks", "2", "--backend", "numpy")
FIRST = (*RUN, "--projection-dim", "8", "--seed", "3")


def _extract(tmp_path: Path, name: str, classes: list[str], seed: int) -> Path:
    """A store ``extract`` writes from an image folder: it has a data identity and a split manifest."""
    make_image_tree(tmp_path / name, dict.fromkeys(classes, 5), test_per_class=2, seed=seed)
    out = tmp_path / f"{name}.zarr"
    result = invoke("extract", "--dataset", "imagefolder", "--data-dir", tmp_path / name, "--model", "pixels",
                    "--image-size", 4, "--out", out, "--workers", 0)
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture
def model_and_store(tmp_path: Path) -> tuple[Path, Path]:
    first, second = _extract(tmp_path, "a", ["a0", "a1", "a2"], 0), _extract(tmp_path, "b", ["b0", "b1"], 1)
    assert invoke("learn", "--features", first, "--out", tmp_path / "first", *FIRST).exit_code == 0
    return tmp_path / "first" / "model.safetensors", second


def test_identities_are_read_once_and_recorded(model_and_store, tmp_path, monkeypatch):
    model, store = model_and_store
    calls: list[Path] = []

    def counted(opened):
        calls.append(Path(opened.path))
        return data_identities(opened)

    monkeypatch.setattr(newrows, "data_identities", counted)
    monkeypatch.setattr(outputs, "data_identities", counted)
    result = invoke("learn", "--init-model", model, "--features", store, "--out", tmp_path / "next", *RUN)
    assert result.exit_code == 0, result.output
    assert calls == [store]
    before = read_model(model)[1]["learned_data"]
    after = read_model(tmp_path / "next" / "model.safetensors")[1]["learned_data"]
    identities = data_identities(continuation.open_store(store))
    assert len(identities) == 2 and after == [*before, *identities]


def test_a_store_replaced_after_its_rows_were_checked_is_refused(model_and_store, tmp_path, monkeypatch):
    model, store = model_and_store
    other = _extract(tmp_path, "c", ["b0", "b1"], 2)
    real = continuation.prepare

    def swapped(*args, **kwargs):
        shutil.rmtree(store)
        shutil.copytree(other, store)
        return real(*args, **kwargs)

    monkeypatch.setattr(continuation, "prepare", swapped)
    out = tmp_path / "next"
    result = invoke("learn", "--init-model", model, "--features", store, "--out", out, *RUN)
    assert_clean_error(result, "was replaced while it was being opened", out)
