"""What a fuzz of the command lines (about 2,200 runs, 2026-11-29) found, each now refused in one line or recorded:
an export that overwrote the store it read, Si-Blurry tasks and classes lost to ``--drop-last`` in silence, and
sizes that reached NumPy as tracebacks."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import assert_clean_error, assert_one_line_error, build_store, invoke

from foal_pipe.protocol.stream import si_blurry
from foal_pipe.store import open_store, write_store
from foal_pipe.store.blockfusion import FinalNorm


@pytest.fixture
def store(tmp_path):
    return build_store(tmp_path / "s.zarr", n_train=300, n_test=120)


@pytest.mark.parametrize("inside", ["zarr.json", "train/zarr.json", "manifest.json"])
def test_a_manifest_export_into_the_store_is_refused_before_writing(tmp_path, inside):
    rng = np.random.default_rng(0)
    y = np.arange(40) % 4
    path = write_store(tmp_path / "s.zarr", (rng.normal(size=(40, 6)), y), (rng.normal(size=(8, 6)), y[:8]), list("abcd"),
                       chunk_rows=8)
    before = {p: p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}
    result = invoke("info", path, "--export-manifest", path / inside)
    assert_one_line_error(result, "lies in the feature store", "choose a path outside the store")
    assert {p: p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()} == before
    open_store(path)


def test_drop_last_emptying_a_si_blurry_task_is_refused(store, tmp_path):
    out = tmp_path / "o"
    result = invoke("learn", "--features", store, "--out", out, "--stream", "si-blurry", "--batch-size", 1000,
                    "--drop-last", "--projection-dim", 16)
    assert_clean_error(result, "--drop-last would drop all", out)


def test_classes_drop_last_removes_from_a_si_blurry_stream_are_recorded():
    """A class whose every row falls in the dropped tails was left out of every task, its test rows unscored, and
    ``dropped_classes`` said []: over many seeds, a class is dropped exactly when no task holds it."""
    labels = np.array([0] * 48 + [1] + [2] * 30)
    lost = 0
    for seed in range(60):
        stream = si_blurry(labels, 3, 1, 40, seed, drop_last=True)
        held = {c for task in stream.tasks for c in task}
        assert sorted(set(range(3)) - held) == stream.dropped
        lost += bool(stream.dropped)
    assert lost > 0


def test_the_drop_is_warned_and_written(tmp_path):
    labels = np.array([0] * 48 + [1] + [2] * 30)
    seed = next(s for s in range(60) if si_blurry(labels, 3, 1, 40, s, drop_last=True).dropped == [1])
    rng = np.random.default_rng(0)
    path = write_store(tmp_path / "s.zarr", (rng.normal(size=(79, 6)), labels), (rng.normal(size=(9, 6)), np.arange(9) % 3),
                       list("abc"), chunk_rows=16)
    out = tmp_path / "o"
    result = invoke("learn", "--features", path, "--out", out, "--stream", "si-blurry", "--tasks", 1, "--seed", seed,
                    "--batch-size", 40, "--drop-last", "--projection-dim", 8)
    assert result.exit_code == 0, result.output
    assert "--drop-last drops the last partial batch" in result.output
    assert json.loads((out / "metrics.json").read_text())["dropped_classes"] == [1]


@pytest.mark.parametrize("tasks", ["301", "10000000000", "99999999999999999999999"])
def test_si_blurry_tasks_beyond_the_rows_are_refused(store, tmp_path, tasks):
    out = tmp_path / "o"
    result = invoke("learn", "--features", store, "--out", out, "--stream", "si-blurry", "--tasks", tasks)
    assert_clean_error(result, "is more than the 300 training rows", out)


@pytest.mark.parametrize("dim", ["1073741825", "9223372036854775807", "99999999999999999999999"])
def test_a_projection_dim_beyond_any_plan_is_refused(store, tmp_path, dim):
    out = tmp_path / "o"
    assert_clean_error(invoke("learn", "--features", store, "--out", out, "--projection-dim", dim),
                       "is too large: its D x D Gram matrix alone would need more than 8 EiB", out)


@pytest.fixture
def blocks_store(tmp_path):
    rng = np.random.default_rng(2)
    y = np.tile(np.arange(4), 40)
    blocks = (rng.normal(size=(160, 4, 6)) + 2 * y[:, None, None]).astype(np.float32)
    norm = FinalNorm("layernorm", 1e-6, weight=np.linspace(0.5, 2, 6, dtype=np.float32), bias=np.zeros(6, np.float32))
    return write_store(tmp_path / "b.zarr", (blocks[:128, -1], y[:128]), (blocks[128:, -1], y[128:]), list("abcd"),
                       chunk_rows=32, blocks=(blocks[:128], blocks[128:]), norm=norm)


@pytest.mark.parametrize(("fusions", "message"), [
    ("last,block:4", "lists last and block:4, the same features of this store's 4 blocks"),
    ("mean:1-4,mean-cls", "lists mean:1-4 and mean-cls, the same features"),
    ("concat:2-2,block:2", "lists concat:2-2 and block:2, the same features"),
    ("last,", "has an empty item between commas"),
])
def test_fusions_that_name_the_same_features_twice_are_refused(blocks_store, tmp_path, fusions, message):
    out = tmp_path / "o"
    result = invoke("sweep", "--features", blocks_store, "--out", out, "--fusions", fusions, "--gammas", "1", "--no-loo",
                    "--tasks", 2, "--projection-dim", 8)
    if fusions == "last,":  # text that is not a list of fusions: a usage error (tests/test_usage_exit_codes.py)
        assert result.exit_code == 2 and message in result.output and not out.exists(), result.output
    else:
        assert_clean_error(result, message, out)


def test_reader_processes_of_extract_end_with_it(tmp_path):
    """SIGKILL of `extract --model pixels` left its reader processes alive, blocked on their pipe and holding the
    store's lock, so the documented resume was refused until they were found and killed by hand."""
    import os
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "reader.py"
    script.write_text(
        "import os, sys, time\n"
        "import numpy as np\n"
        "from foal_pipe.extract.loading import _numpy_batches\n"
        "class Slow:\n"
        "    def __getitem__(self, i):\n"
        "        time.sleep(0.05)\n"
        "        return np.zeros(3), 0, os.getpid()\n"
        "for _, _, pids in _numpy_batches(Slow(), [[i] for i in range(10_000)], 2):\n"
        "    print(pids[0], flush=True)\n")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    readers = set()
    while len(readers) < 2:
        readers.add(int(proc.stdout.readline()))
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    def running(pid: int) -> bool:  # a zombie (state Z) has ended, whoever reaps it
        try:
            return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(running(pid) for pid in readers):
        time.sleep(0.1)
    alive = [pid for pid in readers if running(pid)]
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive


