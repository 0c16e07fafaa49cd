"""Boundaries whose factorisations run ahead (:class:`~foal_pipe.protocol.learners.gram.FactorAhead`): each
boundary's ``eigh`` or ``dsytrd`` on the walk's other thread while the next task's first blocks are summed. The
boundaries must equal, bit for bit, those of the walk that factors each boundary where it ends, and the BLAS pools
must get their threads back however the walk ends."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np
import pytest
from helpers import build_store

import foal_pipe.protocol.classsums as classsums
import foal_pipe.protocol.learners.gram as gram
from foal_pipe.core.linalg import _threadpools
from foal_pipe.core.statistics import RidgeStatistics
from foal_pipe.errors import FoalPipeError
from foal_pipe.protocol.ahead import EIGH_COST, ELEMENT_COST, REDUCTION_COST, ahead_blocks
from foal_pipe.protocol.classsums import class_statistics, order_boundaries
from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig
from foal_pipe.protocol.learners.gram import GramLearner
from foal_pipe.protocol.run import prepare
from foal_pipe.protocol.runstate import row_sample
from foal_pipe.protocol.solvers import Boundary, FixedGamma, ManyGammas
from foal_pipe.protocol.walk import shared_rows, walk

GRID = [1e-2, 1.0, 100.0]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return build_store(tmp_path_factory.mktemp("ahead") / "s.zarr", n_train=900, n_test=120)


def _run(store, monkeypatch, loo, sample=0, rows_per_block=16, dtype="float64"):
    monkeypatch.setattr("foal_pipe.protocol.runstate.block_rows", lambda dim: rows_per_block)  # many blocks a task
    return prepare(store, StreamConfig(tasks=4, seed=2), ModelConfig(projection_dim=48, loo_sample=sample, dtype=dtype),
                   EvaluationConfig(), ExecutionConfig(backend="numpy"), loo=loo)


def _solver(run, loo, sample):
    return ManyGammas(GRID, loo, None, 4, row_sample(run) if loo and sample else None)


def _blas_threads() -> list[int]:
    return [pool["num_threads"] for pool in _threadpools().info() if pool["user_api"] == "blas"]


def _walk(run, solver, ahead):
    """The walk's learner, its factorisations ahead or in place."""
    learner = GramLearner(run, {None: solver})
    assert learner.ahead  # a gamma path on NumPy runs ahead unless told not to
    learner.ahead = ahead
    return walk(run, [learner])[0]


@pytest.mark.parametrize("blocks", [1, 3, 100])
@pytest.mark.parametrize(("loo", "sample", "dtype"), [(False, 0, "float64"), (True, 0, "float64"),
                                                      (True, 60, "float64"), (True, 60, "float32")])
def test_boundaries_factored_ahead_equal_those_factored_in_place(store, monkeypatch, loo, sample, dtype, blocks):
    run = _run(store, monkeypatch, loo, sample, dtype=dtype)
    threads, sums, projections = [], [], []
    factor, from_batch, project = RidgeStatistics.factor, RidgeStatistics.from_batch, gram._project

    def recording_factor(self, vectors):
        threads.append(threading.current_thread().name)
        return factor(self, vectors)

    def recording_sums(H, labels, classes=None):
        sums.append(min(_blas_threads()))
        return from_batch(H, labels, classes)

    def recording_projection(run, X):
        projections.append(min(_blas_threads()))
        return project(run, X)

    monkeypatch.setattr(RidgeStatistics, "factor", recording_factor)
    monkeypatch.setattr(RidgeStatistics, "from_batch", staticmethod(recording_sums))
    monkeypatch.setattr(gram, "_project", recording_projection)
    monkeypatch.setattr(gram, "ahead_blocks", lambda run, vectors: blocks)
    before = _blas_threads()
    in_place = _walk(run, _solver(run, loo, sample), False).boundaries
    assert threads == ["MainThread"] * 4 and min(sums) == min(before)
    threads.clear(), sums.clear(), projections.clear()
    learner = _walk(run, _solver(run, loo, sample), True)
    ahead = learner.boundaries
    assert threads[:3] == ["foal-pipe-factor_0"] * 3 and threads[3] == "MainThread"  # the last has no next task
    assert _blas_threads() == before
    per_task = [len(list(learner.blocks.blocks(k))) for k in range(4)]
    assert min(per_task) > 3
    # each task after the first: its first blocks projected beside the boundary before, all but the last also summed
    # (a task with fewer blocks joins at its end: every block summed)
    summed = [i < (blocks - 1 if blocks <= n else n) for n in per_task[1:] for i in range(n)]
    projected = [i < blocks for n in per_task[1:] for i in range(n)]
    if min(before) > 1:
        assert [t == 1 for t in sums] == [False] * per_task[0] + summed
        walk_projections = [t == 1 for t in projections][: sum(per_task)]  # then the pass's, when rows are projected
        assert walk_projections == [False] * per_task[0] + projected
    assert len(ahead) == len(in_place) == 4
    for a, b in zip(ahead, in_place, strict=True):
        np.testing.assert_array_equal(a.W, b.W)
        np.testing.assert_array_equal(a.gammas, b.gammas)
        np.testing.assert_array_equal(a.gcv, b.gcv)
        for name in ("loo_accuracy", "loo_mse"):
            if loo:
                np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
            else:
                assert getattr(a, name) is None and getattr(b, name) is None


