"""``info`` / ``info --verify`` audit (s21): a store with several kinds of problems gets every one reported (a damaged
features chunk no longer hides a label the readers refuse, a label that differs from the split manifest, or a manifest
that is not readable), each once and a reader's refusal worded with flags; an incomplete store's ``progress`` that
``extract`` cannot resume from is a problem; a file a store's writer does not make is named; the size on disk counts
the store's own files."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest
import zarr
from helpers import digits_pixels_spec, fault_store, int32_store, invoke

import foal_pipe.store as st
from foal_pipe.errors import FoalPipeError
from foal_pipe.extract import run_extract
from foal_pipe.store import complete_store, verify_store
from foal_pipe.store.chunks import REEXTRACT
from foal_pipe.store.manifest import stored_manifest
from foal_pipe.store.verify import REFUSED, WHOLE_STORE
from foal_pipe.store.write import check_replaceable, replace_manifest

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def digits_store(tmp_path_factory) -> Path:
    """digits through `extract --model pixels`: a split manifest, train 1,442 rows and test 355 in chunks of 128."""
    out = tmp_path_factory.mktemp("ref") / "digits.zarr"
    run_extract(digits_pixels_spec(out))
    return out


def _copy(source: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(source, tmp_path / source.name))


def _flip(file: Path, at: int = 10) -> None:
    raw = bytearray(file.read_bytes())
    raw[at] ^= 1
    file.write_bytes(bytes(raw))


def _reseal(path: Path) -> None:
    """Seal the store again as it is now (chunk records, generation id), as another program completing it would."""
    group = zarr.open_group(str(path), mode="r+")
    rows = {split: int(group[f"{split}/features"].shape[0]) for split in ("train", "test")}
    group.attrs.update({"complete": False, "progress": rows})
    complete_store(path)


def _set_label(path: Path, split: str, row: int, value: int) -> None:
    labels = zarr.open_array(str(path / split / "labels"), mode="r+")
    y = labels[:]
    y[row] = value
    labels[:] = y


def _error(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


# -- 1: several kinds of problems, all reported ------------------------------------------------------------------
def test_a_damaged_chunk_does_not_hide_a_label_every_reader_refuses(tmp_path):
    path = fault_store(tmp_path / "s.zarr")
    _set_label(path, "train", 7, 99)  # 4 classes
    _reseal(path)
    with pytest.raises(FoalPipeError) as refused:
        st.open_store(path)
    _flip(path / "test/features/c/0/0")
    assert [str(p) for p in verify_store(path).problems] == [
        "test/features rows 0-31: damaged (checksum mismatch)", f"{WHOLE_STORE}: {REFUSED}{refused.value}"]
    error = _error(invoke("info", path, "--verify"))
    assert error == (f"Error: {path} is damaged: test/features rows 0-31: damaged (checksum mismatch); {WHOLE_STORE}: "
                     f"{REFUSED}{refused.value}; {REEXTRACT}")


def test_a_damaged_chunk_does_not_hide_a_label_that_differs_from_the_manifest(tmp_path, digits_store):
    path = _copy(digits_store, tmp_path)
    y7 = int(zarr.open_array(str(path / "train/labels"), mode="r")[7])
    _set_label(path, "train", 7, (y7 + 1) % 10)
    _reseal(path)
    _flip(path / "train/features/c/3/0")
    differs = f"train/labels: row 7 differs from the split manifest's label for that row (manifest {y7}, labels {(y7 + 1) % 10})"
    assert [str(p) for p in verify_store(path).problems] == ["train/features rows 384-511: damaged (checksum mismatch)",
                                                            differs]
    error = _error(invoke("info", path, "--verify"))
    assert error == f"Error: {path} is damaged: train/features rows 384-511: damaged (checksum mismatch); {differs}; {REEXTRACT}"
    assert error.count(REEXTRACT) == 1  # the fix once, not after each problem too


def test_damaged_labels_and_features_do_not_hide_an_unreadable_manifest(tmp_path, digits_store):
    path = _copy(digits_store, tmp_path)
    doc = json.loads(stored_manifest(path))
    doc["train"][3][1] = "zz"  # not a SHA-256
    replace_manifest(path, (json.dumps(doc, separators=(",", ":")) + "\n").encode())
    _reseal(path)
    _flip(path / "test/labels/c/0")
    _flip(path / "train/features/c/2/0")
    problems = [str(p) for p in verify_store(path).problems]
    assert problems[:2] == ["test/labels rows 0-354: damaged (checksum mismatch)",
                            "train/features rows 256-383: damaged (checksum mismatch)"]
    assert len(problems) == 3 and problems[2].startswith(f"manifest: {path}: its split manifest is not readable (train "
                                                         "row 3 is not [name, sha256"), problems
    assert _error(invoke("info", path, "--verify")).count(REEXTRACT) == 1


def test_missing_damaged_and_edited_all_reported_with_the_chunks_read(tmp_path):
    path = fault_store(tmp_path / "s.zarr")
    (path / "train/features/c/1/0").unlink()
    _flip(path / "test/features/c/1/0")
    meta = json.loads((path / "zarr.json").read_text())
    meta["attributes"]["dataset"] = "other"
    (path / "zarr.json").write_text(json.dumps(meta))
    result = invoke("info", path, "--verify", "--json")
    summary = json.loads(result.stdout)
    assert result.exit_code == 1
    assert summary["problems"][0].startswith(f"{WHOLE_STORE}: its attributes or array metadata differ from those it "
                                             "was completed with")
    assert summary["problems"][1:] == ["test/features rows 32-63: damaged (checksum mismatch)",
                                       "train/features rows 32-63: missing"]
    chunk_files = [p for p in path.rglob("c/*") if p.is_file()] + [p for p in path.rglob("c/*/*") if p.is_file()]
    assert summary["chunks_read"] == len(chunk_files) - 1  # every file there but the damaged one


def test_a_readers_refusal_among_other_problems_names_its_flag(tmp_path):
    int32_store(tmp_path / "d.zarr")
    _flip(tmp_path / "d.zarr/train/features/c/1/0")
    result = invoke("info", tmp_path / "d.zarr", "--verify", "--json")
    problems = json.loads(result.stdout)["problems"]
    assert problems[0] == "train/features rows 16-31: damaged (checksum mismatch)"
    assert len(problems) == 2 and problems[1].endswith("re-extract it with --dtype float32"), problems
    assert _error(result).endswith(f"outside the spec (float16, float32, float64); re-extract it with --dtype float32; "
                                   f"{REEXTRACT}")


# -- 2: an incomplete store's progress that extract cannot resume from --------------------------------------------
@pytest.mark.parametrize(("progress", "problem"), [
    ({"train": 50, "test": 64}, 'train/features: attribute \'progress\' records 50 rows written, expected a multiple of '
                                '32 from 0 to 128 (extract refuses to resume it)'),
    ({"train": 64, "test": -5}, "test/features: attribute 'progress' records -5 rows written, expected a multiple of "
                                "32 from 0 to 64 (extract refuses to resume it)"),
    ({"train": 1000, "test": "x"}, None),
    ([1, 2], f"{WHOLE_STORE}: its attribute 'progress' is [1, 2], expected the rows written of each split (extract "
             "refuses to resume it)"),
])
def test_progress_that_extract_cannot_resume_from_is_a_problem(tmp_path, progress, problem):
    path = fault_store(tmp_path / "s.zarr")
    group = zarr.open_group(str(path), mode="r+")
    attrs = {k: v for k, v in dict(group.attrs).items() if k != "generation"}
    group.attrs.put(attrs | {"complete": False, "progress": progress})
    found = [str(p) for p in verify_store(path, read=False).problems]
    if problem is None:
        assert [p.split(":")[0] for p in found] == ["train/features", "test/features"], found
    else:
        assert found == [problem]
    assert invoke("info", path).exit_code == 1


def test_progress_at_a_chunk_boundary_is_resumable_and_no_problem(tmp_path):
    path = fault_store(tmp_path / "s.zarr")
    group = zarr.open_group(str(path), mode="r+")
    attrs = {k: v for k, v in dict(group.attrs).items() if k != "generation"}
    group.attrs.put(attrs | {"complete": False, "progress": {"train": 64, "test": 64}})
    assert verify_store(path).problems == []
    assert invoke("info", path, "--verify").exit_code == 0


# -- 3: a file a store's writer does not make; the size on disk -------------------------------------------------
def test_a_foreign_file_is_named_as_the_overwrite_fix_refuses_it(tmp_path):
    path = fault_store(tmp_path / "s.zarr")
    (path / "train/features/c/notes.txt").write_text("mine")
    with pytest.raises(FoalPipeError, match="notes.txt"):
        check_replaceable(path)  # what `extract --overwrite` runs before replacing the store
    result = invoke("info", path, "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["foreign_file"] == "train/features/c/notes.txt"
    table = invoke("info", path)
    assert table.exit_code == 0 and "'train/features/c/notes.txt'" in " ".join(table.output.split())
    assert json.loads(invoke("info", fault_store(tmp_path / "clean.zarr"), "--json").stdout)["foreign_file"] is None


def test_the_printed_numbers_are_the_stores_own(tmp_path):
    path = fault_store(tmp_path / "s.zarr")
    (tmp_path / "big").write_bytes(b"\0" * 1_000_000)
    os.symlink(tmp_path / "big", path / "link")  # outside the store: not its size
    own = 0
    for root, _, files in os.walk(path):
        for name in files:
            info = os.lstat(os.path.join(root, name))
            own += info.st_size if stat.S_ISREG(info.st_mode) else 0
    summary = json.loads(invoke("info", path, "--json").stdout)
    assert summary["bytes_on_disk"] == own
    attrs = json.loads((path / "zarr.json").read_text())["attributes"]
    assert summary["classes"] == attrs["classes"] == ["a", "b", "c", "d"]
    for split, rows in (("train", 128), ("test", 64)):
        array = json.loads((path / split / "features" / "zarr.json").read_text())
        assert array["shape"] == [rows, 6]
        assert summary["splits"][split] == {"rows": rows, "dim": 6, "dtype": array["data_type"],
                                            "chunk_rows": array["chunk_grid"]["configuration"]["chunk_shape"][0]}
