"""Metrics on hand-made accuracy matrices, and the stream protocol (class order, split, shuffling)."""

from __future__ import annotations

import numpy as np
import pytest

from foal_pipe.core.metrics import summarize
from foal_pipe.errors import FoalPipeError
from foal_pipe.protocol.stream import build_stream, split_classes


def test_metrics_by_hand():
    acc = [[0.9], [0.8, 0.7], [0.6, 0.75, 0.5]]
    m = summarize(acc)
    assert m["A_steps"] == pytest.approx([0.9, 0.75, (0.6 + 0.75 + 0.5) / 3])
    assert m["A_avg"] == pytest.approx((0.9 + 0.75 + 1.85 / 3) / 3)
    assert m["A_last"] == pytest.approx(1.85 / 3)
    # paper Eq. 17-18: j=0: max(0.9, 0.8) - 0.6 = 0.3; j=1: max(0.7) - 0.75 = -0.05
    assert m["F"] == pytest.approx((0.3 - 0.05) / 2)
    # published code: max over all rows incl. the last, mean over all 3 tasks: (0.3 + 0 + 0) / 3
    assert m["F_published_code"] == pytest.approx(0.1)


def test_metrics_single_task_and_square_input():
    assert summarize([[0.5]]) == {"A_steps": [0.5], "A_avg": 0.5, "A_last": 0.5, "F": 0.0, "F_published_code": 0.0}
    square = np.array([[1.0, np.nan], [0.5, 0.7]])
    assert summarize(square)["F"] == pytest.approx(0.5)


def test_split_classes_is_seeded_and_even():
    a, dropped = split_classes(47, 10, np.random.default_rng(0), drop_remainder=True)
    b, _ = split_classes(47, 10, np.random.default_rng(0), drop_remainder=True)
    assert a == b and len(a) == 10 and all(len(t) == 4 for t in a) and len(dropped) == 7
    assert sorted([c for t in a for c in t] + dropped) == list(range(47))
    c, _ = split_classes(47, 10, np.random.default_rng(1), drop_remainder=True)
    assert c != a


def test_split_classes_gives_the_remainder_to_the_first_tasks():
    """47 classes in 10 tasks: the first 7 tasks get 5 classes, the last 3 get 4; nothing is dropped, and the
    even split's tasks are the same whether or not the remainder is dropped."""
    order = np.random.default_rng(0).permutation(47).tolist()
    tasks, dropped = split_classes(47, 10, np.random.default_rng(0))
    assert [len(t) for t in tasks] == [5] * 7 + [4] * 3 and dropped == []
    assert tasks[0] == sorted(order[:5]) and tasks[-1] == sorted(order[43:])
    for drop in (False, True):
        assert split_classes(40, 10, np.random.default_rng(0), drop_remainder=drop) == (
            [sorted(np.random.default_rng(0).permutation(40)[4 * t : 4 * t + 4].tolist()) for t in range(10)], [])
    assert [len(t) for t in split_classes(8, None, np.random.default_rng(0))[0]] == [1] * 8  # default: 10, at most C
    assert [len(t) for t in split_classes(47, None, np.random.default_rng(0))[0]] == [5] * 7 + [4] * 3


def test_build_stream_shuffles_within_tasks_and_drops_last():
    labels = np.repeat(np.arange(6), 13)  # 13 rows per class
    s = build_stream(labels, 6, 3, 10, seed=0)
    assert [sorted(np.unique(labels[r]).tolist()) for r in s.rows] == s.tasks
    assert all(r.size == 26 for r in s.rows) and not np.array_equal(s.rows[0], np.sort(s.rows[0]))
    assert [b.size for b in s.batches(0)] == [10, 10, 6]
    d = build_stream(labels, 6, 3, 10, seed=0, drop_last=True)
    assert all(r.size == 20 for r in d.rows)
    np.testing.assert_array_equal(d.rows[0], s.rows[0][:20])  # same order, tail dropped
    row_task = s.row_tasks(labels.size)
    assert (row_task >= 0).all() and s.task_of_label(6)[labels[s.rows[2]]].tolist() == [2] * 26


def test_stream_errors():
    labels = np.repeat(np.arange(4), 5)
    with pytest.raises(FoalPipeError, match="at least 1"):
        build_stream(labels, 4, 2, 0, 0)
    with pytest.raises(FoalPipeError, match="larger than the number of classes"):
        build_stream(labels, 4, 5, 10, 0)
    with pytest.raises(FoalPipeError, match="no training rows"):
        build_stream(labels, 5, None, 10, 0, class_order=[[0, 1], [4]])
