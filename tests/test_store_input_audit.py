"""The store input audit: ``info --verify`` runs every reader's check, damaged row indices and manifests are refused
when a store is opened, Zarr format-2 and sharded stores are refused up front, older stores' generation ids catch a
chunk replaced mid-run, and ``info`` tells the truth about checksums, incomplete stores and odd class names."""

from __future__ import annotations

import errno
import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import zarr
from helpers import build_store, invoke, unseal_to_format_3

from foal_pipe.errors import FoalPipeError
from foal_pipe.io import WriteError, atomic_dir
from foal_pipe.store import (
    StoreMeta,
    complete_store,
    create_array,
    open_store,
    verify_store,
    write_store,
)
from foal_pipe.store.blockfusion import FinalNorm
from foal_pipe.store.write import FeatureWriter, create_skeleton, mark_progress

CLASSES = ["a", "b", "c", "d"]


def _rows(n: int, seed: int, dim: int = 8) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = np.arange(n) % len(CLASSES)
    return (rng.normal(size=(len(CLASSES), dim))[y] + rng.normal(size=(n, dim))).astype(np.float32), y


def _completed(path: Path, train: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray]) -> Path:
    """A format-5 store written as another program would (create_array, progress, complete_store): sealed whatever
    its rows hold."""
    group = zarr.open_group(str(path), mode="w")
    for split, (x, y) in (("train", train), ("test", test)):
        create_array(group, f"{split}/features", x.shape, (16, x.shape[1]), str(x.dtype))[:] = x
        create_array(group, f"{split}/labels", y.shape, (max(len(y), 1),), "int64")[:] = y
    group.attrs.put({"format": "foal-pipe/features", "format_version": 5, "classes": CLASSES, "dataset": "synthetic",
                     "encoder": {"name": "synthetic",
                                 "fusion": "none", "image_size": 0, "normalize": False},
                     "progress": {"train": len(train[0]), "test": len(test[0])}})
    complete_store(path)
    return path


# -- F1: info --verify runs the readers' checks -------------------------------------------------------------------
@pytest.mark.parametrize("edit", ["label", "count", "width"])
def test_verify_refuses_what_every_reader_refuses(tmp_path, edit):
    (x, y), test = _rows(96, 0), _rows(48, 1)
    if edit == "label":
        y = y.copy()
        y[5] = 7  # 4 classes
    elif edit == "count":
        y = y[:-1]
    else:
        test = _rows(48, 1, dim=6)
    store = _completed(tmp_path / "s.zarr", (x, y), test)
    with pytest.raises(FoalPipeError) as refused:
        open_store(store)
    problems = [str(p) for p in verify_store(store).problems]
    assert problems == [f"(whole store): readers refuse it: {refused.value}"]
    result = invoke("info", "--verify", store)
    assert result.exit_code == 1 and "all intact" not in result.output, result.output
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0] == f"Error: {store} fails --verify: {refused.value}", result.stderr


# -- F2: train/index and the manifest are checked when the store is opened ----------------------------------------
def _flip_first_chunk(store: Path, array: str) -> None:
    chunk = next(p for p in sorted((store / array / "c").rglob("*")) if p.is_file())
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0xFF
    chunk.write_bytes(bytes(data))


@pytest.mark.parametrize(("array", "where"), [("train/index", "rows"), ("manifest", "bytes")])
def test_a_damaged_index_or_manifest_is_refused_when_the_store_is_opened(tmp_path, array, where):
    store = tmp_path / "digits.zarr"
    assert invoke("extract", "--dataset", "digits", "--model", "pixels", "--out", store, "--workers", 0).exit_code == 0
    n_bytes = json.loads((store / "zarr.json").read_text())["attributes"]["manifest"]["bytes"]
    _flip_first_chunk(store, array)
    with pytest.raises(FoalPipeError, match=rf"{array} chunk at {where} 0-[\d,]+ is damaged \(checksum mismatch\)"):
        open_store(store)
    if array == "manifest":
        with pytest.raises(FoalPipeError, match=f"bytes 0-{n_bytes - 1:,} is damaged"):
            open_store(store)
    result = invoke("learn", "--features", store, "--out", tmp_path / "run", "--tasks", 2)
    assert result.exit_code == 1 and "is damaged" in result.output and not (tmp_path / "run").exists()


