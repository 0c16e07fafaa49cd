"""Store integrity: a missing or damaged chunk is refused by every reader and named by split and rows; resume
re-extracts holes below its progress; version-1 stores still read; `info` and `info --verify` report damage.

Before format version 2, a deleted chunk read as rows of zeros (learn exited 0 with other metrics), `info`
said "complete", a resume did not notice a hole, and a truncated chunk was a Zstd traceback.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr
from helpers import digits_pixels_spec, interrupt_after
from typer.testing import CliRunner

import foal_pipe.store as st
from foal_pipe.cli import app
from foal_pipe.errors import FoalPipeError
from foal_pipe.extract import run_extract
from foal_pipe.protocol.commands import run_learn
from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig
from foal_pipe.store import compute_generation, open_store, read_meta, verify_store
from foal_pipe.store.chunks import missing_chunks

pytestmark = pytest.mark.usefixtures("one_torch_thread")
runner = CliRunner()
CHUNK = 128  # digits: train 1,442 rows = 12 chunks (the last of 34 rows), test 355 rows = 3 chunks


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ref") / "digits.zarr"
    run_extract(digits_pixels_spec(out))
    return out


@pytest.fixture
def store(tmp_path, reference) -> Path:
    copy = tmp_path / "digits.zarr"
    shutil.copytree(reference, copy)
    return copy


def _chunk(store: Path, split: str, i: int) -> Path:
    return store / split / "features" / "c" / str(i) / "0"


def _files(store: Path) -> dict[str, bytes]:
    return {p.relative_to(store).as_posix(): p.read_bytes() for p in sorted(store.rglob("*")) if p.is_file()}


def assert_one_line_error(result, *fragments: str) -> None:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    text = " ".join(result.output.split())
    assert "Error: " in text
    for fragment in fragments:
        assert fragment in text, text


def _learn(features: Path, out: Path):
    return runner.invoke(app, ["learn", "--features", str(features), "--out", str(out), "--tasks", "5",
                               "--projection-dim", "64"])


def test_every_array_has_a_crc32c_checksum_and_every_chunk_a_file(reference):
    group = zarr.open_group(str(reference), mode="r")
    for name in ("train/features", "train/labels", "train/index", "test/features", "test/labels", "test/index"):
        codecs = json.loads((reference / name / "zarr.json").read_text())["codecs"]
        assert [c["name"] for c in codecs] == ["bytes", "zstd", "crc32c"], name
        assert missing_chunks(reference, group[name]) == (0, [])
    assert len(list((reference / "train" / "features" / "c").iterdir())) == 12


@pytest.mark.parametrize("split,i,rows", [("train", 3, "rows 384-511"), ("test", 2, "rows 256-354")])
def test_a_deleted_chunk_is_refused_not_read_as_zeros(store, tmp_path, split, i, rows):
    _chunk(store, split, i).unlink()
    with pytest.raises(FoalPipeError, match=rf"{split}/features has 1 of 1?\d chunk files missing \(first at {rows}\)"):
        open_store(store)
    with pytest.raises(FoalPipeError, match="chunk files missing"):
        run_learn(store, tmp_path / "run", StreamConfig(tasks=5), ModelConfig(projection_dim=64), EvaluationConfig(),
              ExecutionConfig())
    assert not (tmp_path / "run").exists()
    assert_one_line_error(_learn(store, tmp_path / "cli-run"), f"{split}/features", rows, "re-extract it")
    shown = runner.invoke(app, ["info", str(store)])
    assert_one_line_error(shown, f"{split}/features {rows}: missing")
    assert "damaged" in shown.output


def test_a_chunk_deleted_while_a_learner_reads_is_an_error(store, tmp_path):
    opened = open_store(store)
    _chunk(store, "train", 5).unlink()
    with pytest.raises(FoalPipeError, match=r"train/features chunk at rows 640-767 is missing"):
        list(opened.train.iter_chunks())
    with pytest.raises(FoalPipeError, match=r"train/features chunk at rows 640-767 is missing"):
        opened.train.take(np.array([3, 700, 1]))


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_damaged_chunk_is_named_not_a_decompression_traceback(store, tmp_path, damage):
    path = _chunk(store, "train", 2)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if damage == "truncate" else data[:40] + bytes([data[40] ^ 1]) + data[41:])
    opened = open_store(store)  # the listing is fine: the damage shows when the chunk is read
    with pytest.raises(FoalPipeError, match=r"train/features chunk at rows 256-383 is damaged \(checksum mismatch\)"):
        list(opened.train.iter_chunks())
    with pytest.raises(FoalPipeError, match=r"rows 256-383 is damaged \(checksum mismatch\)"):
        opened.train.take(np.array([1000, 300]))
    assert_one_line_error(_learn(store, tmp_path / "run"), "train/features chunk at rows 256-383 is damaged")
    assert not (tmp_path / "run").exists()
    rls = runner.invoke(app, ["learn", "--features", str(store), "--out", str(tmp_path / "rls"), "--tasks", "5",
                              "--projection-dim", "64", "--engine", "rls"])
    assert_one_line_error(rls, "rows 256-383 is damaged (checksum mismatch)")


def test_a_damaged_labels_chunk_is_named(store):
    path = store / "test" / "labels" / "c" / "0"
    path.write_bytes(path.read_bytes()[:-3] + b"xyz")
    with pytest.raises(FoalPipeError, match=r"test/labels chunk at rows 0-354 is damaged \(checksum mismatch\)"):
        open_store(store)
    (store / "train" / "index" / "c" / "0").unlink()
    with pytest.raises(FoalPipeError, match="train/index has 1 of 1 chunk files missing"):
        open_store(store)


def test_info_verify_reports_every_problem_by_split_and_rows(store):
    clean = runner.invoke(app, ["info", str(store), "--verify"])
    assert clean.exit_code == 0, clean.output
    assert "20 chunks read, all intact" in clean.output  # 12 + 3 feature chunks, 1 label + 1 index chunk per
    # split, 1 split-manifest chunk
    assert "crc32c checksum on every chunk" in clean.output
    _chunk(store, "train", 0).unlink()
    _chunk(store, "train", 1).unlink()
    bad = _chunk(store, "test", 1)
    bad.write_bytes(bad.read_bytes()[:100])
    result = runner.invoke(app, ["info", str(store), "--verify"])
    assert_one_line_error(result, "train/features rows 0-255: missing",
                          "test/features rows 128-255: damaged (checksum mismatch)")
    as_json = runner.invoke(app, ["info", str(store), "--verify", "--json"])
    assert as_json.exit_code == 1
    summary = json.loads(as_json.stdout)
    assert summary["problems"] == ["test/features rows 128-255: damaged (checksum mismatch)",
                                   "train/features rows 0-255: missing"]
    assert summary["chunks_read"] == 20 - 3


def test_verify_finds_a_chunk_copied_over_another(store):
    """A chunk replaced by another valid chunk passes its checksum; its record (format 4) catches it."""
    group = zarr.open_group(str(store), mode="r")
    assert compute_generation(store, group) == read_meta(store)[1].generation
    shutil.copyfile(_chunk(store, "train", 1), _chunk(store, "train", 2))
    result = verify_store(store)
    assert [str(p) for p in result.problems] == [
        "train/features rows 256-383: damaged (it holds the chunk of rows 128-255, moved or copied here)"]


def test_verify_recomputes_an_older_stores_generation(store):
    """A format-3 store has no chunk records: the generation id, recomputed from every chunk, catches the copy."""
    group = zarr.open_group(str(store), mode="r+")
    attrs = {k: v for k, v in dict(group.attrs).items() if k not in ("generation", "manifest")} | {"format_version": 3}
    for name in ("train/features", "train/labels", "train/index", "test/features", "test/labels", "test/index"):
        group[name].update_attributes({"chunk_files": None})
    del group["manifest"]  # format 5's: a format-3 store has none
    group.attrs.put(attrs)
    group.attrs.put(attrs | {"generation": compute_generation(store)})
    assert verify_store(store).problems == []
    shutil.copyfile(_chunk(store, "train", 1), _chunk(store, "train", 2))
    assert [str(p) for p in verify_store(store).problems] == [
        "(whole store): its files changed after it was completed (generation id mismatch)"]


def test_resume_re_extracts_a_hole_below_progress(tmp_path, monkeypatch, reference):
    spec = digits_pixels_spec(tmp_path / "digits.zarr")
    real = interrupt_after(monkeypatch, 6)
    with pytest.raises(KeyboardInterrupt):
        run_extract(spec)
    monkeypatch.setattr(st.FeatureWriter, "write", real)
    assert read_meta(spec.out_path)[1].extra["progress"] == {"train": 768, "test": 0}
    _chunk(spec.out_path, "train", 2).unlink()
    report = run_extract(spec)
    assert report.status == "resumed" and report.holes == {"train": 256} and report.resumed_from["train"] == 256
    assert _files(spec.out_path) == _files(reference)


def test_extract_repairs_a_complete_store_with_a_missing_chunk(store, reference):
    _chunk(store, "test", 1).unlink()
    result = runner.invoke(app, ["extract", "--dataset", "digits", "--model", "pixels", "--out", str(store),
                                 "--chunk-rows", str(CHUNK), "--batch-size", "50", "--workers", "0"])
    assert result.exit_code == 0, result.output
    assert "were missing or damaged below the recorded progress" in result.output and "test from row 128" in result.output
    assert _files(store) == _files(reference)


def test_resume_refuses_a_store_whose_labels_lost_a_chunk(tmp_path, monkeypatch):
    spec = digits_pixels_spec(tmp_path / "digits.zarr")
    real = interrupt_after(monkeypatch, 2)
    with pytest.raises(KeyboardInterrupt):
        run_extract(spec)
    monkeypatch.setattr(st.FeatureWriter, "write", real)
    (spec.out_path / "train" / "labels" / "c" / "0").unlink()
    with pytest.raises(FoalPipeError, match=r"is damaged \(train/labels rows 0-1,441: missing\); pass overwrite=True"):
        run_extract(spec)
    assert run_extract(spec, overwrite=True).status == "created"
    assert verify_store(spec.out_path).problems == []


def _version_1_store(path: Path, x: np.ndarray, y: np.ndarray) -> Path:
    """A store as foal-pipe 0.1 wrote it: Zarr's default codecs (no checksum), timestamps in the attributes."""
    group = zarr.open_group(str(path), mode="w")
    for split, rows in (("train", slice(0, 80)), ("test", slice(80, 100))):
        feats = group.create_array(f"{split}/features", shape=x[rows].shape, chunks=(16, x.shape[1]), dtype="float32")
        feats[:] = x[rows]
        labels = group.create_array(f"{split}/labels", shape=y[rows].shape, chunks=(100,), dtype="int64")
        labels[:] = y[rows]
    group.attrs.update({"format": "foal-pipe/features", "format_version": 1, "classes": ["a", "b", "c", "d"],
                        "dataset": "old", "encoder": {"name": "synthetic",
                                                      "fusion": "none", "image_size": 0, "normalize": False},
                        "created": "2026-11-01T00:00:00+00:00",
                        "complete": True})
    return path


