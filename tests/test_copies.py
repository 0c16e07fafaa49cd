"""``copy.copy`` of a fitted estimator learns apart from the original (a shallow copy shared the ridge engine, so
learning on the copy moved the original's weights but not its ``n_samples_seen_``); both then equal the closed form
of their own rows."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from foal_pipe import AnalyticClassifier, head_classifier


def _rows(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 5)), rng.integers(0, 3, n)


def _closed_form(X: np.ndarray, y: np.ndarray, gamma: float) -> np.ndarray:
    Y = (y[:, None] == np.arange(3)).astype(np.float64)
    return np.linalg.solve(X.T @ X + gamma * np.eye(X.shape[1]), X.T @ Y)


@pytest.mark.parametrize("engine", ["gram", "rls"])
def test_a_copy_of_a_fitted_classifier_learns_apart_from_it(engine):
    X, y = _rows(0, 60)
    X2, y2 = _rows(1, 20)
    original = AnalyticClassifier(gamma=2.0, engine=engine).fit(X, y)
    copied = copy.copy(original)
    copied.partial_fit(X2, y2)
    np.testing.assert_allclose(original.weights_, _closed_form(X, y, 2.0), rtol=0, atol=1e-10)
    np.testing.assert_allclose(copied.weights_, _closed_form(np.vstack([X, X2]), np.concatenate([y, y2]), 2.0),
                               rtol=0, atol=1e-10)
    assert (original.n_samples_seen_, copied.n_samples_seen_) == (60, 80)
    original.partial_fit(X2[:5], y2[:5])  # and the other way round
    np.testing.assert_allclose(copied.weights_, _closed_form(np.vstack([X, X2]), np.concatenate([y, y2]), 2.0),
                               rtol=0, atol=1e-10)


@pytest.mark.parametrize("head", ["ncm", "slda", "ridge"])
def test_a_copy_of_a_fitted_head_learns_apart_from_it(head):
    X, y = _rows(0, 60)
    original = head_classifier(head).fit(X, y)
    before = original.class_scores(X)
    copy.copy(original).partial_fit(*_rows(1, 20))
    np.testing.assert_array_equal(original.class_scores(X), before)


def test_a_pickle_of_a_loaded_classifier_written_before_its_file_record_moved_loads(tmp_path):
    """A loaded classifier's file record lived in ``foal_pipe.model.classifier`` as ``_FileRecord`` until the
    twenty-ninth stop: a pickle naming it there loads, predicts and saves the file's record again."""
    import pickle

    from foal_pipe.model.modelfile import read_model

    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(40, 5)), np.arange(40) % 2
    AnalyticClassifier().fit(X, y).save(tmp_path / "m.safetensors", class_names=["ant", "bee"])
    loaded = AnalyticClassifier.load(tmp_path / "m.safetensors")
    new = pickle.dumps(loaded, protocol=0)
    old = new.replace(b"foal_pipe.model.filerecord\nFileRecord", b"foal_pipe.model.classifier\n_FileRecord")
    assert old != new
    again = pickle.loads(old)
    np.testing.assert_array_equal(again.predict(X), loaded.predict(X))
    again.save(tmp_path / "again.safetensors")
    assert read_model(tmp_path / "again.safetensors")[1]["class_names"] == ["ant", "bee"]
