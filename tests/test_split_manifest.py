"""Split manifests: a store records the images of each split with their SHA-256; `extract --split-manifest` reuses
another store's split exactly (from the store or its exported JSON) and refuses missing or changed images."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr
from helpers import assert_one_line_error, make_image_tree, runner

from foal_pipe.cli import app
from foal_pipe.extract.manifest import read_manifest
from foal_pipe.store import open_store, read_meta, write_store

PIXELS = ["--model", "pixels", "--image-size", "8", "--workers", "0"]


def _extract(*args: str | Path):
    return runner.invoke(app, ["extract", *PIXELS, *map(str, args)])


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _features(store: Path, split: str) -> np.ndarray:
    return np.asarray(zarr.open_group(str(store), mode="r")[f"{split}/features"][:])


@pytest.fixture
def photos(tmp_path: Path) -> Path:
    """One folder per class, no split: the images lab A splits with --test-split."""
    return make_image_tree(tmp_path / "photos", {"ant": 4, "bee": 5, "cow": 3}, split=False)


def test_a_store_records_each_splits_images_by_name_and_sha256(tmp_path, photos):
    result = _extract("--dataset", "imagefolder", "--data-dir", photos, "--test-split", "0.4", "--out", tmp_path / "a.zarr")
    assert result.exit_code == 0, result.output
    store = open_store(tmp_path / "a.zarr")
    manifest = read_manifest(tmp_path / "a.zarr")
    assert manifest.classes == ("ant", "bee", "cow")
    for split in ("train", "test"):
        entries = manifest.splits[split]
        np.testing.assert_array_equal([label for _, _, label in entries], store.split(split).labels)
        for name, digest, label in entries:
            assert name.startswith(f"{manifest.classes[label]}/") and digest == _sha256(photos / name)
    listed = sorted(name for split in ("train", "test") for name, _, _ in manifest.splits[split])
    assert listed == sorted(p.relative_to(photos).as_posix() for p in photos.rglob("*.png"))
    assert len(manifest.splits["test"]) == 2 + 2 + 1  # 0.4 of 4, 5, 3 images, rounded half up
    _, meta = read_meta(tmp_path / "a.zarr")
    assert meta.format_version == 5 and meta.extra["manifest"]["sha256"] == manifest.sha256
    info = runner.invoke(app, ["info", str(tmp_path / "a.zarr"), "--export-manifest", str(tmp_path / "m.json")])
    assert info.exit_code == 0 and f"sha256 {manifest.sha256[:12]}" in info.output, info.output
    exported = json.loads((tmp_path / "m.json").read_text())
    assert exported["format"] == "foal-pipe/split-manifest" and exported["classes"] == ["ant", "bee", "cow"]
    assert exported["test"] == [[name, _sha256(photos / name), label] for name, _, label in manifest.splits["test"]]


def test_split_manifest_reuses_another_labs_split_exactly(tmp_path, photos):
    """Lab A splits its folder with a seed; lab B holds the same images in its own train/ and test/ folders (another
    split) plus one image A never had. From A's store, or A's exported manifest, B gets A's split: the same rows,
    labels and features, the same manifest, and the same attributes but the recorded source folder and A's seed."""
    a = tmp_path / "a.zarr"
    assert _extract("--dataset", "imagefolder", "--data-dir", photos, "--test-split", "0.3", "--split-seed", "4",
                    "--out", a).exit_code == 0
    lab_b = tmp_path / "lab_b"
    for k, image in enumerate(sorted(photos.rglob("*.png"))):
        target = lab_b / ("test" if k % 2 else "train") / image.relative_to(photos)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(image, target)
    make_image_tree(tmp_path / "extra", {"ant": 1}, test_per_class=0)
    shutil.copyfile(tmp_path / "extra" / "train" / "ant" / "img000.png", lab_b / "train" / "ant" / "new.png")
    runner.invoke(app, ["info", str(a), "--export-manifest", str(tmp_path / "a.json")])
    for source, out in ((a, tmp_path / "b.zarr"), (tmp_path / "a.json", tmp_path / "b2.zarr")):
        result = _extract("--dataset", "imagefolder", "--data-dir", lab_b, "--split-manifest", source, "--out", out)
        assert result.exit_code == 0, result.output
        assert read_manifest(out).to_bytes() == read_manifest(a).to_bytes()
        for split in ("train", "test"):
            np.testing.assert_array_equal(open_store(out).split(split).labels, open_store(a).split(split).labels)
            np.testing.assert_array_equal(_features(out, split), _features(a, split))
        mine, theirs = (read_meta(path)[1].to_dict() for path in (out, a))
        assert theirs["extract"].pop("test_split") == {"test_fraction": 0.3, "seed": 4}  # how A drew it; B reads a list
        assert {k: v for k, v in mine.items() if k not in ("source", "generation")} == \
            {k: v for k, v in theirs.items() if k not in ("source", "generation")}
    again = _extract("--dataset", "imagefolder", "--data-dir", lab_b, "--split-manifest", a, "--out", tmp_path / "b.zarr")
    assert again.exit_code == 0 and "already complete" in again.output, again.output


