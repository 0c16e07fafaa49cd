"""The two exact engines behind :class:`~foal_pipe.model.classifier.AnalyticClassifier`.

Both keep the ridge solution ``W = (H^T H + gamma I)^-1 H^T Y`` over every sample seen so far:

* :class:`RLSEngine` is the paper's recursive least squares (Theorems 3.1-3.2): per batch, a Woodbury
  update of ``R = (H^T H + gamma I)^-1`` and of ``W``. Cost O(D^2 S) per batch, every batch.
* :class:`GramEngine` accumulates :class:`~foal_pipe.core.statistics.RidgeStatistics` (order-free sums) and
  solves for ``W`` only when the weights are asked for: O(D^2 S) per batch as one BLAS call, O(D^3) per solve.
  With ``gamma="auto"`` it picks gamma by GCV from the statistics alone.

Engines are written against the array API; their namespace is that of their arrays (nothing holds a
module, so an engine pickles).
"""

from __future__ import annotations

import functools
import threading
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar

import numpy as np
from array_api_compat import array_namespace, device

from foal_pipe.core.backend import dtype_name
from foal_pipe.core.drift import DRIFTS, diagonal_resolution
from foal_pipe.core.gammapath import gcv_undeterminable
from foal_pipe.core.gammasearch import PER_DECADE, best_point, search_grid
from foal_pipe.core.linalg import check_gammas, checked_solve, float64, one_hot, shifted
from foal_pipe.core.statistics import DEFAULT_GAMMA_GRID, RidgeStatistics, align_columns
from foal_pipe.core.sumfields import joined_classes
from foal_pipe.errors import FoalPipeError, param

#: GCV's choice is flagged when the effective degrees of freedom exceed this fraction of the rows.
GCV_DOF_WARNING = 0.9

_LOCKS: weakref.WeakKeyDictionary[Any, threading.RLock] = weakref.WeakKeyDictionary()
_LOCKS_LOCK = threading.Lock()


def owner_lock(owner: Any) -> threading.RLock:
    """The re-entrant lock of ``owner`` (an estimator, an engine, a deployed model), made when first asked for: its
    learning calls and lazy solves hold it, and its readers take their snapshot of the model under it. Kept outside
    the object, so that pickles, copies and ``vars()`` stay as they were (a lock neither pickles nor deep-copies)."""
    with _LOCKS_LOCK:
        lock = _LOCKS.get(owner)
        if lock is None:
            lock = _LOCKS[owner] = threading.RLock()
        return lock


P = ParamSpec("P")
R = TypeVar("R")


def locked(method: Callable[Concatenate[Any, P], R]) -> Callable[Concatenate[Any, P], R]:
    """``method`` run under its owner's lock (:func:`owner_lock`)."""
    @functools.wraps(method)
    def held(self: Any, *args: P.args, **kwargs: P.kwargs) -> R:
        with owner_lock(self):
            return method(self, *args, **kwargs)

    return held


def gcv_choice(statistics: RidgeStatistics, grid: Sequence[float],
               per_decade: int = PER_DECADE) -> tuple[float, Any, str | None]:
    """``(gamma, W, warning)``: the gamma of least GCV over the refined search of ``grid``'s range, ``per_decade``
    points a decade (:func:`~foal_pipe.core.gammasearch.search_grid`), its weights, and a warning when ``df/n > 0.9``.

    GCV needs no row (exemplar-free) but degenerates when the effective degrees of freedom near ``n``. The
    weights are solved at the chosen gamma, so they equal those of a classifier given that gamma. Points at or below
    the sums' resolution (float32 sums) are left out, as ``learn --gamma auto`` leaves them (all of them: refused).
    """
    path = statistics.gamma_path(vectors=False)
    points = search_grid(grid, per_decade)
    usable = points > path.floor if path.floor else np.ones(points.size, dtype=bool)
    points = points[usable] if usable.any() else points
    values = path.gcv(points)
    if not np.isfinite(values).any():
        raise gcv_undeterminable()
    index = best_point(values, larger=False)
    gamma = float(points[index])
    ratio = float(path.dof([gamma])[0]) / max(statistics.n, 1)
    warnings_ = []
    if ratio > GCV_DOF_WARNING:
        warnings_.append(f"GCV chose gamma {gamma:g} where the effective degrees of freedom are {100 * ratio:.0f}% of "
                         f"the {statistics.n} rows; GCV is unreliable as D nears n: prefer leave-one-out selection")
    if index == 0 and not usable.all():
        warnings_.append(f"gamma='auto' chose {gamma:g}, the least gamma its {dtype_name(statistics.dtype)} sums resolve "
                         f"(above {path.floor:.3g}); the grid's smaller gammas were left out, their solutions being noise")
    warning = "; ".join(warnings_) or None
    return gamma, statistics.solve(gamma, drift_checked=True), warning  # the path's floor checked every gamma


