"""`extract --dataset hdf5 | imagefolder | images` and split manifests, as an audit (s21) found them.

Before: an HDF5 file changed between the loader's first read and a later one made a store pairing the labels read
first with other images (exit 0), or stopped partway leaving a store, or ended in a KeyError traceback; class names
that are not UTF-8 ended in a UnicodeDecodeError traceback or were stored as lone surrogates; uint64 labels past
int64 were called "negative"; a manifest's digest in capitals was called an image with other bytes; a manifest with
an empty split was blamed on --data-dir; the manifest of an `images` store could not be reused; an image file name
that is not UTF-8 ended in a UnicodeEncodeError traceback.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr
from helpers import assert_one_line_error, invoke, make_image_tree, store_files

from foal_pipe.extract import run

h5py = pytest.importorskip("h5py")
AGAIN = "re-run the command once nothing writes the file"


def _h5(path: Path, n_train: int = 8, train_labels: np.ndarray | None = None, test_labels: np.ndarray | None = None,
        drop: str | None = None, classes: object = None) -> Path:
    """8 train and 4 test 6x6 RGB uint8 images, each image's pixels all equal to its row number; 2 classes."""
    with h5py.File(path, "w") as f:
        f["train/images"] = np.broadcast_to(np.arange(n_train, dtype=np.uint8)[:, None, None, None], (n_train, 6, 6, 3))
        f["train/labels"] = np.arange(n_train) % 2 if train_labels is None else train_labels
        f["test/images"] = np.zeros((4, 6, 6, 3), np.uint8)
        f["test/labels"] = np.arange(4) % 2 if test_labels is None else test_labels
        if callable(classes):
            classes(f)
        if drop is not None:
            del f[drop]
    return path


def _extract(dataset: str, data: Path, out: Path, *extra: object):
    return invoke("extract", "--dataset", dataset, "--data-dir", data, "--model", "pixels", "--image-size", 8,
                  "--out", out, "--chunk-rows", 4, "--batch-size", 2, "--workers", 0, "--device", "cpu", *extra)


# -- 1: an HDF5 file changed after its first read ------------------------------------------------------------------
@pytest.mark.parametrize("change,fragment", [
    (dict(drop="train/images"), "train/images is gone or no longer a dataset"),
    (dict(n_train=12, train_labels=(np.arange(12) + 1) % 2), "its train/images have shape (12, 6, 6, 3) now, where 8 "
                                                            "images lying as HWC were read then"),
    (dict(n_train=6), "its train/images have shape (6, 6, 6, 3) now, where 8 images lying as HWC were read then"),
    (dict(train_labels=(np.arange(8) + 1) % 2), "its train/labels differ from those read then (8 rows, the first row 0: "
                                                "0 then, 1 now)"),
])
def test_a_file_changed_after_its_first_read_is_refused_before_a_store_is_written(tmp_path, monkeypatch, change, fragment):
    data, out = _h5(tmp_path / "d.h5"), tmp_path / "s.zarr"
    checked = run.check_readable

    def rewritten_first(inputs, resuming=False):  # the labels and shapes are read; the file is then replaced
        os.replace(_h5(tmp_path / "new.h5", **change), data)
        return checked(inputs, resuming)

    monkeypatch.setattr(run, "check_readable", rewritten_first)
    assert_one_line_error(_extract("hdf5", data, out), f"{data} changed since foal-pipe first read it: ", fragment, AGAIN)
    assert not out.exists() and not list(tmp_path.glob(".s.zarr*"))


def test_a_file_relabelled_while_a_complete_store_is_checked_is_refused(tmp_path, monkeypatch):
    data, out = _h5(tmp_path / "d.h5"), tmp_path / "s.zarr"
    assert _extract("hdf5", data, out).exit_code == 0
    opened = run.open_inputs

    def relabelled_after(spec):
        inputs = opened(spec)
        os.replace(_h5(tmp_path / "new.h5", test_labels=np.array([1, 0, 1, 0])), data)  # the same images
        return inputs

    monkeypatch.setattr(run, "open_inputs", relabelled_after)
    assert_one_line_error(_extract("hdf5", data, out), "its test/labels differ from those read then (4 rows, the first "
                          "row 0: 0 then, 1 now)", AGAIN)