def test_split_manifest_refuses_missing_or_changed_images_and_leaves_nothing(tmp_path, photos):
    a = tmp_path / "a.zarr"
    assert _extract("--dataset", "imagefolder", "--data-dir", photos, "--test-split", "0.5", "--out", a).exit_code == 0
    copy = tmp_path / "copy"
    shutil.copytree(photos, copy)
    (copy / "bee" / "img003.png").unlink()
    out = tmp_path / "b.zarr"
    assert_one_line_error(_extract("--dataset", "imagefolder", "--data-dir", copy, "--split-manifest", a, "--out", out),
                          "1 image of the split manifest", "'bee/img003.png') is not in", "point --data-dir at the "
                          "images the manifest lists")
    shutil.copyfile(photos / "bee" / "img003.png", copy / "bee" / "img003.png")
    shutil.copyfile(photos / "ant" / "img000.png", copy / "cow" / "img001.png")  # other bytes, same name
    assert_one_line_error(_extract("--dataset", "imagefolder", "--data-dir", copy, "--split-manifest", a, "--out", out),
                          "image 'cow/img001.png' of the split manifest", "has other bytes in", "than the manifest "
                          "records; restore the original file")
    assert not out.exists() and not list(tmp_path.glob(".b.zarr*"))
    assert_one_line_error(_extract("--dataset", "imagefolder", "--data-dir", photos, "--split-manifest", a,
                                   "--test-split", "0.5", "--out", out), "--split-manifest lists the split itself; "
                          "drop --test-split")
    assert_one_line_error(_extract("--dataset", "digits", "--split-manifest", a, "--out", out),
                          "--split-manifest splits image files; digits is not read from image files")
    (tmp_path / "bad.json").write_text('{"format": "x"}')
    assert_one_line_error(_extract("--dataset", "imagefolder", "--data-dir", photos, "--split-manifest",
                                   tmp_path / "bad.json", "--out", out), "is not a split manifest")
    rng = np.random.default_rng(0)
    plain = write_store(tmp_path / "plain.zarr", (rng.normal(size=(4, 2)), np.arange(4) % 2),
                        (rng.normal(size=(2, 2)), np.arange(2)), ["x", "y"])
    assert_one_line_error(_extract("--dataset", "imagefolder", "--data-dir", photos, "--split-manifest", plain,
                                   "--out", out), "records no split manifest")
    assert not out.exists()
    assert_one_line_error(runner.invoke(app, ["info", str(plain), "--export-manifest", str(tmp_path / "p.json")]),
                          "plain.zarr records no split manifest")
    assert not (tmp_path / "p.json").exists()


def test_a_changed_image_is_noticed_where_its_features_are_written(tmp_path, image_tree):
    """The same command over an image edited since its row was written is refused; an image replaced in rows not
    written yet (an unreadable file fixed before resuming) is taken, and the manifest records the new file."""
    out = tmp_path / "s.zarr"
    assert _extract("--dataset", "imagefolder", "--data-dir", image_tree, "--out", out).exit_code == 0
    image = image_tree / "test" / "dog" / "img001.png"
    original = image.read_bytes()
    image.write_bytes((image_tree / "test" / "cat" / "img000.png").read_bytes())
    assert_one_line_error(_extract("--dataset", "imagefolder", "--data-dir", image_tree, "--out", out),
                          "s.zarr was extracted from other images: test row 3 holds the features of 'dog/img001.png' "
                          f"(SHA-256 {hashlib.sha256(original).hexdigest()[:12]}...), now 'dog/img001.png' (SHA-256 "
                          f"{_sha256(image)[:12]}...); restore the original images, or pass --overwrite")
    image.write_bytes(original)
    again = _extract("--dataset", "imagefolder", "--data-dir", image_tree, "--out", out)
    assert again.exit_code == 0 and "already complete" in again.output, again.output


def test_an_in_memory_dataset_names_rows_by_dataset_index_and_hashes_their_pixels():
    from sklearn.datasets import load_digits

    from foal_pipe.datasets.manifest import build_manifest
    from foal_pipe.datasets.registry import open_dataset

    data = open_dataset("digits")
    manifest = build_manifest(data)
    pixels = np.rint(load_digits().images * (255.0 / 16.0)).astype(np.uint8)
    test = manifest.splits["test"]
    assert [int(name) for name, _, _ in test] == data.test.index.tolist() and len(test) == 355
    for name, digest, label in test[:20]:
        image = pixels[int(name)]
        assert digest == hashlib.sha256(b"|u1(8, 8)" + image.tobytes()).hexdigest()
        assert label == load_digits().target[int(name)]