#: Values ``float()`` takes that are no numeric parameter: a flag (``float(True)`` is 1), or text, which is the command
#: line's to parse (:func:`~foal_pipe.protocol.config.parse_gamma`, ``--head-option``), not an estimator's.
NOT_NUMBERS = (bool, np.bool_, str, bytes)


def check_gamma(gamma: Any) -> float:
    """A positive, finite gamma as a float; anything else refused (:data:`NOT_NUMBERS` too)."""
    try:
        if isinstance(gamma, NOT_NUMBERS):
            raise TypeError
        value = float(gamma)
    except (TypeError, ValueError):
        raise FoalPipeError(f"gamma must be a positive number or 'auto', got {gamma!r}; try {param('gamma', 1)}") from None
    if not np.isfinite(value) or value <= 0:
        raise FoalPipeError(f"gamma must be a positive number, got {gamma}; try {param('gamma', 1)}")
    return value


def checked_weights(W: Any) -> Any:
    """``W``, refused when not finite (an ill-conditioned float32 recursion, or a solve past its precision)."""
    xp = array_namespace(W)
    if not bool(xp.all(xp.isfinite(W))):
        raise FoalPipeError(
            f"the classifier has non-finite weights (ill-conditioned system); use a larger {param('gamma')} "
            f"or {param('dtype', 'float64')}"
        )
    return W


