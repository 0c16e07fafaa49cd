"""Randomised audit of `foal-pipe extract`: the same features whatever --batch-size and --workers, a store stopped
(SIGINT, SIGTERM, SIGKILL) at random moments and resumed equal to an uninterrupted one, never taken by `learn` while
incomplete, and inputs that change between a stop and its resume (or under the run) refused, never mixed.

The default part runs the `pixels` encoder on a small image tree; the tiny-ViT runs through the real CLI are slow.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zarr
from helpers import TINY_VIT, TINY_VIT_KWARGS, interrupt_after, make_image_tree, store_files
from PIL import Image
from typer.testing import CliRunner

import foal_pipe.extract.run as extract_run
from foal_pipe.cli import app

ROOT = Path(__file__).resolve().parents[1]
MAIN = "import sys; from foal_pipe.cli import main; sys.argv[0] = 'foal-pipe'; main()"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
VIT_KWARGS = ",".join(f"{k}={v}" for k, v in TINY_VIT_KWARGS)
runner = CliRunner()


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """Two classes of 6 train and 2 test images of mixed sizes and modes."""
    return make_image_tree(tmp_path / "imgs", {"a": 6, "b": 6})


def _pixels(tree: Path, out: Path, *more: str) -> list[str]:
    return ["extract", "--dataset", "imagefolder", "--data-dir", str(tree), "--model", "pixels", "--image-size", "8",
            "--out", str(out), "--chunk-rows", "4", "--batch-size", "2", "--workers", "0", "--device", "cpu", *more]


def _with(args: list[str], **options: str | None) -> list[str]:
    """``args`` with each ``--option``'s value replaced, or the option added (``None``: a flag without a value)."""
    args = list(args)
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if flag in args:
            args[args.index(flag) + 1] = str(value)
        else:
            args += [flag] if value is None else [flag, value]
    return args


def _features(store: Path) -> dict[str, np.ndarray]:
    group = zarr.open_group(str(store), mode="r")
    return {split: np.asarray(group[f"{split}/features"][:]) for split in ("train", "test")}


def _stopped_after_chunks(args: list[str], chunks: int) -> None:
    """Run ``args`` in-process, stopped by Ctrl-C once ``chunks`` chunks are written."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        interrupt_after(monkeypatch, chunks)
        result = runner.invoke(app, args)
    assert result.exit_code == 130, result.output


def _one_line_refusal(args: list[str], *fragments: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


# --- 1. determinism: what --batch-size, --workers, --chunk-rows and --dtype change -------------------------------


def test_batch_size_and_workers_give_the_same_store_bytes(tmp_path, tree):
    """They are not among the store's settings (a resume may change them), so they must not change a byte."""
    reference = tmp_path / "ref.zarr"
    assert runner.invoke(app, _pixels(tree, reference)).exit_code == 0
    for batch, workers in (("1", "0"), ("3", "2"), ("4", "1")):
        out = tmp_path / f"b{batch}w{workers}.zarr"
        result = runner.invoke(app, _with(_pixels(tree, out), batch_size=batch, workers=workers))
        assert result.exit_code == 0, result.output
        assert store_files(out) == store_files(reference), (batch, workers)


def test_chunk_rows_and_dtype_change_the_layout_not_the_values(tmp_path, tree):
    """Another --chunk-rows stores the same float32 values; --dtype float16 stores them rounded to float16."""
    reference = tmp_path / "ref.zarr"
    assert runner.invoke(app, _pixels(tree, reference)).exit_code == 0
    want = _features(reference)
    other_chunks, half = tmp_path / "c3.zarr", tmp_path / "f16.zarr"
    assert runner.invoke(app, _with(_pixels(tree, other_chunks), chunk_rows="3")).exit_code == 0
    assert runner.invoke(app, [*_pixels(tree, half), "--dtype", "float16"]).exit_code == 0
    for split, values in _features(other_chunks).items():
        np.testing.assert_array_equal(values, want[split])
    for split, values in _features(half).items():
        assert values.dtype == np.float16
        np.testing.assert_array_equal(values, want[split].astype(np.float16))


def test_the_same_command_twice_differs_only_in_the_run_log(tmp_path, tree):
    out = tmp_path / "s.zarr"
    assert runner.invoke(app, _pixels(tree, out)).exit_code == 0
    first = store_files(out)
    shutil.rmtree(out)
    assert runner.invoke(app, _pixels(tree, out)).exit_code == 0
    assert store_files(out) == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["imgs", "s.zarr", "s.zarr.log.json"]