def test_predict_images_with_a_model_of_features_no_encoder_made(store, tmp_path):
    """Such a model's `predict --images` said "unknown --fusion 'none'", an option the user never gave."""
    from PIL import Image

    out = tmp_path / "run"
    assert invoke("learn", "--features", store, "--out", out, "--tasks", 2, "--projection-dim", 16).exit_code == 0
    Image.new("RGB", (8, 8)).save(tmp_path / "a.png")
    result = invoke("predict", "--model", out / "model.safetensors", "--images", tmp_path / "a.png")
    assert_one_line_error(result, "encoder 'synthetic', which foal-pipe did not extract", "--features")


def test_loader_deaths_while_an_extract_unwinds_from_sigterm_are_one_line(tmp_path, monkeypatch):
    """SIGTERM to the process group (timeout, Slurm, systemd) stopped torch's loader workers too; torch's report of
    their deaths, raised while the interrupt unwound, ended `extract` in a 121-line traceback. Any other error
    still surfaces."""
    import foal_pipe.extract as extract

    def stopped(*args, **kwargs):
        try:
            raise KeyboardInterrupt
        finally:
            raise RuntimeError("DataLoader worker (pid 1) is killed by signal: Terminated.")

    monkeypatch.setattr(extract, "run_extract", stopped)
    args = ("extract", "--dataset", "digits", "--model", "pixels", "--out", tmp_path / "d.zarr")
    result = invoke(*args)
    assert result.exit_code == 130, result.output
    assert "Interrupted:" in result.output and "Traceback" not in result.output

    def fails(*args, **kwargs):
        raise RuntimeError("an error of its own")

    monkeypatch.setattr(extract, "run_extract", fails)
    result = invoke(*args)
    assert result.exit_code != 0 and isinstance(result.exception, RuntimeError)
