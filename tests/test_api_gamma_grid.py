"""``AnalyticClassifier(gamma_grid=...)`` at a fixed gamma (either engine) warns that the grid is ignored, as
scikit-learn warns of ``l1_ratio`` without ``penalty='elasticnet'``; the CLI refuses the same combination."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from foal_pipe import AnalyticClassifier


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(40, 5)), rng.integers(0, 3, 40)


@pytest.mark.parametrize("params", [{"engine": "rls"}, {"engine": "gram", "gamma": 0.5}])
def test_a_grid_at_a_fixed_gamma_warns(params):
    X, y = _data()
    with pytest.warns(UserWarning, match="gamma_grid is used only with gamma='auto'"):
        AnalyticClassifier(gamma_grid=(1e-3, 1.0), **params).fit(X, y)


def test_the_grid_with_auto_does_not_warn_and_is_used():
    X, y = _data()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        clf = AnalyticClassifier(gamma="auto", gamma_grid=(0.25, 4.0)).fit(X, y)
    assert 0.25 <= clf.gamma_ <= 4.0
