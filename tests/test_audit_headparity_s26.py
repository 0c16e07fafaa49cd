"""Audit s26: parity of every head's routes to one model.

Audited, for ncm, slda, fecam, cosine, balanced and dual, on tiny float64 stores (scratch runs, most already covered
elsewhere and not repeated here): `foal-pipe learn --head H` then `load_model` with and without `estimators=False`
(scores bit-identical), `ESTIMATORS[H]` fitted on the same rows of the head's space (within 1e-13; dual only in
learn's stream order), `foal-pipe predict` (predictions, and the `score` column equal to `DeployedModel.best` to the
bit, names by id) and the definitions written plainly (tests/helpers.py: ncm, slda, fecam, cosine, zero rows
included); `predict_proba` rows summing to 1 with argmax = predict (slda, balanced, dual; ncm, fecam, cosine refuse);
class order and names with a class missing from the train split and a store whose names are not sorted; head options
recorded and read back (`--shrinkage`, `oas`, fecam's both, `--head-option`, dual's batch size and gamma_comp);
`--head-rows activations` (identity, relu, cos, sigmoid), `--projection-dim 0`, `--dtype float32` (every head);
`DeployedModel.partial_fit` with new classes by name and known ones by id, then save twice (same bytes), reload (same
scores, names, rows outside stores), pickle, the same bytes whether loaded with estimators or not; `learn
--init-model` against Python `partial_fit` (every head, float64 and float32; dual bit for bit in the same stream
order, task by task); a refused fecam solve undone with its class names; stores of another width or other class
names refused in one line by `predict`, `--init-model` and `--eval-features`. All of that held.

Faults found (each test below failed on b543cdb for its reason; all fixed):

1. `HeadClassifier` (a loaded head model's `classifier`, documented in docs/deploy.md as "the same methods on the rows
   of the head's space") does not check the rows it scores: rows of another width give NumPy's bare ``ValueError``
   (``matmul: Input operand 1 has a mismatch ...``; fecam ``operands could not be broadcast``), where the head's
   estimator (`ESTIMATORS[H]`) and the ridge classifier refuse them in one line naming the width.
2. `HeadClassifier.partial_fit` takes NaN rows: ncm's statistics turn NaN for good, so every later prediction is
   refused ("the scores of X overflow float64 ... rescale the features") and the model cannot be saved, where the
   estimator refuses the rows and keeps its model.
3. `HeadClassifier.partial_fit` reads its labels with ``np.asarray(labels, dtype=np.int64)``: float labels 2.9 and
   1.5 are truncated to classes 2 and 1 and the rows silently join those classes, where the ridge classifier of a
   loaded model and `DeployedModel.partial_fit` refuse float labels (nothing is truncated, docs/deploy.md).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import invoke, ref_cosine, ref_fecam, ref_ncm, ref_slda

from foal_pipe import load_model
from foal_pipe.errors import FoalPipeError
from foal_pipe.model.headestimator import ESTIMATORS
from foal_pipe.store import write_store

ARGS = {"ncm": [], "slda": ["--shrinkage", "0.25"], "fecam": ["--shrinkage", "0.5", "--shrinkage-offdiag", "0.3"],
        "cosine": [], "balanced": ["--projection-dim", "12", "--gamma", "0.5"],
        "dual": ["--projection-dim", "12", "--gamma", "0.5", "--compensation", "0.7", "--batch-size", "7"]}
REFERENCES = {"ncm": ref_ncm, "slda": lambda X, y, T: ref_slda(X, y, T, 0.25),
              "fecam": lambda X, y, T: ref_fecam(X, y, T, 0.5, 0.3), "cosine": ref_cosine}
D = 6


def _rows(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` float64 rows of four classes in turn, class k shifted by 3 along feature k."""
    rng = np.random.default_rng(seed)
    y = np.tile(np.arange(4), n // 4)
    return rng.normal(size=(n, D)) + 3 * np.eye(4, D)[y], y


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, tuple[np.ndarray, ...]]:
    """Every head learned (one task, numpy) on one store of 80 train and 24 test rows."""
    root = tmp_path_factory.mktemp("headparity26")
    (x, y), (t, yt) = _rows(80, 0), _rows(24, 1)
    store = write_store(root / "s.zarr", (x, y), (t, yt), ["b", "a", "d", "c"], chunk_rows=16, dtype="float64")
    for head, args in ARGS.items():
        result = invoke("learn", "--features", store, "--out", root / head, "--head", head, *args, "--tasks", 1,
                        "--seed", 2, "--backend", "numpy")
        assert result.exit_code == 0, result.output
    return root, (x, y, t, yt)


