"""Issue 24's outside fault test, feature-store family: every case is refused in one line, never trained on.

Before: swapping or copying chunk files kept every CRC-32C valid, so `learn`, `sweep` and `predict` trained
and predicted on rows in the wrong place with exit 0 (only `info --verify` noticed); an edited final-norm
attribute or norm array silently changed the fused features (A_avg 28.98 vs 59.23); `write_store` deleted a
folder of user files; a chunk that is a FIFO hung every reader and a symlink to /dev/zero exhausted the
memory; a shape edited to 10^12 rows was a MemoryError traceback.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from functools import partial
from pathlib import Path

import helpers
import numpy as np
import pytest
import zarr
from typer.testing import CliRunner

from foal_pipe.cli import app
from foal_pipe.errors import FoalPipeError
from foal_pipe.store import open_store, verify_store, write_store
from foal_pipe.store.blockfusion import FinalNorm

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
CLASSES = ["a", "b", "c", "d"]
runner = CliRunner()


assert_one_line_error = partial(helpers.assert_one_line_error, after_notes=True)


def _data(n: int, d: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = np.tile(np.arange(4), n // 4)
    return (rng.normal(size=(n, d)) + 3 * y[:, None]).astype(np.float32), y


@pytest.fixture
def store(tmp_path) -> Path:
    (xt, yt), (xs, ys) = _data(256, 6, 0), _data(128, 6, 1)
    return write_store(tmp_path / "s.zarr", (xt, yt), (xs, ys), CLASSES, chunk_rows=32)


@pytest.fixture
def blocks_store(tmp_path) -> Path:
    rng = np.random.default_rng(2)
    y = np.tile(np.arange(4), 40)
    blocks = (rng.normal(size=(160, 3, 6)) + 2 * y[:, None, None]).astype(np.float32)
    norm = FinalNorm("layernorm", 1e-6, weight=np.linspace(0.5, 2, 6, dtype=np.float32), bias=np.zeros(6, np.float32))
    return write_store(tmp_path / "b.zarr", (blocks[:128, -1], y[:128]), (blocks[128:, -1], y[128:]), CLASSES,
                       chunk_rows=32, blocks=(blocks[:128], blocks[128:]), norm=norm)


def _chunk(store: Path, name: str, i: int) -> Path:
    return store / name / "c" / str(i) / ("0" if name.endswith("features") else "0/0")


def _learn(store: Path, out: Path, *extra: str):
    return runner.invoke(app, ["learn", "--features", str(store), "--out", str(out), "--tasks", "2",
                               "--projection-dim", "16", *extra])


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """The CLI in its own process: a hang is a timeout, a runaway read cannot take the test runner's memory."""
    return subprocess.run([sys.executable, "-c", "from foal_pipe.cli import main; main()", *map(str, args)],
                          env=ENV, capture_output=True, text=True, timeout=timeout)


# -- chunks in the wrong place (6 silent) ------------------------------------------------------------------------
def _swap(a: Path, b: Path) -> None:
    tmp = a.with_name("swap")
    os.rename(a, tmp)
    os.rename(b, a)
    os.rename(tmp, b)


@pytest.mark.parametrize("how", ["swap", "copy"])
@pytest.mark.parametrize("command", ["learn", "sweep", "predict"])
def test_a_chunk_moved_or_copied_is_refused_by_every_reader(store, tmp_path, how, command):
    split = "test" if command == "predict" else "train"
    run = tmp_path / "good"
    assert _learn(store, run).exit_code == 0
    first, second = _chunk(store, f"{split}/features", 0), _chunk(store, f"{split}/features", 1)
    _swap(first, second) if how == "swap" else shutil.copyfile(second, first)
    out = tmp_path / "out"
    if command == "learn":
        result = _learn(store, out)
    elif command == "sweep":
        result = runner.invoke(app, ["sweep", "--features", str(store), "--out", str(out), "--tasks", "2",
                                     "--projection-dim", "16", "--gammas", "0.1,1"])
    else:
        result = runner.invoke(app, ["predict", "--model", str(run / "model.safetensors"), "--features", str(store),
                                     "--out", str(out)])
    assert_one_line_error(result, f"{split}/features chunk at rows 0-31 is damaged (it holds the chunk of rows "
                                  "32-63, moved or copied here)")
    assert not out.exists()


def test_a_moved_chunk_is_refused_by_take_and_verify(store):
    _swap(_chunk(store, "train/features", 2), _chunk(store, "train/features", 5))
    opened = open_store(store)
    with pytest.raises(FoalPipeError, match=r"train/features chunk at rows 64-95 is damaged \(it holds the chunk of "
                                            r"rows 160-191"):
        opened.train.take(np.array([70, 3]))
    assert [str(p) for p in verify_store(store).problems] == [
        "train/features rows 64-95: damaged (it holds the chunk of rows 160-191, moved or copied here)",
        "train/features rows 160-191: damaged (it holds the chunk of rows 64-95, moved or copied here)"]