# -- F3: Zarr format-2 stores; atomic_dir names only its own writes ---------------------------------------------
def test_a_zarr_format_2_store_is_refused_up_front(tmp_path):
    group = zarr.open_group(str(tmp_path / "v2.zarr"), mode="w", zarr_format=2)
    for split, (x, y) in (("train", _rows(32, 0)), ("test", _rows(16, 1))):
        group.create_array(f"{split}/features", shape=x.shape, chunks=(16, 8), dtype="float32")[:] = x
        group.create_array(f"{split}/labels", shape=y.shape, chunks=y.shape, dtype="int64")[:] = y
    group.attrs.put({"format": "foal-pipe/features", "format_version": 1, "classes": CLASSES, "dataset": "d",
                     "encoder": {"name": "synthetic", "fusion": "none", "image_size": 0, "normalize": False}, "complete": True})
    with pytest.raises(FoalPipeError, match="is a Zarr format-2 group"):
        open_store(tmp_path / "v2.zarr")
    result = invoke("info", tmp_path / "v2.zarr")
    assert result.exit_code == 1 and "Zarr format-2 group" in result.output, result.output


def test_atomic_dir_reports_only_its_own_writes_as_write_errors(tmp_path):
    missing = tmp_path / "input" / "zarr.json"
    with pytest.raises(FileNotFoundError) as raised, atomic_dir(tmp_path / "out") as tmp:
        (tmp / "model").write_text("x")
        missing.read_bytes()
    assert raised.value.filename == str(missing) and not (tmp_path / "out").exists()
    with pytest.raises(WriteError, match="cannot write .*out: No space left on device"), atomic_dir(tmp_path / "out") as tmp:
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp / "model"))


# -- F4: a store without checksums is "decoded", not "intact" -----------------------------------------------------
def test_info_does_not_call_a_store_without_checksums_intact(tmp_path):
    store = build_store(tmp_path / "v1.zarr", n_train=64, n_test=32)
    result = invoke("info", "--verify", store)
    assert result.exit_code == 0, result.output
    assert "all intact" not in result.output and "all decoded" in result.output
    assert "shows only as a decoding error" not in result.output and "unnoticed" in result.output


# -- F5: a format-3 store with a generation id ----------------------------------------------------------------------
def _format_3(path: Path) -> Path:
    return unseal_to_format_3(write_store(path, _rows(64, 0), _rows(32, 1), CLASSES, chunk_rows=16))


def test_a_chunk_replaced_after_opening_a_format_3_store_is_noticed(tmp_path):
    store = _format_3(tmp_path / "s.zarr")
    opened = open_store(store)
    opened.check_unchanged()
    chunks = store / "train" / "features" / "c"
    shutil.copyfile(chunks / "1" / "0", chunks / "2" / "0")
    with pytest.raises(FoalPipeError, match="changed while it was being read .*chunk files differ"):
        opened.check_unchanged()
    with pytest.raises(FoalPipeError, match="or its chunk files do"):
        open_store(store)


# -- F6/F7: non-finite fusions and norm parameters -------------------------------------------------------------------
def _blocks_store(path: Path, eps: float, weight: np.ndarray, constant_row: int | None = None) -> Path:
    (x, y), (xt, yt) = _rows(32, 0), _rows(16, 1)
    rng = np.random.default_rng(2)
    blocks = (x[:, None, :] + rng.normal(0, 0.1, (32, 3, 8))).astype(np.float32)
    if constant_row is not None:
        blocks[constant_row] = 1.0
    test_blocks = (xt[:, None, :] + rng.normal(0, 0.1, (16, 3, 8))).astype(np.float32)
    return write_store(path, (x, y), (xt, yt), CLASSES, chunk_rows=16, blocks=(blocks, test_blocks),
                       norm=FinalNorm("layernorm", eps, weight, np.zeros(8, np.float32)))


