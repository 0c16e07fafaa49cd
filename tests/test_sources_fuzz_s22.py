"""`extract`'s sources other than a plain folder, as an audit (s22) probed them: HDF5 files changed during a run or
between a stop and its resume, split manifests edited by hand, and scikit-learn's digits.

The invariant for HDF5: a store that ends complete holds the features of the file its ``data_sha256`` names, every
row of it; a file changed under a run is refused, never mixed in.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr
from helpers import assert_one_line_error, invoke, make_image_tree, store_files

import foal_pipe.extract.run as run
from foal_pipe.extract import ExtractSpec, create_store, extract_rows, mark_progress
from foal_pipe.extract.manifest import read_manifest
from foal_pipe.store import writer_lock

h5py = pytest.importorskip("h5py")


# -- HDF5 ------------------------------------------------------------------------------------------------------------
def _h5(path: Path, base: int = 0, link: str | None = None, classes: tuple[str, ...] = ("a", "b")) -> Path:
    """8 train and 4 test 6x6 RGB images of 2 classes, written aside and renamed into place (a reader holding the old
    file keeps it). Train image k is all ``base + k``, test images all ``base``. ``link``: ``soft`` stores train/images
    behind a soft link, ``external`` makes it an external link to ``other.h5`` beside ``path``."""
    aside = path.with_name(f".{path.name}.new")
    with h5py.File(aside, "w") as f:
        images = np.broadcast_to((base + np.arange(8, dtype=np.uint8))[:, None, None, None], (8, 6, 6, 3))
        if link == "soft":
            f["data/images"] = images
            f["train/images"] = h5py.SoftLink("/data/images")
        elif link == "external":
            f["train/images"] = h5py.ExternalLink(str(path.with_name("other.h5")), "/x")
        else:
            f["train/images"] = images
        f["train/labels"] = np.arange(8) % 2
        f["test/images"] = np.full((4, 6, 6, 3), base, np.uint8)
        f["test/labels"] = np.arange(4) % 2
        f.attrs["classes"] = list(classes)
    os.replace(aside, path)
    return path


def _extract_h5(data: Path, out: Path, *extra: object):
    return invoke("extract", "--dataset", "hdf5", "--data-dir", data, "--model", "pixels", "--image-size", 8, "--out",
                  out, "--chunk-rows", 4, "--batch-size", 2, "--workers", 0, "--device", "cpu", *extra)


def _features(store: Path) -> dict[str, np.ndarray]:
    group = zarr.open_group(str(store), mode="r")
    return {split: np.asarray(group[f"{split}/features"][:]) for split in ("train", "test")}


def _complete(store: Path) -> bool:
    return store.is_dir() and zarr.open_group(str(store), mode="r").attrs.get("complete") is True


@pytest.mark.parametrize("when", ["after the store is created", "between the train and test splits"])
def test_an_hdf5_file_replaced_during_a_run_never_ends_in_a_complete_store_of_other_rows(tmp_path, monkeypatch, when):
    """The store's data_sha256 is the original file's; once it is back, a complete store must hold its features."""
    data, out, fresh = _h5(tmp_path / "d.h5"), tmp_path / "s.zarr", tmp_path / "fresh.zarr"
    replaced: list[bool] = []

    def replace_once() -> None:
        if not replaced:
            replaced.append(True)
            _h5(data, base=100)  # the same rows, labels and classes; other pixels

    create, mark = run.create_store, run.mark_progress
    if when == "after the store is created":
        monkeypatch.setattr(run, "create_store", lambda *a, **k: (create(*a, **k), replace_once())[0])
    else:
        monkeypatch.setattr(run, "mark_progress", lambda path, split, hi: (mark(path, split, hi), split == "train"
                                                                             and hi == 8 and replace_once()))
    first = _extract_h5(data, out)
    monkeypatch.undo()
    assert replaced
    _h5(data)  # the original file back
    again = _extract_h5(data, out)
    assert _extract_h5(data, fresh).exit_code == 0
    if first.exit_code == 0 or again.exit_code == 0:
        assert _complete(out)
        ours, theirs = _features(out), _features(fresh)
        assert all(ours[split].tobytes() == theirs[split].tobytes() for split in ours)


def test_an_external_link_swapped_in_after_the_check_is_still_refused(tmp_path, monkeypatch):
    data, out = _h5(tmp_path / "d.h5"), tmp_path / "s.zarr"
    with h5py.File(tmp_path / "other.h5", "w") as f:  # another file the user can read, of the same shape
        f["x"] = np.full((8, 6, 6, 3), 77, np.uint8)
    opened = run.open_inputs
    monkeypatch.setattr(run, "open_inputs", lambda spec: (opened(spec), _h5(data, link="external"))[0])
    result = _extract_h5(data, out)
    assert result.exit_code == 1 and not _complete(out), result.output


def _stopped(data: Path, out: Path) -> None:
    """The first train chunk (rows 0-3) of ``data`` written and recorded, as a run stopped there leaves it."""
    spec = ExtractSpec(dataset="hdf5", data_dir=str(data), model="pixels", image_size=8, out=str(out), chunk_rows=4,
                       batch_size=2, workers=0, device="cpu")
    with writer_lock(out):
        state = create_store(spec)
        extract_rows(spec, "train", 0, 4, path=state.path, inputs=run.open_inputs(spec))
        mark_progress(state.path, "train", 4)


@pytest.mark.parametrize("change,fragments", [
    (dict(classes=("b", "a")), ("was extracted with different settings (classes: ['a', 'b'] -> ['b', 'a'])",)),
    (dict(link="soft", base=50), ("was extracted from other data: the train images of",)),
    (dict(link="external"), ("dataset train/images is an external link to", "store the data inside the file")),
])
def test_an_hdf5_file_changed_between_a_stop_and_its_resume_is_refused(tmp_path, change, fragments):
    data, out = _h5(tmp_path / "d.h5"), tmp_path / "s.zarr"
    with h5py.File(tmp_path / "other.h5", "w") as f:
        f["x"] = np.full((8, 6, 6, 3), 3, np.uint8)
    _stopped(data, out)
    before = store_files(out)
    _h5(data, **change)
    assert_one_line_error(_extract_h5(data, out), *fragments)
    assert store_files(out) == before and not _complete(out)


def test_the_same_pixels_behind_a_soft_link_resume_to_a_fresh_runs_bytes(tmp_path):
    """A soft link within the file is read as its target: the same images resume, and end as a fresh run."""
    data, out, fresh = _h5(tmp_path / "d.h5"), tmp_path / "s.zarr", tmp_path / "fresh.zarr"
    _stopped(data, out)
    _h5(data, link="soft")
    assert _extract_h5(data, out).exit_code == 0
    assert _extract_h5(data, fresh).exit_code == 0
    assert store_files(out) == store_files(fresh)
    np.testing.assert_allclose(_features(out)["train"][:, 0], (np.arange(8) / 255 - 0.5) / 0.5, rtol=0, atol=1e-6)  # row k: k


# -- split manifests -------------------------------------------------------------------------------------------------
PIXELS = ("--model", "pixels", "--image-size", 8, "--workers", 0, "--device", "cpu", "--chunk-rows", 4)


def _extract_dir(data: Path, out: Path, *extra: object):
    return invoke("extract", "--dataset", "imagefolder", "--data-dir", data, "--out", out, *PIXELS, *extra)


@pytest.fixture
def lab_a(tmp_path: Path) -> tuple[Path, Path, dict]:
    """A folder per class split with --test-split, its store and its exported manifest (as a dict)."""
    photos = make_image_tree(tmp_path / "photos", {"ant": 4, "bee": 5, "cow": 3}, split=False)
    store = tmp_path / "a.zarr"
    assert _extract_dir(photos, store, "--test-split", 0.4, "--split-seed", 3).exit_code == 0
    assert invoke("info", store, "--export-manifest", tmp_path / "a.json").exit_code == 0
    return photos, store, json.loads((tmp_path / "a.json").read_text())


def _with(tmp_path: Path, doc: dict, name: str = "edited.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def _edited(doc: dict, edit: str) -> dict:
    doc = json.loads(json.dumps(doc))
    train = doc["train"]
    if edit == "digest":
        train[1][1] = "0" * 64
    elif edit == "renamed class":
        doc["classes"][1] = "wasp"
    elif edit == "duplicated row":
        train.append(list(train[0]))
    elif edit == "row in both splits":
        doc["test"].append(list(train[0]))
    elif edit == "relabelled row":
        train[0][2] = (train[0][2] + 1) % 3
    elif edit == "class without rows":
        doc["classes"].append("dog")
    return doc


@pytest.mark.parametrize("edit,fragments", [
    ("digest", ("of the split manifest", "has other bytes in", "restore the original file")),
    ("renamed class", ("in the split manifest", "but class 'wasp'", "it is not the same dataset")),
    ("duplicated row", ("lists the image", "twice in its train split", "remove one of its entries")),
    ("row in both splits", ("lists image", "in both splits", "remove one of its entries")),
    ("relabelled row", ("in the split manifest", "it is not the same dataset")),
    ("class without rows", ("lists class 'dog' without any image in either split",)),
])
def test_an_edited_manifest_is_refused_in_one_line_leaving_nothing(tmp_path, lab_a, edit, fragments):
    photos, _, doc = lab_a
    out = tmp_path / "b.zarr"
    assert_one_line_error(_extract_dir(photos, out, "--split-manifest", _with(tmp_path, _edited(doc, edit))), *fragments)
    assert not out.exists() and not list(tmp_path.glob(".b.zarr*"))


def _rows_by_name(store: Path) -> dict[str, np.ndarray]:
    manifest, features = read_manifest(store), _features(store)
    return {name: features[split][row] for split in ("train", "test")
            for row, (name, _, _) in enumerate(manifest.splits[split])}


@pytest.mark.parametrize("edit", ["reordered", "dropped row", "classes renumbered"])
def test_an_edited_manifest_that_is_still_a_split_gives_exactly_that_split(tmp_path, lab_a, edit):
    """Rows, labels and class names follow the manifest; each row holds its image's features (those of A's store)."""
    photos, a, doc = lab_a
    doc = json.loads(json.dumps(doc))
    if edit == "reordered":
        doc["train"].reverse()
        doc["test"] = doc["test"][1:] + doc["test"][:1]
    elif edit == "dropped row":
        del doc["train"][2]
    else:  # the class list reversed, every label renumbered to match: the same classes under other ids
        doc["classes"].reverse()
        for split in ("train", "test"):
            for entry in doc[split]:
                entry[2] = 2 - entry[2]
    out = tmp_path / "b.zarr"
    result = _extract_dir(photos, out, "--split-manifest", _with(tmp_path, doc))
    assert result.exit_code == 0, result.output
    manifest = read_manifest(out)
    assert list(manifest.classes) == doc["classes"]
    ours, theirs = _rows_by_name(out), _rows_by_name(a)
    group = zarr.open_group(str(out), mode="r")
    for split in ("train", "test"):
        assert [list(entry) for entry in manifest.splits[split]] == doc[split]
        np.testing.assert_array_equal(np.asarray(group[f"{split}/labels"][:]), [entry[2] for entry in doc[split]])
    assert ours.keys() <= theirs.keys() and len(ours) == sum(len(doc[split]) for split in ("train", "test"))
    for name, row in ours.items():
        assert row.tobytes() == theirs[name].tobytes(), name


def test_the_same_images_in_another_folder_give_the_same_store_but_its_recorded_source(tmp_path, lab_a):
    """The root attributes record where the data was read (``source``) and so the generation id; nothing else differs."""
    photos, a, _ = lab_a
    elsewhere = tmp_path / "deep" / "copy of photos"
    shutil.copytree(photos, elsewhere)
    out = tmp_path / "b.zarr"
    assert _extract_dir(elsewhere, out, "--split-manifest", a).exit_code == 0
    again = tmp_path / "c.zarr"
    assert _extract_dir(photos, again, "--split-manifest", a).exit_code == 0
    ours, theirs = store_files(out), store_files(again)
    assert ours.keys() == theirs.keys()
    assert [name for name in ours if ours[name] != theirs[name]] == ["zarr.json"]
    attrs = {k: dict(zarr.open_group(str(p), mode="r").attrs) for k, p in (("ours", out), ("theirs", again))}
    assert attrs["ours"].pop("source") == str(elsewhere) and attrs["theirs"].pop("source") == str(photos)
    assert attrs["ours"].pop("generation") != attrs["theirs"].pop("generation")
    assert attrs["ours"] == attrs["theirs"]


@pytest.mark.slow
def test_a_resume_with_a_manifest_reordered_past_the_written_rows_ends_as_a_fresh_run(tmp_path, lab_a, monkeypatch):
    """Two train images of one class not written yet swap rows: the labels stay, so the resume goes on, with the new
    manifest's order, and ends as a fresh run with that manifest."""
    photos, _, doc = lab_a
    first = _with(tmp_path, doc, "first.json")
    mark = run.mark_progress

    def stop_after_first_chunk(path, split, hi):
        mark(path, split, hi)
        raise KeyboardInterrupt

    monkeypatch.setattr(run, "mark_progress", stop_after_first_chunk)
    out = tmp_path / "b.zarr"
    assert _extract_dir(photos, out, "--split-manifest", first).exit_code != 0
    monkeypatch.undo()
    assert not _complete(out)
    train = doc["train"]
    pair = next((i, j) for i in range(4, len(train)) for j in range(i + 1, len(train)) if train[i][2] == train[j][2])
    train[pair[0]], train[pair[1]] = train[pair[1]], train[pair[0]]
    second = _with(tmp_path, doc, "second.json")
    assert _extract_dir(photos, out, "--split-manifest", second).exit_code == 0
    fresh = tmp_path / "fresh.zarr"
    assert _extract_dir(photos, fresh, "--split-manifest", second).exit_code == 0
    assert store_files(out) == store_files(fresh)