def _model(runs, head: str, estimators: bool = True):
    root, _ = runs
    return load_model(root / head / "model.safetensors", estimators=estimators)


# --- 1. a loaded head's classifier scores rows of any width ------------------------------------------------------

@pytest.mark.parametrize("estimators", [True, False], ids=["estimators", "light"])
@pytest.mark.parametrize("head", list(ARGS))
def test_loaded_head_classifier_refuses_rows_of_another_width_in_one_line(runs, head, estimators):
    model = _model(runs, head, estimators)
    classifier = model.classifier
    x = runs[1][0]
    width = model.rows(x[:1]).shape[1]
    estimator = ESTIMATORS[head](**classifier.options).fit(model.rows(x), runs[1][1])
    with pytest.raises(FoalPipeError, match=f"expecting {width} features"):  # the estimator's refusal
        estimator.predict(np.zeros((2, width - 1)))
    for method in (classifier.predict, classifier.class_scores):
        try:
            method(np.zeros((2, width - 1)))
        except FoalPipeError as exc:
            assert "\n" not in str(exc) and str(width) in str(exc), str(exc)
        except Exception as exc:  # noqa: BLE001 - the fault: NumPy's own error escapes
            pytest.fail(f"{head}: {method.__name__} of rows of width {width - 1} raised {type(exc).__name__}: {exc}")
        else:
            pytest.fail(f"{head}: {method.__name__} scored rows of width {width - 1} (the model's are {width} wide)")


# --- 2. NaN rows taken by partial_fit leave ncm unable to predict ------------------------------------------------

def test_loaded_ncm_classifier_refuses_nan_rows_and_keeps_its_model(runs):
    x, y, t, _ = runs[1]
    classifier = _model(runs, "ncm").classifier
    with pytest.raises(FoalPipeError, match="NaN"):  # what the head's estimator does with such rows
        ESTIMATORS["ncm"]().fit(x, y).partial_fit(np.full((2, D), np.nan), [0, 0])
    try:
        classifier.partial_fit(np.full((2, D), np.nan), np.array([0, 0]))
    except FoalPipeError:
        pass  # refused: the model must be as it was
    classes, expected = ref_ncm(x, y, t)
    assert classifier.classes_.tolist() == classes.tolist()
    np.testing.assert_allclose(classifier.class_scores(t), expected, rtol=0, atol=1e-12)


# --- 3. float labels truncated into other classes ----------------------------------------------------------------

@pytest.mark.parametrize("head", list(REFERENCES))
def test_loaded_head_classifier_refuses_float_labels_rather_than_truncating_them(runs, head):
    x, y, t, _ = runs[1]
    model = _model(runs, head)
    extra = np.random.default_rng(5).normal(size=(4, D)) * 4 - 2
    with pytest.raises(FoalPipeError):  # the documented public route: floats refused, nothing truncated
        model.partial_fit(extra, np.array([2.9, 2.9, 1.5, 1.5]))
    try:
        model.classifier.partial_fit(extra, np.array([2.9, 2.9, 1.5, 1.5]))
    except FoalPipeError:
        pass  # refused: the model must be as it was
    classes, expected = REFERENCES[head](x, y, t)  # the head on the store's rows alone: no row joined class 2 or 1
    np.testing.assert_allclose(model.classifier.class_scores(t), expected, rtol=1e-9, atol=1e-9)
    assert model.classifier.n_samples_seen_ == y.size
