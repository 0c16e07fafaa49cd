"""Array-API helpers shared by the statistics and the gamma paths: one-hot targets, gamma checks, float64 solves."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from functools import cache
from typing import Any

import numpy as np
from array_api_compat import array_namespace, device, is_cupy_namespace, is_numpy_namespace, is_torch_namespace
from threadpoolctl import OpenBLASController, ThreadpoolController

from foal_pipe.core.backend import dtype_name, linalg_errors, to_numpy
from foal_pipe.core.drift import (
    DRIFTS,
    NAMED_SHARE,
    SCALE_SPREAD,
    UNITS,
    column_scales,
    drift,
    drift_beyond,
    drift_floor,
    drift_share,
    least_gamma,
    resolution,
    rounded_up,
)
from foal_pipe.errors import FoalPipeError, param

#: Factorisations up to this dimension run on one BLAS thread: measured on a shared 2-core machine, a
#: 1000 x 1000 ``eigh`` took 0.18-0.35 s on one thread and 0.6-1.5 s on two under load (solve: 0.05 vs
#: 0.2-2.7 s); small factorisations gain little from threads and lose much when cores are busy.
SINGLE_THREAD_FACTOR_DIM = 2048


def class_positions(classes: np.ndarray, labels: Any) -> np.ndarray:
    """Column of each label in sorted ``classes``; every label must be one of them."""
    labels = np.asarray(labels).ravel()
    pos = np.searchsorted(classes, labels)
    known = pos < classes.size
    known[known] = classes[pos[known]] == labels[known]
    if not known.all():
        raise FoalPipeError(f"label {labels[np.flatnonzero(~known)[0]]!r} is not among the classes; "
                            "pass the classes of every label")
    return pos


def one_hot(labels: Any, classes: np.ndarray, like: Any) -> Any:
    """``Y`` (n x C): ``Y[i, k] = 1`` where ``labels[i] == classes[k]``, in the namespace, device and dtype of ``like``."""
    xp = array_namespace(like)
    pos = xp.asarray(class_positions(classes, labels), device=device(like))
    columns = xp.arange(classes.size, device=device(like))
    return xp.astype(pos[:, None] == columns[None, :], like.dtype)


#: Rows of activations cast to float64 at a time by :func:`target_sums`: a temporary of 2 MiB per 1,000 features,
#: not a float64 copy of the batch (328 MiB for 4,096 rows at D = 10,000, against float32 sums' saving).
TARGET_ROWS = 256


def target_sums(H: Any, labels: Any, classes: np.ndarray) -> Any:
    """``Q = H^T Y`` (D x C, ``Y``: :func:`one_hot`) in float64 whatever ``H``'s dtype: the products of float32 rows
    with 0/1 are exact there and their sums round at float64's unit. Float32 ``Q`` rounds inside each BLAS product,
    alike for repeated rows (5e-6 of it at 4,096 rows), which the drift checks, counting ``G``'s rounding, miss."""
    xp = array_namespace(H)
    if H.dtype == xp.float64:
        return H.T @ one_hot(labels, classes, H)
    Y = one_hot(labels, classes, xp.empty(0, dtype=xp.float64, device=device(H)))
    Q = xp.zeros((H.shape[1], classes.size), dtype=xp.float64, device=device(H))
    for lo in range(0, H.shape[0], TARGET_ROWS):
        hi = min(lo + TARGET_ROWS, H.shape[0])  # array_api_strict refuses a slice past the end
        Q += xp.astype(H[lo:hi, ...], xp.float64).T @ Y[lo:hi, ...]
    return Q


def shifted(G: Any, gamma: float) -> Any:
    """``G + gamma I`` as one new float64 array (no identity matrix is built)."""
    xp = array_namespace(G)
    flat = xp.reshape(xp.astype(G, xp.float64, copy=True), (-1,))
    flat[:: G.shape[0] + 1] += gamma  # a view of the copy for NumPy, CuPy and torch; the reshape below is exact either way
    return xp.reshape(flat, G.shape)


