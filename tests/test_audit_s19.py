"""Faults found by the nineteenth stop's audits: a deployed model's class names checked when set, predict's note for a
model without class names, and its message for a checkpoint given to an encoder without weights."""

import numpy as np
import pytest
from helpers import PIXELS

from foal_pipe import AnalyticClassifier, FoalPipeError
from foal_pipe.extract.encoding import build_recorded_encoder
from foal_pipe.model.deploy import DeployedModel


@pytest.fixture
def deployed():
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(60, 6)), rng.integers(0, 3, 60)
    return DeployedModel(AnalyticClassifier(gamma=1.0).fit(X, y), None, ["a", "b", "c"], {})


@pytest.mark.parametrize("names, problem", [(["a", "a", "b"], "names 'a' twice"),
                                            ([1, 2, 3], "must be a list of strings")])
def test_class_names_are_checked_when_set(deployed, names, problem):
    """A name twice sent a labelled row of the first to the second's class (partial_fit), and ints were accepted:
    both were refused only at save, blaming a file not yet written."""
    with pytest.raises(FoalPipeError, match=problem) as caught:
        deployed.class_names = names
    assert "pass one distinct string per class" in str(caught.value)
    assert deployed.class_names == ["a", "b", "c"]


def test_a_checkpoint_for_an_encoder_without_weights_is_named_plainly():
    with pytest.raises(FoalPipeError, match="encoder pixels has no weights, not a checkpoint's; drop"):
        build_recorded_encoder({**PIXELS, "weights": {}}, checkpoint="y.safetensors")


def test_predict_says_when_a_model_without_class_names_takes_the_stores(tmp_path):
    """A model saved by AnalyticClassifier.save records no class names: predict reads its label ids as the store's,
    which named a class the model never learned with exit 0 and nothing said."""
    from helpers import invoke

    from foal_pipe import load_model
    from foal_pipe.model.ridgemodel import RidgeModel
    from foal_pipe.store import write_store

    rng = np.random.default_rng(1)
    X, y = rng.normal(size=(90, 6)), np.repeat(np.arange(3), 30)
    X += 3.0 * y[:, None]
    store = write_store(tmp_path / "s.zarr", (X, y), (X[:30], y[:30]), ["x", "y", "z"])
    result = invoke("learn", "--features", store, "--out", tmp_path / "run", "--tasks", 1, "--projection-dim", 16)
    assert result.exit_code == 0, result.output
    learnt = tmp_path / "run" / "model.safetensors"
    nameless = AnalyticClassifier.from_model(RidgeModel.load(learnt))  # the sums alone: no class names recorded
    nameless.save(tmp_path / "m.safetensors", projection=load_model(learnt).projection)
    said = []
    for model in (tmp_path / "m.safetensors", learnt):
        result = invoke("predict", "--model", model, "--features", store, "--out", tmp_path / f"{len(said)}.csv")
        assert result.exit_code == 0, result.output
        said.append("records no class names" in " ".join(result.output.split()))
        if said[-1]:  # the advice names what records them
            assert "set foal_pipe.load_model(...).class_names and save it" in " ".join(result.output.split())
    assert said == [True, False]


def test_a_gamma_the_sums_cannot_take_is_refused_naming_one_they_take(tmp_path):
    """Following "use a gamma of at least" (the sums' resolution) was refused again as not positive definite or too
    ill-conditioned, with only "use a larger gamma": the three refusals now name one gamma, at which the drift lies
    at a quarter of the limit (float32's estimate from 32 columns refused one named at the limit), and it passes."""
    import re

    from helpers import invoke
    from sklearn.datasets import load_digits

    from foal_pipe.store import write_store

    X, y = load_digits(return_X_y=True)
    store = write_store(tmp_path / "d.zarr", (X[:1400], y[:1400]), (X[1400:], y[1400:]), [str(i) for i in range(10)])
    for dtype, cases in (("float64", (("1e-20", "below the resolution"), ("3.1e-14", "not positive definite"),
                                      ("1e-10", "too ill-conditioned"))),
                         ("float32", (("1.7e-05", "not positive definite"), ("1e-3", "too ill-conditioned")))):
        args = ("--features", store, "--tasks", 10, "--projection-dim", 200, "--seed", 3, "--dtype", dtype)
        named = set()
        for gamma, refusal in cases:
            result = invoke("learn", *args, "--gamma", gamma, "--out", tmp_path / "r")
            assert result.exit_code == 1 and refusal in result.output, result.output
            named.add(re.search(r"use a gamma of at least (\S+) ", result.output).group(1))
        assert len(named) == 1, named
        result = invoke("learn", *args, "--gamma", named.pop(), "--out", tmp_path / dtype)
        assert result.exit_code == 0, result.output


def test_the_named_gamma_falls_back_where_the_eigenvalues_fail(monkeypatch):
    """Where LAPACK's eigenvalues do not converge the refusal still says one line: the resolution's figure, or only
    to use a larger gamma, never a traceback."""
    import array_api_compat.numpy as xp

    from foal_pipe.core.linalg import larger_gamma

    def fails(A):
        raise np.linalg.LinAlgError("Eigenvalues did not converge")

    monkeypatch.setattr(xp.linalg, "eigvalsh", fails)
    G = np.diag([4.0, 1.0])
    assert larger_gamma(G, None, 1e-3).startswith("use a gamma of at least 0.001 ")
    assert larger_gamma(G) == "use a larger gamma"