def test_an_unchanged_file_still_extracts_the_same_bytes(tmp_path):
    data = _h5(tmp_path / "d.h5")
    assert _extract("hdf5", data, tmp_path / "a.zarr").exit_code == 0
    assert _extract("hdf5", data, tmp_path / "b.zarr").exit_code == 0
    assert store_files(tmp_path / "a.zarr") == store_files(tmp_path / "b.zarr")
    features = np.asarray(zarr.open_group(str(tmp_path / "a.zarr"), mode="r")["train/features"][:])
    assert features.shape == (8, 3 * 8 * 8) and len({row.tobytes() for row in features}) == 8  # each row its image


# -- 2: HDF5 class names and labels --------------------------------------------------------------------------------
@pytest.mark.parametrize("write,shown", [
    (lambda f: f.attrs.create("classes", [b"\xff", b"b"], dtype=h5py.string_dtype("utf-8")), "'\\udcff'"),
    (lambda f: f.create_dataset("classes", data=[b"\xe9t\xe9", b"b"], dtype=h5py.string_dtype("utf-8")), "b'\\xe9t\\xe9'"),
    (lambda f: f.create_dataset("classes", data=np.array([b"a", b"\xff\xfe"], dtype="S4")), "b'\\xff\\xfe'"),
])
def test_class_names_that_are_not_utf8_are_refused_naming_them(tmp_path, write, shown):
    data, out = _h5(tmp_path / "d.h5", classes=write), tmp_path / "s.zarr"
    k = 1 if "\\xff\\xfe" in shown else 0
    assert_one_line_error(_extract("hdf5", data, out), f"{data}: its 'classes' name {k} ({shown}) is not UTF-8 text; "
                          "store the class names as UTF-8 strings")
    assert not out.exists()


def test_utf8_class_names_of_every_storage_still_read(tmp_path):
    for k, write in enumerate([lambda f: f.attrs.create("classes", ["é", "b"], dtype=h5py.string_dtype("utf-8")),
                               lambda f: f.create_dataset("classes", data=["é", "b"], dtype=h5py.string_dtype("utf-8")),
                               lambda f: f.create_dataset("classes", data=np.array(["é".encode(), b"b"], dtype="S4"))]):
        out = tmp_path / f"s{k}.zarr"
        assert _extract("hdf5", _h5(tmp_path / f"d{k}.h5", classes=write), out).exit_code == 0
        assert json.loads((out / "zarr.json").read_text())["attributes"]["classes"] == ["é", "b"]


def test_uint64_labels_past_int64_are_named_by_their_value(tmp_path):
    data = _h5(tmp_path / "d.h5", train_labels=np.array([0, 1, 0, 1, 0, 1, 0, 2**64 - 1], np.uint64))
    assert_one_line_error(_extract("hdf5", data, tmp_path / "s.zarr"),
                          f"{data}: train/labels holds the label 18,446,744,073,709,551,615; labels must be 0..K-1")


def test_a_class_in_one_split_keeps_its_label_id_and_learn_names_it(tmp_path):
    """As documented (docs/streams.md, "Classes left out"): an HDF5 class with test rows only is label 2 in the store,
    and `learn` leaves it out, naming it; the class with train rows only is trained on."""
    data = _h5(tmp_path / "d.h5", train_labels=np.array([0, 1, 3] * 2 + [0, 1]), test_labels=np.array([0, 1, 2, 2]))
    out = tmp_path / "s.zarr"
    assert _extract("hdf5", data, out).exit_code == 0
    group = zarr.open_group(str(out), mode="r")
    assert list(group.attrs["classes"]) == ["0", "1", "2", "3"]
    np.testing.assert_array_equal(group["test/labels"][:], [0, 1, 2, 2])
    result = invoke("learn", "--features", out, "--out", tmp_path / "run", "--tasks", 1, "--backend", "numpy")
    assert result.exit_code == 0, result.output
    assert "1 class (label ids [2]) has test rows but no training row" in " ".join(result.output.split())


# -- 3: split manifests edited or from another dataset ---------------------------------------------------------------
@pytest.fixture
def exported(tmp_path: Path) -> tuple[Path, dict]:
    photos = make_image_tree(tmp_path / "photos", {"ant": 3, "bee": 3}, split=False)
    assert _extract("imagefolder", photos, tmp_path / "a.zarr", "--test-split", "0.4").exit_code == 0
    assert invoke("info", tmp_path / "a.zarr", "--export-manifest", tmp_path / "a.json").exit_code == 0
    return photos, json.loads((tmp_path / "a.json").read_text())