def finite_resolution(G: Any, Q: Any = None) -> float:
    """``eps(dtype) * max diag(G)``, the resolution of a gamma path (whose eigenvalues are given to ``u lambda_max``
    each, whatever the columns' scales; a single solve resolves less: :func:`~foal_pipe.core.drift.resolution`),
    refused when the sums overflowed (a non-finite diagonal) or, given the class sums ``Q``, underflowed: a largest
    diagonal entry below ``tiny / eps`` of the dtype while ``Q`` is not zero means products of the features fell to
    subnormal numbers or zero, so ``G`` lost them while ``Q`` kept the features."""
    xp = array_namespace(G)
    name = dtype_name(G.dtype)
    fix = "rescale the features" + ("" if name == "float64" else f" or use {param('dtype', 'float64')}")
    if G.shape[0] == 0:
        return 0.0
    info = xp.finfo(G.dtype)
    largest = float(info.eps) * max(float(xp.max(xp.reshape(G, (-1,))[:: G.shape[0] + 1])), 0.0)
    if not np.isfinite(largest):
        raise FoalPipeError(
            f"the {name} Gram sums overflowed (the features are too large for this dtype); {fix}"
        )
    if Q is not None and Q.shape[1] and largest < float(info.smallest_normal) and float(xp.max(xp.abs(Q))) > 0:
        raise FoalPipeError(
            f"the {name} Gram sums underflowed (products of the features fall below {float(info.smallest_normal):.0e}, the "
            f"smallest normal {name}); {fix}"
        )
    return largest


#: Random columns solved beside (or after) ``Q`` to estimate ``|R (G + gamma I)^-1 R|_F^2`` (Hutchinson; ``R``:
#: :func:`~foal_pipe.core.drift.column_scales`).
PROBES = 32


def probe_columns(like: Any) -> Any:
    """:data:`PROBES` fixed standard-normal columns of ``like``'s row count, in its namespace and on its device."""
    xp = array_namespace(like)
    return xp.asarray(np.random.default_rng(0).standard_normal((like.shape[0], PROBES)), device=device(like))


def cheap_drift_floor(lowest: float, dim: int, top: float, dtype: str) -> float:
    """A gamma above which :func:`drift` stays within :data:`DRIFTS` whatever the spectrum: ``|(G + gamma I)^-1|_F^2
    <= D / (lambda_min + gamma)^2``. Where it lies below the resolution floor no eigenvalue beyond the lowest is
    needed."""
    return max(0.0, drift(float(dim), top, dtype) / DRIFTS[dtype] - lowest)


def drift_refusal(gamma: float, moved: float, dtype: str, G: Any = None, Q: Any = None,
                  top: float | None = None) -> FoalPipeError:
    """The refusal of a gamma the sums' rounding moves the weights at; given the sums, it names one they take."""
    return FoalPipeError(
        f"at gamma {gamma:g} the rounding of the {dtype} Gram sums may move the weights by about "
        f"{drift_beyond(moved, dtype)} (more than {drift_share(DRIFTS[dtype], dtype)}: G + gamma I is too "
        f"ill-conditioned for them); {larger_gamma(G, Q, top=top)}{float64_way_out(dtype)}")


def larger_gamma(G: Any = None, Q: Any = None, floor: float | None = None, top: float | None = None) -> str:
    """A refusal's advice: with the sums ``G`` (D up to :data:`SINGLE_THREAD_FACTOR_DIM`), a gamma they take, the
    least above their resolution at which their rounding moves the weights by :data:`NAMED_SHARE` of the limit:
    from their eigenvalues (:func:`drift_floor`; computed for the message alone), which bound the drift of columns of
    every scale, then, where the columns' scales differ (:func:`column_scales`), as :func:`check_drift` measures it,
    by bisection below that bound (a factorisation a step); else ``floor`` or only a larger one. ``top``: the
    rounding's scale (:attr:`~foal_pipe.core.statistics.RidgeStatistics.rounding_top`), by default ``max|G|``."""
    if G is not None and 0 < G.shape[0] <= SINGLE_THREAD_FACTOR_DIM:
        dtype, limit, scales = dtype_name(G.dtype), NAMED_SHARE * DRIFTS[dtype_name(G.dtype)], column_scales(G)
        top = largest_entry(G) if top is None else top
        with suppress(*linalg_errors()):  # LAPACK did not converge: the advice without a figure from the eigenvalues
            values = to_numpy(array_namespace(G).linalg.eigvalsh(float64(G))).astype(np.float64)
            finite_resolution(G, Q)
            least = resolution(G)
            floor = max(least, drift_floor(values, top, dtype, limit))
            if not bool(array_namespace(G).all(scales == 1)) and floor > least:
                floor = max(least, least_gamma(lambda gamma: probed_drift(G, gamma, scales, top=top), limit, least,
                                               floor, 1e-4))
    if floor is None:
        return "use a larger gamma"
    return f"use a gamma of at least {rounded_up(floor)} (a later task's sums, over more rows, may need more)"


