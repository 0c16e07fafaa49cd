"""The registered benchmarks: CUB-200-2011 as its archive unpacks, and the PTM-CIL train/ and test/ folders, read from
miniature archives with the full class count (one or two tiny images per class), their class names and split; a
wrong class count refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import runner
from PIL import Image

from foal_pipe.cli import app
from foal_pipe.datasets.registry import DATASETS, open_dataset
from foal_pipe.errors import FoalPipeError

BENCHMARKS = {"cub200": 200, "imagenet-r": 200, "imagenet-a": 200, "objectnet": 200, "omnibenchmark": 300, "vtab": 50}


def _image(path: Path, k: int) -> None:
    """A 4x4 image whose colour encodes ``k`` (distinct files), PNG or JPEG by the suffix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (4, 4), (k % 256, k // 256 % 256, 7)).save(path)


def make_cub(root: Path, n_classes: int = 200) -> dict[str, list[tuple[str, int]]]:
    """CUB_200_2011/ with ``classes.txt``, ``images.txt``, ``image_class_labels.txt``, ``train_test_split.txt`` and
    ``images/<NNN.Name>/``: class c has c % 3 + 2 images, its first one a test image. Returns each split's
    (relative path, label) in image-id order."""
    names = [f"{c + 1:03d}.Bird_{c}" for c in range(n_classes)]
    rows: dict[str, list[tuple[str, int]]] = {"train": [], "test": []}
    images, labels, split = [], [], []
    image_id = 0
    for c, name in enumerate(names):
        for i in range(c % 3 + 2):
            image_id += 1
            rel = f"{name}/Bird_{c}_{i:04d}.jpg"
            _image(root / "images" / rel, image_id)
            images.append(f"{image_id} {rel}")
            labels.append(f"{image_id} {c + 1}")
            split.append(f"{image_id} {int(i > 0)}")
            rows["train" if i > 0 else "test"].append((rel, c))
    (root / "classes.txt").write_text("".join(f"{k + 1} {n}\n" for k, n in enumerate(names)))
    for name, lines in (("images.txt", images), ("image_class_labels.txt", labels), ("train_test_split.txt", split)):
        (root / name).write_text("\n".join(lines) + "\n")
    return rows


def make_ptm_cil(root: Path, n_classes: int, test_classes: int | None = None) -> list[str]:
    """``root/train/<class>/`` (2 images each, class 0 a third) and ``root/test/<class>/`` (1 image each, PNG and
    JPEG), class folders named like ImageNet wnids; returns the class names in sorted order."""
    classes = [f"n{10_000_000 + 7 * c:08d}" for c in range(n_classes)]
    k = 0
    for c, name in enumerate(classes):
        for i in range(3 if c == 0 else 2):
            k += 1
            _image(root / "train" / name / f"{name}_{i}.{'jpg' if i else 'png'}", k)
    for name in classes[: n_classes if test_classes is None else test_classes]:
        k += 1
        _image(root / "test" / name / f"{name}_t.png", k)
    return sorted(classes)


def test_every_benchmark_is_registered_with_its_class_count():
    assert {name: DATASETS[name].classes for name in BENCHMARKS} == BENCHMARKS
    for name in BENCHMARKS:
        assert DATASETS[name].locate is not None and "DIR" in DATASETS[name].looks_in


def test_cub200_reads_the_archive_with_its_official_split_and_class_names(tmp_path):
    rows = make_cub(tmp_path / "CUB_200_2011")
    for data_dir in (tmp_path, tmp_path / "CUB_200_2011"):  # DIR/CUB_200_2011 or DIR itself
        data = open_dataset("cub200", data_dir)
        assert data.name == "cub200" and len(data.classes) == 200
        assert data.classes[0] == "001.Bird_0" and data.classes[199] == "200.Bird_199"
        for split in ("train", "test"):
            source = data.split(split)
            expected = rows[split]
            assert len(source) == len(expected)
            assert [Path(p).relative_to(tmp_path / "CUB_200_2011" / "images").as_posix() for p in source.paths] == \
                [rel for rel, _ in expected]
            np.testing.assert_array_equal(source.labels, [label for _, label in expected])
    assert len(data.test) == 200 and len(data.train) == sum(c % 3 + 1 for c in range(200))
    assert DATASETS["cub200"].locate(tmp_path) == str(tmp_path / "CUB_200_2011")


def test_cub200_refuses_a_wrong_class_count_and_a_missing_image(tmp_path):
    root = tmp_path / "CUB_200_2011"
    make_cub(root, n_classes=199)
    with pytest.raises(FoalPipeError, match=r"classes.txt lists 199 classes, but CUB-200-2011 has 200"):
        open_dataset("cub200", tmp_path)
    make_cub(root)
    (root / "images" / "007.Bird_6" / "Bird_6_0001.jpg").unlink()
    with pytest.raises(FoalPipeError, match=r"Bird_6_0001.jpg is missing \(images.txt lists it\)"):
        open_dataset("cub200", tmp_path)
    with pytest.raises(FoalPipeError, match=r"CUB-200-2011 not found: .*CUB_200_2011.tgz"):
        open_dataset("cub200", tmp_path / "elsewhere")


@pytest.mark.parametrize("name", ["imagenet-r", "imagenet-a", "objectnet", "omnibenchmark", "vtab"])
def test_ptm_cil_benchmark_reads_train_and_test_folders(tmp_path, name):
    folder = "vtab-cil/vtab" if name == "vtab" else name  # where LAMDA-PILOT's utils/data.py reads it
    classes = make_ptm_cil(tmp_path / folder, BENCHMARKS[name])
    data = open_dataset(name, tmp_path)
    assert data.name == name and data.classes == classes and data.location == str(tmp_path / folder)
    assert len(data.train) == 2 * len(classes) + 1 and len(data.test) == len(classes)
    np.testing.assert_array_equal(data.train.labels, np.r_[0, np.repeat(np.arange(len(classes)), 2)])
    np.testing.assert_array_equal(data.test.labels, np.arange(len(classes)))
    assert all(f"/train/{classes[y]}/" in p for p, y in zip(data.train.paths, data.train.labels))
    assert all(f"/test/{classes[y]}/" in p for p, y in zip(data.test.paths, data.test.labels))
    assert DATASETS[name].locate(tmp_path) == str(tmp_path / folder)


def test_ptm_cil_refuses_a_wrong_class_count_and_unmatched_folders(tmp_path):
    make_ptm_cil(tmp_path / "imagenet-r", 199)
    with pytest.raises(FoalPipeError, match=r"ImageNet-R at .* has 199 class folders in train/, but the benchmark has "
                                            r"200; unpack the whole archive"):
        open_dataset("imagenet-r", tmp_path)
    make_ptm_cil(tmp_path / "omnibenchmark", 300)
    for image in (tmp_path / "omnibenchmark" / "test" / "n10000007").iterdir():
        image.unlink()
    with pytest.raises(FoalPipeError, match=r"OmniBenchmark at .*: test/n10000007 holds no images \(1 empty class "
                                            r"folder in test/\); unpack the whole archive again"):
        open_dataset("omnibenchmark", tmp_path)
    make_ptm_cil(tmp_path / "objectnet", 200, test_classes=198)
    with pytest.raises(FoalPipeError, match=r"test/ and train/ hold different class folders \(.* 2 in all\)"):
        open_dataset("objectnet", tmp_path)
    with pytest.raises(FoalPipeError, match=r"VTAB not found: looked for train/<class>/ and test/<class>/ folders in "
                                            r".*vtab-cil/vtab or .*; download the archive linked from LAMDA-PILOT"):
        open_dataset("vtab", tmp_path)
    assert DATASETS["vtab"].locate(tmp_path) is None


def test_datasets_command_lists_every_dataset_and_where_each_is_found(tmp_path):
    result = runner.invoke(app, ["datasets"])
    assert result.exit_code == 0, result.output
    listed = [line.split()[0] for line in result.output.splitlines()[1:] if line.strip() and line[0] != " "]
    assert listed == list(DATASETS)
    make_cub(tmp_path / "CUB_200_2011", n_classes=3)  # found: the count is checked when it is read, not listed
    make_ptm_cil(tmp_path / "imagenet-r", 2)
    result = runner.invoke(app, ["datasets", "--data-dir", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in json.loads(result.output)}
    assert list(rows) == list(DATASETS)
    assert {name: row["classes"] for name, row in rows.items() if name in BENCHMARKS} == BENCHMARKS
    found = {name: row["found"] for name, row in rows.items()}
    assert found["cub200"] == str(tmp_path / "CUB_200_2011") and found["imagenet-r"] == str(tmp_path / "imagenet-r")
    assert found["digits"] == "scikit-learn (bundled)" and found["imagefolder"] == "-" and found["hdf5"] == "-"
    assert {name for name, where in found.items() if where is None} == set(DATASETS) - {
        "cub200", "imagenet-r", "digits", "imagefolder", "images", "hdf5"}
    table = runner.invoke(app, ["datasets", "--data-dir", str(tmp_path)])
    lines = {line.split()[0]: line for line in table.output.splitlines() if line.strip()}
    assert lines["imagenet-r"].rstrip().endswith(str(tmp_path / "imagenet-r")) and lines["vtab"].rstrip().endswith("no")
