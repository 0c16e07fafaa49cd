"""Dataset reading faults found by a hunt: each input below was read wrongly, or accepted when a reader refuses it
later, before the fix.

- Row order depended on the file system's listing order when names tie in natural order (``x1``, ``x01``), so two
  copies of one tree gave stores of other bytes and other ``--test-split`` draws.
- HDF5 ``classes`` naming one class twice made a store every reader refuses; a stray label (10^6) made a million
  classes; RGBA arrays ``(N, H, W, 4)`` were not seen as H x W images (``pixels`` upscaled them to 32 px).
- Image folders whose splits disagree on classes (a test-only class, ``Dog``/``dog``, ``é`` NFC/NFD) were accepted.
- A broken symbolic link ``*.png`` was left out in silence; a zero-byte one (and, without a split manifest, a broken
  link) stopped extraction partway instead of before the store was created.
"""

from __future__ import annotations

import unicodedata
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_clean_error, assert_identical_stores, invoke, make_image_tree
from PIL import Image

from foal_pipe.datasets import open_dataset
from foal_pipe.datasets.sources import images_in, to_rgb_array
from foal_pipe.errors import FoalPipeError

h5py = pytest.importorskip("h5py")


def _extract(data: Path, out: Path, *extra: str, dataset: str = "imagefolder"):
    return invoke("extract", "--dataset", dataset, "--data-dir", data, "--model", "pixels", "--out", out,
                  "--workers", "0", "--device", "cpu", *extra)


def _listing(monkeypatch, reverse: bool) -> None:
    """The file system lists entries in sorted or reversed order (tmpfs lists newest first)."""
    real = Path.rglob
    monkeypatch.setattr(Path, "rglob", lambda self, pattern: iter(sorted(real(self, pattern), reverse=reverse)))


# --- 1. row order ---------------------------------------------------------------------------------------------------

def _tied_tree(root: Path) -> Path:
    rng = np.random.default_rng(0)
    for split, names in (("train", ("x1", "x01", "x001", "x2", "y")), ("test", ("x1", "x01"))):
        for cls in ("a", "b"):
            (root / split / cls).mkdir(parents=True)
            for name in names:
                Image.fromarray(rng.integers(0, 256, (6, 6, 3), dtype=np.uint8)).save(root / split / cls / f"{name}.png")
    return root


def test_ties_in_natural_order_are_broken_by_the_name(tmp_path, monkeypatch):
    root = _tied_tree(tmp_path / "t")
    orders = []
    for reverse in (False, True):
        _listing(monkeypatch, reverse)
        orders.append([p.name for p in images_in(root / "train" / "a")])
    assert orders[0] == orders[1] == ["x001.png", "x01.png", "x1.png", "x2.png", "y.png"]


def test_trees_listed_in_other_orders_give_identical_stores_and_splits(tmp_path, monkeypatch):
    root = _tied_tree(tmp_path / "t")
    for reverse, name in ((False, "a"), (True, "b")):
        _listing(monkeypatch, reverse)
        assert _extract(root, tmp_path / f"{name}.zarr").exit_code == 0
        assert _extract(root / "train", tmp_path / f"{name}-split.zarr", "--test-split", "0.4").exit_code == 0
    assert_identical_stores(tmp_path / "a.zarr", tmp_path / "b.zarr")
    assert_identical_stores(tmp_path / "a-split.zarr", tmp_path / "b-split.zarr")


def _touch(root: Path, names: list[str]) -> Path:
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"")
    return root


def test_order_without_ties_is_the_natural_order_as_before(tmp_path):
    root = _touch(tmp_path, ["img10.png", "img2.png", "Img3.png", "a/b1.png", "a/b10.png", "a/b9.png", "z.png", "1.png"])
    got = [p.relative_to(root).as_posix() for p in images_in(root)]
    assert got == ["1.png", "Img3.png", "a/b1.png", "a/b9.png", "a/b10.png", "img2.png", "img10.png", "z.png"]


def test_names_with_superscript_digits_are_ordered_not_a_traceback(tmp_path):
    """``str.isdigit`` holds for ``²``, which ``int`` cannot read: the digit runs are those the pattern split off."""
    root = _touch(tmp_path, ["x1²10.png", "x1²2.png", "x0²3.png"])
    assert [p.name for p in images_in(root)] == ["x0²3.png", "x1²2.png", "x1²10.png"]


# --- 2. and 4. HDF5 classes and labels ------------------------------------------------------------------------------