def probed_drift(G: Any, gamma: float, scales: Any, Q: Any = None, named: bool = False, top: float | None = None) -> float:
    """:func:`drift` at ``gamma`` from :data:`PROBES` random columns, each row times ``scales``
    (:func:`column_scales`), solved: ``|R (G + gamma I)^-1 R|_F^2`` estimated (Hutchinson). Where ``G + gamma I`` is
    not positive definite: refused naming a gamma (``named``; :func:`gamma_solver`), else infinite. ``top``: as
    :func:`larger_gamma`'s."""
    xp, dim = array_namespace(G), G.shape[0]
    r = scales[:, None]
    with factor_threads(dim):
        if named:
            solver = gamma_solver(G, gamma, Q, top)
        else:
            try:
                solver = spd_solver(shifted(G, float(gamma)), dtype_name(G.dtype))
            except FoalPipeError:
                return math.inf
        solved = solver(r * probe_columns(G))
    return drift(float(xp.sum((r * solved) ** 2)) / PROBES, largest_entry(G) if top is None else top,
                 dtype_name(G.dtype))


def check_drift(G: Any, gamma: float, Q: Any = None, top: float | None = None) -> None:
    """Refuse what :func:`check_gammas` refuses, and a gamma at which the rounding of the sums ``G`` moves
    ``(G + gamma I)^-1 Q`` by more than :data:`DRIFTS` (:func:`drift`, each column at its own scale): every check of
    a solver that factors ``G + gamma I`` once per gamma. Free where the bound ``D / gamma^2`` already passes (every
    well-conditioned case), else :data:`PROBES` random columns solved (:func:`probed_drift`). ``top``: as
    :func:`larger_gamma`'s."""
    check_gammas(G, gamma, Q, top)
    dtype, dim = dtype_name(G.dtype), G.shape[0]
    top = largest_entry(G) if top is None else top
    if dim == 0 or drift(dim / float(gamma) / float(gamma), top, dtype) <= DRIFTS[dtype]:  # gamma^2: inf past 1e154
        return
    moved = probed_drift(G, gamma, column_scales(G), Q, named=True, top=top)
    if moved > DRIFTS[dtype]:
        raise drift_refusal(float(gamma), moved, dtype, G, Q, top)


#: The float64 solve's own rounding moves ``W`` by at most about ``u sqrt(D) lambda_max / gamma`` (relative,
#: Frobenius), which :func:`drift` (the sums' rounding, scaled by ``max|G|``) does not see: it is reached where ``G``
#: has rank one (every row alike), whose ``W`` lies in the one direction ``G`` scales by ``lambda_max`` while the
#: rounding's share falls in those ``(G + gamma I)^-1`` scales by ``1 / gamma``. On such Grams (D = 100 to 1,000) the
#: eigenvector and tridiagonal forms erred 1.0-1.41x that, Cholesky up to 0.3x; sigmoid features' sums stayed within
#: 2e-11 down to gamma 1e-9. Within ``SOLVE_SPREAD`` times it of :data:`DRIFTS`, :func:`check_solved` measures.
SOLVE_SPREAD = 2.0
#: One step of iterative refinement measured 0.81-1.17x the true change in those cases: the margin on its figure.
REFINEMENT_MARGIN = 1.5


def solve_may_move(top: float, dim: int, gamma: float, dtype: str) -> bool:
    """Whether the solve's own rounding could move ``W`` by more than :data:`DRIFTS` at ``gamma`` (``top``: an upper
    bound on ``lambda_max``, such as ``tr(G)``)."""
    return SOLVE_SPREAD * UNITS["float64"] * math.sqrt(dim) * top > DRIFTS[dtype] * gamma