@pytest.mark.parametrize("digest", [str.upper, lambda d: "z" * 64])
def test_a_digest_that_is_not_lowercase_hex_is_a_malformed_manifest(tmp_path, exported, digest):
    photos, doc = exported
    doc["train"][0][1] = digest(doc["train"][0][1])
    (tmp_path / "m.json").write_text(json.dumps(doc))
    assert_one_line_error(_extract("imagefolder", photos, tmp_path / "b.zarr", "--split-manifest", tmp_path / "m.json"),
                          f"{tmp_path / 'm.json'}: train entry", "is not [name, sha256 (64 lowercase hex digits)")
    assert not (tmp_path / "b.zarr").exists()


@pytest.mark.parametrize("split", ["train", "test"])
def test_a_manifest_with_an_empty_split_is_named(tmp_path, exported, split):
    photos, doc = exported
    doc[split] = []
    (tmp_path / "m.json").write_text(json.dumps(doc))
    assert_one_line_error(_extract("imagefolder", photos, tmp_path / "b.zarr", "--split-manifest", tmp_path / "m.json"),
                          f"the split manifest {tmp_path / 'm.json'} lists no {split} images, and a store of labelled "
                          "images needs both splits")


def test_an_images_manifest_is_reused_and_kept_apart_from_a_labelled_one(tmp_path, exported):
    photos, _ = exported
    assert _extract("images", photos, tmp_path / "i.zarr").exit_code == 0
    assert invoke("info", tmp_path / "i.zarr", "--export-manifest", tmp_path / "i.json").exit_code == 0
    again = _extract("images", photos, tmp_path / "j.zarr", "--split-manifest", tmp_path / "i.json")
    assert again.exit_code == 0, again.output
    assert store_files(tmp_path / "i.zarr") == store_files(tmp_path / "j.zarr")
    assert_one_line_error(_extract("images", photos, tmp_path / "k.zarr", "--split-manifest", tmp_path / "a.json"),
                          "is unlabelled in", "but class 'ant' in the split manifest")
    assert_one_line_error(_extract("imagefolder", photos, tmp_path / "k.zarr", "--split-manifest", tmp_path / "i.json"),
                          "is class 'ant' in", "but unlabelled in the split manifest")
    assert not (tmp_path / "k.zarr").exists()


@pytest.mark.skipif(sys.platform == "darwin", reason="macOS file systems refuse names that are not UTF-8")
@pytest.mark.parametrize("dataset", ["imagefolder", "images"])
def test_an_image_file_name_that_is_not_utf8_is_refused_naming_it(tmp_path, dataset):
    tree = make_image_tree(tmp_path / "tree", {"ant": 2, "bee": 2})
    odd = os.fsencode(tree / "train" / "bee") + b"/\xff.png"
    os.rename(os.fsencode(tree / "train" / "bee" / "img000.png"), odd)
    if dataset == "images":
        os.rename(os.fsencode(tree / "test" / "ant" / "img000.png"), odd.replace(b"train/bee", b"test/ant"))
        odd = odd.replace(b"train/bee", b"test/ant")
    out = tmp_path / "s.zarr"
    assert_one_line_error(_extract(dataset, tree, out), f"the image file {odd!r} has a name that is not UTF-8 text",
                          "rename it (or its folder) in UTF-8")
    assert not out.exists()


def test_a_manifest_path_that_is_a_device_is_not_called_missing(tmp_path, exported):
    photos, _ = exported
    assert_one_line_error(_extract("imagefolder", photos, tmp_path / "b.zarr", "--split-manifest", "/dev/null"),
                          "split manifest /dev/null is not a file or a folder; pass a feature store")


def test_a_file_replaced_before_a_worker_first_opens_it_is_refused(tmp_path):
    """The window between the check at hashing time and a loader's first open: the loader's own first open checks the
    file still holds the labels it was given (new images with the old labels, before)."""
    from foal_pipe.datasets.h5source import H5Source
    from foal_pipe.errors import FoalPipeError

    path = _h5(tmp_path / "d.h5")
    with h5py.File(path, "r") as f:
        labels = np.asarray(f["train/labels"][:])
    source = H5Source(path, "train", labels)
    _h5(path, train_labels=(labels + 1) % 2)
    with pytest.raises(FoalPipeError, match="changed since foal-pipe first read it"):
        source.load(0)
    _h5(path, train_labels=labels)
    assert source.load(0).shape  # the same file again: read