def _h5(path: Path, train_labels, classes=None, images=None, test_labels=(0, 1), test_images=None) -> Path:
    rng = np.random.default_rng(0)
    n = len(train_labels)
    with h5py.File(path, "w") as f:
        f["train/images"] = images if images is not None else rng.integers(0, 256, (n, 6, 6), dtype=np.uint8)
        f["train/labels"] = np.asarray(train_labels)
        f["test/images"] = (test_images if test_images is not None
                            else rng.integers(0, 256, (len(test_labels), 6, 6), dtype=np.uint8))
        f["test/labels"] = np.asarray(test_labels)
        if classes is not None:
            f.attrs["classes"] = classes
    return path


def test_hdf5_classes_naming_one_class_twice_are_refused_before_a_store(tmp_path):
    path = _h5(tmp_path / "d.h5", [0, 1, 2, 0], ["a", "a", "b"])
    assert_clean_error(_extract(path, tmp_path / "s.zarr", dataset="hdf5"), "its 'classes' names 'a' twice", tmp_path / "s.zarr")
    nfd = unicodedata.normalize("NFD", "é")
    with pytest.raises(FoalPipeError, match="one name .* in two Unicode normalisations"):
        open_dataset("hdf5", _h5(tmp_path / "e.h5", [0, 1, 2, 0], ["é", nfd, "b"]))
    assert open_dataset("hdf5", _h5(tmp_path / "f.h5", [0, 1, 2, 0], ["Dog", "dog", "b"])).classes == ["Dog", "dog", "b"]


def test_hdf5_stray_labels_are_refused_naming_the_count_and_the_largest(tmp_path):
    labels = np.arange(20) % 10
    labels[5] = 10**6
    with pytest.raises(FoalPipeError, match=r"labels go up to 1,000,000, so 1,000,001 classes, but 999,990 of the labels "
                                            r"0..1,000,000 have no image"):
        open_dataset("hdf5", _h5(tmp_path / "a.h5", labels))
    labels[7] = 12
    with pytest.raises(FoalPipeError, match=r"2 labels lie outside 0..9, the 10 classes its 'classes' lists \(the "
                                            r"largest label is 1,000,000\)"):
        open_dataset("hdf5", _h5(tmp_path / "b.h5", labels, [str(k) for k in range(10)]))
    with pytest.raises(FoalPipeError, match="negative labels"):
        open_dataset("hdf5", _h5(tmp_path / "c.h5", [0, 1], test_labels=(0, -1)))
    listed = open_dataset("hdf5", _h5(tmp_path / "d.h5", [0, 1, 0], ["a", "b", "c"]))  # a listed class may be empty
    assert listed.classes == ["a", "b", "c"]


# --- 5. RGBA HDF5 arrays --------------------------------------------------------------------------------------------

def test_hdf5_rgba_images_are_read_at_their_size_with_alpha_dropped_like_a_png(tmp_path):
    rng = np.random.default_rng(2)
    rgba, test = rng.integers(0, 256, (4, 8, 8, 4), dtype=np.uint8), rng.integers(0, 256, (2, 8, 8, 4), dtype=np.uint8)
    path = _h5(tmp_path / "d.h5", [0, 1, 1, 0], images=rgba, test_images=test)  # one native size: both splits 8 x 8
    data = open_dataset("hdf5", path)
    assert data.native_size == 8
    Image.fromarray(rgba[1], "RGBA").save(tmp_path / "x.png")
    with Image.open(tmp_path / "x.png") as png:
        as_png = to_rgb_array(png, 8)
    np.testing.assert_array_equal(to_rgb_array(data.train.load(1), 8), as_png)
    np.testing.assert_array_equal(as_png, rgba[1][..., :3].transpose(2, 0, 1))
    chw = _h5(tmp_path / "chw.h5", [0, 1, 1, 0], images=np.ascontiguousarray(rgba.transpose(0, 3, 1, 2)),
              test_images=np.ascontiguousarray(test.transpose(0, 3, 1, 2)))
    assert open_dataset("hdf5", chw).native_size == 8
    np.testing.assert_array_equal(to_rgb_array(open_dataset("hdf5", chw).train.load(1), 8), as_png)
    assert _extract(path, tmp_path / "s.zarr", dataset="hdf5").exit_code == 0
    from foal_pipe.store import open_store

    assert open_store(tmp_path / "s.zarr").train.features.shape == (4, 192)


def test_hdf5_images_with_other_channel_counts_are_refused(tmp_path):
    path = _h5(tmp_path / "d.h5", [0, 1], images=np.zeros((2, 6, 6, 2), np.uint8))
    with pytest.raises(FoalPipeError, match=r"train/images has shape \(2, 6, 6, 2\).*C = 1 \(grey\), 3 \(RGB\) or 4 \(RGBA\)"):
        open_dataset("hdf5", path)


# --- 3. class folders that disagree between splits --------------------------------------------------------------

def _png(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (6, 6), (10, 20, 30)).save(path)


