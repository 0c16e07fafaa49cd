"""The stream protocol audit's faults: classes with no training row, --drop-last's emptied classes, pilot seeds
beyond NumPy's range, StreamConfig's types, the message of a class absent from both splits, the paper's task sizes,
per-order stream counts and continuing a model without projection."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_clean_error, invoke

from foal_pipe.errors import FoalPipeError
from foal_pipe.protocol.config import StreamConfig
from foal_pipe.protocol.stream import build_stream
from foal_pipe.report.paper import match_paper
from foal_pipe.store import write_store


def _store(path: Path, train: list[int], test: list[int], n_classes: int, dim: int = 6) -> Path:
    """A store of well separated classes with the given labels per split."""
    rng = np.random.default_rng(0)
    means = rng.normal(0, 3, size=(n_classes, dim))

    def rows(labels: list[int]) -> tuple[np.ndarray, np.ndarray]:
        y = np.asarray(labels, dtype=np.int64)
        return (means[y] + rng.normal(0, 1, size=(y.size, dim))).astype(np.float32), y

    return write_store(path, rows(train), rows(test), [f"c{i}" for i in range(n_classes)])


def _learn(store: Path, out: Path, *extra: object) -> tuple[dict, str]:
    result = invoke("learn", "--features", store, "--out", out, "--projection-dim", 0, "--backend", "numpy", *extra)
    assert result.exit_code == 0, result.output
    return json.loads((out / "metrics.json").read_text()), result.output


@pytest.mark.parametrize("stream", ["disjoint", "si-blurry"])
def test_class_with_test_rows_and_no_training_row_is_dropped_with_a_warning(tmp_path, stream):
    train, test = [0, 1, 3] * 6, [0, 1, 2, 3] * 3
    store = _store(tmp_path / "s.zarr", train, test, 4)
    m, output = _learn(store, tmp_path / "r", "--tasks", 2, "--stream", stream)
    assert m["dropped_classes"] == [2] and "label ids [2]" in output and "no training row" in output
    assert 2 not in {c for task in m["tasks"] for c in task}
    assert m["n_test"] == sum(label != 2 for label in test)  # class 2's test rows are not scored


def test_drop_last_emptying_a_class_on_a_disjoint_stream_drops_it_as_si_blurry_does(tmp_path):
    train, test = [0] + [1] * 4 + [2] * 5, [0, 0, 1, 1, 2, 2]
    store = _store(tmp_path / "s.zarr", train, test, 3)
    labels = np.asarray(train)
    seen_drop = False
    for seed in (9, 1, 2):
        order = build_stream(labels, 3, 1, 4, seed).rows[0]  # the same draws; --drop-last keeps the first 8 rows
        kept = sorted(set(labels[order[: order.size - order.size % 4]].tolist()))
        expected = sorted(set(train) - set(kept))
        seen_drop |= bool(expected)
        m, output = _learn(store, tmp_path / f"r{seed}", "--tasks", 1, "--batch-size", 4, "--drop-last", "--seed", seed)
        assert m["dropped_classes"] == expected and m["tasks"] == [kept]
        assert m["n_test"] == sum(label in kept for label in test)
        assert ("--drop-last drops" in output) == bool(expected)
        blurry, _ = _learn(store, tmp_path / f"b{seed}", "--tasks", 1, "--batch-size", 4, "--drop-last", "--seed", seed,
                           "--stream", "si-blurry", "--disjoint-ratio", 100)
        assert blurry["dropped_classes"] == sorted(set(train) - {c for t in blurry["tasks"] for c in t})
    assert seen_drop


@pytest.mark.parametrize("command", ["learn", "sweep"])
def test_pilot_seed_beyond_numpy_range_is_one_line_error(tmp_path, command):
    store = _store(tmp_path / "s.zarr", list(range(8)) * 3, list(range(8)), 8)
    extra = ["--gammas", "1"] if command == "sweep" else []
    result = invoke(command, "--features", store, "--out", tmp_path / "o", "--projection-dim", 0,
                    "--class-order", f"pilot:{2**32}", *extra)
    assert_clean_error(result, "below 2**32", tmp_path / "o")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("kwargs", [dict(tasks=2.0), dict(tasks="3"), dict(tasks=True), dict(batch_size=2.5),
                                    dict(batch_size=True), dict(class_order=[[0, 1], [2, 3]]), dict(drop_last="no"),
                                    dict(drop_remainder=1), dict(stream=None)])
def test_stream_config_refuses_wrong_types_in_one_line(kwargs):
    with pytest.raises(FoalPipeError) as info:
        StreamConfig(**kwargs)
    assert "\n" not in str(info.value) and next(iter(kwargs)) in str(info.value)


def test_stream_config_keeps_plain_values():
    config = StreamConfig(tasks=np.int64(2), batch_size=np.int64(4), class_order="pilot", drop_last=True)
    assert type(config.tasks) is int and type(config.batch_size) is int and config.class_order == "pilot"


@pytest.mark.parametrize("extra", [("--eval-every", 5), ("--stream", "si-blurry")])
def test_class_absent_from_both_splits_is_not_called_trained(tmp_path, extra):
    train, test = [0, 1, 3] * 6, [0, 1, 3] * 3
    store = _store(tmp_path / "s.zarr", train, test, 4)
    m, _ = _learn(store, tmp_path / "r", "--tasks", 2, *extra)
    assert m["n_test"] == len(test)


def test_paper_match_lists_unequal_task_sizes():
    base = dict(dataset="cifar100", encoder={"name": "vit_base_patch16_224.augreg2_in21k_ft_in1k", "fusion": "mean",
                                             "image_size": 224, "normalize": True},
                feature_dim=768, projection_dim=1000, activation="sigmoid", gamma=1.0, batch_size=10, n_tasks=10,
                n_train_seen=50000, n_test=10000, dropped_classes=[])
    even = [list(range(10 * i, 10 * i + 10)) for i in range(10)]
    uneven = [list(range(55))] + [list(range(55 + 5 * i, 60 + 5 * i)) for i in range(9)]
    assert match_paper({**base, "tasks": even}).differences == ()
    assert any("classes per task" in d and "55" in d for d in match_paper({**base, "tasks": uneven}).differences)
    core = {**base, "dataset": "core50", "n_tasks": 9}
    paper_split = [list(range(10))] + [list(range(10 + 5 * i, 15 + 5 * i)) for i in range(8)]
    even9 = np.array_split(np.arange(50), 9)
    assert not any("classes per task" in d for d in match_paper({**core, "tasks": paper_split}).differences)
    assert any("classes per task" in d for d in match_paper({**core, "tasks": [t.tolist() for t in even9]}).differences)


def test_order_seeds_record_each_orders_stream_counts_where_they_differ(tmp_path):
    train = [0] * 5 + [1] * 7 + [2] * 9 + [3] * 6 + [4] * 3 + [5] * 10
    store = _store(tmp_path / "s.zarr", train, list(range(6)) * 2, 6)
    seeds = (0, 1, 2, 3)
    alone = [_learn(store, tmp_path / f"o{s}", "--tasks", 3, "--batch-size", 4, "--drop-last", "--order-seed", s)[0]
             for s in seeds]
    assert len({a["n_train_seen"] for a in alone}) > 1  # the orders stream different numbers of rows
    m, _ = _learn(store, tmp_path / "all", "--tasks", 3, "--batch-size", 4, "--drop-last",
                  "--order-seeds", ",".join(map(str, seeds)))
    assert [o["n_train_seen"] for o in m["orders"]] == [a["n_train_seen"] for a in alone]
    assert m["n_train_seen"] == alone[0]["n_train_seen"]
    plain, _ = _learn(store, tmp_path / "plain", "--tasks", 3, "--order-seeds", "0,1")
    assert all("n_train_seen" not in o for o in plain["orders"])  # the same in every order: top level only


def test_continuing_a_model_without_projection_accepts_projection_dim_0(tmp_path):
    first = _store(tmp_path / "a.zarr", list(range(4)) * 5, list(range(4)) * 2, 4)
    second = _store(tmp_path / "b.zarr", list(range(4)) * 3, list(range(4)) * 2, 4)
    _learn(first, tmp_path / "m", "--tasks", 2)
    m, _ = _learn(second, tmp_path / "c", "--tasks", 2, "--init-model", tmp_path / "m" / "model.safetensors")
    assert m["projection_dim"] == 0
    result = invoke("learn", "--features", second, "--out", tmp_path / "d", "--projection-dim", 6, "--init-model",
                    tmp_path / "m" / "model.safetensors")
    assert_clean_error(result, "conflicts with the model's 0", tmp_path / "d")
