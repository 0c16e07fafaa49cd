"""Every I/O and format error of a feature store, and of a class-order file, is one line naming the problem
and the fix: `Error: ...`, exit status 1, no traceback, nothing half-written.

Before: attributes of the wrong type were coerced (`classes: "abc"` became three classes a, b, c; `true` and
`1.0` passed as format version 1), complex and boolean features were trained on, a 10^12-row labels array was
read whole, symlink loops and non-UTF-8 class orders were tracebacks, booleans in a class order were label 1,
and a full disk during extract was a traceback.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import zarr
from typer.testing import CliRunner

import foal_pipe.store as st
from foal_pipe.cli import app
from foal_pipe.errors import FoalPipeError
from foal_pipe.extract import ExtractSpec, run_extract
from foal_pipe.protocol.stream import build_stream, dropped_warning, read_class_order
from foal_pipe.store import open_store, read_meta, write_store

runner = CliRunner()
CLASSES = ["a", "b", "c", "d"]


def assert_one_line_error(result, *fragments: str) -> None:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    text = " ".join(" ".join(lines).split())
    assert text.startswith("Error: ") or lines[-1].startswith("Error: "), result.output
    for fragment in fragments:
        assert fragment in text, text


@pytest.fixture
def good(tmp_path) -> Path:
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(120, 6)).astype(np.float32), np.tile(np.arange(4), 30)
    return write_store(tmp_path / "s.zarr", (x[:100], y[:100]), (x[100:], y[100:]), CLASSES, chunk_rows=32)


def _with_attrs(store: Path, **changes) -> Path:
    meta = store / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["attributes"].update(changes)
    meta.write_text(json.dumps(doc))
    return store


def _both_commands_refuse(store: Path, tmp_path: Path, *fragments: str) -> None:
    learn = runner.invoke(app, ["learn", "--features", str(store), "--out", str(tmp_path / "run"), "--tasks", "2",
                                "--projection-dim", "16"])
    assert_one_line_error(learn, *fragments)
    assert not (tmp_path / "run").exists()
    assert_one_line_error(runner.invoke(app, ["info", str(store)]), *fragments)


ATTRIBUTES = [
    ({"classes": "abcd"}, "attribute 'classes' must be a non-empty list of class names (strings), but it is a string"),
    ({"classes": 4}, "but it is an integer (4)"),
    ({"classes": ["a", True, "c", "d"]}, "but it holds a boolean (true)"),
    ({"classes": []}, "but it is empty"),
    ({"encoder": "vit_base"}, "attribute 'encoder' must be a mapping, but it is a string"),
    ({"encoder": ["vit"]}, "attribute 'encoder' must be a mapping, but it is a list"),
    ({"format_version": True}, "format_version true (a boolean), expected an integer (1, 2, 3, 4 or 5)"),
    ({"format_version": 1.0}, "format_version 1.0 (a number), expected an integer"),
    ({"format_version": "2"}, 'format_version "2" (a string)'),
    ({"format_version": 7}, "format_version 7 but this foal-pipe reads versions 1, 2, 3, 4 or 5"),
    ({"dataset": 5}, "attribute 'dataset' must be a string, but it is an integer"),
    ({"complete": "yes"}, "attribute 'complete' must be a boolean, but it is a string"),
    ({"generation": 12}, "attribute 'generation' must be a string"),
    ({"format": None}, "is not a foal-pipe feature store (attribute 'format' is null"),
]


@pytest.mark.parametrize("changes,message", ATTRIBUTES, ids=[str(c) for c, _ in ATTRIBUTES])
def test_attributes_of_the_wrong_type(good, tmp_path, changes, message):
    _both_commands_refuse(_with_attrs(good, **changes), tmp_path, message)


@pytest.mark.parametrize("content", ["{garbage", "", "[1, 2]", '{"zarr_format": 3, "node_type": "array"}'])
def test_a_corrupt_group_zarr_json(good, tmp_path, content):
    (good / "zarr.json").write_text(content)
    _both_commands_refuse(good, tmp_path, f"the group metadata of {good} is corrupt", "re-extract the store")


def test_a_corrupt_array_zarr_json(good, tmp_path):
    (good / "train" / "features" / "zarr.json").write_text('{"zarr_format": 3, "node_type": "array", "shape": 7}')
    _both_commands_refuse(good, tmp_path, "train/features/zarr.json is corrupt", "re-extract it")


def _store_with(tmp_path: Path, features_dtype: str = "float32", labels_dtype: str = "int64") -> Path:
    """A complete, checksummed store whose arrays have the given dtypes (other code might write one)."""
    group = zarr.open_group(str(tmp_path / "d.zarr"), mode="w")
    rng = np.random.default_rng(1)
    for split, n in (("train", 40), ("test", 12)):
        st.create_array(group, f"{split}/features", (n, 3), (16, 3), features_dtype)[:] = (
            rng.normal(size=(n, 3)).astype(features_dtype))
        st.create_array(group, f"{split}/labels", (n,), (n,), labels_dtype)[:] = np.arange(n) % 2
    group.attrs.put({"format": "foal-pipe/features", "format_version": 2, "classes": ["x", "y"], "dataset": "d",
                     "encoder": {"name": "e", "fusion": "none", "image_size": 0, "normalize": False}, "complete": True})
    return tmp_path / "d.zarr"


@pytest.mark.parametrize("dtype", ["complex64", "bool", "int32", "uint8"])
def test_feature_dtypes_outside_the_spec(tmp_path, dtype):
    store = _store_with(tmp_path, features_dtype=dtype)
    with pytest.raises(FoalPipeError, match=rf"train/features in .* has dtype {dtype}, outside the spec \(float16, "
                                            r"float32, float64\)"):
        open_store(store)
    result = runner.invoke(app, ["learn", "--features", str(store), "--out", str(tmp_path / "run"), "--tasks", "2"])
    assert_one_line_error(result, f"has dtype {dtype}, outside the spec")


@pytest.mark.parametrize("dtype", ["float64", "bool"])
def test_label_dtypes_that_are_not_integers(tmp_path, dtype):
    with pytest.raises(FoalPipeError, match=rf"train/labels in .* has dtype {dtype}, expected integers"):
        open_store(_store_with(tmp_path, labels_dtype=dtype))


def test_boolean_labels_are_not_written_as_class_ids(tmp_path):
    """A mask passed for the labels was written as ids 0 and 1, which the reader refuses in a store's own arrays."""
    x = np.random.default_rng(0).normal(size=(6, 3))
    mask = np.arange(6) % 2 == 0
    with pytest.raises(FoalPipeError, match=r"^write_store: train labels are booleans, not class ids; .*y\.astype\(int\)"):
        write_store(tmp_path / "b.zarr", (x, mask), (x, np.arange(6) % 2), ["x", "y"])
    assert not (tmp_path / "b.zarr").exists()
    write_store(tmp_path / "i.zarr", (x, mask.astype(int)), (x, np.arange(6) % 2), ["x", "y"])
    assert open_store(tmp_path / "i.zarr").train.labels[:].tolist() == mask.astype(int).tolist()


