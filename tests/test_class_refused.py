"""A head's refusal of one class names it as the caller does: the estimator's own labels, the store's class names, the
model's names (a head numbers its classes itself, and those ids are nobody's labels)."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_one_line_error, invoke

from foal_pipe import load_model
from foal_pipe.errors import ClassRefused, FoalPipeError
from foal_pipe.model.headestimator import head_classifier
from foal_pipe.store import write_store

NAMES = ["cat", "dog", "zebra", "owl"]


def _rows(seed: int, labels: np.ndarray, flat: int | None) -> np.ndarray:
    """Rows that vary, but every row of class ``flat`` the same."""
    X = np.random.default_rng(seed).normal(size=(labels.size, 6)) + labels[:, None]
    if flat is not None:
        X[labels == flat] = 1.0
    return X


def _store(path: Path, classes: list[int], flat: int | None, seed: int = 0) -> Path:
    """Store ids 0..3 named as :data:`NAMES`, train rows of ``classes`` only (test rows of every class)."""
    y = np.repeat(classes, 30)
    yt = np.repeat(np.arange(len(NAMES)), 5)
    return write_store(path, (_rows(seed, y, flat), y), (_rows(seed + 1, yt, None), yt), NAMES, chunk_rows=64)


def test_estimator_names_the_class_by_the_callers_label():
    y = np.repeat([5, 7, 9], 20)
    X = _rows(0, y, flat=7)
    with pytest.raises(FoalPipeError, match=r"^fecam: class 7 has no variance in any dimension"):
        head_classifier("fecam").fit(X, y)
    est = head_classifier("fecam").partial_fit(X[y != 7], y[y != 7])
    est.predict(X[:2])
    est.partial_fit(X[y == 7], y[y == 7])
    with pytest.raises(FoalPipeError, match=r"^fecam: class 7 has no variance .* back at its last solved model"):
        est.predict(X[:2])
    assert est.classes_.tolist() == [5, 9]


def test_estimator_names_a_string_label():
    y = np.repeat(["a", "b", "c"], 20)
    X = _rows(0, np.repeat([0, 1, 2], 20), flat=1)
    with pytest.raises(FoalPipeError, match=r"^fecam: class 'b' has a dimension of zero variance"):
        head_classifier("fecam", shrinkage=0.0).fit(X, y)


def test_learn_names_the_class_as_the_store_does(tmp_path):
    store = _store(tmp_path / "s.zarr", [0, 1, 2, 3], flat=2)
    result = invoke("learn", "--features", store, "--out", tmp_path / "run", "--head", "fecam", "--tasks", 2)
    assert_one_line_error(result, "fecam: class 'zebra' has no variance in any dimension")
    assert not (tmp_path / "run").exists()


def test_a_continued_model_names_the_class_as_the_store_does(tmp_path):
    """The continued head numbers classes by the model (cat, dog, owl are 0, 1, 2; zebra comes fourth): the refusal
    still names the class, not the model's id 3 or the store's id 2."""
    first = _store(tmp_path / "a.zarr", [0, 1, 3], flat=None)
    assert invoke("learn", "--features", first, "--out", tmp_path / "a", "--head", "fecam", "--tasks", 1).exit_code == 0
    second = _store(tmp_path / "b.zarr", [2], flat=2, seed=5)
    result = invoke("learn", "--features", second, "--out", tmp_path / "b", "--init-model",
                    tmp_path / "a" / "model.safetensors", "--tasks", 1)
    assert_one_line_error(result, "fecam: class 'zebra' has no variance in any dimension", after_notes=True)

    model = load_model(tmp_path / "a" / "model.safetensors")
    model.partial_fit(_rows(5, np.full(30, 2), flat=2), ["zebra"] * 30)
    with pytest.raises(FoalPipeError, match=r"^fecam: class 'zebra' has no variance .* back at its last solved model"):
        model.predict(_rows(6, np.zeros(3, dtype=int), None))


def test_the_refusal_pickles_as_its_message():
    exc = ClassRefused(3, lambda name: f"class {name} is refused")
    assert str(exc.named({3: "owl"})) == "class 'owl' is refused"
    assert exc.named({4: "owl"}) is exc
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is FoalPipeError and str(back) == "class 3 is refused"