def test_version_1_stores_still_read(tmp_path):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(100, 6)).astype(np.float32), np.tile(np.arange(4), 25)
    old = _version_1_store(tmp_path / "old.zarr", x, y)
    opened = open_store(old)
    assert opened.meta.format_version == 1 and opened.meta.generation is None
    np.testing.assert_array_equal(np.concatenate([b for _, b in opened.train.iter_chunks()]), x[:80])
    opened.check_unchanged()
    shown = runner.invoke(app, ["info", str(old), "--verify"])
    assert shown.exit_code == 0, shown.output
    assert "no chunk checksums" in shown.output and "all decoded" in shown.output
    chunk = old / "train" / "features" / "c" / "1" / "0"
    chunk.write_bytes(chunk.read_bytes()[:20])
    with pytest.raises(FoalPipeError, match=r"train/features chunk at rows 16-31 is damaged \(\w+"):
        list(open_store(old).train.iter_chunks())
    chunk.unlink()
    with pytest.raises(FoalPipeError, match="train/features has 1 of 5 chunk files missing"):
        open_store(old)
    refused = run_extract_over(old)
    assert "not one written by `foal-pipe extract`" in refused


def run_extract_over(path: Path) -> str:
    with pytest.raises(FoalPipeError) as info:
        run_extract(digits_pixels_spec(path))
    return str(info.value)