def test_float64_features_are_in_the_spec(tmp_path):
    assert open_store(_store_with(tmp_path, features_dtype="float64")).train.features.dtype == np.float64


def _absurd(tmp_path: Path, rows: int, chunk: int, fake_files: bool) -> Path:
    """Metadata claiming ``rows`` train rows (nothing like it on disk); with ``fake_files``, one chunk file
    per array so that the listing passes and only the sizes can tell."""
    group = zarr.open_group(str(tmp_path / "big.zarr"), mode="w")
    st.create_array(group, "train/features", (rows, 4), (chunk, 4), "float32")
    st.create_array(group, "train/labels", (rows,), (chunk,), "int64")
    st.create_array(group, "test/features", (2, 4), (2, 4), "float32")[:] = 0
    st.create_array(group, "test/labels", (2,), (2,), "int64")[:] = 0
    group.attrs.put({"format": "foal-pipe/features", "format_version": 2, "classes": ["x"], "dataset": "big",
                     "encoder": {"name": "e", "fusion": "none", "image_size": 0, "normalize": False}, "complete": True})
    if fake_files:
        for key in ("train/features/c/0/0", "train/labels/c/0"):
            (tmp_path / "big.zarr" / key).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / "big.zarr" / key).write_bytes(b"\0" * 64)
    return tmp_path / "big.zarr"


