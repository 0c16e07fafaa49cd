"""Two ways rounding, not the data, decided a result with exit 0.

Features near 1e-30 (valid float32 normals): every sigmoid activation rounded to exactly 0.5, every row expanded to
the same row, and learn reported chance (23.7% with 4 classes) where relu gave 73%; now a block of rows that differ
but all land on the activation's value at 0 is refused. Scores near 1e308: the ties check's rounding bound overflowed
to inf and refused scores 20% apart as a tie; now it is computed scaled, and scores beyond float64's range (inf) are
refused as that, not ranked by argmax. Exact argmaxes are of rational arithmetic on the same float64 values.
"""

from fractions import Fraction

import numpy as np
import pytest
from helpers import assert_one_line_error, invoke
from sklearn.pipeline import make_pipeline

from foal_pipe import AnalyticClassifier, FoalPipeError, SmoothProjection, head_classifier
from foal_pipe.core.expansion import Expansion
from foal_pipe.core.scoring import ModelScores, Rows, Ties
from foal_pipe.store import write_store

ERASED = "nothing of their differences is left"
BEYOND = "beyond float64's range"
TIED = "tie within their own rounding"


def blobs(scale: float, n: int = 240, d: int = 12, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Four well separated Gaussian classes, times ``scale``, as float32."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 4, n)
    X = (3.0 * rng.normal(size=(4, d))[y] + rng.normal(size=(n, d))) * scale
    return X.astype(np.float32), y


def scaled_store(path, scale: float):
    return write_store(path, blobs(scale), blobs(scale, 120, seed=1), [f"c{k}" for k in range(4)], chunk_rows=64)


def learn(store, out, *extra: str):
    return invoke("learn", "--features", store, "--out", out, "--tasks", 2, "--projection-dim", 48, "--seed", 3,
                  "--backend", "numpy", *extra)


@pytest.mark.parametrize("extra", [(), ("--head", "ncm", "--head-rows", "activations")])
def test_learn_refuses_features_the_sigmoid_rounds_to_one_half(tmp_path, extra):
    out = tmp_path / "run"
    result = learn(scaled_store(tmp_path / "s.zarr", 1e-30), out, *extra)
    assert_one_line_error(result, ERASED, "--activation relu", "--projection-dim 0", "scale 1")
    assert not out.exists()


@pytest.mark.parametrize("extra", [("--activation", "relu"), ("--projection-dim", "0")])
def test_the_named_fixes_run_on_the_same_store(tmp_path, extra):
    result = learn(scaled_store(tmp_path / "s.zarr", 1e-30), tmp_path / "run", *extra)
    assert result.exit_code == 0, result.output


def test_features_that_keep_a_few_digits_are_not_refused(tmp_path):
    """At 1e-14 sigmoid(x P) = 0.5 + (x P) / 4 keeps a few hundred distinct values above 0.5's ulp: partial loss."""
    X, _ = blobs(1e-14)
    H = Expansion.draw(X.shape[1], 48, "uniform", "sigmoid", 3, "float64").transform(X)
    assert np.unique(H).size > 100
    assert learn(scaled_store(tmp_path / "s.zarr", 1e-14), tmp_path / "run").exit_code == 0


@pytest.mark.parametrize("activation", ["sigmoid", "cos"])
def test_expansion_refuses_differing_rows_all_at_the_value_at_zero(activation):
    X, _ = blobs(1e-30)
    expansion = Expansion.draw(X.shape[1], 48, "uniform", activation, 3, "float64")
    with pytest.raises(FoalPipeError, match=ERASED):
        expansion.transform(X)
    at_zero = expansion.transform(np.zeros((3, X.shape[1])))  # exact zeros: the rows do not differ
    assert np.array_equal(at_zero, np.repeat(at_zero[:1], 3, axis=0))
    expansion.transform(np.repeat(X[:1], 5, axis=0))  # equal rows, and one row alone, are no loss
    expansion.transform(X[:1])


def test_relu_and_identity_keep_small_inputs_exactly():
    X, _ = blobs(1e-30)
    for activation in ("relu", "identity"):
        H = Expansion.draw(X.shape[1], 48, "uniform", activation, 3, "float64").transform(X)
        assert np.unique(H).size > 100


@pytest.mark.parametrize("head", [AnalyticClassifier, lambda: head_classifier("ncm")])
def test_python_estimators_refuse_too(head):
    X, y = blobs(1e-30)
    with pytest.raises(FoalPipeError, match=ERASED):
        make_pipeline(SmoothProjection(n_components=48, random_state=0), head()).fit(X, y)


def exact_argmax(H: np.ndarray, W: np.ndarray) -> np.ndarray:
    """The argmax of ``H @ W`` in rational arithmetic."""
    scores = [[sum(Fraction(float(h)) * Fraction(float(w)) for h, w in zip(row, col, strict=True)) for col in W.T]
              for row in H]
    return np.array([max(range(len(s)), key=s.__getitem__) for s in scores])


def test_scores_near_the_top_of_float64_are_ranked_not_called_a_tie():
    """balanced's scores are ``x w_c`` (no bias): at ``x`` = 3.4e306 > 0 they rank as ``w_c`` does, 20% apart."""
    y = np.repeat([0, 1, 2], 20)
    X = np.array([0.01, 0.012, -0.01])[y][:, None]
    clf = head_classifier("balanced", gamma=1e-6).fit(X, y)
    w = clf.class_scores(np.array([[1.0]]))[0]
    assert np.argmax(w) == 1 and w[1] > 1.1 * w[0] > 0
    row = np.array([[3.4e306]])
    assert np.isfinite(clf.class_scores(row)).all()
    assert clf.predict(row)[0] == 1


def test_ties_bound_near_the_top_of_float64():
    """Scores about 1e308: apart by 20% they are ranked as their exact argmax; apart by less than their rounding (the
    scaled bound, about 1e292) they are still a tie; overflowed to inf they are refused as beyond float64's range."""
    h = np.array([[3.4e306]])
    W = np.array([[30.0, 36.0, -30.0]])
    assert Ties.of(W).check((h @ W)[:, None, :], h)[0, 0] == exact_argmax(h, W)[0] == 1
    # two classes that differ (by a second feature, 1e280 of the row) far below the scores' rounding: a true tie
    near, close = np.array([[3.4e306, 1e280]]), np.array([[30.0, 30.0], [0.0, 1.0]])
    with pytest.raises(FoalPipeError, match=TIED):
        Ties.of(close).check((near @ close)[:, None, :], near)
    huge = np.array([[1e200]])
    over = np.array([[1e200, 2e200]])
    with np.errstate(over="ignore"):
        scores = huge @ over
    with pytest.raises(FoalPipeError, match=BEYOND):
        Ties.of(over).check(scores[:, None, :], huge)
    with pytest.raises(FoalPipeError, match=BEYOND), np.errstate(over="ignore"):
        ModelScores(over, 1).argmax(Rows.of(huge))
