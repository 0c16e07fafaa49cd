"""The one walk (:func:`foal_pipe.protocol.walk.walk`): the order in which it calls its learners, one read of the
train split for all of them, and the registry's table of learners (every head's ``learn`` and continuation)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import build_store

from foal_pipe.heads import HEADS
from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig
from foal_pipe.protocol.continuation import PARTS
from foal_pipe.protocol.headscores import build_heads
from foal_pipe.protocol.learners.gram import GramLearner
from foal_pipe.protocol.learners.heads import HeadsLearner
from foal_pipe.protocol.learnkinds import LEARN_KINDS
from foal_pipe.protocol.run import prepare
from foal_pipe.protocol.solvers import FixedGamma
from foal_pipe.protocol.walk import Learner, walk
from foal_pipe.store import Split


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return build_store(tmp_path_factory.mktemp("walk") / "s.zarr")


def _run(store, **model):
    return prepare(store, StreamConfig(tasks=3, seed=5), ModelConfig(projection_dim=20, **model), EvaluationConfig(),
                   ExecutionConfig(backend="numpy"))


class Recorder(Learner):
    """Records every call of the walk and the rows it is given."""

    label = "recorder"

    def __init__(self, run, calls, name):
        super().__init__(run)
        self.calls, self.name, self.task_rows = calls, name, []

    def begin(self, advance):
        self.calls.append((self.name, "begin"))

    def start(self, rows):
        self.calls.append((self.name, "start"))
        self.rows = rows

    def add_task(self, k, rows, advance):
        assert rows is self.rows
        self.calls.append((self.name, "add", k))
        self.task_rows.append(np.sort(rows.labels[rows.position[self.run.stream.rows[k]]]))

    def end_task(self, k, rows, advance):
        self.calls.append((self.name, "end", k))

    def finish(self, rows, advance):
        self.calls.append((self.name, "finish"))


def test_the_walk_calls_its_learners_task_by_task_in_order(store):
    run = _run(store)
    calls = []
    a, b = walk(run, [Recorder(run, calls, "a"), Recorder(run, calls, "b")])
    expected = [("a", "begin"), ("b", "begin"), ("a", "start"), ("b", "start")]
    for k in range(3):
        expected += [("a", "add", k), ("b", "add", k), ("a", "end", k), ("b", "end", k)]
    assert calls == [*expected, ("a", "finish"), ("b", "finish")]
    assert a.rows is b.rows  # one cache for both
    labels = run.store.train.labels
    for k, task in enumerate(run.stream.rows):  # each task's rows are the stream's
        np.testing.assert_array_equal(a.task_rows[k], np.sort(labels[task]))


def test_learners_in_one_walk_share_one_read_and_keep_their_bits(store, monkeypatch):
    """ridge's Gram lanes and a registry head walked together: every train chunk decoded once, and each learner's
    boundaries the same bits as when it walks alone."""
    run = _run(store, gamma=0.5)
    alone_gram = walk(run, [GramLearner(run, {None: FixedGamma(0.5)})])[0]
    alone_heads = walk(run, [HeadsLearner(run, build_heads(run, ["ncm"], {}))])[0]
    decoded = []
    original = Split.read_raw

    def counting(self, lo, hi):
        decoded.append((self.name, lo))
        return original(self, lo, hi)

    monkeypatch.setattr(Split, "read_raw", counting)
    gram, heads = walk(run, [GramLearner(run, {None: FixedGamma(0.5)}), HeadsLearner(run, build_heads(run, ["ncm"], {}))])
    chunks = -(-run.store.train.n_rows // run.store.train.chunk_rows)
    assert sorted(decoded) == sorted(set(decoded)) and len(decoded) == chunks
    for together, apart in zip(gram.boundaries, alone_gram.boundaries, strict=True):
        np.testing.assert_array_equal(together.classes, apart.classes)
        np.testing.assert_array_equal(together.W, apart.W)
    for together, apart in zip(heads.boundaries["ncm"], alone_heads.boundaries["ncm"], strict=True):
        np.testing.assert_array_equal(together.classes, apart.classes)
        X = np.random.default_rng(0).normal(size=(5, run.features_dim))
        np.testing.assert_array_equal(together.scores(X), apart.scores(X))


def test_every_head_has_a_learn_and_a_continuation_through_the_table():
    assert {entry.learner for entry in HEADS.values()} <= set(LEARN_KINDS) & set(PARTS)
    assert HEADS["ridge"].learner == "gram" and HEADS["ridge"].gram_lanes
    assert all(entry.learner == "heads" and not entry.gram_lanes for name, entry in HEADS.items() if name != "ridge")