def test_absurd_shapes_are_refused_from_the_metadata(tmp_path):
    many = _absurd(tmp_path, 10**12, 1 << 20, fake_files=False)
    with pytest.raises(FoalPipeError, match=r"train/labels \(1,000,000,000,000 rows\) needs 14,901.2 GiB in memory"):
        open_store(many)  # the sizes are checked before the chunk files are listed
    assert_one_line_error(runner.invoke(app, ["info", str(many)]), "953,675 chunk files missing")
    shutil.rmtree(many)
    one = _absurd(tmp_path, 10**12, 10**12, fake_files=True)
    with pytest.raises(FoalPipeError, match=r"train/labels \(1,000,000,000,000 rows\) needs 14,901.2 GiB in memory"):
        open_store(one)


def test_symlink_loops(good, tmp_path):
    loop = tmp_path / "loop.zarr"
    os.symlink(loop.name, loop)
    _both_commands_refuse(loop, tmp_path, f"cannot open feature store {loop}: Too many levels of symbolic links")
    chunks = good / "train" / "features" / "c"
    os.symlink("..", chunks / "up")
    with pytest.raises(FoalPipeError, match=r"cannot list .*train/features: directory loop"):
        open_store(good)
    (chunks / "up").unlink()
    shutil.rmtree(chunks / "1")
    os.symlink("1", chunks / "1")
    _both_commands_refuse(good, tmp_path, "cannot list", "Too many levels of symbolic links")


def test_a_file_and_a_dangling_symlink(tmp_path):
    (tmp_path / "f.zarr").write_text("x")
    with pytest.raises(FoalPipeError, match="is a file, not a feature store"):
        open_store(tmp_path / "f.zarr")
    os.symlink("nowhere", tmp_path / "d.zarr")
    with pytest.raises(FoalPipeError, match=r"does not exist \(a symlink to nothing\)"):
        open_store(tmp_path / "d.zarr")


# -- class-order files -------------------------------------------------------------------------------------------
def test_class_order_files(tmp_path, good):
    path = tmp_path / "order.json"
    path.write_bytes(b"\xff\xfe[[0, 1], [2, 3]]")
    with pytest.raises(FoalPipeError, match=r"is not UTF-8 text \(byte 0\); write e.g. \[\[0,1\],\[2,3\]\]"):
        read_class_order(path, 4)
    path.write_text("[[true, 1], [2, 3]]")
    with pytest.raises(FoalPipeError, match=r"holds true, which is not a label id"):
        read_class_order(path, 4)
    path.write_text("[[0, 1.0], [2, 3]]")
    with pytest.raises(FoalPipeError, match=r"holds 1.0, which is not a label id"):
        read_class_order(path, 4)
    result = runner.invoke(app, ["learn", "--features", str(good), "--out", str(tmp_path / "run"),
                                 "--class-order", str(path)])
    assert_one_line_error(result, "holds 1.0, which is not a label id")
    path.write_text("[[0, 2]]")
    order = read_class_order(path, 4)
    stream = build_stream(open_store(good).train.labels, 4, None, 10, 0, order)
    assert stream.dropped == [1, 3]
    assert dropped_warning(stream, 4, class_order=True) == (
        "warning: --class-order lists 2 of the store's 4 classes; dropping the other 2 classes (label ids [1, 3]): "
        "their rows are neither trained on nor evaluated")
    even = build_stream(open_store(good).train.labels, 4, 3, 10, 0, drop_remainder=True)
    assert dropped_warning(even, 4, class_order=False).startswith(
        "warning: 4 classes do not split evenly into 3 tasks; --drop-remainder drops 1 class (label ids [")
    uneven = build_stream(open_store(good).train.labels, 4, 3, 10, 0)
    assert dropped_warning(uneven, 4, class_order=False) == (
        "note: 4 classes do not split evenly into 3 tasks: task 1 has 2 classes, tasks 2-3 have 1 class "
        "(--drop-remainder drops the 1 class left over instead, as the published code)")
    with pytest.raises(FoalPipeError, match="drop_remainder applies to the seeded split into tasks"):
        build_stream(open_store(good).train.labels, 4, None, 10, 0, order, drop_remainder=True)
    assert dropped_warning(build_stream(np.arange(8) % 4, 4, 2, 2, 0), 4, class_order=False) is None