# --- 3. inputs that change between a stop and its resume ---------------------------------------------------------


def _white(path: Path) -> None:
    Image.fromarray(np.full((9, 9, 3), 255, np.uint8)).save(path)


@pytest.mark.parametrize(("change", "fragments"), [
    ({"image_size": "9"}, ["different settings", "encoder.image_size: 8 -> 9"]),
    ({"model": TINY_VIT, "image_size": "16"}, ["different settings", "encoder.blocks: None -> 12"]),
    ({"dtype": "float16"}, ["different settings", "dtype: 'float32' -> 'float16'"]),
    ({"chunk_rows": "2"}, ["different settings", "chunk_rows: 4 -> 2"]),
    ({"no_normalize": None}, ["different settings", "encoder.normalize: True -> False"]),
    ("remove b/img005.png", ["different settings", "rows.train: 12 -> 11"]),
    ("add a/img099.png", ["different settings", "rows.train: 12 -> 13"]),
    ("replace a/img000.png", ["from other images: train row 0", "'a/img000.png'"]),
    ("move b/img005.png to a", ["other labels: train row"]),
])
def test_a_resume_with_other_inputs_is_refused_in_one_line_and_changes_nothing(tmp_path, tree, change, fragments):
    out = tmp_path / "s.zarr"
    args = _pixels(tree, out)
    _stopped_after_chunks(args, 1)
    before = store_files(out)
    train = tree / "train"
    if isinstance(change, dict):
        args = _with(args, **change)
    elif change.startswith("remove"):
        (train / "b" / "img005.png").unlink()
    elif change.startswith("add"):
        _white(train / "a" / "img099.png")
    elif change.startswith("replace"):
        _white(train / "a" / "img000.png")
    else:  # the last image of b, not written yet, to the end of a: the same rows, one label moved
        (train / "b" / "img005.png").rename(train / "a" / "zz.png")
    _one_line_refusal(args, *fragments, "--overwrite")
    assert store_files(out) == before


def test_an_image_replaced_in_rows_not_written_yet_resumes_as_a_fresh_run(tmp_path, tree):
    out, fresh = tmp_path / "s.zarr", tmp_path / "fresh.zarr"
    _stopped_after_chunks(_pixels(tree, out), 1)
    _white(tree / "train" / "b" / "img005.png")  # row 11, in the third chunk
    assert runner.invoke(app, _pixels(tree, out)).exit_code == 0
    assert runner.invoke(app, _pixels(tree, fresh)).exit_code == 0
    assert store_files(out) == store_files(fresh)


def test_an_image_replaced_while_extracting_is_never_stored_under_its_old_hash(tmp_path, tree, monkeypatch):
    """The image of the last train row is replaced after the store (with its manifest) is created, before the row is
    encoded; then the original file comes back. The store must not end complete, verified and wrong: its manifest
    naming the original's SHA-256 beside the features of the replacement."""
    out = tmp_path / "s.zarr"
    victim = tree / "train" / "b" / "img005.png"
    original, create = victim.read_bytes(), extract_run.create_store

    def create_then_replace(*args, **kwargs):
        state = create(*args, **kwargs)
        _white(victim)
        return state

    monkeypatch.setattr(extract_run, "create_store", create_then_replace)
    runner.invoke(app, _pixels(tree, out))
    monkeypatch.undo()
    victim.write_bytes(original)
    done = runner.invoke(app, _pixels(tree, out))  # "complete, nothing to do" when the race went unseen
    fresh = tmp_path / "fresh.zarr"
    assert runner.invoke(app, _pixels(tree, fresh)).exit_code == 0
    assert done.exit_code != 0 or _features(out)["train"].tobytes() == _features(fresh)["train"].tobytes()


def test_learn_refuses_a_stopped_store(tmp_path, tree):
    out = tmp_path / "s.zarr"
    _stopped_after_chunks(_pixels(tree, out), 2)
    result = runner.invoke(app, ["learn", "--features", str(out), "--out", str(tmp_path / "run"), "--tasks", "2",
                                 "--projection-dim", "8"])
    assert result.exit_code == 1 and "not complete" in result.output, result.output
    assert not (tmp_path / "run").exists()


# --- 2. the real CLI stopped at random moments (tiny ViT, DataLoader workers) ------------------------------------


def _vit_args(checkpoint: Path, out: Path, batch: int = 1, workers: int = 2) -> list[str]:
    return ["extract", "--dataset", "digits", "--model", TINY_VIT, "--model-kwargs", VIT_KWARGS, "--checkpoint",
            str(checkpoint), "--device", "cpu", "--chunk-rows", "64", "--batch-size", str(batch), "--workers",
            str(workers), "--out", str(out)]