def test_a_fusion_that_divides_by_zero_is_named_without_warnings(tmp_path):
    store = _blocks_store(tmp_path / "s.zarr", 0.0, np.ones(8, np.float32), constant_row=5)
    train = open_store(store, fusion="mean:1-3").train
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(FoalPipeError, match="fusion mean:1-3 of train row 5 is NaN or inf") as refused:
            train.read(0, 16)
    assert "blocks_dtype" not in str(refused.value) and "fusion_norm=False" in str(refused.value)


def test_a_non_finite_norm_parameter_is_named_as_one(tmp_path):
    weight = np.ones(8, np.float32)
    weight[3] = np.nan
    store = _blocks_store(tmp_path / "s.zarr", 1e-6, weight)
    with pytest.raises(FoalPipeError, match="norm/weight in .*a parameter of the final norm, holds nan at feature 3") as e:
        open_store(store)
    assert "first bad row" not in str(e.value) and "dtype" not in str(e.value)


# -- F8: an incomplete format-5 store is not sealed -----------------------------------------------------------------
def test_info_does_not_call_an_incomplete_store_sealed(tmp_path):
    path = tmp_path / "part.zarr"
    y = np.arange(64) % 4
    encoder = {"name": "synthetic", "fusion": "none", "image_size": 0, "normalize": False}
    create_skeleton(path, StoreMeta(tuple(CLASSES), "synthetic", encoder), 8, "float32", 16,
                    {"train": y, "test": y[:32]})
    FeatureWriter(path, "train").write(0, np.ones((16, 8), np.float32))
    mark_progress(path, "train", 16)
    result = invoke("info", path)
    assert result.exit_code == 0 and "sealed" not in result.output, result.output
    shown = invoke("info", "--json", path)
    assert json.loads(shown.output)["integrity"] is False


# -- F9: sharded arrays ---------------------------------------------------------------------------------------------
def test_a_sharded_array_is_refused_as_unsupported(tmp_path):
    store = write_store(tmp_path / "s.zarr", _rows(32, 0), _rows(16, 1), CLASSES, chunk_rows=16)
    group = zarr.open_group(str(store), mode="r+")
    x = group["train/features"][:]
    del group["train/features"]
    group.create_array("train/features", shape=x.shape, chunks=(8, 8), shards=(16, 8), dtype="float32")[:] = x
    with pytest.raises(FoalPipeError, match="train/features: it is sharded") as refused:
        open_store(store)
    assert "missing" not in str(refused.value)
    result = invoke("info", store)
    assert result.exit_code == 1 and "sharded" in result.output and "missing" not in result.output, result.output


# -- F10: an empty train split --------------------------------------------------------------------------------------
def test_an_empty_train_split_is_named(tmp_path):
    store = write_store(tmp_path / "s.zarr", (np.zeros((0, 8)), np.zeros(0, int)), _rows(16, 1), CLASSES, chunk_rows=16)
    with pytest.raises(FoalPipeError, match="has an empty train split") as refused:
        open_store(store).check_labelled()
    assert "unlabelled" not in str(refused.value)


# -- F11: class names that would print ambiguously ------------------------------------------------------------------
def test_info_quotes_class_names_that_would_read_ambiguously(tmp_path):
    names = ["a,b", 'c"d', "e\nf", ""]
    store = write_store(tmp_path / "s.zarr", _rows(32, 0), _rows(16, 1), names, chunk_rows=16)
    result = invoke("info", store)
    assert result.exit_code == 0, result.output
    assert "4: " + ", ".join(json.dumps(n) for n in names) in result.output