def test_a_chunk_from_another_store_is_refused(store, tmp_path):
    (xt, yt), (xs, ys) = _data(256, 6, 7), _data(128, 6, 8)
    other = write_store(tmp_path / "o.zarr", (xt, yt), (xs, ys), CLASSES, chunk_rows=32)
    shutil.copyfile(_chunk(other, "train/features", 3), _chunk(store, "train/features", 3))
    assert_one_line_error(_learn(store, tmp_path / "run"), "train/features chunk at rows 96-127 is damaged "
                                                           "(checksum mismatch)")


def test_moved_blocks_chunks_are_refused_in_a_fusion(blocks_store, tmp_path):
    _swap(_chunk(blocks_store, "train/blocks", 0), _chunk(blocks_store, "train/blocks", 1))
    assert_one_line_error(_learn(blocks_store, tmp_path / "run", "--fusion", "mean-cls"),
                          "train/blocks chunk at rows 0-31 is damaged (it holds the chunk of rows 32-63")


# -- fusion parameters edited (1 silent) -------------------------------------------------------------------------
def _edit_attrs(store: Path, edit) -> None:
    doc = json.loads((store / "zarr.json").read_text())
    edit(doc["attributes"])
    (store / "zarr.json").write_text(json.dumps(doc))


@pytest.mark.parametrize("edit", [
    lambda a: a["blocks"]["norm"].update(eps=10.0),
    lambda a: a["blocks"]["norm"].update(kind="rmsnorm"),
    lambda a: a.update(classes=["b", "a", "c", "d"]),
], ids=["eps", "kind", "classes"])
def test_edited_attributes_are_refused(blocks_store, tmp_path, edit):
    _edit_attrs(blocks_store, edit)
    message = "is damaged: its attributes or array metadata differ from those it was completed with"
    assert_one_line_error(_learn(blocks_store, tmp_path / "run", "--fusion", "mean-cls"), message)
    assert_one_line_error(runner.invoke(app, ["info", str(blocks_store)]), "differ from those it was completed with")


def test_an_edited_norm_array_is_refused(blocks_store, tmp_path):
    zarr.open_group(str(blocks_store), mode="r+")["norm/weight"][:] = np.ones(6, np.float32)  # a valid CRC-32C
    assert_one_line_error(_learn(blocks_store, tmp_path / "run", "--fusion", "mean-cls"),
                          "norm/weight chunk at rows 0-5 is damaged (checksum mismatch)")


def test_an_edited_array_record_is_refused(store, tmp_path):
    meta = store / "train" / "features" / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["attributes"]["chunk_files"]["crc32c"][0] ^= 1
    meta.write_text(json.dumps(doc))
    assert_one_line_error(_learn(store, tmp_path / "run"), "differ from those it was completed with")


# -- write_store and what is at its path (1 data loss) -----------------------------------------------------------
def test_write_store_refuses_to_delete_what_is_not_a_store(tmp_path):
    (xt, yt), (xs, ys) = _data(64, 4, 0), _data(16, 4, 1)
    folder = tmp_path / "thesis"
    folder.mkdir()
    (folder / "chapter1.tex").write_text("years of work")
    with pytest.raises(FoalPipeError, match=r"thesis exists and is a folder that is not a feature store; refusing to "
                                            r"replace it: choose another path or remove it"):
        write_store(folder, (xt, yt), (xs, ys), CLASSES)
    assert (folder / "chapter1.tex").read_text() == "years of work" and sorted(os.listdir(folder)) == ["chapter1.tex"]
    (tmp_path / "notes.txt").write_text("keep")
    with pytest.raises(FoalPipeError, match="notes.txt exists and is a file; refusing to replace it"):
        write_store(tmp_path / "notes.txt", (xt, yt), (xs, ys), CLASSES)
    assert (tmp_path / "notes.txt").read_text() == "keep"
    assert not list(tmp_path.glob(".*creating"))
    again = write_store(tmp_path / "s.zarr", (xt, yt), (xs, ys), CLASSES)  # a store, or an empty folder: replaced
    write_store(again, (xt[::-1], yt[::-1]), (xs, ys), CLASSES)
    np.testing.assert_array_equal(next(open_store(again).train.iter_chunks())[1], xt[::-1])


