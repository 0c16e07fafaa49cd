"""``dual``: DS-AL (Zhuang et al., AAAI 2024, "DS-AL: A Dual-Stream Analytic Learning for Exemplar-Free
Class-Incremental Learning"): a main ridge stream on ``relu(h)`` and a compensation ridge stream on ``tanh(h)``
fitted to what the main stream leaves over, ``h`` the rows after the projection and before any activation.

The recursion is ``DSAL.fit`` in ZHUANGHP/Analytic-continual-learning (``analytic/DSAL.py``, lines 61-77 at commit
0afd6bf), called once per mini-batch ``(h_b, Y_b)`` of the stream (``analytic/ACIL.py``, line 240):

1. the main stream takes the batch (``RecursiveLinear.fit``, ``analytic/AnalyticLinear.py`` lines 101-128): its
   weights become the ridge solution ``W_m = (G_m + gamma I)^-1 Q_m`` over every relu row so far, this batch
   included;
2. "previous label cleansing" (DSAL.py lines 71-73): the residual ``E_b = Y_b - relu(h_b) W_m``, with the columns
   of earlier tasks' classes set to zero;
3. the compensation stream takes ``(tanh(h_b), E_b)``: at a boundary its weights are the ridge solution
   ``W_c = (G_c + gamma_comp I)^-1 sum_b tanh(h_b)^T E_b``.

Scores are ``relu(h) W_m + compensation * tanh(h) W_c`` (DSAL.py line 58). The residuals depend on the order of the
rows and on how they are cut into batches, so exact here means equal to this recursion for the stream's
mini-batches: the rows of each task (those after the previous ``boundary()``), in stream order, cut from that
task's first row into batches of ``batch_size`` rows; the task's last batch holds the rest (it may be short), as
a DataLoader without ``drop_last`` gives. ``add`` may receive blocks of any size: a partial batch is carried
over to the next block and flushed at ``boundary()``.

Which columns are cleansed. The published code zeroes ``Y_comp[:, :-increase_size]`` (DSAL.py line 73): every
column but the last ``increase_size`` of ``0 .. M``, where ``M`` is the largest label seen so far (the width of
``Y_main``, line 62) and ``increase_size`` the number of classes of the current phase (the base phase's size in
phase 0, ``main.py`` lines 227-229). With class ids numbered in task order, that is every class of an earlier
task once the running ``M`` has reached the current task's largest class; before that (a batch in which the
task's largest class has not yet appeared), the kept window slides down onto earlier classes. Class ids here are
global and any order may be walked, so this head states the rule by task, which the published code means:
the columns of every class seen before the current task began are zeroed, the classes first seen in the current
task are kept. A class that recurs from an earlier task is zeroed. Predictions are over the classes seen (the
published code also scores never-seen ids below ``M``, with zero weights).

Numerics: the main stream keeps ``R = (G_m + gamma I)^-1`` by the Woodbury update of the published code (a batch
costs O(b D^2), not a D x D solve), run for several consecutive batches in one pass over ``R``
(:meth:`DualHead._batches`), and refreshes it from ``G_m`` by an exact float64 solve at every boundary, where
``W_m`` and ``W_c`` are exact solves too; the residuals the compensation stream took are a cancellation whose
rounding a boundary estimates, refused where it may move ``W_c`` by more than 1e-4
(:meth:`DualHead._check_residuals`). Measured on one core at D = 1000, batch 10: 860 rows/s batch by batch with the
Grams per batch, 1,500-1,900 with the Grams per block, 2,200-2,800 with 25-batch blocks (load 2-6 on 2 shared cores).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any, ClassVar

import numpy as np
from array_api_compat import array_namespace, device

from foal_pipe.core.drift import DRIFTS, UNITS
from foal_pipe.core.linalg import (
    PROBES,
    check_drift,
    check_solved,
    float64,
    one_hot,
    probe_columns,
    shifted,
    solve_spd,
    spd_solver,
)
from foal_pipe.core.scoring import Ties
from foal_pipe.core.statistics import align_columns
from foal_pipe.errors import FoalPipeError, param
from foal_pipe.heads.base import HeadBase, check_gram_room, largest_square, magnitude
from foal_pipe.heads.checks import FLOAT64, at_least_one, check_rows, finite, positive
from foal_pipe.heads.moments import on_device, row_major

#: Rows whose Woodbury steps share one pass over the D x D inverse (at most; a quarter of D for a small D).
BLOCK_ROWS = 256


def block_batches(batch_size: int, dim: int) -> int:
    """Mini-batches per block of :meth:`DualHead._batches`: about ``min(BLOCK_ROWS, D / 4)`` rows, at least one batch."""
    return max(1, min(BLOCK_ROWS, dim // 4) // batch_size)


def relu(h: Any) -> Any:
    """``max(h, 0)`` as a new array (``h`` is left as it is)."""
    xp = array_namespace(h)
    return xp.where(h > 0, h, xp.zeros_like(h))


@dataclass(eq=False)
class DualScorer:
    """``relu(h) W_main + compensation * tanh(h) W_comp`` over ``classes``."""

    classes: np.ndarray
    W_main: Any
    W_comp: Any
    compensation: float

    def scores(self, X: Any) -> Any:
        xp = array_namespace(X)
        h = float64(X)
        return relu(h) @ self.W_main + self.compensation * (xp.tanh(h) @ self.W_comp)

    def ties(self, X: Any) -> tuple[Ties, Any]:
        """What refuses rows whose :meth:`scores` tie within their float64 rounding (:meth:`Ties.check`): the scores
        are ``[relu(h), tanh(h)] @ [W_main; compensation W_comp]``, two products of D terms, whose rounding with
        tanh's own (a few units), the product by ``compensation`` and the sum of the two that of a 2D + 6 term sum
        bounds."""
        xp = array_namespace(X)
        h = float64(X)
        W = xp.concat([self.W_main, self.compensation * self.W_comp], axis=0)
        return Ties.of(W, depth=int(W.shape[0]) + 6), xp.concat([relu(h), xp.tanh(h)], axis=1)


@dataclass(frozen=True)
class DualOptions:
    """DS-AL's options (see :class:`DualHead`); ``batch_size`` is the stream's, recorded in the model file."""

    gamma: float = 1.0
    gamma_comp: float | None = None
    compensation: float = 1.0
    batch_size: int = 10

    def __post_init__(self) -> None:
        gamma = positive("gamma", self.gamma)
        object.__setattr__(self, "gamma", gamma)
        object.__setattr__(self, "gamma_comp", gamma if self.gamma_comp is None
                           else positive("gamma_comp", self.gamma_comp))
        object.__setattr__(self, "compensation", finite("compensation", self.compensation))
        object.__setattr__(self, "batch_size", at_least_one("batch_size", self.batch_size, 10))


class DualHead(HeadBase):
    """DS-AL's main and compensation streams on the projected rows, equal to the published per-batch recursion.

    Parameters
    ----------
    xp : array namespace
    dim : int
        Width D of the projected rows.
    **options
        :class:`DualOptions`: ``gamma`` (float, default 1.0), the main stream's ridge regularisation, > 0;
        ``gamma_comp`` (float or None, default None), the compensation stream's, > 0 (None: ``gamma``);
        ``compensation`` (float, default 1.0), ``C`` in ``scores = main + C * compensation``; ``batch_size`` (int,
        default 10), rows per mini-batch of the recursion (each task's rows are cut from its first row).

    Attributes
    ----------
    classes_ : ndarray of shape (C,)
        Sorted class ids of the rows the recursion has taken (a carried-over partial batch's not yet).
    earlier_ : ndarray
        Classes seen before the current task: their columns of the residual are zeroed.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> h = np.random.default_rng(0).normal(size=(9, 4))
    >>> head = DualHead(batch_size=4, xp=xp, dim=4)
    >>> head.add(h[:5], np.array([0, 1, 0, 1, 1]))
    >>> _ = head.boundary()
    >>> head.add(h[5:], np.array([2, 2, 3, 3]))
    >>> model = head.boundary()
    >>> model.classes.tolist(), head.earlier_.tolist()
    ([0, 1, 2, 3], [0, 1, 2, 3])
    """

    name: ClassVar[str] = "dual"
    space: ClassVar[str] = "projected"
    score_bytes: ClassVar[int] = 20  # its two products and their ties
    Options: ClassVar[type] = DualOptions
    scorer_tensors: ClassVar[Mapping[str, tuple[str, ...]]] = {"W_main": ("D", "C"), "W_comp": ("D", "C")}
    state_tensors: ClassVar[Mapping[str, tuple[str, ...]]] = {
        "R": ("D", "D"), "G_main": ("D", "D"), "Q_main": ("D", "C"), "G_comp": ("D", "D"), "Q_comp": ("D", "C")}
    weight_tensor: ClassVar[str | None] = "W_main"
    probabilities: ClassVar[str | None] = "shares"  # least-squares fits to one-hot targets, as ridge's
    solve_on_demand: ClassVar[bool] = False  # a boundary flushes the batch, refreshes R and closes the task's classes

    def __init__(self, *, xp: ModuleType, dim: int, **options: Any) -> None:
        self.options = DualOptions(**options)
        self.gamma = self.options.gamma
        self.gamma_comp: float = self.gamma if self.options.gamma_comp is None else self.options.gamma_comp
        self.compensation, self.batch_size = self.options.compensation, self.options.batch_size
        self.xp = xp
        self.dim = int(dim)
        self.classes_ = np.zeros(0, dtype=np.int64)
        self.earlier_ = np.zeros(0, dtype=np.int64)
        self._pending: list[tuple[Any, np.ndarray]] = []  # the partial batch: blocks of rows and their labels
        self._state: dict[str, Any] | None = None  # built at the first row, on its device
        # the residuals' rounding (:meth:`_residual_rounding`): this task's sum of |M_JJ|_F^2 and the squared
        # estimate over the tasks closed so far
        self._solves: Any = 0.0  # a device scalar once a block is added
        self._rounded = 0.0

    @staticmethod
    def memory(n_classes: int, dim: int) -> int:
        """Bytes at the largest (a boundary's main solve): the two Grams, ``Q_m`` and ``Q_c``, the recursion's ``R``
        (kept for the estimate of its error, :meth:`_residual_rounding`), the shifted Gram, the right-hand side
        ``[Q_m | I]`` and its solution ``[W_m | R]``: ``8 (6 D^2 + 4 D C)``."""
        return FLOAT64 * (6 * dim * dim + 4 * dim * n_classes)

    @staticmethod
    def kept(changed: int, seen: int, dim: int) -> int:
        return FLOAT64 * 2 * seen * dim

    def state_dict(self, scorer: DualScorer) -> dict[str, Any]:
        assert self._state is not None
        return {"W_main": scorer.W_main, "W_comp": scorer.W_comp, **self._state}

    def load_state_dict(self, tensors: Mapping[str, Any]) -> None:
        """The recursion's state right after a boundary: no partial batch, ``R`` the exact inverse, every class seen
        an earlier task's (its residual columns zeroed from the next row on)."""
        self.classes_ = np.asarray(tensors["classes"], dtype=np.int64).copy()
        self.earlier_ = self.classes_.copy()
        self._state = {key: on_device(self.xp, tensors[key]) for key in self.state_tensors}

    @classmethod
    def scorer_from(cls, classes: np.ndarray, tensors: Mapping[str, Any], options: Any) -> DualScorer:
        return DualScorer(classes, tensors["W_main"], tensors["W_comp"], options.compensation)

    def _start(self, like: Any) -> dict[str, Any]:
        xp, where, D = self.xp, device(like), self.dim
        empty = xp.zeros((D, 0), dtype=xp.float64, device=where)
        R = xp.eye(D, dtype=xp.float64, device=where) / self.gamma
        return {"R": R, "G_main": xp.zeros((D, D), dtype=xp.float64, device=where), "Q_main": empty,
                "G_comp": xp.zeros((D, D), dtype=xp.float64, device=where), "Q_comp": empty}

    def add(self, X: Any, labels: np.ndarray) -> None:
        """Take rows in stream order: full batches run the recursion, the remainder waits for the next block; a refused
        batch (rows of another width, relu products that overflow G_main) changes nothing."""
        labels = check_rows(X, labels, self.dim)
        if labels.size == 0:
            return
        X = float64(X)
        main = relu(X)  # tanh's squares are at most 1: only G_main can overflow
        held = 0.0 if self._state is None else largest_square(self._state["G_main"])
        check_gram_room(self.name, magnitude(main), labels.size, held)
        if self._state is None:
            self._state = self._start(X)
        comp = self.xp.tanh(X)  # the Grams are sums, whatever the batches: one product per block
        self._state["G_main"] += main.T @ main
        self._state["G_comp"] += comp.T @ comp
        pending = sum(int(block.shape[0]) for block, _ in self._pending)
        start = 0
        if pending:  # complete the carried-over batch first
            start = min(self.batch_size - pending, labels.size)
            self._pending.append((X[:start, ...], labels[:start]))
            if pending + start < self.batch_size:
                return
            self._flush()
        stop = start + (labels.size - start) // self.batch_size * self.batch_size
        rows = self.batch_size * block_batches(self.batch_size, self.dim)
        for lo in range(start, stop, rows):
            self._batches(X[lo:min(lo + rows, stop), ...], labels[lo:min(lo + rows, stop)])
        if stop < labels.size:
            self._pending.append((X[stop:, ...], labels[stop:]))

    def _flush(self) -> None:
        if self._pending:
            blocks, labels = zip(*self._pending)
            self._pending = []
            self._batches(self.xp.concat(list(blocks), axis=0), np.concatenate(labels))

    def _batches(self, h: Any, labels: np.ndarray) -> None:
        """DSAL.fit on each mini-batch of ``h`` (B x D: consecutive batches of ``batch_size`` rows, the last one
        possibly short), in order.

        The published step per batch ``X`` (RecursiveLinear.fit) is ``R <- R - R X^T (I + X R X^T)^-1 X R``: two
        passes over the D x D ``R`` for b rows. Here the batches of a block share one pass: with ``R0`` the inverse
        at the block's start and ``Z`` the block's relu rows, the same recursion runs on ``T = Z R Z^T`` and
        ``V = Z R Q_m`` (B x B and B x C), and ``R`` is updated once at the end, ``R0 - (Z R0)^T (I + Z R0 Z^T)^-1
        Z R0``. Equal to the per-batch recursion in exact arithmetic. Products that overflow (rows far larger than
        gamma) leave non-finite values, which the boundary refuses in one line (:meth:`boundary`), without NumPy's
        warnings first.
        """
        with np.errstate(over="ignore", invalid="ignore"):
            self._steps(h, labels)

    def _steps(self, h: Any, labels: np.ndarray) -> None:
        """:meth:`_batches`' work."""
        xp, state, b = self.xp, self._state, self.batch_size
        assert state is not None
        seen = np.union1d(self.classes_, labels)
        if seen.size > self.classes_.size:  # a class's columns are zero until its first row: widening early is exact
            for key in ("Q_main", "Q_comp"):
                state[key] = align_columns(state[key], self.classes_, seen)
            self.classes_ = seen
        Y = one_hot(labels, seen, h)
        Z = relu(h)
        P = Z @ state["R"]
        M = P @ Z.T
        T = xp.asarray(M, copy=True)  # Z R Z^T for the current R
        V = P @ state["Q_main"]  # Z R Q_m for the current R and Q_m
        rows, C = labels.size, seen.size
        for lo in range(0, rows, b):
            hi = min(lo + b, rows)
            # RecursiveLinear.fit on rows lo:hi, seen through T and V; K = (I + T_JJ)^-1
            U = V[lo:hi, :] + T[lo:hi, lo:hi] @ Y[lo:hi, :]  # X R (Q_m + X^T Y_J)
            KU = solve_spd(shifted(T[lo:hi, lo:hi], 1.0), xp.concat([U, T[lo:hi, hi:]], axis=1), "float64")
            V[lo:, :] += T[lo:, lo:hi] @ (Y[lo:hi, :] - KU[:, :C])
            if hi < rows:
                T[hi:, hi:] -= T[hi:, lo:hi] @ KU[:, C:]
        # previous label cleansing: each batch's residual under the main stream updated with it (V's rows are final
        # once their batch is done), earlier tasks' columns zeroed
        keep = xp.asarray(np.isin(seen, self.earlier_, invert=True).astype(np.float64), device=device(h))
        state["Q_comp"] += xp.tanh(h).T @ ((Y - V) * keep[None, :])
        state["Q_main"] += Z.T @ Y
        batch = xp.asarray(np.arange(rows) // b, device=device(h))
        # kept on the device until the boundary: a float() here would wait for the device at every block
        self._solves = self._solves + xp.sum(xp.where(batch[:, None] == batch[None, :], M * M, xp.zeros_like(M)))
        R = state["R"] - P.T @ solve_spd(shifted(M, 1.0), P, "float64")
        state["R"] = 0.5 * (R + R.T)  # symmetric, as the exact inverse is (:meth:`_residual_rounding`)

    def _check_recursion(self, before: Any, exact: Any) -> None:
        """Refuse a task whose Woodbury steps the boundary's exact solve contradicts: within a task the residuals
        come from ``R``'s steps, run while ``G_m`` may be near singular (the first task: ``R0 = I / gamma``), so their
        rounding is at least as large as ``R``'s own at the task's end (:meth:`_check_residuals` bounds it),
        ``before`` (``R`` times :data:`PROBES` fixed random columns) against ``exact`` (the exact inverse times them).
        At gamma 1e-12 that moved ``R`` by 5% and the residuals by as much, unseen by the exact solves; a task started
        from a refreshed, well-conditioned ``R`` moves it by ~1e-15."""
        xp = self.xp
        scale = float(xp.linalg.vector_norm(exact))
        moved = float(xp.linalg.vector_norm(before - exact)) / scale if scale else 0.0
        if not moved <= DRIFTS["float64"]:
            raise FoalPipeError(
                f"dual's per-batch recursion's rounding moved (G_main + gamma I)^-1 by {moved:.1g} (more than "
                f"{DRIFTS['float64']:g}) from its exact solve at this task's end (G_main near singular within the task "
                f"at gamma {self.gamma:g}), and the residuals it gave the compensation stream by as much; use a larger "
                "gamma for dual, or scale the features down")

    def _residual_rounding(self, walked: Any) -> None:
        """Add the closed task's share to the estimate of ``|dE|_F``, how far rounding moved the residuals ``E = Y -
        relu(h) W_m`` (all batches stacked) the compensation stream took. They are a cancellation (``relu(h) W_m`` is
        close to ``Y`` where the main stream fits the batch), so R's relative drift (:meth:`_check_recursion`) does not
        bound them. Two sources: a batch's step solves ``I + T_JJ`` (``T_JJ = Z_J R Z_J^T``), off by about ``u
        |T_JJ|_F |Y_J|_F``, bounded with ``M_JJ``, the block's ``Z_J R0 Z_J^T``; and ``R``'s own error ``N``, the
        recursion's ``walked`` at the task's end less the boundary's exact inverse (its share of the residuals grows
        with the rows as ``R``'s entries shrink), which moves a batch's residual by ``Z_J N Q_m``: summed over the task,
        ``tr((N Q_m)^T G_m N Q_m)`` with ``Q_m`` and ``G_m`` at the task's end (``Q_m``'s entries only grow: relu rows,
        one-hot targets). ``R`` is kept symmetric (each block's step and the boundary's inverse averaged with their
        transposes, the usual cure of RLS's drift), which keeps ``N`` small: the antisymmetric error alone, before,
        made this estimate 60x the weights' true change on digits and refused runs whose weights were 2e-5 off.
        Calibrated against 64-bit-mantissa per-batch solves (253 cases: identical rows and Gaussian classes, D 8 to
        60, 40 to 4,000 rows, scales 1 to 1e3, gammas 1e-6 to 1): every case off by more than 1e-4 refused, the
        estimate 3x the true change or more in 90% of the runs it passed, and never under 0.9x."""
        state = self._state
        assert state is not None
        moved = (walked - state["R"]) @ state["Q_main"]
        kept = float(self.xp.sum(moved * (state["G_main"] @ moved)))
        self._rounded += UNITS["float64"] ** 2 * self.batch_size * float(self._solves) + kept
        self._solves = 0.0

    def _check_residuals(self, G_comp: Any, W_comp: Any, inverse: Callable[[Any], Any]) -> None:
        """Refuse compensation weights the residuals' rounding (:meth:`_residual_rounding`) may move by more than
        :data:`~foal_pipe.core.drift.DRIFTS`: ``W_c`` moves by ``(G_c + gamma_c I)^-1 T^T dE`` (``T`` the tanh rows
        stacked, ``T^T T = G_c``), at most ``|dE|_F max sqrt(l) / (l + gamma_c)`` over ``G_c``'s eigenvalues ``l``:
        ``1 / (2 sqrt(gamma_c))``, or, where that does not pass, ``|(G_c + gamma_c I)^-1|_F^(1/2)`` estimated by
        :data:`~foal_pipe.core.linalg.PROBES` random columns solved by ``inverse`` (the solve's factor). Calibrated
        against the recursion's residuals and weights computed exactly per batch (mpmath, or 64-bit-mantissa solves;
        D 8 to 60, 40 to 8,000 rows, scales 1 to 1e3, gamma 1e-6 to 1, identical rows as in the audit and Gaussian
        classes, blocks of 1 and 6 batches): the figure was 2.3x to 5,300x the weights' true change (9x to 19x on
        Gaussian classes with more rows than D), every case off by more than 1e-4 refused."""
        xp = self.xp
        size = float(xp.linalg.vector_norm(W_comp))
        if not self._rounded or not size:  # W_c = 0 exactly: every residual column zeroed, nothing rounded
            return
        spread = math.sqrt(self._rounded) / size
        moved = spread * 0.5 / math.sqrt(self.gamma_comp)
        if moved > DRIFTS["float64"]:
            solved = inverse(probe_columns(G_comp))
            moved = min(moved, spread * math.sqrt(float(xp.linalg.vector_norm(solved)) / math.sqrt(PROBES)))
        if not moved <= DRIFTS["float64"]:
            raise FoalPipeError(
                f"dual's compensation weights may be off by {moved:.1g} (more than {DRIFTS['float64']:g}): the per-batch "
                f"recursion's rounding at gamma {self.gamma:g} moves the residuals Y - relu(h) W_main it fits them to, which "
                "nearly cancel where the main stream fits the rows (rows large against gamma, or alike); use a larger "
                "gamma for dual, or scale the features down")

    @staticmethod
    def _check_sums(G: Any, option: str, gamma: float) -> None:
        """:func:`~foal_pipe.core.linalg.check_drift` of one stream's sums, its refusal saying which option its gamma
        is and that the gamma it names is the sums' alone: the recursion's and the compensation's checks, which run
        after at the gamma the run was made with, may ask for a larger one (their rounding is the walk's, which
        another gamma changes)."""
        try:
            check_drift(G, gamma)
        except FoalPipeError as refusal:
            raise FoalPipeError(f"{refusal} (for {param(option)}); dual's checks of its per-batch recursion, run after "
                                "this one, may then ask for a larger gamma still") from None

    def boundary(self) -> DualScorer:
        """Flush the task's last (possibly short) batch; both streams solved exactly; the next task starts."""
        self._flush()
        state = self._state
        if state is None:
            raise FoalPipeError("the dual head has no rows yet; add rows before a task boundary")
        xp, D = self.xp, self.dim
        self._check_sums(state["G_main"], "gamma", self.gamma)
        self._check_sums(state["G_comp"], "gamma_comp", self.gamma_comp)
        C = self.classes_.size
        probes = probe_columns(state["G_main"])
        before = state["R"] @ probes
        walked = state["R"]
        state["R"] = None  # refreshed below from the exact solve
        main = spd_solver(shifted(state["G_main"], self.gamma), "float64")
        both = main(xp.concat([state["Q_main"], xp.eye(D, dtype=xp.float64, device=device(state["G_main"]))], axis=1))
        W_main, state["R"] = xp.asarray(both[:, :C], copy=True), 0.5 * (both[:, C:] + both[:, C:].T)
        self._check_recursion(before, state["R"] @ probes)
        self._residual_rounding(walked)
        comp = spd_solver(shifted(state["G_comp"], self.gamma_comp), "float64")
        W_comp = comp(state["Q_comp"])
        check_solved(state["G_main"], self.gamma, W_main, state["Q_main"], main)
        check_solved(state["G_comp"], self.gamma_comp, W_comp, state["Q_comp"], comp)
        if not (bool(xp.all(xp.isfinite(W_main))) and bool(xp.all(xp.isfinite(W_comp)))):
            raise FoalPipeError(f"dual's weights overflow float64 at gamma {self.gamma:g}: its per-batch recursion's "
                                "products grow as the rows' squares over gamma; use a larger gamma for dual, or scale the "
                                "features down")
        self._check_residuals(state["G_comp"], W_comp, comp)
        self.earlier_ = self.classes_.copy()
        return DualScorer(classes=self.classes_.copy(), W_main=row_major(W_main), W_comp=row_major(W_comp),
                          compensation=self.compensation)  # a model file's layout: its checks' bits as loaded