@pytest.mark.parametrize("train,test,message", [
    ("a", "c", r"class 'c' has images in .*test/c but none in .*train/c"),
    ("Dog", "dog", r"class folders .*train/Dog and .*test/dog are one class name: 'Dog' and 'dog', which differ only in case"),
    (unicodedata.normalize("NFC", "é"), unicodedata.normalize("NFD", "é"),
     r"class folders .*test/.* and .*train/.* are one class name: 'e\\u0301' and '\\xe9', one name \('é'\) in two "
     r"Unicode normalisations"),
])
def test_class_folders_the_splits_disagree_on_are_refused_before_a_store(tmp_path, train, test, message):
    root = tmp_path / "t"
    for split, cls in (("train", "b"), ("test", "b"), ("train", train), ("test", test)):
        _png(root / split / cls / "1.png")
    with pytest.raises(FoalPipeError, match=message):
        open_dataset("imagefolder", root)
    result = _extract(root, tmp_path / "s.zarr")
    assert_clean_error(result, "one class name" if train != "a" else "has images in", tmp_path / "s.zarr")


def test_a_class_with_test_images_only_is_refused_naming_it_and_the_split(tmp_path):
    root = tmp_path / "t"
    for split, cls in (("train", "a"), ("test", "a"), ("test", "c")):
        _png(root / split / cls / "1.png")
    (root / "train" / "c").mkdir()  # an empty folder is no training image either
    with pytest.raises(FoalPipeError, match=r"class 'c' has images in .*test/c but none in .*train/c"):
        open_dataset("imagefolder", root)
    (root / "test" / "c" / "1.png").unlink()
    (root / "test" / "c").rmdir()
    (root / "train" / "c").rmdir()
    _png(root / "train" / "d" / "1.png")  # and a class never tested
    with pytest.raises(FoalPipeError, match=r"class 'd' has images in .*train/d but none in .*test/d"):
        open_dataset("imagefolder", root)


def test_a_class_with_no_images_in_either_split_is_refused(tmp_path):
    """Empty folders in both splits made a class of no rows: `learn` then refused "task 0 (classes [2]) has no
    training rows", a label id the user never saw."""
    root = make_image_tree(tmp_path / "t", {"a": 2, "b": 2})
    (root / "train" / "c").mkdir()
    (root / "test" / "c").mkdir()
    with pytest.raises(FoalPipeError, match=r"class 'c' has no images in .*train/c nor in .*test/c"):
        open_dataset("imagefolder", root)


def test_class_folders_differing_in_case_in_one_folder_are_refused(tmp_path):
    root = make_image_tree(tmp_path / "t", {"Dog": 2, "dog": 2, "cat": 2}, split=False)
    with pytest.raises(FoalPipeError, match="'Dog' and 'dog', which differ only in case"):
        open_dataset("imagefolder", root, test_split=0.5)


# --- 6. broken symbolic links ---------------------------------------------------------------------------------------

def test_a_broken_symlink_image_is_refused_by_name_like_an_unreadable_file(tmp_path):
    root = make_image_tree(tmp_path / "t", {"a": 2, "b": 2})
    link = root / "train" / "a" / "gone.png"
    link.symlink_to(tmp_path / "nowhere.png")
    assert str(link) in [str(p) for p in images_in(root / "train")]
    result = _extract(root, tmp_path / "s.zarr")
    assert_clean_error(result, f"cannot read image {link} (a broken symbolic link to {tmp_path / 'nowhere.png'})",
                       tmp_path / "s.zarr")
    data = open_dataset("images", root)  # no manifest hashing: the reader names it
    with pytest.raises(ValueError, match="a broken symbolic link"):
        data.test.load([str(p) for p in data.test.paths].index(str(link)))


@pytest.mark.parametrize("fault", ["broken link", "empty file"])
def test_unreadable_files_are_refused_before_a_store_is_written(tmp_path, fault):
    """Without a split manifest nothing hashes the files first: a broken link or an empty file late in the list
    stopped `--dataset images` partway, a store half-filled; both are now found by a stat before any row."""
    root = make_image_tree(tmp_path / "t", {"a": 3, "b": 3}, split=False)
    bad = root / "b" / "zz-last.png"
    if fault == "broken link":
        bad.symlink_to(tmp_path / "nowhere.png")
        why = f"a broken symbolic link to {tmp_path / 'nowhere.png'}"
    else:
        bad.write_bytes(b"")
        why = "an empty file"
    (root / "b" / "zz-later.png").write_bytes(b"")
    out = tmp_path / "s.zarr"
    result = _extract(root, out, dataset="images")
    assert_clean_error(result, f"cannot read image {bad} ({why}) and 1 more; remove or replace the files", out)
    assert not list(tmp_path.glob("s.zarr*")), "nothing of the store left behind"
