"""Every walk decodes each stored chunk once, whatever the class order and the number of tasks, and its results
still equal the closed form."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from typer.testing import CliRunner

import foal_pipe.store.chunks as chunks
import foal_pipe.store.read as st
from foal_pipe.cli import app
from foal_pipe.store import open_store, write_store

N_CLASSES, DIM, CHUNK = 100, 12, 50


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """100 classes of 6 train and 2 test rows, in a random row order, 50-row chunks (12 train chunks)."""
    rng = np.random.default_rng(4)
    means = rng.normal(size=(N_CLASSES, DIM)) * 2
    y, yt = rng.permutation(np.repeat(np.arange(N_CLASSES), 6)), rng.permutation(np.repeat(np.arange(N_CLASSES), 2))
    x, xt = means[y] + rng.normal(size=(y.size, DIM)), means[yt] + rng.normal(size=(yt.size, DIM))
    return write_store(tmp_path_factory.mktemp("one") / "s.zarr", (x.astype(np.float32), y), (xt.astype(np.float32), yt),
                       [f"c{i}" for i in range(N_CLASSES)], chunk_rows=CHUNK)


@pytest.fixture
def decoded(monkeypatch):
    """``(split, first row of the chunk)`` of every features (or blocks) chunk decoded, however it is read."""
    seen: Counter = Counter()
    read_rows, take = chunks.read_rows, st.Split._take

    def counting_read(root, name, array, lo, hi):
        step = int(array.chunks[0])
        if name.endswith(("/features", "/blocks")):  # not the labels, read whole when the store is opened
            seen.update((name.split("/")[0], c * step) for c in range(lo // step, (hi - 1) // step + 1))
        return read_rows(root, name, array, lo, hi)

    def counting_take(self, leaf, rows):
        seen.update((self.name, int(c) * self.chunk_rows) for c in np.unique(rows // self.chunk_rows))
        return take(self, leaf, rows)

    monkeypatch.setattr(st, "read_rows", counting_read)  # as store.read looks it up
    monkeypatch.setattr(st.Split, "_take", counting_take)
    return seen


def _invoke(*args):
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result


COMMANDS = {
    "learn": ["learn"],
    "learn-rls": ["learn", "--engine", "rls"],
    "learn-auto": ["learn", "--gamma", "auto", "--gamma-grid", "0.1,1,10"],
    "learn-auto-reprojected": ["learn", "--gamma", "auto", "--gamma-grid", "0.1,1,10", "--max-memory", "1KiB"],
    "sweep": ["sweep", "--gammas", "0.1,1,10"],
    "sweep-no-loo": ["sweep", "--gammas", "0.1,1,10", "--no-loo"],
    "orders": ["learn", "--order-seeds", "0,1"],
    "sweep-heads": ["sweep", "--gammas", "0.1,1,10", "--heads", "ridge,ncm,slda,fecam,balanced,dual"],
}


@pytest.mark.parametrize("tasks", [1, 10, 100])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_each_chunk_is_decoded_once_per_walk(store, decoded, tmp_path, command, tasks):
    _invoke(*COMMANDS[command], "--features", store, "--out", tmp_path / "out", "--tasks", tasks,
            "--projection-dim", 24, "--seed", 5, "--backend", "numpy")
    train_chunks, test_chunks = -(-600 // CHUNK), -(-200 // CHUNK)
    assert max(decoded.values()) == 1, decoded
    assert sum(1 for split, _ in decoded if split == "train") == train_chunks
    assert sum(1 for split, _ in decoded if split == "test") == test_chunks


@pytest.mark.parametrize("head", ["ncm", "slda", "fecam", "balanced", "dual"])
def test_learn_head_decodes_each_chunk_once(store, decoded, tmp_path, head):
    projection = [] if head in ("ncm", "slda", "fecam") else ["--projection-dim", 24]
    _invoke("learn", "--head", head, "--features", store, "--out", tmp_path / "out", "--tasks", 10, "--seed", 5,
            "--backend", "numpy", *projection)
    assert max(decoded.values()) == 1, decoded
    assert sum(1 for split, _ in decoded if split == "train") == -(-600 // CHUNK)
    assert sum(1 for split, _ in decoded if split == "test") == -(-200 // CHUNK)


def test_a_table_decodes_each_chunk_once(store, decoded, tmp_path):
    """``table``: every head, task count and order of a store from one read (its checks before the runs read labels
    alone)."""
    _invoke("table", "--features", store, "--out", tmp_path / "t", "--heads", "ridge,ncm,balanced", "--tasks", "5,10",
            "--order-seeds", "0,1", "--gamma", 1, "--projection-dim", 24, "--backend", "numpy")
    assert max(decoded.values()) == 1, decoded
    assert sum(1 for split, _ in decoded if split == "train") == -(-600 // CHUNK)
    assert sum(1 for split, _ in decoded if split == "test") == -(-200 // CHUNK)


def test_results_equal_the_closed_form_with_100_tasks(store, tmp_path):
    """100 one-class tasks in a random class order: W after the last task is ridge over every row."""
    from safetensors.numpy import load_file

    _invoke("learn", "--features", store, "--out", tmp_path / "run", "--tasks", 100, "--projection-dim", 24,
            "--seed", 5, "--backend", "numpy", "--gamma", 0.5)
    model = load_file(str(tmp_path / "run" / "model.safetensors"))
    opened = open_store(store)
    x, y = opened.train.read(0, 600).astype(np.float64), opened.train.labels
    H = 1 / (1 + np.exp(-(x @ model["projection"])))
    W = np.linalg.solve(H.T @ H + 0.5 * np.eye(24), H.T @ (y[:, None] == model["classes"][None, :]))
    assert np.abs(model["W"] - W).max() / np.abs(W).max() < 1e-9
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["n_tasks"] == 100 and metrics["n_train_seen"] == 600


def test_continuing_a_model_decodes_the_new_store_once(store, decoded, tmp_path):
    rng = np.random.default_rng(9)
    y = np.repeat(np.arange(4), 30)
    x = rng.normal(size=(y.size, DIM)).astype(np.float32) + y[:, None]
    new = write_store(tmp_path / "new.zarr", (x, y), (x[::3], y[::3]), ["n0", "n1", "n2", "n3"], chunk_rows=CHUNK)
    _invoke("learn", "--features", store, "--out", tmp_path / "base", "--tasks", 10, "--projection-dim", 24,
            "--backend", "numpy")
    decoded.clear()
    _invoke("learn", "--init-model", tmp_path / "base" / "model.safetensors", "--features", new, "--out",
            tmp_path / "more", "--tasks", 2, "--backend", "numpy")
    assert max(decoded.values()) == 1, decoded
    assert sum(1 for split, _ in decoded if split == "train") == -(-120 // CHUNK)


def test_rows_reach_the_device_as_each_chunk_is_decoded(store, monkeypatch):
    """On a device backend the rows are scattered there during the read (no bulk copy after it): every block and
    gather equals the host rows, and the device copy exists before the walk asks for a block."""
    torch = pytest.importorskip("torch")
    import array_api_compat.torch as xp

    import foal_pipe.protocol.rowcache as rowcache

    monkeypatch.setattr(rowcache, "on_device", lambda namespace: namespace is xp)  # torch on the CPU stands in
    split = open_store(store).split("train")
    groups = np.asarray(split.labels) % 7
    rows = rowcache.GroupedRows(split, [None], groups, 7, 2**30, xp=xp)
    assert (None, xp.__name__) in rows._device
    host = rowcache.GroupedRows(split, [None], groups, 7, 2**30)
    assert np.array_equal(rows.block(None, 0, rows.n_rows), host.block(None, 0, host.n_rows))
    for lo, hi in zip(rows.offsets[:-1], rows.offsets[1:]):
        assert torch.equal(rows.block(None, int(lo), int(hi), xp), torch.from_numpy(host.block(None, int(lo), int(hi))))
    scattered = np.random.default_rng(0).permutation(rows.n_rows)[:50]
    assert torch.equal(rows.take(None, scattered, xp), torch.from_numpy(host.take(None, scattered)))