# -- writer side: write_store refuses rows no reader would accept, before writing anything ---------------------------
@pytest.mark.parametrize("edit", ["count", "label", "width", "zero width"])
def test_write_store_refuses_bad_rows_before_writing(tmp_path, edit):
    (x, y), test = _rows(32, 0), _rows(16, 1)
    message = {"count": "do not match", "label": r"label 9 at row 0 is outside \[0, 4\)", "width": "8 dimensions but",
               "zero width": "d >= 1"}[edit]
    if edit == "count":
        y = y[:-1]
    elif edit == "label":
        y = y + 9
    elif edit == "width":
        test = _rows(16, 1, dim=5)
    else:
        x, test = np.zeros((32, 0), np.float32), (np.zeros((16, 0), np.float32), test[1])
    with pytest.raises(FoalPipeError, match=message):
        write_store(tmp_path / "s.zarr", (x, y), test, CLASSES, chunk_rows=16)
    assert not (tmp_path / "s.zarr").exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("where", ["train", "test", "train blocks", "test blocks"])
def test_write_store_refuses_non_finite_rows_before_writing(tmp_path, value, where):
    """Every reader refuses a store holding NaN or inf, so the writer refuses the rows first, naming the value and
    its place; a finite store of the same rows is written (the check is on what was given, not on the dtype)."""
    (x, y), (xt, yt) = _rows(32, 0), _rows(16, 1)
    x, xt = x.astype(np.float64), xt.astype(np.float64)
    tokens = [np.ones((32, 2, x.shape[1]), np.float32), np.ones((16, 2, x.shape[1]), np.float32)]
    split, *blocks = where.split()
    target = (tokens[0] if split == "train" else tokens[1]) if blocks else (x if split == "train" else xt)
    spot = (5, 1, 3) if blocks else (5, 3)
    target[spot] = value
    kind = "block token" if blocks else "feature"
    with pytest.raises(FoalPipeError, match=rf"write_store: {split} {kind} -?(nan|inf) \(row 5, "
                                            rf"{'position 1, 3' if blocks else 'column 3'}\) is not a finite number"):
        write_store(tmp_path / "s.zarr", (x, y), (xt, yt), CLASSES, chunk_rows=16, blocks=tuple(tokens))
    assert list(tmp_path.iterdir()) == []
    target[spot] = 0.0
    store = open_store(write_store(tmp_path / "s.zarr", (x, y), (xt, yt), CLASSES, chunk_rows=16, blocks=tuple(tokens)))
    assert store.split("train").n_rows == 32


@pytest.mark.parametrize("edit", ["three", "one", "none", "rows", "flat", "blocks", "strings"])
def test_write_store_refuses_block_tokens_it_cannot_keep_in_one_line(tmp_path, edit):
    """Block tokens are a (train, test) pair of (N, L, d) real numbers, a row per feature row and the same L and d in
    both splits; anything else is one line before anything is written (a raw ValueError or a half-made store
    before)."""
    (x, y), (xt, yt) = _rows(32, 0), _rows(16, 1)
    train, test = np.ones((32, 2, 8), np.float32), np.ones((16, 2, 8), np.float32)
    blocks, message = {
        "three": ((train, test, test), "must be a pair"),
        "one": ((train,), "must be a pair"),
        "none": ((train, None), "test block tokens are object values"),
        "rows": ((train, train), r"test block tokens have shape \(32, 2, 8\)"),
        "flat": ((train[:, 0], test[:, 0]), r"train block tokens have shape \(32, 8\)"),
        "blocks": ((train, np.ones((16, 3, 8), np.float32)), r"test block tokens have shape \(16, 3, 8\)"),
        "strings": ((train, test.astype(str)), "test block tokens are <U32 values"),
    }[edit]
    with pytest.raises(FoalPipeError, match=message) as caught:
        write_store(tmp_path / "s.zarr", (x, y), (xt, yt), CLASSES, chunk_rows=16, blocks=blocks)
    assert "\n" not in str(caught.value)
    assert list(tmp_path.iterdir()) == []