def check_solved(G: Any, gamma: float, W: Any, Q: Any, inverse: Any = None, top: float | None = None,
                 advice: str = "use a larger gamma") -> None:
    """Refuse ``W``, a solve of ``(G + gamma I) W = Q``, where the solve's own rounding may have moved it by more
    than :data:`DRIFTS` (:data:`SOLVE_SPREAD`): one step of iterative refinement, ``|inverse(Q - (G + gamma I) W)|_F
    / |W|_F``, measures how far, only where :func:`solve_may_move` (``top``: a bound on ``lambda_max``, by default
    ``tr(G)``). ``inverse``: how the solve applies ``(G + gamma I)^-1`` (its :func:`spd_solver`; by default a new
    Cholesky factorisation)."""
    xp = array_namespace(G)
    dtype, dim = dtype_name(G.dtype), G.shape[0]
    if top is None:
        top = float(xp.sum(xp.linalg.diagonal(G))) if dim else 0.0
    if not solve_may_move(top, dim, gamma, dtype):
        return
    norm2 = float(xp.sum(W * W))
    if norm2 == 0.0:  # Q = 0: W = 0 exactly
        return
    solve = inverse or (lambda R: solve_spd(shifted(G, gamma), R, dtype))
    A = float64(G)
    correction = solve(float64(Q) - (A @ W + gamma * W))
    moved = REFINEMENT_MARGIN * math.sqrt(float(xp.sum(correction * correction)) / norm2)
    if moved > DRIFTS[dtype]:
        raise FoalPipeError(
            f"at gamma {gamma:g} the float64 solve's own rounding may move the weights by up to "
            f"{drift_beyond(moved, dtype)} ({REFINEMENT_MARGIN:g}x what a step of iterative refinement measured; more "
            f"than {drift_share(DRIFTS[dtype], dtype)}: G + gamma I is too ill-conditioned, as the Gram of nearly "
            f"identical rows is); {advice}")


def largest_entry(G: Any) -> float:
    """``max|G|``, the scale of the rounding of its entries (:func:`drift`)."""
    xp = array_namespace(G)
    return float(xp.max(xp.abs(G))) if G.shape[0] else 0.0


def check_positive(gammas: np.ndarray) -> None:
    """Refuse the first gamma that is not a positive finite number."""
    bad = gammas[~(np.isfinite(gammas) & (gammas > 0))]
    if bad.size:
        raise FoalPipeError(f"gamma must be a positive number, got {bad[0]:g}; try {param('gamma', 1)}")


def float64_way_out(dtype: str) -> str:
    """`` or dtype='float64'`` (the CLI: ``--dtype float64``) for float32 sums; nothing for float64 sums, which
    have no wider dtype to go to."""
    return "" if dtype == "float64" else f" or {param('dtype', 'float64')}"


def not_positive_definite(where: str, dtype: str = "float32", G: Any = None, Q: Any = None,
                          top: float | None = None) -> FoalPipeError:
    """The refusal of a ``G + gamma I`` that rounding left indefinite (``where``: which gamma; ``dtype``: the sums';
    given the sums ``G``, a gamma they take is named: :func:`larger_gamma`, with ``top``)."""
    return FoalPipeError(
        f"G + gamma I is not positive definite {where}: rounding in the Gram sums outweighs gamma, so the solve "
        f"would be noise; {larger_gamma(G, Q, top=top)}{float64_way_out(dtype)}"
    )


def check_gammas(G: Any, gammas: Any, Q: Any = None, top: float | None = None) -> None:
    """Refuse gammas that are not positive or that underflow in the dtype of ``G`` (see
    :func:`~foal_pipe.core.drift.resolution`), and
    sums that overflowed or (given ``Q``) underflowed (:func:`finite_resolution`); a refusal names a gamma the sums
    take (:func:`larger_gamma`, with ``top``)."""
    low = np.atleast_1d(np.asarray(gammas, dtype=np.float64))
    check_positive(low)
    finite_resolution(G, Q)
    floor = resolution(G)
    if floor and low.min() < floor:
        raise FoalPipeError(
            f"gamma {low.min():g} is below the resolution of the {dtype_name(G.dtype)} Gram sums "
            f"({floor:.3g} = eps x the largest diagonal entry, or {SCALE_SPREAD**2:g}x the least where less), so the solve "
            f"would be noise; {larger_gamma(G, Q, floor, top)}"
            f"{float64_way_out(dtype_name(G.dtype))}"
        )


