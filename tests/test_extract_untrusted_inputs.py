"""Inputs `extract` must not trust: an HDF5 file whose datasets lie in other files (external storage, an external link,
a virtual dataset: the store held another file's bytes), declared shapes too large to read (a raw MemoryError
traceback, from an HDF5 file or from a resumed store's edited metadata), and a folder of symbolic links reaching one
folder twice (a chain of 20 such folders listed one image 2^20 times)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_one_line_error, invoke, make_image_tree, store_files

from foal_pipe.datasets.hdf5 import load_hdf5
from foal_pipe.datasets.loaders import load_imagefolder
from foal_pipe.datasets.sources import images_in
from foal_pipe.errors import FoalPipeError

h5py = pytest.importorskip("h5py")
SECRET = np.frombuffer(b"TOPSECRET-password=hunter2\n" * 10, dtype=np.uint8)  # 270 bytes
FIX = "not data stored in the file, and foal-pipe reads only the file it is given; store the data inside the file"


def _extract(data: Path, out: Path, dataset: str = "hdf5"):
    return invoke("extract", "--dataset", dataset, "--data-dir", data, "--model", "pixels", "--image-size", 4,
                  "--out", out, "--chunk-rows", 2, "--workers", 0, "--device", "cpu")


def _h5(path: Path, **datasets) -> Path:
    """An HDF5 file of 4 train and 2 test 8x8 images; ``datasets``: name (``/`` as ``__``) -> a value to store
    instead (an array, a link, or a callable that makes the dataset in the file)."""
    rng = np.random.default_rng(0)
    plain = {"train/images": rng.integers(0, 256, (4, 8, 8), dtype=np.uint8), "train/labels": np.array([0, 1, 0, 1]),
             "test/images": rng.integers(0, 256, (2, 8, 8), dtype=np.uint8), "test/labels": np.array([0, 1])}
    with h5py.File(path, "w") as f:
        for name, value in {**plain, **{k.replace("__", "/"): v for k, v in datasets.items()}}.items():
            if callable(value):
                value(f, name)
            else:
                f[name] = value
    return path


# -- 1. HDF5 data that lies in another file -------------------------------------------------------------------------
def _external_storage(secret: Path):
    def make(f, name):
        f.create_dataset(name, shape=(4, 8, 8), dtype="u1", external=[(str(secret), 0, 256)])
    return make


def _virtual(other: Path):
    def make(f, name):
        layout = h5py.VirtualLayout(shape=(4, 8, 8), dtype="u1")
        layout[:] = h5py.VirtualSource(str(other), "imgs", shape=(4, 8, 8))
        f.create_virtual_dataset(name, layout, fillvalue=0)
    return make


@pytest.mark.parametrize("kind", ["external storage", "external link", "virtual", "soft link out", "classes"])
def test_hdf5_data_in_another_file_is_refused_naming_the_dataset(tmp_path, kind):
    secret = tmp_path / "secret.txt"
    secret.write_bytes(SECRET.tobytes())
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as g:
        g["imgs"] = SECRET[:256].reshape(4, 8, 8)
        g["grp/images"] = SECRET[:256].reshape(4, 8, 8)
        g["grp/labels"] = np.array([0, 1, 0, 1])
        g["names"] = np.array([b"cat", b"dog"])
    made, name, why = {
        "external storage": ({"train__images": _external_storage(secret)}, "train/images",
                             f"is stored outside the file (external raw storage in {secret})"),
        "external link": ({"train__images": h5py.ExternalLink(str(other), "/imgs")}, "train/images",
                          f"is an external link to {other}:/imgs"),
        "virtual": ({"train__images": _virtual(other)}, "train/images", f"is a virtual dataset mapping {other}"),
        "soft link out": ({"ext": h5py.ExternalLink(str(other), "/grp"), "train__images": h5py.SoftLink("/ext/images")},
                          "train/images", f"is a soft link into another file ({other})"),
        "classes": ({"classes": h5py.ExternalLink(str(other), "/names")}, "classes", f"is an external link to {other}:/names"),
    }[kind]
    path = _h5(tmp_path / "d.h5", **made)
    with pytest.raises(FoalPipeError) as info:
        load_hdf5(path, False)
    assert str(info.value).startswith(f"{path}: dataset {name} {why}") and FIX in str(info.value), str(info.value)
    result = _extract(path, tmp_path / "s.zarr")
    assert_one_line_error(result, f"dataset {name} {why}", FIX)
    assert not (tmp_path / "s.zarr").exists() and SECRET.tobytes()[:20].decode() not in result.output


def test_an_external_link_on_the_way_to_a_dataset_is_refused(tmp_path):
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as g:
        g["grp/images"] = SECRET[:128].reshape(2, 8, 8)
        g["grp/labels"] = np.array([0, 1])
    path = _h5(tmp_path / "d.h5")
    with h5py.File(path, "a") as f:
        del f["test"]
        f["test"] = h5py.ExternalLink(str(other), "/grp")
    with pytest.raises(FoalPipeError, match=f"dataset test/images is an external link to {other}:/grp, not data stored"):
        load_hdf5(path, False)


def test_a_soft_link_inside_the_file_reads_as_the_dataset_itself(tmp_path):
    plain = load_hdf5(_h5(tmp_path / "plain.h5"), False)
    images = np.random.default_rng(0).integers(0, 256, (4, 8, 8), dtype=np.uint8)
    soft = load_hdf5(_h5(tmp_path / "soft.h5", data__imgs=images, train__images=h5py.SoftLink("/data/imgs")), False)
    assert np.array_equal(soft.train.load(3), plain.train.load(3)) and soft.train.labels.tolist() == [0, 1, 0, 1]


# -- 2. shapes declared too large to read ---------------------------------------------------------------------------
def _empty(shape, dtype, chunks):
    def make(f, name):
        f.create_dataset(name, shape=shape, dtype=dtype, chunks=chunks)
    return make


def test_hdf5_labels_declared_longer_than_the_images_are_refused_before_reading(tmp_path):
    path = _h5(tmp_path / "d.h5", train__labels=_empty((10**11,), "i8", (1024,)))
    result = _extract(path, tmp_path / "s.zarr")
    assert_one_line_error(result, "train/images has shape (4, 8, 8) and train/labels 100000000000 rows; expected N "
                                  "labels and N images")
    assert not (tmp_path / "s.zarr").exists()


def test_hdf5_labels_too_many_to_hold_are_refused_before_reading(tmp_path):
    path = _h5(tmp_path / "d.h5", train__images=_empty((10**12, 8, 8), "u1", (1, 8, 8)),
               train__labels=_empty((10**12,), "i8", (1024,)))
    result = _extract(path, tmp_path / "s.zarr")
    assert_one_line_error(result, "train/labels declares 1,000,000,000,000 rows, 14.6 TiB in memory, more than the")
    assert not (tmp_path / "s.zarr").exists()


def test_hdf5_images_larger_than_an_image_file_may_be_are_refused_before_hashing(tmp_path, monkeypatch):
    from PIL import Image

    path = _h5(tmp_path / "d.h5", train__images=_empty((2, 10**6, 10**6), "u1", (1, 64, 64)),
               train__labels=np.array([0, 1]))
    result = _extract(path, tmp_path / "s.zarr")
    limit = 2 * Image.MAX_IMAGE_PIXELS
    assert_one_line_error(result, f"each train/images image is 1,000,000 x 1,000,000 = 1,000,000,000,000 pixels, more "
                                  f"than the {limit:,} an image file may have")
    assert not (tmp_path / "s.zarr").exists()
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 32)  # the limit is Pillow's, as for image files: 64 pixels pass
    assert load_hdf5(_h5(tmp_path / "ok.h5"), False).native_size == 8
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 31)
    with pytest.raises(FoalPipeError, match=r"each train/images image is 8 x 8 = 64 pixels, more than the 62 an image"):
        load_hdf5(_h5(tmp_path / "big.h5"), False)


@pytest.mark.parametrize(("leaf", "shape", "chunk", "message"), [
    ("train/labels", 10**12, 10**12, "train/labels: shape (1000000000000,), unlike the 6 rows of train/features"),
    ("test/index", 4, 10**12, "test/index: one chunk needs 7,450.6 GiB in memory, more than half of the"),
    ("train/index", 7, 7, "train/index: shape (7,), unlike the 6 rows of train/features"),
])
def test_a_resumed_store_with_edited_row_arrays_is_refused_before_reading(tmp_path, leaf, shape, chunk, message):
    tree = make_image_tree(tmp_path / "tree", {"a": 3, "b": 3})
    assert _extract(tree, tmp_path / "s.zarr", "imagefolder").exit_code == 0
    store = tmp_path / "t.zarr"
    shutil.copytree(tmp_path / "s.zarr", store)
    group = json.loads((store / "zarr.json").read_text())
    group["attributes"]["complete"] = False
    group["attributes"].pop("generation", None)
    (store / "zarr.json").write_text(json.dumps(group))
    meta = json.loads((store / leaf / "zarr.json").read_text())
    meta["shape"], meta["chunk_grid"]["configuration"]["chunk_shape"] = [shape], [chunk]
    (store / leaf / "zarr.json").write_text(json.dumps(meta))
    before = store_files(store)
    result = _extract(tree, store, "imagefolder")
    assert_one_line_error(result, f"{store} is damaged ({message}", "pass --overwrite to extract it again")
    assert store_files(store) == before


# -- 3. one folder reached twice through symbolic links ---------------------------------------------------------------
def _chain(tree: Path, depth: int) -> Path:
    """``chain/d0..d<depth>``, each holding two links to the next, one image at the end; ``train/a/sub`` -> ``d0``."""
    from PIL import Image

    chain = tree / "chain"
    for k in range(depth + 1):
        (chain / f"d{k}").mkdir(parents=True)
    for k in range(depth):
        for name in ("l1", "l2"):
            (chain / f"d{k}" / name).symlink_to(f"../d{k + 1}")
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(chain / f"d{depth}" / "x.png")
    (tree / "train" / "a" / "sub").symlink_to(chain / "d0")
    return tree


def test_a_folder_reached_twice_through_links_is_refused_naming_both(tmp_path):
    tree = _chain(make_image_tree(tmp_path / "tree", {"a": 1, "b": 1}, test_per_class=1), 3)
    a = tree / "train" / "a"
    with pytest.raises(FoalPipeError) as info:
        images_in(a)  # before: 2^3 = 8 paths of one image
    assert str(info.value) == (
        f"{a}/sub/l1/l1/l2 and {a}/sub/l1/l1/l1 are one folder ({tree}/chain/d3), reached twice: "
        f"its images would be read twice; remove the duplicate link {a}/sub/l1/l1/l2")
    result = _extract(tree, tmp_path / "s.zarr", "imagefolder")
    assert_one_line_error(result, f"{a}/sub/l1/l1/l2 and {a}/sub/l1/l1/l1 are one folder", "remove the duplicate link")
    assert not (tmp_path / "s.zarr").exists()
    for k in range(3):  # one link each: every folder once, read as before
        (tree / "chain" / f"d{k}" / "l2").unlink()
    assert [p.relative_to(a).as_posix() for p in images_in(a)] == ["img000.png", "sub/l1/l1/l1/x.png"]
    assert len(load_imagefolder(tree, False).train) == 3


def test_a_link_back_to_a_folder_above_is_still_named_a_loop(tmp_path):
    tree = make_image_tree(tmp_path / "tree", {"a": 1}, test_per_class=1)
    (tree / "train" / "a" / "x" / "y").mkdir(parents=True)
    (tree / "train" / "a" / "x" / "y" / "up").symlink_to(tree / "train" / "a" / "x")
    with pytest.raises(FoalPipeError, match=r"x/y/up is a symbolic link to .*a/x, which leads back to a folder that "
                                            r"holds it \(.*x/y/up is .*a/x again\): searching it would never end"):
        images_in(tree / "train" / "a")


def test_a_link_that_sorts_before_its_folder_is_the_one_named(tmp_path):
    """``p/a -> z`` beside the folder ``p/z``: the link is searched first, so the real folder is the one reached
    again; the refusal still names the link to remove, never the folder that holds the images."""
    from PIL import Image

    p = tmp_path / "p"
    (p / "z").mkdir(parents=True)
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(p / "z" / "0.png")
    (p / "a").symlink_to("z")
    with pytest.raises(FoalPipeError) as info:
        images_in(p)
    assert str(info.value).endswith(f"; remove the duplicate link {p / 'a'}")


def test_a_soft_link_to_itself_is_refused_in_one_line(tmp_path):
    """``f["train/images"] = SoftLink("/train/images")``: h5py's "too many links" was a traceback."""
    path = _h5(tmp_path / "loop.h5", train__images=h5py.SoftLink("/train/images"))
    with pytest.raises(FoalPipeError, match=r"train/images cannot be followed \(.*\): a soft link that leads back to "
                                            r"itself or nowhere"):
        load_hdf5(path, False)
    result = _extract(path, tmp_path / "s.zarr")
    assert_one_line_error(result, "train/images cannot be followed", "a soft link that leads back to itself")
    assert not (tmp_path / "s.zarr").exists()
