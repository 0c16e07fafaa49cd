"""Datasets and extract, third audit: one strict reader of a store's split manifest, CORe50 with object folders
missing, class and file names of an NFD copy, a manifest class without rows, and the staging folder a killed
``extract --overwrite`` leaves."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_one_line_error, make_image_tree, runner, store_files

from foal_pipe.cli import app
from foal_pipe.datasets import open_dataset
from foal_pipe.errors import FoalPipeError
from foal_pipe.extract import ExtractSpec, run_extract
from foal_pipe.extract.manifest import read_manifest
from foal_pipe.store import open_store, read_meta, verify_store, writer_lock
from foal_pipe.store.manifest import data_identities
from foal_pipe.store.meta import StoreMeta
from foal_pipe.store.verify import ChunkProblem
from foal_pipe.store.write import FeatureWriter, complete_store, create_skeleton, mark_progress

PIXELS = ["--model", "pixels", "--image-size", "8", "--workers", "0"]
SHA = "ab" * 32


def _extract(*args: str | Path):
    return runner.invoke(app, ["extract", *PIXELS, *map(str, args)])


# --- 1. one strict reader of a store's split manifest --------------------------------------------------------------

def _manifest_doc(**changes) -> dict:
    doc = {"format": "foal-pipe/split-manifest", "format_version": 1, "classes": ["ant", "bee"],
           "train": [["ant/1.png", SHA, 0], ["bee/1.png", SHA[::-1], 1]], "test": [["bee/2.png", SHA, 1]]}
    return {**doc, **changes}


def _store_with_manifest(path: Path, raw: bytes) -> Path:
    """A complete store of format 5 (train labels 0, 1; test 1) recording ``raw`` as its manifest, its SHA-256 right."""
    labels = {"train": np.array([0, 1]), "test": np.array([1])}
    meta = StoreMeta(("ant", "bee"), "imagefolder", {"name": "synthetic", "fusion": "none", "image_size": 0,
                                                     "normalize": False}, extra={"source": "/data"})
    create_skeleton(path, meta, 3, "float32", 4, labels, {s: np.arange(len(y)) for s, y in labels.items()}, None, raw)
    for split, y in labels.items():
        FeatureWriter(path, split).write(0, np.ones((len(y), 3), np.float32))
        mark_progress(path, split, len(y))
    complete_store(path)
    return path


@pytest.mark.parametrize("raw, why", [
    (json.dumps(_manifest_doc(train=[["ant/1.png", SHA, 0], ["bee/1.png", SHA, True]])).encode(),
     'train row 1 is not [name, sha256 (64 hex digits), label in 0..1 or -1]: ["bee/1.png", "' + SHA + '", true]'),
    (json.dumps({k: v for k, v in _manifest_doc().items() if k != "format"}).encode(),
     "no 'format': 'foal-pipe/split-manifest'"),
    (json.dumps(_manifest_doc(test=None)).encode(), "'test' is not a list of [name, sha256, label]"),
    (json.dumps(_manifest_doc(classes=["ant", 7])).encode(), "'classes' is not a non-empty list of class names"),
    (b'{"format": "foal-pipe/split-manifest", "train": [', "not JSON"),
])
def test_a_malformed_manifest_is_one_refusal_in_a_models_identity_and_in_verify(tmp_path, raw, why):
    store = _store_with_manifest(tmp_path / "s.zarr", raw)
    message = f"{store}: its split manifest is not readable ({why}); re-extract it"
    with pytest.raises(FoalPipeError) as refused:
        data_identities(open_store(store))
    assert str(refused.value).startswith(message)
    problems = verify_store(store).problems
    assert problems == [ChunkProblem("manifest", 0, 0, str(refused.value))]


def test_a_well_formed_manifest_names_the_train_images_and_verifies(tmp_path):
    store = _store_with_manifest(tmp_path / "s.zarr", json.dumps(_manifest_doc()).encode())
    assert verify_store(store).problems == []
    rows = [[SHA, "ant"], [SHA[::-1], "bee"]]
    images = "images:" + hashlib.sha256(json.dumps(["imagefolder", rows]).encode()).hexdigest()
    assert data_identities(open_store(store))[-1] == images


# --- 2. CORe50 with object folders missing --------------------------------------------------------------------------

def _core50(root: Path) -> Path:
    """Every session s1..s11 with every object o1..o50, one 4x4 PNG each."""
    from PIL import Image

    png = root.parent / "frame.png"
    root.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (4, 4), (9, 99, 199)).save(png)
    for s in range(1, 12):
        for o in range(1, 51):
            (root / f"s{s}" / f"o{o}").mkdir(parents=True)
            shutil.copyfile(png, root / f"s{s}" / f"o{o}" / f"C_{s:02d}_{o:02d}_000.png")
    return root


def test_core50_with_object_folders_missing_is_refused_naming_them(tmp_path):
    root = _core50(tmp_path / "data" / "core50_128x128")
    data = open_dataset("core50", tmp_path / "data")
    assert len(data.classes) == 50 and len(data.train) == 8 * 50 and len(data.test) == 3 * 50
    shutil.rmtree(root / "s3" / "o7")
    shutil.rmtree(root / "s5" / "o12")
    (root / "s9" / "o50" / "C_09_50_000.png").unlink()  # an empty object folder is as good as none
    with pytest.raises(FoalPipeError) as refused:
        open_dataset("core50", tmp_path / "data")
    assert str(refused.value) == (f"CORe50 at {root}: 3 of its 550 object folders (session/object) are missing or hold "
                                  "no images (s5/o12, s9/o50, s3/o7); unzip the whole core50_128x128.zip")
    out = tmp_path / "core50.zarr"
    assert_one_line_error(_extract("--dataset", "core50", "--data-dir", tmp_path / "data", "--out", out),
                          "3 of its 550 object folders", "(s5/o12, s9/o50, s3/o7)")
    assert not out.exists() and not list(tmp_path.glob(".core50.zarr*"))


# --- 3. NFD copies: NFC class and file names --------------------------------------------------------------------------

def _nfd_copy(source: Path, target: Path) -> Path:
    """``source`` copied with every name decomposed (NFD), as macOS unpacks it."""
    for path in sorted(source.rglob("*")):
        copy = target / unicodedata.normalize("NFD", path.relative_to(source).as_posix())
        if path.is_dir():
            copy.mkdir(parents=True)
        else:
            shutil.copyfile(path, copy)
    return target


def test_an_nfd_copy_gives_the_same_class_names_manifest_and_store_bytes(tmp_path):
    tree = make_image_tree(tmp_path / "nfc", {"café": 3, "naïve": 3, "zoo": 3})
    (tree / "train" / "zoo" / "img000.png").rename(tree / "train" / "zoo" / "élan.png")
    data = tmp_path / "data"
    shutil.copytree(tree, data)
    assert _extract("--dataset", "imagefolder", "--data-dir", data, "--out", tmp_path / "a.zarr").exit_code == 0
    shutil.rmtree(data)
    _nfd_copy(tree, data)
    assert (data / "train" / "cafe\u0301").is_dir() and not (data / "train" / "café").exists()
    result = _extract("--dataset", "imagefolder", "--data-dir", data, "--out", tmp_path / "b.zarr")
    assert result.exit_code == 0, result.output
    _, meta = read_meta(tmp_path / "b.zarr")
    assert list(meta.classes) == ["café", "naïve", "zoo"]
    assert all(unicodedata.is_normalized("NFC", name) for name in meta.classes)
    assert "zoo/élan.png" in [name for name, _, _ in read_manifest(tmp_path / "b.zarr").splits["train"]]
    assert store_files(tmp_path / "a.zarr") == store_files(tmp_path / "b.zarr")


def test_two_names_equal_in_nfc_form_are_refused(tmp_path):
    tree = make_image_tree(tmp_path / "data", {"café": 2, "bee": 2})
    shutil.copytree(tree / "train" / "café", tree / "train" / "cafe\u0301")
    assert_one_line_error(_extract("--dataset", "imagefolder", "--data-dir", tree, "--out", tmp_path / "a.zarr"),
                          "are one class name", "in two Unicode normalisations")
    shutil.rmtree(tree / "train" / "cafe\u0301")
    composed, decomposed = tree / "train" / "bee" / "é.png", tree / "train" / "bee" / "e\u0301.png"
    shutil.copyfile(composed.parent / "img000.png", composed)
    shutil.copyfile(composed.parent / "img001.png", decomposed)
    assert_one_line_error(_extract("--dataset", "imagefolder", "--data-dir", tree, "--out", tmp_path / "a.zarr"),
                          f"the image files {ascii(str(decomposed))} and {ascii(str(composed))}",
                          "in two Unicode normalisations", "rename one of them")
    assert not (tmp_path / "a.zarr").exists()


# --- 4. a split manifest's class without rows -----------------------------------------------------------------------

def test_a_manifest_class_without_images_is_refused_at_extract(tmp_path):
    photos = make_image_tree(tmp_path / "photos", {"ant": 4, "bee": 5, "cow": 3}, split=False)
    a = tmp_path / "a.zarr"
    assert _extract("--dataset", "imagefolder", "--data-dir", photos, "--test-split", "0.4", "--out", a).exit_code == 0
    assert runner.invoke(app, ["info", str(a), "--export-manifest", str(tmp_path / "m.json")]).exit_code == 0
    doc = json.loads((tmp_path / "m.json").read_text())
    doc["classes"] += ["dog", "emu"]  # listed, but no image of either
    (tmp_path / "m2.json").write_text(json.dumps(doc))
    out = tmp_path / "b.zarr"
    assert_one_line_error(_extract("--dataset", "imagefolder", "--data-dir", photos, "--split-manifest",
                                   tmp_path / "m2.json", "--out", out),
                          f"the split manifest {tmp_path / 'm2.json'} lists class 'dog' without any image in either "
                          "split (2 such classes), which would be a class with no rows; list its images, or remove it "
                          "from 'classes' and renumber the labels after it")
    assert not out.exists()


# --- 5. the staging folder of a killed --overwrite ------------------------------------------------------------------

def _spec(tree: Path, out: Path, size: int) -> ExtractSpec:
    return ExtractSpec(dataset="imagefolder", data_dir=str(tree), model="pixels", image_size=size, workers=0,
                       device="cpu", chunk_rows=4, out=str(out))


def _killed_overwrite(monkeypatch, tree: Path, out: Path, size: int, where: str) -> Path:
    """Run ``extract --overwrite`` of ``out`` at image size ``size`` and kill it (KeyboardInterrupt) at ``where``:
    ``progress`` (after the first chunk) or ``swap`` (complete, before it is swapped in)."""
    from foal_pipe.extract import run, state

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(run, "mark_progress", killed) if where == "progress" else patch.setattr(state, "replace_store", killed)
        with pytest.raises(KeyboardInterrupt):
            run_extract(_spec(tree, out, size), overwrite=True)
    staged = out.parent / f".{out.name}.replacing"
    assert staged.is_dir()
    return staged


def test_a_stale_staging_folder_is_removed_by_the_next_extract(tmp_path, image_tree, monkeypatch, capsys):
    out = tmp_path / "a.zarr"
    run_extract(_spec(image_tree, out, 8))
    before = store_files(out)
    staged = _killed_overwrite(monkeypatch, image_tree, out, 4, "progress")
    assert (tmp_path / ".a.zarr.replacing.log.json").is_file()
    report = run_extract(_spec(image_tree, out, 8))  # without --overwrite: the old store is kept, the staging settled
    assert report.status == "complete" and store_files(out) == before
    assert not staged.exists() and not (tmp_path / ".a.zarr.replacing.log.json").exists()
    assert f"note: removed {staged}, left by an interrupted overwrite of {out}\n" == capsys.readouterr().err
    staged = _killed_overwrite(monkeypatch, image_tree, out, 4, "progress")
    shutil.rmtree(out)
    report = run_extract(_spec(image_tree, out, 4), overwrite=True)  # no store to replace: built in place
    assert report.status == "created" and not staged.exists()
    assert open_store(out).dim == 3 * 4 * 4


def test_a_staging_folder_being_written_is_left_alone(tmp_path, image_tree, monkeypatch):
    out = tmp_path / "a.zarr"
    run_extract(_spec(image_tree, out, 8))
    staged = _killed_overwrite(monkeypatch, image_tree, out, 4, "progress")
    files = store_files(staged)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom foal_pipe.store import writer_lock\n"
                               f"with writer_lock({str(out)!r}):\n    print('held', flush=True)\n    time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(FoalPipeError, match=f"is being written by process {holder.pid} "):
            run_extract(_spec(image_tree, out, 8))
        assert store_files(staged) == files
    finally:
        holder.kill()
        holder.wait()
    with writer_lock(out):  # the holder's lock was released with it
        pass


def test_a_replacement_killed_before_its_swap_is_swapped_in_by_the_next_overwrite(tmp_path, image_tree, monkeypatch):
    out = tmp_path / "a.zarr"
    run_extract(_spec(image_tree, out, 8))
    staged = _killed_overwrite(monkeypatch, image_tree, out, 4, "swap")
    assert read_meta(staged)[1].complete and open_store(out).dim == 3 * 8 * 8
    run_extract(_spec(image_tree, out, 4), overwrite=True)
    assert open_store(out).dim == 3 * 4 * 4 and not staged.exists()


# --- 6. what stands at the staging name; a complete replacement swapped in ---------------------------------------

@pytest.mark.parametrize("kind", ["symlink", "store-with-a-user-file"])
def test_a_staging_name_that_is_not_an_overwrites_own_is_refused_before_anything_changes(tmp_path, image_tree, kind):
    out, other = tmp_path / "a.zarr", tmp_path / "other.zarr"
    assert _extract("--dataset", "imagefolder", "--data-dir", image_tree, "--out", out).exit_code == 0
    shutil.copytree(out, other)
    staged = tmp_path / ".a.zarr.replacing"
    if kind == "symlink":
        staged.symlink_to(other)
        what = "a symlink"
    else:
        shutil.copytree(out, staged)
        (staged / "mine.txt").write_text("mine")
        what = "a feature store that also holds 'mine.txt', which a store does not write"
    before, before_other, log = store_files(out), store_files(other), (tmp_path / "a.zarr.log.json").read_bytes()
    for _ in range(2):
        assert_one_line_error(_extract("--dataset", "imagefolder", "--data-dir", image_tree, "--out", out, "--overwrite"),
                              f"{staged} is {what}, not a replacement of {out} that --overwrite builds under that name; "
                              "remove it (or move it away), then re-run")
        assert not out.is_symlink() and store_files(out) == before and store_files(other) == before_other
        assert (tmp_path / "a.zarr.log.json").read_bytes() == log
    assert staged.is_symlink() if kind == "symlink" else (staged / "mine.txt").read_text() == "mine"


@pytest.mark.parametrize("own_log", [True, False], ids=["its-log", "no-log"])
def test_a_complete_replacement_swapped_in_says_so_and_logs_it(tmp_path, image_tree, monkeypatch, own_log):
    out = tmp_path / "a.zarr"
    run_extract(_spec(image_tree, out, 8))
    staged = _killed_overwrite(monkeypatch, image_tree, out, 4, "swap")
    if not own_log:  # a replacement whose log is gone: the swap still leaves the store a log
        (tmp_path / ".a.zarr.replacing.log.json").unlink()
    result = _extract("--dataset", "imagefolder", "--data-dir", image_tree, "--image-size", "4", "--chunk-rows", "4",
                      "--out", out, "--overwrite")
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "nothing to do" not in text
    assert f"wrote {out} (resumed from train 15, test 6): train 15 x 48 float32, test 6 x 48 float32" in text
    assert (f"note: swapped in the complete replacement of {out} that an interrupted overwrite left in {staged}"
            in text)
    assert not staged.exists() and open_store(out).dim == 3 * 4 * 4
    runs = json.loads((tmp_path / "a.zarr.log.json").read_text())["runs"]
    assert [r["status"] for r in runs] == (["created", "swapped"] if own_log else ["swapped"])
    assert runs[-1]["generation"] == read_meta(out)[1].generation and runs[-1]["seconds"] == 0.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.zarr", "a.zarr.log.json", "images"]


# --- 7. a split manifest naming one image twice in one split, in NFC and NFD ---------------------------------------

def _manifest_of(tmp_path: Path, tree: Path) -> dict:
    a = tmp_path / "a.zarr"
    assert _extract("--dataset", "imagefolder", "--data-dir", tree, "--out", a).exit_code == 0
    assert runner.invoke(app, ["info", str(a), "--export-manifest", str(tmp_path / "m.json")]).exit_code == 0
    return json.loads((tmp_path / "m.json").read_text())


def test_one_image_twice_in_a_split_in_nfc_and_nfd_is_named_so(tmp_path):
    tree = make_image_tree(tmp_path / "data", {"café": 3, "bee": 3})
    doc = _manifest_of(tmp_path, tree)
    first = doc["train"][0]
    assert first[0] == "bee/img000.png"
    doc["train"] = [e for e in doc["train"] if e[0].startswith("bee/")] + [
        e for e in doc["train"] if e[0].startswith("café/")][:1]
    entry = doc["train"][-1]
    doc["train"].append([unicodedata.normalize("NFD", entry[0]), entry[1], entry[2]])
    (tmp_path / "m2.json").write_text(json.dumps(doc))
    assert_one_line_error(_extract("--dataset", "imagefolder", "--data-dir", tree, "--split-manifest",
                                   tmp_path / "m2.json", "--out", tmp_path / "b.zarr"),
                          f"{tmp_path / 'm2.json'} lists the image {entry[0]!r} twice in its train split (in two Unicode "
                          "normalisations, one name); a split names each image once: remove one of its entries")
    assert not (tmp_path / "b.zarr").exists()


def test_a_manifest_in_nfd_form_records_its_names_in_nfc(tmp_path):
    tree = make_image_tree(tmp_path / "data", {"café": 3, "naïve": 3})
    doc = _manifest_of(tmp_path, tree)
    for split in ("train", "test"):
        doc[split] = [[unicodedata.normalize("NFD", name), digest, label] for name, digest, label in doc[split]]
    (tmp_path / "nfd.json").write_text(json.dumps(doc))
    b = tmp_path / "b.zarr"
    result = _extract("--dataset", "imagefolder", "--data-dir", tree, "--split-manifest", tmp_path / "nfd.json", "--out", b)
    assert result.exit_code == 0, result.output
    assert read_manifest(b).splits == read_manifest(tmp_path / "a.zarr").splits
    assert all(unicodedata.is_normalized("NFC", name) for split in ("train", "test")
               for name, _, _ in read_manifest(b).splits[split])