@cache
def _threadpools() -> ThreadpoolController:
    """The process's thread pools, found once: each lookup reads /proc/self/maps (about 3 ms, more than a
    Cholesky factorisation at D = 500). SciPy's own BLAS is loaded first so that it is among them."""
    import scipy.linalg  # noqa: F401

    return ThreadpoolController()


def blas_threads() -> int:
    """The BLAS threads in force now (the most of any BLAS pool: OpenBLAS's environment variables and
    ``threadpool_limits`` set every pool alike; 1 where threadpoolctl finds none), which decides the cheaper route
    where the routes scale apart."""
    return max((pool.num_threads for pool in _threadpools().lib_controllers if pool.user_api == "blas"), default=1)


class OneThread:
    """A holder of the process's one-thread BLAS limit, as a context or until :meth:`restore_original_limits`.

    The pools' thread counts are global to the process, and threadpoolctl's limiter restores, on leaving, the counts
    it found on entering: two threads whose limits overlapped (A enters, B enters and finds 1, A leaves, B leaves)
    left every BLAS pool at one thread for the rest of the process, and with it every later product's bits (an
    estimator's readers in threads did, in the test suite). The holders are counted instead: the first sets one
    thread, the last gives back the counts the first found."""

    _lock = threading.Lock()
    _holders = 0
    _limiter: Any = None

    def __init__(self) -> None:
        with OneThread._lock:
            if OneThread._holders == 0:
                with _any_thread_sets():
                    OneThread._limiter = _threadpools().limit(limits=1, user_api="blas")
            OneThread._holders += 1
        self._held = True

    def restore_original_limits(self) -> None:
        """Give the limit back (once): the pools' counts return when no holder is left."""
        with OneThread._lock:
            if not self._held:
                return
            self._held = False
            OneThread._holders -= 1
            if OneThread._holders == 0:
                with _any_thread_sets():
                    OneThread._limiter.restore_original_limits()
                OneThread._limiter = None

    def __enter__(self) -> OneThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore_original_limits()


@contextmanager
def _any_thread_sets() -> Iterator[None]:
    """Let this thread set OpenBLAS's thread count, and no thread keep that right after. threadpoolctl 3.8 lets one
    Python thread at a time set a pthreads OpenBLAS's count (process-wide) and silently ignores the others' calls: a
    limit given back by a thread other than the one that took it was ignored, leaving every pool at one thread, and
    one taken beside a user's ``threadpool_limits`` in another thread was ignored too."""
    clear = getattr(OpenBLASController, "clear_controlling_thread", None)  # threadpoolctl < 3.8 has no such rule
    if clear is not None:
        clear(force=True)
    try:
        yield
    finally:
        if clear is not None:
            clear(force=True)


def factor_threads(dim: int) -> AbstractContextManager:
    """A BLAS thread limit for one factorisation of dimension ``dim`` (see ``SINGLE_THREAD_FACTOR_DIM``): one thread
    (:class:`OneThread`) up to it, the threads in force above."""
    return OneThread() if dim <= SINGLE_THREAD_FACTOR_DIM else nullcontext()


def float64(a: Any) -> Any:
    xp = array_namespace(a)
    return a if a.dtype == xp.float64 else xp.astype(a, xp.float64)


def solve_spd(A: Any, Q: Any, dtype: str = "float32") -> Any:
    """``A^-1 Q`` for a symmetric ``A`` that may be overwritten, refused unless numerically positive definite
    (:func:`spd_solver`, used once)."""
    return spd_solver(A, dtype)(Q)


