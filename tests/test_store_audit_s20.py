"""Store and extract audit (s20): ``info --verify`` keeps a reader's refusal so the CLI names its flag; the NaN/inf
refusal names the store and suggests a wider dtype only for float16; a re-run of ``extract`` over a complete store
repairs a chunk file that is not the one it was completed with instead of calling it complete."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_identical_stores, digits_pixels_spec, int32_store, invoke, write_nonfinite_store

from foal_pipe.cli.flags import cli_form
from foal_pipe.errors import FoalPipeError
from foal_pipe.extract import run_extract
from foal_pipe.store import open_store, verify_store
from foal_pipe.store.verify import REFUSED, WHOLE_STORE, changed_chunks

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# -- 1: the verify path keeps the refusal, whose parameters the CLI names as flags ------------------------------------
def test_verify_keeps_a_readers_refusal_for_the_cli_to_name_its_flag(tmp_path):
    int32_store(tmp_path / "d.zarr")
    [problem] = verify_store(tmp_path / "d.zarr").problems
    reason = (f"train/features in {tmp_path / 'd.zarr'} has dtype int32, outside the spec (float16, float32, float64); "
              "re-extract it with ")
    assert str(problem) == f"{WHOLE_STORE}: {REFUSED}{reason}dtype='float32'"  # Python's words, as before
    assert problem.refusal is not None and problem.refusal.render(cli_form) == f"{reason}--dtype float32"


# -- 2: NaN/inf in a store names it, and float16 alone gets the wider-dtype hint -------------------------------------
def _nan_store(path: Path, dtype: str = "float32", blocks_dtype: str | None = None) -> Path:
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(600, 4)), np.arange(600) % 3
    blocks = None
    if blocks_dtype is None:
        x[400, 3] = np.nan
    else:
        b = np.ones((600, 2, 4), blocks_dtype)
        b[400, 1, 2] = np.inf
        blocks = (b, b[:100])
    return write_nonfinite_store(path, (x, y), (x[:100], y[:100]), list("abc"), chunk_rows=64, dtype=dtype,
                                 blocks=blocks)


@pytest.mark.parametrize(("dtype", "hint"), [("float32", ""), ("float64", ""),
                                             ("float16", " (try dtype='float32' instead of float16)")])
def test_nan_features_name_the_store_and_a_wider_dtype_only_for_float16(tmp_path, dtype, hint):
    path = _nan_store(tmp_path / "nan.zarr", dtype)
    with pytest.raises(FoalPipeError) as refused:
        list(open_store(path).train.iter_chunks())
    assert str(refused.value) == (f"{path}: train/features has NaN or inf values (first bad row: 400); "
                                  f"re-extract the store{hint}")
    with pytest.raises(FoalPipeError) as taken:
        open_store(path).train.take(np.array([3, 400]))
    assert str(taken.value) == str(refused.value)


@pytest.mark.parametrize(("dtype", "hint"), [("float32", ""),
                                             ("float16", " (try blocks_dtype='float32' instead of float16)")])
def test_nan_blocks_name_the_store_and_a_wider_blocks_dtype_only_for_float16(tmp_path, dtype, hint):
    path = _nan_store(tmp_path / "nan.zarr", blocks_dtype=dtype)
    with pytest.raises(FoalPipeError) as refused:
        open_store(path).train.read_blocks(384, 448)
    assert str(refused.value) == (f"{path}: train/blocks has NaN or inf values (first bad row: 400); "
                                  f"re-extract the store{hint}")


def test_learn_on_a_float32_store_with_nan_names_it_without_the_float16_hint(tmp_path):
    path = _nan_store(tmp_path / "nan_train.zarr")
    result = invoke("learn", "--features", path, "--out", tmp_path / "run", "--tasks", 3, "--projection-dim", 8,
                    "--gamma", 1, "--backend", "numpy")
    assert result.exit_code == 1 and "Traceback" not in result.output
    text = " ".join(result.output.split())
    assert text.endswith(f"Error: {path}: train/features has NaN or inf values (first bad row: 400); re-extract the store")
    assert not (tmp_path / "run").exists()


# -- 3: extract over a complete store with a changed chunk file repairs it ------------------------------------------
@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ref") / "digits.zarr"
    run_extract(digits_pixels_spec(out))
    return out


def _flip_mid_chunk(file: Path) -> None:
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    file.write_bytes(bytes(data))


def _as_of_old(file: Path, edit) -> None:
    """Edit ``file`` and give it back a time long before the store was completed."""
    edit(file)
    os.utime(file, ns=(10**18, 10**18))


@pytest.mark.parametrize(("damage", "rows"), [
    (_flip_mid_chunk, "rows 512-639: damaged (checksum mismatch)"),  # modified since: decoded
    (lambda f: _as_of_old(f, lambda g: g.write_bytes(g.read_bytes()[:-3])), None),  # size differs
    (lambda f: _as_of_old(f, lambda g: g.write_bytes(g.read_bytes()[:-1] + bytes([g.read_bytes()[-1] ^ 1]))), None),
])
def test_extract_repairs_a_chunk_file_changed_since_completion(tmp_path, reference, damage, rows):
    path = tmp_path / "digits.zarr"
    shutil.copytree(reference, path)
    damage(path / "train" / "features" / "c" / "4" / "0")
    [problem] = changed_chunks(path)
    assert (problem.array, problem.lo, problem.hi) == ("train/features", 512, 640)
    assert rows is None or str(problem) == f"train/features {rows}"
    report = run_extract(digits_pixels_spec(path))
    assert report.status == "resumed" and report.holes == {"train": 512} and report.resumed_from == {"train": 512,
                                                                                                     "test": 355}
    assert_identical_stores(reference, path)
    assert changed_chunks(path) == [] and verify_store(path).problems == []


def test_extract_cli_no_longer_calls_a_damaged_store_complete(tmp_path, reference):
    path = tmp_path / "digits.zarr"
    shutil.copytree(reference, path)
    _flip_mid_chunk(path / "test" / "features" / "c" / "1" / "0")
    result = invoke("extract", "--dataset", "digits", "--model", "pixels", "--out", path, "--chunk-rows", 128,
                    "--batch-size", 50, "--workers", 0, "--device", "cpu")
    assert result.exit_code == 0, result.output
    assert "already complete" not in result.output and "test from row 128" in result.output
    assert_identical_stores(reference, path)


def test_a_changed_labels_chunk_is_refused_naming_overwrite(tmp_path, reference):
    path = tmp_path / "digits.zarr"
    shutil.copytree(reference, path)
    _as_of_old(path / "train" / "labels" / "c" / "0", lambda f: f.write_bytes(f.read_bytes()[:-2]))
    with pytest.raises(FoalPipeError, match=r"is damaged \(train/labels rows 0-1,441: damaged \(.* recorded\)\); "
                                            r"pass overwrite=True to extract it again"):
        run_extract(digits_pixels_spec(path))