def test_each_boundary_is_factored_from_its_own_sums(store, monkeypatch):
    """The walk keeps summing while a boundary factors: the factorisation must see the sums at its boundary, not
    the next task's rows too (a shared array would make both walks' boundaries differ from the closed form)."""
    run = _run(store, monkeypatch, loo=False)
    boundaries = _walk(run, ManyGammas([1.0], False, None, 4), True).boundaries
    for k, b in enumerate(boundaries):
        rows = np.concatenate(run.stream.rows[: k + 1])
        X = np.asarray(run.store.train.features[:])[np.sort(rows)]
        H = run.projection.transform(X.astype(np.float64))
        classes = np.unique(run.store.train.labels[rows])
        np.testing.assert_array_equal(b.classes, classes)
        Y = (run.store.train.labels[np.sort(rows)][:, None] == classes[None, :]).astype(np.float64)
        W = np.linalg.solve(H.T @ H + np.eye(H.shape[1]), H.T @ Y)
        np.testing.assert_allclose(b.W[:, 0, :], W, rtol=1e-8, atol=1e-10)


def test_a_failed_factorisation_ahead_stops_the_walk_and_gives_the_threads_back(store, monkeypatch):
    run = _run(store, monkeypatch, loo=True)
    factor = RidgeStatistics.factor

    def failing(self, vectors):
        if threading.current_thread().name.startswith("foal-pipe-factor") and self.n > 300:
            raise FoalPipeError("LAPACK failed")
        return factor(self, vectors)

    monkeypatch.setattr(RidgeStatistics, "factor", failing)
    before = _blas_threads()
    with pytest.raises(FoalPipeError, match="LAPACK failed"):
        _walk(run, _solver(run, True, 0), True)
    assert _blas_threads() == before
    assert not [t for t in threading.enumerate() if t.name.startswith("foal-pipe-factor")]