def _cli(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    """The CLI in a process of its own; Ctrl-C reaches it even when the tests run in the background (SIGINT ignored)."""
    return subprocess.Popen([sys.executable, "-c", MAIN, *args], env=env or ENV, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.default_int_handler))


@pytest.fixture(scope="module")
def vit_reference(tmp_path_factory, tiny_vit_checkpoint) -> tuple[Path, float]:
    """An uninterrupted CLI run (batch 1, 2 workers) and its wall time, from start-up to exit."""
    out = tmp_path_factory.mktemp("ref") / "digits.zarr"
    started = time.monotonic()
    proc = _cli(_vit_args(tiny_vit_checkpoint, out))
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    return out, time.monotonic() - started


def test_vit_batch_size_and_workers_give_the_same_store_bytes(tmp_path, tiny_vit_checkpoint, vit_reference):
    for batch, workers in ((48, 0), (7, 1)):
        out = tmp_path / f"b{batch}.zarr"
        proc = _cli(_vit_args(tiny_vit_checkpoint, out, batch, workers))
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
        assert store_files(out) == store_files(vit_reference[0]), (batch, workers)


SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)


@pytest.mark.parametrize("seed", range(3))
def test_stopped_at_a_random_moment_then_resumed_equals_an_uninterrupted_store(tmp_path, tiny_vit_checkpoint,
                                                                                vit_reference, seed):
    """Seed k sends signal k % 3 after a random delay within the reference run's wall time (from 0.5 s: a stop during
    the interpreter's start-up ends it as Python does), once or twice; a stopped run exits with the signal's status
    and an ``Interrupted:`` line, the store it leaves is never taken by `learn` while incomplete, and the same command
    then finishes it byte for byte."""
    reference, seconds = vit_reference
    rng = random.Random(seed)
    signum = SIGNALS[seed % 3]
    out = tmp_path / "s.zarr"
    for _ in range(1 + seed // 3):
        proc = _cli(_vit_args(tiny_vit_checkpoint, out))
        time.sleep(rng.uniform(0.5, seconds))
        stopped = proc.poll() is None
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=300)
        if not stopped:
            assert proc.returncode == 0, err[-2000:]
        elif signum == signal.SIGKILL:
            assert proc.returncode == -signal.SIGKILL, err[-2000:]
        else:
            assert proc.returncode == 128 + signum, err[-2000:]
            assert err.splitlines()[-1].startswith("Interrupted: "), err[-2000:]
        if out.exists() and json.loads((out / "zarr.json").read_bytes())["attributes"].get("complete") is not True:
            learned = runner.invoke(app, ["learn", "--features", str(out), "--out", str(tmp_path / "run"), "--tasks",
                                          "2", "--projection-dim", "8"])
            assert learned.exit_code == 1 and "not complete" in learned.output, learned.output
            assert not (tmp_path / "run").exists()
    resumed = _cli(_vit_args(tiny_vit_checkpoint, out))
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err[-2000:]
    assert store_files(out) == store_files(reference)
    verified = runner.invoke(app, ["info", str(out), "--verify"])
    assert verified.exit_code == 0 and "all intact" in verified.output, verified.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.zarr", "s.zarr.log.json"]


#: Ctrl-C arrives while a batch's shared memory is fetched from its DataLoader worker (the race a random SIGINT hit
#: about once in 14 runs): the parent drops the worker's connection mid-handshake, then the signal lands.
MID_FETCH = """
import os, signal, socket
from multiprocessing import connection, resource_sharer
real, calls = resource_sharer.DupFd.detach, []

def detach(self):
    calls.append(1)
    if len(calls) == 3:
        address, _key = self._id
        with socket.socket(getattr(socket, connection.address_type(address))) as s:
            s.connect(address)
        os.kill(os.getpid(), signal.SIGINT)
    return real(self)

resource_sharer.DupFd.detach = detach
"""


def test_ctrl_c_while_a_batch_is_fetched_from_a_worker_prints_one_line(tmp_path, tiny_vit_checkpoint):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(MID_FETCH)
    out = tmp_path / "s.zarr"
    proc = _cli(_vit_args(tiny_vit_checkpoint, out, batch=8), ENV | {"PYTHONPATH": f"{site}{os.pathsep}{ROOT}"})
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err[-2000:]
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith(("train:", "test:"))]
    assert lines == [f"Interrupted: {out} is incomplete; re-run the same command to resume after the last written "
                     "chunk."], err[-3000:]