# -- full and read-only disks during extract ---------------------------------------------------------------------
def _mount_tmpfs(where: Path, options: str) -> None:
    where.mkdir(exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip()[:80]}); needs root")


@pytest.fixture
def mounts(tmp_path):
    made: list[Path] = []

    def mount(name: str, options: str) -> Path:
        where = tmp_path / name
        _mount_tmpfs(where, options)
        made.append(where)
        return where

    yield mount
    for where in made:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


EXTRACT = ["extract", "--dataset", "digits", "--model", "pixels", "--chunk-rows", "128", "--batch-size", "50",
           "--workers", "0"]


@pytest.mark.usefixtures("one_torch_thread")
def test_a_full_disk_during_extract(tmp_path, mounts):
    """The 232 kB store does not fit a 96 kB disk: one line, the store left incomplete and resumable, and once
    there is room the resumed store equals an uninterrupted one byte for byte."""
    disk = mounts("small", "size=96k")
    out = disk / "digits.zarr"
    result = runner.invoke(app, [*EXTRACT, "--out", str(out)])
    assert_one_line_error(result, "No space left on device")
    assert not list(disk.glob(".*.creating")) and not (disk / "digits.zarr.lock").exists()
    if out.exists():
        assert not read_meta(out)[1].complete
        assert not list(out.rglob("*.partial"))
    subprocess.run(["mount", "-o", "remount,size=4m", str(disk)], check=True)
    again = runner.invoke(app, [*EXTRACT, "--out", str(out)])
    assert again.exit_code == 0, again.output
    reference = tmp_path / "ref.zarr"
    run_extract(ExtractSpec(dataset="digits", model="pixels", out=str(reference), chunk_rows=128, batch_size=50,
                            workers=0, device="cpu"))
    files = {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    assert files == {p.relative_to(reference).as_posix(): p.read_bytes() for p in sorted(reference.rglob("*"))
                     if p.is_file()}


@pytest.mark.usefixtures("one_torch_thread")
def test_a_read_only_target(tmp_path, mounts):
    disk = mounts("ro", "ro,size=1m")
    result = runner.invoke(app, [*EXTRACT, "--out", str(disk / "digits.zarr")])
    assert_one_line_error(result, f"cannot create the lock file {disk / 'digits.zarr.lock'}: Read-only file system",
                          "choose a writable location")
    assert list(disk.iterdir()) == []


def test_a_format_1_store_missing_a_chunk_says_why_it_may_not_be_damage(tmp_path):
    """Format 1's writer left out chunks of zeros (zarr's default then): such a store was called "damaged" with no
    word of why a valid old store lacks a file. It is still refused (a deleted chunk looks the same), saying so."""
    from helpers import build_store

    path = build_store(tmp_path / "old.zarr")
    (path / "test" / "labels" / "c" / "0").unlink()
    result = CliRunner().invoke(app, ["learn", "--features", str(path), "--out", str(tmp_path / "r")])
    assert result.exit_code == 1
    line = " ".join(result.output.split())
    assert "test/labels has 1 of 1 chunk files missing" in line and "a store of format 1 leaves out chunks" in line, line


def test_an_incomplete_store_of_an_older_format_is_not_advised_to_resume(tmp_path):
    """`learn` and `info` said "re-run the same extract to resume" for an interrupted store of an older format, which
    `extract` then refuses to resume (it asks for --overwrite): the advice went round in a loop."""
    from helpers import build_store

    path = build_store(tmp_path / "old.zarr", complete=False)  # format 1
    runner = CliRunner()
    for args in (["learn", "--features", str(path), "--out", str(tmp_path / "r")], ["info", str(path)]):
        text = " ".join(runner.invoke(app, args).output.split())
        assert "store format 1, which this foal-pipe does not resume" in text and "--overwrite" in text, text
        assert "to resume it" not in text and "to resume)" not in text, text