# -- chunk files that are not files (7 hangs) --------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "huge"])
@pytest.mark.parametrize("command", ["learn", "predict", "verify"])
def test_a_chunk_that_is_not_a_chunk_file_is_refused_at_once(store, tmp_path, kind, command):
    run = tmp_path / "good"
    assert _learn(store, run).exit_code == 0
    split = "test" if command == "predict" else "train"
    chunk = _chunk(store, f"{split}/features", 1)
    chunk.unlink()
    if kind == "fifo":
        os.mkfifo(chunk)
    elif kind == "dev-zero":
        os.symlink("/dev/zero", chunk)
    else:
        with open(chunk, "wb") as f:  # sparse: 64 GiB that cost nothing on disk
            f.truncate(64 << 30)
    args = {"learn": ["learn", "--features", store, "--out", tmp_path / "out", "--tasks", "2", "--projection-dim", "16"],
            "predict": ["predict", "--model", run / "model.safetensors", "--features", store],
            "verify": ["info", "--verify", store]}[command]
    result = _cli(*args)
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    why = {"fifo": "a FIFO, not a regular file", "dev-zero": "a character device, not a regular file",
           "huge": "68,719,476,736 bytes, more than a chunk of its array can hold"}[kind]
    text = " ".join(result.stderr.split())
    assert f"{split}/features" in text and "rows 32-63" in text and why in text, text
    assert not (tmp_path / "out").exists()


# -- absurd shapes (MemoryError tracebacks) ----------------------------------------------------------------------
def _edit_rows(store: Path, rows: int) -> None:
    for name in ("train/features", "train/labels"):
        meta = store / name / "zarr.json"
        doc = json.loads(meta.read_text())
        doc["shape"][0] = rows
        meta.write_text(json.dumps(doc))


@pytest.mark.parametrize("sealed", [True, False], ids=["format4", "format3"])
def test_a_shape_edited_to_a_trillion_rows_is_refused_in_one_line(store, tmp_path, sealed):
    if not sealed:
        helpers.unseal_to_format_3(store)
    _edit_rows(store, 10**12)
    assert_one_line_error(_learn(store, tmp_path / "run"), "train/labels (1,000,000,000,000 rows) needs 14,901.2 GiB")
    shown = runner.invoke(app, ["info", str(store)])
    assert shown.exit_code == 1 and "Traceback" not in shown.output, shown.output
    assert "31,249,999,992 chunk files missing" in " ".join(shown.output.split())
    verified = runner.invoke(app, ["info", "--verify", str(store)])
    assert verified.exit_code == 1 and "Traceback" not in verified.output, verified.output


@pytest.mark.slow
def test_a_moved_chunk_is_refused_on_a_dask_cluster(store, tmp_path):
    """Workers read through the same checked store (pickled with its chunk records); the chunk is named by split and
    rows, as in a local run."""
    pytest.importorskip("distributed")
    _swap(_chunk(store, "train/features", 0), _chunk(store, "train/features", 1))
    result = _learn(store, tmp_path / "run", "--scheduler", "dask", "--dask-address", "local", "--workers", "1")
    assert_one_line_error(result, "train/features chunk at rows ", "moved or copied here)")
    text = " ".join(result.output.split())  # whichever of the two swapped chunks a worker reads first is named
    assert ("rows 0-31 is damaged (it holds the chunk of rows 32-63," in text
            or "rows 32-63 is damaged (it holds the chunk of rows 0-31," in text), text
    assert not (tmp_path / "run").exists()


def test_a_hand_made_format_4_store_needs_complete_store(tmp_path):
    """Another program's writer that declares format 4 gets the integrity data from complete_store."""
    from foal_pipe.store import StoreMeta, complete_store

    group = zarr.open_group(str(tmp_path / "h.zarr"), mode="w")
    group.attrs.update(StoreMeta(("a", "b"), "hand", {"name": "x",
                                                      "fusion": "none", "image_size": 0, "normalize": False}).to_dict())
    for split in ("train", "test"):
        group.create_array(f"{split}/features", shape=(6, 2), chunks=(4, 2), dtype="float32")[:] = np.arange(12.0).reshape(6, 2)
        group.create_array(f"{split}/labels", shape=(6,), chunks=(6,), dtype="int64")[:] = np.arange(6) % 2
    group.attrs.update({"complete": True})
    with pytest.raises(FoalPipeError, match=r"declares format_version 5 but has no generation id; complete it with "
                                            r"foal_pipe.store.complete_store"):
        open_store(tmp_path / "h.zarr")
    group.attrs.update({"complete": False, "progress": {"train": 6, "test": 6}})
    complete_store(tmp_path / "h.zarr")
    assert open_store(tmp_path / "h.zarr").train.read(0, 6).shape == (6, 2)
