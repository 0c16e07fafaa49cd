"""Audit of `foal-pipe extract`'s datasets and resume: labels written once and never compared on resume, a store of
`--dataset images` without its split manifest, an HDF5 file whose splits differ in image size taken for one native
size, and dataset files whose faults were extracted in silence (Tiny-ImageNet's annotations naming an image twice,
Fashion-MNIST labels beyond its 10 classes); each made a store with other labels or rows than the dataset's."""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import zarr
from helpers import assert_clean_error, invoke

from foal_pipe.datasets.loaders import load_hdf5, load_imagefolder
from foal_pipe.datasets.manifest import SplitManifest, apply_manifest, build_manifest
from foal_pipe.errors import FoalPipeError
from foal_pipe.extract import ExtractSpec, create_store, extract_rows, finish_store, mark_progress
from foal_pipe.store import verify_store, writer_lock
from foal_pipe.store.manifest import stored_manifest
from foal_pipe.store.write import replace_manifest


def _tree(root: Path, train: int = 10, test: int = 2) -> Path:
    """``root/{train,test}/{a,b}/<class><i>.png``: small random images (8x8 RGB)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in (("train", train), ("test", test)):
        for cls in ("a", "b"):
            (root / split / cls).mkdir(parents=True)
            for i in range(n):
                Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(root / split / cls / f"{cls}{i:02d}.png")
    return root


def _spec(data: Path, out: Path, dataset: str = "imagefolder") -> ExtractSpec:
    return ExtractSpec(dataset=dataset, data_dir=str(data), model="pixels", image_size=4, out=str(out), chunk_rows=4,
                       workers=0)


def _begun(spec: ExtractSpec, split: str, rows: int) -> Path:
    """A store of ``spec`` interrupted after ``rows`` rows of ``split``."""
    with writer_lock(spec.out_path):
        state = create_store(spec)
        extract_rows(spec, split, 0, rows, path=state.path)
        mark_progress(state.path, split, rows)
    return state.path


def _cli(spec: ExtractSpec):
    return invoke("extract", "--dataset", spec.dataset, "--data-dir", spec.data_dir, "--model", "pixels", "--image-size", 4,
                  "--out", spec.out, "--chunk-rows", 4, "--workers", 0)


def _refused(result, *fragments: str) -> None:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert lines[-1].startswith("Error: ") and all(f in lines[-1] for f in fragments), result.output


def test_resume_refuses_labels_of_moved_images(tmp_path: Path) -> None:
    """An image not written yet moved to the other class folder (same row counts): the resume used to finish the
    store with the old label for its row while the manifest said the new one."""
    data, out = _tree(tmp_path / "data"), tmp_path / "s.zarr"
    spec = _spec(data, out)
    _begun(spec, "train", 4)
    before = np.asarray(zarr.open_group(str(out), mode="r")["train/labels"][:])
    shutil.move(data / "train/a/a09.png", data / "train/b/a09.png")  # row 9: class a -> class b (natural order)
    now = load_imagefolder(data, False).split("train").labels
    row = int(np.flatnonzero(before != now)[0])
    _refused(_cli(spec), f"train row {row} has label {before[row]} in the store but {now[row]}", "--overwrite")
    group = zarr.open_group(str(out), mode="r")
    assert group.attrs["progress"]["train"] == 4 and group.attrs["complete"] is not True
    assert np.array_equal(group["train/labels"][:], before)
    result = invoke("extract", "--dataset", "imagefolder", "--data-dir", data, "--model", "pixels", "--image-size", 4,
                    "--out", out, "--chunk-rows", 4, "--workers", 0, "--overwrite")
    assert result.exit_code == 0, result.output
    assert np.array_equal(zarr.open_group(str(out), mode="r")["train/labels"][:], now)


def test_verify_compares_manifest_labels_with_labels(tmp_path: Path) -> None:
    """A complete store whose split manifest gives a row another label than its labels array (what such a resume
    left) was reported intact."""
    spec = _spec(_tree(tmp_path / "data"), tmp_path / "s.zarr")
    with writer_lock(spec.out_path):
        state = create_store(spec)
        doc = json.loads(stored_manifest(state.path))
        doc["train"][9][2] = 1 - doc["train"][9][2]
        replace_manifest(state.path, SplitManifest.from_dict(doc, "edited").to_bytes())
        for split, rows in state.rows.items():
            extract_rows(spec, split, 0, rows, path=state.path)
            mark_progress(state.path, split, rows)
        finish_store(state)
    problems = [str(p) for p in verify_store(spec.out_path).problems]
    assert len(problems) == 1 and "train/labels" in problems[0] and "row 9 " in problems[0], problems
    result = invoke("info", spec.out, "--verify")
    assert result.exit_code == 1 and "row 9 differs from the split manifest" in result.output, result.output


def test_images_dataset_records_manifest_and_resume_checks_it(tmp_path: Path) -> None:
    """`--dataset images` recorded no split manifest, so a resume over an image changed in a written row went on."""
    from PIL import Image

    (tmp_path / "d").mkdir()
    rng = np.random.default_rng(1)
    for i in range(8):
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(tmp_path / "d" / f"im{i}.png")
    spec = _spec(tmp_path / "d", tmp_path / "s.zarr", "images")
    path = _begun(spec, "test", 4)
    doc = json.loads(stored_manifest(path))
    files = sorted((tmp_path / "d").iterdir())
    assert doc["train"] == [] and doc["test"] == [[f.name, hashlib.sha256(f.read_bytes()).hexdigest(), -1] for f in files]
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(files[0])  # row 0 is written already
    _refused(_cli(spec), "from other images: test row 0 holds the features of 'im0.png'")


def _h5(path: Path, train_side: int, test_side: int) -> Path:
    import h5py

    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        f["train/images"] = rng.integers(0, 256, (4, train_side, train_side, 3), dtype=np.uint8)
        f["train/labels"] = np.array([0, 1, 0, 1])
        f["test/images"] = rng.integers(0, 256, (2, test_side, test_side, 3), dtype=np.uint8)
        f["test/labels"] = np.array([0, 1])
    return path


def test_hdf5_native_size_needs_every_split(tmp_path: Path) -> None:
    """Train images 6x6, test 8x8: the train side was taken as the native size, so `--resize-on device` was
    accepted and the test images resized twice."""
    assert load_hdf5(_h5(tmp_path / "same.h5", 6, 6), False).native_size == 6
    mixed = _h5(tmp_path / "mixed.h5", 6, 8)
    assert load_hdf5(mixed, False).native_size is None
    out = tmp_path / "s.zarr"
    result = invoke("extract", "--dataset", "hdf5", "--data-dir", mixed, "--model", "pixels", "--image-size", 4,
                    "--out", out, "--workers", 0, "--device", "cpu", "--resize-on", "device")
    assert_clean_error(result, "--resize-on device needs a dataset whose images share one size", out)


def test_tiny_imagenet_annotation_naming_an_image_twice(tmp_path: Path) -> None:
    from PIL import Image

    root = tmp_path / "tiny-imagenet-200"
    for w in ("n01", "n02"):
        (root / "train" / w / "images").mkdir(parents=True)
        Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(root / "train" / w / "images" / f"{w}_0.JPEG")
    (root / "val" / "images").mkdir(parents=True)
    for i in range(2):
        Image.fromarray(np.full((8, 8, 3), i, np.uint8)).save(root / "val" / "images" / f"val_{i}.JPEG")
    (root / "val" / "val_annotations.txt").write_text("val_0.JPEG\tn01\t0 0 1 1\nval_1.JPEG\tn02\t0 0 1 1\n"
                                                      "val_0.JPEG\tn02\t0 0 1 1\n")
    out = tmp_path / "s.zarr"
    result = invoke("extract", "--dataset", "tiny-imagenet", "--data-dir", tmp_path, "--model", "pixels",
                    "--image-size", 4, "--out", out, "--workers", 0)
    assert_clean_error(result, "val_annotations.txt line 3 names 'val_0.JPEG' again (first on line 1)", out)


def test_fashion_mnist_label_beyond_its_classes(tmp_path: Path) -> None:
    def idx(name: str, values: np.ndarray) -> None:
        header = struct.pack(">HBB", 0, 8, values.ndim) + struct.pack(f">{values.ndim}I", *values.shape)
        (tmp_path / name).write_bytes(header + values.astype(np.uint8).tobytes())

    rng = np.random.default_rng(0)
    idx("train-images-idx3-ubyte", rng.integers(0, 256, (4, 28, 28)))
    idx("train-labels-idx1-ubyte", np.array([0, 1, 2, 12]))
    idx("t10k-images-idx3-ubyte", rng.integers(0, 256, (2, 28, 28)))
    idx("t10k-labels-idx1-ubyte", np.array([0, 1]))
    out = tmp_path / "s.zarr"
    result = invoke("extract", "--dataset", "fashion-mnist", "--data-dir", tmp_path, "--model", "pixels",
                    "--image-size", 4, "--out", out, "--workers", 0)
    assert_clean_error(result, "train-labels-idx1-ubyte holds label 12, outside 0..9", out)


def test_manifest_listing_an_image_in_both_splits(tmp_path: Path) -> None:
    """Refused before, but as "has other bytes", which sent the user after an intact file."""
    pool = load_imagefolder(_tree(tmp_path / "data", train=2, test=1), False)
    manifest = build_manifest(pool)
    leak = SplitManifest(manifest.classes, {"train": manifest.splits["train"],
                                            "test": manifest.splits["test"] + manifest.splits["train"][:1]})
    with pytest.raises(FoalPipeError, match="lists image 'a/a00.png' in both splits") as info:
        apply_manifest(pool, leak, "leak.json")
    assert "other bytes" not in str(info.value)