def spd_solver(A: Any, dtype: str = "float32") -> Callable[[Any], Any]:
    """``Q -> A^-1 Q`` for a symmetric ``A`` that may be overwritten, factored once: a later right-hand side (the
    residual :func:`check_solved` refines with) reuses the factor instead of factoring ``A`` again.

    ``G + gamma I`` is positive definite in exact arithmetic; when rounding in the sums (float32) outweighs
    gamma in some direction it is not, and any solution would be noise: the Cholesky factorisation
    notices. NumPy arrays use LAPACK's Cholesky factorisation in place (half an LU's time, no copy of ``A``);
    other namespaces check with :func:`cholesky_or_none`, then solve with the factor (or :func:`checked_solve`):
    the same error on every backend. ``dtype``: the sums', for the refusal's advice.
    """
    xp = array_namespace(A)
    fail = not_positive_definite("at this gamma", dtype)
    if is_numpy_namespace(xp):
        from scipy.linalg import LinAlgError, cho_factor, cho_solve

        try:  # LAPACK's potrf + potrs, what solve(assume_a="pos") runs, without its condition estimate (a quarter
            # of the time at D = 500; the gamma floor is checked instead): the same bits. A is symmetric, so A.T
            # is the same matrix in the Fortran order LAPACK overwrites in place
            factor = cho_factor(A.T, overwrite_a=True, check_finite=False)
        except LinAlgError:
            raise fail from None
        return lambda Q: cho_solve(factor, Q, check_finite=False)
    L = cholesky_or_none(xp, A)
    if L is None:
        raise fail

    def solve(Q: Any) -> Any:
        solved = _cholesky_solve(xp, L, Q)
        return checked_solve(A, Q, fail) if solved is None else solved

    return solve


def gamma_solver(G: Any, gamma: float, Q: Any = None, top: float | None = None) -> Callable[[Any], Any]:
    """:func:`spd_solver` of ``G + gamma I`` (``G`` kept), refused naming a gamma ``G``, ``Q`` take: :func:`larger_gamma`
    (with ``top``)."""
    try:
        return spd_solver(shifted(G, float(gamma)), dtype_name(G.dtype))
    except FoalPipeError:
        raise not_positive_definite(f"at gamma {gamma:g}", dtype_name(G.dtype), G, Q, top) from None


def linalg_raises(xp: Any) -> AbstractContextManager:
    """On CuPy, ``cupyx.errstate(linalg="raise")``: without it CuPy's factorisations and solves report no failure
    (cuSOLVER's ``info`` is dropped, and a failed Cholesky returns the finite partial factor LAPACK's potrf left);
    elsewhere nothing (NumPy and torch raise on their own)."""
    if not is_cupy_namespace(xp):
        return nullcontext()
    import cupyx

    return cupyx.errstate(linalg="raise")


def cholesky_or_none(xp: Any, A: Any) -> Any | None:
    """The lower Cholesky factor of a symmetric ``A`` of namespace ``xp``, or None where it is not numerically
    positive definite: the factorisation raised (:func:`~foal_pipe.core.backend.linalg_errors`), left a non-finite
    entry, or, outside NumPy (whose LAPACK call always reports a failure), a diagonal entry that is not positive,
    which a backend that returns a failed factorisation's partial factor leaves (LAPACK's potrf stops at the first
    non-positive pivot with every entry finite). Any other error (out of memory, a CUDA fault) propagates."""
    try:
        with linalg_raises(xp):
            L = xp.linalg.cholesky(A)
            ok = xp.all(xp.isfinite(L))
            if not is_numpy_namespace(xp):
                ok = ok & xp.all(xp.linalg.diagonal(L) > 0)
            factor_ok = bool(ok)
    except linalg_errors():
        return None
    return L if factor_ok else None


def _cholesky_solve(xp: Any, L: Any, Q: Any) -> Any | None:
    """``(L L^T)^-1 Q`` by two triangular solves with the factor already checked (a third of an LU solve's
    work), where the namespace has triangular solves (CuPy, torch); None elsewhere."""
    if is_cupy_namespace(xp):
        from cupyx.scipy.linalg import solve_triangular

        return solve_triangular(L, solve_triangular(L, Q, lower=True), lower=True, trans="T")
    if is_torch_namespace(xp):
        import torch

        return torch.cholesky_solve(Q, L)
    return None


def checked_solve(A: Any, B: Any, fail: FoalPipeError) -> Any:
    """``linalg.solve(A, B)``, with ``fail`` raised alike on every backend when ``A`` is singular: NumPy and
    torch raise their own errors, CuPy raises under :func:`linalg_raises`; a solution that is not finite is
    refused too. Any other error (out of memory, a CUDA fault) propagates."""
    xp = array_namespace(A)
    try:
        with linalg_raises(xp):
            X = xp.linalg.solve(A, B)
    except linalg_errors():
        raise fail from None
    if not bool(xp.all(xp.isfinite(X))):
        raise fail
    return X
