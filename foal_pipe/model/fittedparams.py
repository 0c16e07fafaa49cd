"""The parameters an estimator's fitted state is built with: checked and turned into ridge's engine, then held fixed.

An estimator records the parameters its state was fitted with; ``set_params`` changes them for the next ``fit``
only, and a later ``partial_fit`` that would mix them is refused (:func:`check_fitted_params`, for
:class:`~foal_pipe.model.classifier.AnalyticClassifier` and the heads' estimators alike). :func:`new_engine` builds
the AnalyticClassifier's engine from its parameters, so the checks of those parameters live beside the engine they
choose rather than in the estimator's module.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from foal_pipe.core.backend import default_device, get_namespace, resolve_dtype
from foal_pipe.core.engines import ENGINES, GramEngine, RLSEngine, check_gamma
from foal_pipe.core.gammasearch import PER_DECADE, search_grid
from foal_pipe.core.statistics import DEFAULT_GAMMA_GRID
from foal_pipe.errors import FoalPipeError, param


def same_param(value: Any, fitted: Any) -> bool:
    """Whether a parameter still has the value the state was fitted with (a number, a string, None or a sequence)."""
    if value is None or fitted is None or isinstance(value, str) or isinstance(fitted, str):
        return value is fitted or (isinstance(value, str) and isinstance(fitted, str) and value == fitted)
    if isinstance(value, (bool, np.bool_)) != isinstance(fitted, (bool, np.bool_)):  # True == 1, but fit refuses one
        return False
    if isinstance(fitted, (int, np.integer)) and not isinstance(value, (int, np.integer)):  # 8.0 where fit took 8
        return False
    return bool(np.array_equal(value, fitted))


def check_fitted_params(estimator: Any, fitted: dict[str, Any]) -> None:
    """Refuse to keep learning after ``set_params`` changed a parameter the ``fitted`` state is built with."""
    for name, value in fitted.items():
        if not same_param(getattr(estimator, name), value):
            raise FoalPipeError(
                f"{param(name)} is {getattr(estimator, name)!r} but this {type(estimator).__name__} was fitted with "
                f"{value!r}; call fit to learn afresh with it, or set {name} back to {value!r} to keep learning")


def grid_gammas(grid: Any) -> tuple[float, ...]:
    """The entries of ``gamma_grid``, checked: a sequence of positive numbers, not one number or a string (iterated
    by character)."""
    try:
        if isinstance(grid, (str, bytes)):
            raise TypeError
        entries = list(grid)
    except TypeError:
        raise FoalPipeError(f"gamma_grid must be a sequence of gammas, got {grid!r:.60}; e.g. gamma_grid=[0.1, 1, 10]"
                            ) from None
    gammas = []
    for g in entries:
        try:
            gammas.append(check_gamma(g))
        except FoalPipeError:
            raise FoalPipeError(f"gamma_grid must hold positive numbers, got {g!r:.30}; e.g. gamma_grid=[0.1, 1, 10]") from None
    return tuple(gammas)


def new_engine(n_features: int, *, gamma: float | str, engine: str, dtype: str, backend: str,
               gamma_grid: Sequence[float] | None, per_decade: int = PER_DECADE) -> tuple[GramEngine | RLSEngine, np.dtype]:
    """A fresh engine for ``n_features`` features built with the estimator's parameters, and its state dtype; the
    parameters are checked first (an unknown engine, a gamma that is not positive, ``"auto"`` without the gram engine)."""
    if engine not in ENGINES:
        raise FoalPipeError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    if gamma != "auto":
        check_gamma(gamma)
    elif engine != "gram":
        raise FoalPipeError("gamma='auto' needs engine='gram' (the RLS recursion fixes gamma in R0 = I/gamma)")
    for name, given in (("gamma_grid", gamma_grid is not None), ("per_decade", per_decade != PER_DECADE)):
        if given and gamma != "auto":  # as scikit-learn warns of l1_ratio without elasticnet
            warnings.warn(f"{name} is used only with gamma='auto'; it is ignored at gamma={gamma!r}", UserWarning,
                          stacklevel=4)
    xp = get_namespace(backend)
    state_dtype = resolve_dtype(dtype)
    xp_dtype, where = getattr(xp, state_dtype.name), default_device(xp)
    if engine == "gram":
        grid = DEFAULT_GAMMA_GRID if gamma_grid is None else grid_gammas(gamma_grid)
        if gamma == "auto":
            search_grid(grid, per_decade)  # refuses an empty grid or a per_decade that is not an integer >= 0
        return GramEngine(n_features, gamma, xp, xp_dtype, where, grid=grid, per_decade=per_decade), state_dtype
    return ENGINES[engine](n_features, gamma, xp, xp_dtype, where), state_dtype