def test_a_walk_failing_while_a_boundary_factors_gives_the_threads_back(store, monkeypatch):
    run = _run(store, monkeypatch, loo=False)
    from_batch = RidgeStatistics.from_batch
    seen = []
    stop = -(-run.stream.rows[0].size // 16) + 2  # the second block of the second task

    def failing(H, labels, classes=None):
        seen.append(min(_blas_threads()))
        if len(seen) == stop:  # beside the first boundary's factorisation
            raise KeyboardInterrupt
        return from_batch(H, labels, classes)

    monkeypatch.setattr(gram, "ahead_blocks", lambda run, vectors: 100)
    monkeypatch.setattr(RidgeStatistics, "from_batch", staticmethod(failing))
    before = _blas_threads()
    with pytest.raises(KeyboardInterrupt):
        _walk(run, _solver(run, False, 0), True)
    assert seen[-1] == 1 or min(before) == 1  # it failed while the pools were at one thread
    assert _blas_threads() == before
    assert not [t for t in threading.enumerate() if t.name.startswith("foal-pipe-factor")]


def test_one_gamma_and_other_backends_factor_in_place(store, monkeypatch):
    run = _run(store, monkeypatch, loo=False)
    assert not GramLearner(run, {None: FixedGamma(1.0)}).ahead
    pytest.importorskip("torch")
    on_torch = prepare(store, StreamConfig(tasks=4, seed=2), ModelConfig(projection_dim=48), EvaluationConfig(),
                       ExecutionConfig(backend="torch"))
    assert not GramLearner(on_torch, {None: ManyGammas(GRID, False, None, 4)}).ahead


@pytest.mark.parametrize(("D", "d", "rows"), [(1000, 768, 4096), (600, 256, 4096), (2000, 768, 2048), (48, 32, 16)])
def test_ahead_blocks_cost_nearest_the_work(D, d, rows):
    """The blocks beside a boundary's work: their projections and the Gram products of all but the last of them, as
    near the work as the blocks allow (neither thread waits at the join for more than half a block)."""
    run = SimpleNamespace(dim=D, block_rows=rows, store=SimpleNamespace(dim=d, classes=range(100)))
    projection = 2.0 * rows * D * d + ELEMENT_COST * rows * D  # the product, the cast and the activation
    block = projection + 2.0 * rows * D * (D + 100)  # and the Gram's products

    def covered(n):
        return (n - 1) * block + projection

    for flops in (EIGH_COST * D**3, REDUCTION_COST * D**3, 0.5 * projection, projection, covered(3),
                  covered(3) + 0.4 * block, covered(3) + 0.6 * block, covered(3) - 0.4 * block):
        n = ahead_blocks(run, flops)
        assert n >= 1 and all(abs(covered(n) - flops) <= abs(covered(m) - flops) for m in (n - 1, n + 1) if m >= 1)
        assert n == 1 or abs(covered(n) - flops) <= block / 2
    assert ahead_blocks(run, covered(3) + 0.4 * block) == 3 and ahead_blocks(run, covered(3) + 0.6 * block) == 4
    assert ahead_blocks(run, EIGH_COST * D**3) >= ahead_blocks(run, REDUCTION_COST * D**3)


def test_a_boundary_without_leave_one_out_runs_ahead_whole_and_costs_its_weights(store, monkeypatch):
    run = _run(store, monkeypatch, loo=False)
    sweep, auto = ManyGammas(GRID, False, None, 4), ManyGammas(GRID, False, "gcv", 4)
    for solver, columns in ((sweep, len(GRID) + 1), (auto, 1)):  # the grid and GCV's choice, or the choice
        learner = GramLearner(run, {None: solver})
        walk(run, [learner])
        lane = learner.lanes[None]
        job, flops = lane.ahead(2)
        boundary = job()
        assert isinstance(boundary, Boundary) and boundary.W.shape[1] == columns
        C = lane.running.classes.size
        assert flops == REDUCTION_COST * 48**3 + 2.0 * 48**2 * columns * C
        np.testing.assert_array_equal(boundary.W, solver.solve(lane.running, 2).W)


def test_boundaries_from_class_sums_factored_beside_their_sample_equal_those_in_place(store, monkeypatch):
    """One-pass orders and ``table`` (:func:`order_boundaries`): each boundary's sums are factored on the second thread
    while its sample's first block is projected; the boundaries equal those factored in place, bit for bit."""
    run = prepare(store, StreamConfig(tasks=4, seed=2), ModelConfig(projection_dim=48, gamma="auto", loo_sample=60),
                  EvaluationConfig(), ExecutionConfig(backend="numpy"), loo=True)
    threads = []
    factor = RidgeStatistics.factor

    def recording_factor(self, vectors):
        threads.append(threading.current_thread().name)
        return factor(self, vectors)

    monkeypatch.setattr(RidgeStatistics, "factor", recording_factor)
    before = _blas_threads()
    with shared_rows([run]) as shared:
        sums = class_statistics(run, shared)
        ahead, _ = order_boundaries(run, sums, ManyGammas.auto(run), shared)
        assert threads == ["foal-pipe-factor_0"] * 4 and _blas_threads() == before
        threads.clear()
        monkeypatch.setattr(classsums, "can_run_ahead", lambda run: False)
        in_place, _ = order_boundaries(run, sums, ManyGammas.auto(run), shared)
        assert threads == ["MainThread"] * 4
    for a, b in zip(ahead, in_place, strict=True):
        assert a.loo_rows is not None and a.loo_rows < 60 * 4  # a true sample at the last boundaries
        for name in ("W", "gammas", "gcv", "loo_accuracy"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