def grow_classes(engine: GramEngine | RLSEngine, classes: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """The sorted ``classes`` with ``labels``' new ones, the engine's columns widened to them (zero where new)."""
    merged = joined_classes(classes, labels)
    if merged is not classes:
        engine.insert_classes(classes, merged)
    return merged


def saved_sums(state: Mapping[str, Any], classes: np.ndarray, n: int, like: Any, dtype: Any) -> RidgeStatistics:
    """The sums a model's state keeps (``G``, ``Q``, ``counts``, ``rounding``) in the namespace and on the device of
    ``like``: ``G`` in ``dtype``, ``Q`` in float64, as :class:`RidgeStatistics` holds it (a file written before the
    twenty-eighth stop holds it in ``G``'s dtype)."""
    xp, where = array_namespace(like), device(like)
    G, Q = xp.asarray(state["G"], dtype=dtype, device=where), xp.asarray(state["Q"], dtype=xp.float64, device=where)
    counts = state.get("counts")
    return RidgeStatistics(G, Q, classes, int(n), None if counts is None else np.asarray(counts), rounding=state.get("rounding"))


def check_engine_dtype(engine: str, dtype: str) -> None:
    """Refuse the RLS recursion in float32: it updates ``(G + gamma I)^-1`` itself, whose rounding errors grow with
    its conditioning and the number of updates without a bound that could be checked (on 300 correlated rows,
    W off by 20% at gamma 1e-4), where the gram engine's float32 sums are solved in float64 and their drift
    checked."""
    if engine == "rls" and dtype == "float32":
        raise FoalPipeError(
            f"{param('engine', 'rls')} with {param('dtype', 'float32')} is refused: the RLS recursion updates "
            "(G + gamma I)^-1 itself in float32, whose rounding no check bounds; use "
            f"{param('engine', 'gram')} (its float32 sums are solved in float64 and checked) or {param('dtype', 'float64')}")


class RLSEngine:
    """The paper's per-batch recursive least squares; ``R0 = I / gamma``, ``W0 = 0``.

    The recursion updates ``(G + gamma I)^-1`` itself, so its rounding is not the sums': at small gammas it moved W
    by 27% (digits, gamma 1e-9) where the sums' exact solve was within 1e-7. The engine therefore keeps those sums
    beside it (float64 ``G`` and ``Q``, each batch's product added as it comes, so that neither a read nor a save
    changes how they are summed) and, whenever the weights are asked for after an update, checks them against that
    solve (:meth:`verify`): a recursion that drifted by more than :data:`~foal_pipe.core.drift.DRIFTS` is refused, as
    is a gamma the sums themselves cannot resolve."""

    name = "rls"
    state_names = ("R", "W")

    def __init__(self, dim: int, gamma: float | str, xp: Any, dtype: Any, device: Any = None) -> None:
        if gamma == "auto":
            raise FoalPipeError("gamma='auto' needs the gram engine (the RLS recursion fixes gamma in R0 = I/gamma)")
        self.gamma = check_gamma(gamma)
        self.R = xp.eye(dim, dtype=dtype, device=device) / self.gamma
        if not bool(xp.all(xp.isfinite(self.R))):
            raise FoalPipeError(
                f"gamma {self.gamma:g} underflows in {dtype_name(dtype)}: R0 = I/gamma is not finite; "
                "use a larger gamma or float64"
            )
        self.W = xp.zeros((dim, 0), dtype=dtype, device=device)
        #: ``W`` minus the exact solve of the sums, float64, as :meth:`verify` last measured it (columns as ``W``'s).
        self.drift = xp.zeros((dim, 0), dtype=xp.float64, device=device)
        self.classes = np.empty(0)
        self._sums: RidgeStatistics | None = RidgeStatistics.empty(dim, xp, xp.float64, device)
        self._verified, self._loaded_rows = True, 0

    def __setstate__(self, state: dict[str, Any]) -> None:
        """An engine pickled before the drift was kept: its weights are checked again, which measures it; one pickled
        while rows waited to be added to its checking sums (before each batch was added as it came): they are added."""
        pending = state.pop("_pending", [])
        self.__dict__.update(state)
        for H, labels in pending:
            self._sums = self._formed_sums()
            self._sums += RidgeStatistics.from_batch(H, labels, np.unique(labels))
        if "drift" not in state:
            xp = array_namespace(self.R)
            self.drift = xp.zeros(self.W.shape, dtype=xp.float64, device=device(self.R))
            self._verified = False

    def insert_classes(self, old: np.ndarray, new: np.ndarray) -> None:
        """Zero columns of ``W`` wherever a class of ``new`` (a sorted superset of ``old``) is not in ``old``."""
        self.W, self.drift = align_columns(self.W, old, new), align_columns(self.drift, old, new)
        self.classes = new

    def restore_classes(self, old: np.ndarray, grown: np.ndarray) -> None:
        """Undo :meth:`insert_classes` of a refused batch (an update that raised changes nothing else)."""
        kept = np.searchsorted(grown, old)
        self.W, self.drift = kept_columns(self.W, kept), kept_columns(self.drift, kept)
        self.classes = old

    @locked
    def update(self, H: Any, labels: Any, classes: np.ndarray) -> None:
        """One Woodbury step: ``K = (I + H R H^T)^-1``, ``W += R H^T K (Y - H W)``, ``R -= R H^T K H R``, and the
        batch's sums added to the checking sums; under the engine's lock (:func:`owner_lock`), so that a reader's
        :meth:`verify` never takes half of a step."""
        check_engine_dtype(self.name, dtype_name(self.R.dtype))
        xp = array_namespace(self.R)
        self._sums = self._formed_sums()
        Y = one_hot(labels, classes, H)
        with np.errstate(over="ignore", invalid="ignore"):  # rows too large overflow here: refused just below, silently
            RHt = self.R @ H.T
            M = H @ RHt + xp.eye(H.shape[0], dtype=H.dtype, device=device(H))
        RHtK = checked_solve(M, RHt.T, FoalPipeError(  # M is symmetric, so (M^-1 RHt^T)^T = RHt M^-1
            f"the RLS update is singular (an ill-conditioned system, or features too large for it); use a larger "
            f"{param('gamma')} or scale the features"
        )).T
        # new arrays, both formed before either is set: a weights_ read before keeps the values it had, and a state
        # that cannot be written (a read-only memory map of a saved learner) is never left half-stepped
        W = self.W + RHtK @ (Y - H @ self.W)
        R = RHtK @ RHt.T
        R *= -1.0
        R += self.R  # R - U, in U's memory: the same bits
        labels = np.asarray(labels).ravel()
        batch = RidgeStatistics.from_batch(float64(H), labels, np.unique(labels))
        self.W, self.R = W, R
        self._sums += batch
        self._verified = False

    def _formed_sums(self) -> RidgeStatistics:
        """The checking sums; after :meth:`load_state`, those the loaded state stands for, ``G + gamma I = R^-1``
        and ``Q = R^-1 W``: continuing a saved recursion is checked from the state it starts from."""
        if self._sums is not None:
            return self._sums
        xp = array_namespace(self.R)
        inverse = xp.linalg.inv(xp.astype(self.R, xp.float64))
        inverse = (inverse + inverse.T) / 2
        Q = inverse @ xp.astype(self.W, xp.float64)
        return RidgeStatistics(shifted(inverse, -self.gamma), Q, self.classes, self._loaded_rows)

    @locked
    def verify(self) -> None:
        """Refuse weights that the recursion's rounding moved from the exact solve of the same sums by more than
        :data:`~foal_pipe.core.drift.DRIFTS` (that solve refuses a gamma the sums cannot resolve). Under the engine's
        lock: readers in several threads verify once."""
        if self._verified:  # a loaded state is verified until it is updated
            return
        xp = array_namespace(self.R)
        exact = self._formed_sums().aligned(self.classes).solve(self.gamma)
        scale = float(xp.linalg.vector_norm(exact))
        drift = xp.astype(self.W, xp.float64) - exact
        moved = float(xp.linalg.vector_norm(drift)) / scale if scale else 0.0
        if not moved <= DRIFTS["float64"]:
            raise FoalPipeError(
                f"the RLS recursion's rounding moved the weights by {moved:.1g} (more than {DRIFTS['float64']:g}) from "
                f"the exact solve of the same sums at gamma {self.gamma:g}; use a larger {param('gamma')} or "
                f"{param('engine', 'gram')}")
        self.drift, self._verified = drift, True

    def weights(self) -> Any:
        """``W``, checked against the exact solve of the sums since the last update (:meth:`verify`)."""
        with owner_lock(self):
            self.verify()
            return self.W

    @property
    def template(self) -> Any:
        """An array of the state: inputs are converted to its dtype and device."""
        return self.R

    def state(self) -> dict[str, Any]:
        """``R`` and ``W``, ``W``'s drift from the exact solve (:meth:`verify`'s, measured first if due), which a
        model file keeps so that its scores are checked with it (:class:`~foal_pipe.core.scoring.Ties`), and the
        float64 sums it is measured against (``G``, ``Q``, ``counts``, ``rounding``): a stream saved and reloaded
        goes on measuring it from them, as the uninterrupted stream does, not from sums rebuilt from ``R``."""
        with owner_lock(self):
            self.verify()
            return {"R": self.R, "W": self.W, "drift": self.drift, **self._formed_sums().aligned(self.classes).state()}

    def load_state(self, state: dict[str, Any], classes: np.ndarray, n: int) -> None:
        xp = array_namespace(self.R)
        for name in self.state_names:
            if name not in state:
                raise FoalPipeError(f"saved rls state lacks the tensor {name!r}; save the model again")
        self.R = xp.asarray(state["R"], dtype=self.R.dtype, device=device(self.R))
        self.W = xp.asarray(state["W"], dtype=self.R.dtype, device=device(self.R))
        self.classes, self._loaded_rows = np.asarray(classes), int(n)
        # the drift the saved state recorded; none in a file from before drifts were kept, which is scored as saved.
        # Learning on measures the drift again, from the sums the loaded state stands for.
        self.drift = (xp.asarray(state["drift"], dtype=xp.float64, device=device(self.R)) if "drift" in state
                      else xp.zeros(self.W.shape, dtype=xp.float64, device=device(self.R)))
        # the checking sums the file kept; none in a file written before it kept them: those the loaded R and W stand for
        self._sums = (saved_sums(state, self.classes, self._loaded_rows, self.R, xp.float64)
                      if "G" in state and "Q" in state else None)
        self._verified = True


class GramEngine:
    """Accumulate ``G = H^T H`` and ``Q = H^T Y``; solve ``(G + gamma I) W = Q`` on demand (float64).

    ``gamma="auto"`` picks the gamma of least GCV over ``grid``'s range (``per_decade`` points a decade) at every
    solve (:func:`gcv_choice`).
    """

    name = "gram"
    state_names = ("G", "Q")
    #: The weights are the exact solve of the sums: no drift from it (:attr:`RLSEngine.drift`).
    drift = None

    def __init__(self, dim: int, gamma: float | str, xp: Any, dtype: Any, device: Any = None,
                 grid: Sequence[float] = DEFAULT_GAMMA_GRID, per_decade: int = PER_DECADE) -> None:
        self.gamma, self.grid, self.per_decade = gamma, tuple(grid), per_decade
        self.statistics = RidgeStatistics.empty(dim, xp, dtype, device)
        self._solution: tuple[float, Any] | None = None

    def insert_classes(self, old: np.ndarray, new: np.ndarray) -> None:
        self.statistics = self.statistics.aligned(new)
        self._solution = None

    def restore_classes(self, old: np.ndarray, grown: np.ndarray) -> None:
        """Undo :meth:`insert_classes` of a refused batch (the sums take a batch only once it is formed)."""
        s, kept = self.statistics, np.searchsorted(grown, old)
        counts = None if s.counts is None else s.counts[kept]
        self.statistics = RidgeStatistics(s.G, kept_columns(s.Q, kept), old, s.n, counts, rounding=s.rounding)
        self._solution = None

    def update(self, H: Any, labels: Any, classes: np.ndarray) -> None:
        """Add the batch's sums; a batch whose products overflow the sums' dtype is refused before it is added (the
        sums would be inf for good, every later solve refused)."""
        xp = array_namespace(H)
        top = float(xp.max(xp.abs(H))) if H.shape[0] * H.shape[1] else 0.0
        if top * top * H.shape[0] > float(np.finfo(dtype_name(self.statistics.G.dtype)).max):
            raise FoalPipeError(f"features of magnitude {top:.3g} overflow the {dtype_name(self.statistics.G.dtype)} Gram "
                                "sums (|x|^2 beyond the largest number); scale the features")
        batch = RidgeStatistics.from_batch(H, labels, classes)
        if self.gamma != "auto":
            self._check_resolved(batch)
        self.statistics += batch
        self._solution = None

    def _check_resolved(self, batch: RidgeStatistics) -> None:
        """Refuse, before it is added, a batch after which the sums could not resolve the fixed gamma (the solve
        would refuse them, and every later one: a deployed model would be stuck with them). The diagonal is added as
        the sums' in-place addition adds it, so the figure is the one the solve would check."""
        G = self.statistics.G
        if G.shape[0] == 0:
            return
        xp = array_namespace(G)
        diagonal = xp.linalg.diagonal(G) + xp.astype(xp.asarray(xp.linalg.diagonal(batch.G), device=device(G)), G.dtype)
        floor = diagonal_resolution(diagonal)
        if floor and float(self.gamma) < floor:  # the sums with the batch (a copy: these stay) name a gamma they take
            prospective = self.statistics + batch
            try:
                check_gammas(prospective.G, float(self.gamma), prospective.Q, prospective.rounding_top)
            except FoalPipeError as exc:
                raise FoalPipeError(f"{exc.template}; this batch is refused and the model left as it was") from None

    def solution(self) -> tuple[float, Any]:
        """``(gamma, W)``: the gamma used (chosen by GCV when ``auto``) and the weights, cached until the next update."""
        if self._solution is None:
            if self.gamma == "auto":
                gamma, W, warning = gcv_choice(self.statistics, self.grid, self.per_decade)
                if warning:
                    warnings.warn(warning, stacklevel=3)
            else:
                gamma, W = float(self.gamma), self.statistics.solve(float(self.gamma))
            self._solution = (gamma, W)
        return self._solution

    def weights(self) -> Any:
        return self.solution()[1]

    def keep_solution(self, gamma: float, W: Any) -> None:
        """Take ``W`` (D x C, solved at ``gamma``) as the solution until the next update: a loaded model's
        weights, as saved."""
        G = self.statistics.G
        xp = array_namespace(G)
        self._solution = (float(gamma), xp.asarray(W, dtype=xp.float64, device=device(G)))

    @property
    def template(self) -> Any:
        """An array of the state: inputs are converted to its dtype and device."""
        return self.statistics.G

    def state(self) -> dict[str, Any]:
        """The statistics' :meth:`~foal_pipe.core.statistics.RidgeStatistics.state`."""
        return self.statistics.state()

    def load_state(self, state: dict[str, Any], classes: np.ndarray, n: int) -> None:
        for name in self.state_names:
            if name not in state:
                raise FoalPipeError(f"saved gram state lacks the tensor {name!r}; save the model again")
        self.statistics = saved_sums(state, classes, n, self.statistics.G, self.statistics.G.dtype)
        self._solution = None


def kept_columns(matrix: Any, kept: np.ndarray) -> Any:
    """The columns ``kept`` of ``matrix``: a class set grown by a refused batch back to the one before it."""
    xp = array_namespace(matrix)
    return xp.take(matrix, xp.asarray(kept, device=device(matrix)), axis=1)


ENGINES: dict[str, type[GramEngine] | type[RLSEngine]] = {"gram": GramEngine, "rls": RLSEngine}
DEFAULT_ENGINE = "gram"