def test_extract_does_not_resume_an_older_format(store):
    group = zarr.open_group(str(store), mode="r+")
    group.attrs.put({**dict(group.attrs), "format_version": 1})
    with pytest.raises(FoalPipeError, match=r"written in store format 1, this foal-pipe writes format 5; pass overwrite=True"):
        run_extract(digits_pixels_spec(store))
    assert run_extract(digits_pixels_spec(store), overwrite=True).status == "created"
    assert read_meta(store)[1].format_version == 5


@pytest.mark.parametrize("sealed", [True, False], ids=["format 5", "no generation id"])
def test_verify_reads_the_split_arrays_even_when_the_split_is_unlisted(tmp_path, sealed):
    """Without ``train/zarr.json`` the group lists no train array, while the readers open ``train/features`` by path:
    ``info --verify`` read the test split only and said "all intact" for a store without a generation id (older
    formats), and zarr's multi-line warning came before every one-line error."""
    rng = np.random.default_rng(0)
    rows = (rng.normal(size=(40, 4)).astype(np.float32), np.arange(40) % 2)
    path = st.write_store(tmp_path / "s.zarr", rows, rows, ["a", "b"], chunk_rows=16)
    if not sealed:  # as a store of format 1 records it: no generation to catch the change
        group = zarr.open_group(str(path), mode="r+")
        attrs = dict(group.attrs)
        attrs.pop("generation", None)
        group.attrs.clear()
        group.attrs.update(attrs)
    (path / "train" / "zarr.json").unlink()
    problems = [str(p) for p in verify_store(path).problems]
    assert any(p.startswith("train/features: not listed by the store's metadata") for p in problems), problems
    result = CliRunner().invoke(app, ["info", "--verify", str(path)])
    assert result.exit_code == 1 and "all intact" not in result.output, result.output
    assert "ZarrUserWarning" not in result.output and "warnings.warn" not in result.output, result.output