# -- digits ----------------------------------------------------------------------------------------------------------
def _extract_digits(out: Path, *extra: object):
    return invoke("extract", "--dataset", "digits", "--model", "pixels", "--workers", 0, "--device", "cpu", "--out", out,
                  *extra)


def test_digits_is_the_documented_split_with_its_pixels_and_refuses_split_options(tmp_path):
    """Every 5th image of each class (positions 4, 9, ...) is a test image; a row's features are its pixels scaled
    from 0..16 to 0..255, normalised by 0.5/0.5, grey repeated over RGB."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    test = np.zeros(len(bunch.target), bool)
    for c in range(10):
        test[np.flatnonzero(bunch.target == c)[4::5]] = True
    out = tmp_path / "d.zarr"
    assert _extract_digits(out).exit_code == 0
    group = zarr.open_group(str(out), mode="r")
    for split, rows in (("train", np.flatnonzero(~test)), ("test", np.flatnonzero(test))):
        np.testing.assert_array_equal(np.asarray(group[f"{split}/index"][:]), rows)
        np.testing.assert_array_equal(np.asarray(group[f"{split}/labels"][:]), bunch.target[rows])
        grey = np.rint(bunch.images[rows] * (255.0 / 16.0)) / 255.0
        expected = np.repeat(((grey - 0.5) / 0.5).reshape(len(rows), 1, 64), 3, axis=1).reshape(len(rows), -1)
        np.testing.assert_allclose(np.asarray(group[f"{split}/features"][:]), expected, rtol=0, atol=1e-6)
    assert (len(np.flatnonzero(~test)), len(np.flatnonzero(test))) == (1442, 355)
    other = tmp_path / "e.zarr"
    assert_one_line_error(_extract_digits(other, "--test-split", 0.2), "--test-split")
    assert_one_line_error(_extract_digits(other, "--split-seed", 1), "--split-seed draws the split of --test-split")
    assert_one_line_error(_extract_digits(other, "--split-manifest", out), "--split-manifest splits image files; digits")
    assert not other.exists()


@pytest.mark.slow
def test_digits_gives_the_same_bytes_twice_and_resumes_to_them(tmp_path, monkeypatch):
    a, b, c = tmp_path / "a.zarr", tmp_path / "b.zarr", tmp_path / "c.zarr"
    assert _extract_digits(a, "--chunk-rows", 256).exit_code == 0
    assert _extract_digits(b, "--chunk-rows", 256, "--workers", 2).exit_code == 0
    assert store_files(a) == store_files(b)
    mark = run.mark_progress

    def stop_at_third_chunk(path, split, hi):
        mark(path, split, hi)
        if hi == 768:
            raise KeyboardInterrupt

    monkeypatch.setattr(run, "mark_progress", stop_at_third_chunk)
    assert _extract_digits(c, "--chunk-rows", 256).exit_code != 0
    monkeypatch.undo()
    assert _extract_digits(c, "--chunk-rows", 256).exit_code == 0
    assert store_files(c) == store_files(a)
