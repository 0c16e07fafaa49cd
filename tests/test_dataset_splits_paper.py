"""DTD and FGVCAircraft train on the paper's split (torchvision's ``train``: 40 DTD images a class, 3,334 aircraft),
and their ``-trainval`` names on the larger sets, from the same folders. No network and no real data: torchvision's
classes are replaced by fakes that record the arguments the loader passes and hold torchvision's split sizes."""

from __future__ import annotations

import json
import re
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from helpers import runner

from foal_pipe.cli import app
from foal_pipe.datasets.registry import DATASETS, open_dataset
from foal_pipe.errors import FoalPipeError
from foal_pipe.report.paper import paper_row

DOCS = Path(__file__).resolve().parent.parent / "docs" / "datasets.md"
#: torchvision's split sizes: DTD partition 1 has 40 images a class in each of train, val and test (47 classes);
#: FGVCAircraft's 100 variants have train 3,334, val 3,333, trainval 6,667 and test 3,333 images.
SIZES = {"DTD": ({"train": 1_880, "val": 1_880, "test": 1_880}, 47, "dtd"),
         "FGVCAircraft": ({"train": 3_334, "val": 3_333, "trainval": 6_667, "test": 3_333}, 100, "fgvc-aircraft-2013b")}


@pytest.fixture
def calls(monkeypatch) -> list[tuple[str, dict]]:
    """A fake ``torchvision.datasets`` with DTD and FGVCAircraft; the list of (class, kwargs) each opening passed.
    A split opened from a root without the dataset's folder fails as torchvision does (RuntimeError)."""
    made: list[tuple[str, dict]] = []

    def fake(cls: str) -> type:
        sizes, n_classes, folder = SIZES[cls]

        class Fake:
            def __init__(self, **kwargs):
                made.append((cls, kwargs))
                if not (Path(kwargs["root"]) / folder).is_dir():
                    raise RuntimeError("Dataset not found or corrupted. You can use download=True to download it")
                self.split = kwargs["split"]
                self._labels = [i % n_classes for i in range(sizes[self.split])]
                self.classes = [f"{cls}-{k}" for k in range(n_classes)]

            def __len__(self) -> int:
                return len(self._labels)

            def __getitem__(self, i: int) -> tuple[str, int]:
                return f"{self.split} {i}", self._labels[i]

        return Fake

    datasets = types.ModuleType("torchvision.datasets")
    datasets.DTD, datasets.FGVCAircraft = fake("DTD"), fake("FGVCAircraft")
    torchvision = types.ModuleType("torchvision")
    torchvision.datasets = datasets
    monkeypatch.setitem(sys.modules, "torchvision", torchvision)
    monkeypatch.setitem(sys.modules, "torchvision.datasets", datasets)
    return made


def _root(tmp_path: Path) -> Path:
    for folder in ("dtd/dtd", "fgvc-aircraft-2013b"):
        (tmp_path / folder).mkdir(parents=True)
    return tmp_path


@pytest.mark.parametrize(("name", "cls", "train_splits", "n_train", "n_test"), [
    ("dtd", "DTD", ["train"], 1_880, 1_880),
    ("dtd-trainval", "DTD", ["train", "val"], 3_760, 1_880),
    ("fgvc-aircraft", "FGVCAircraft", ["train"], 3_334, 3_333),
    ("fgvc-aircraft-trainval", "FGVCAircraft", ["trainval"], 6_667, 3_333),
])
def test_each_name_passes_its_split_to_torchvision(calls, tmp_path, name, cls, train_splits, n_train, n_test):
    root = _root(tmp_path)
    data = open_dataset(name, root)
    extra = {"annotation_level": "variant"} if cls == "FGVCAircraft" else {}
    assert calls == [(cls, {"root": str(root), "download": False, "split": split, **extra})
                     for split in [*train_splits, "test"]]
    assert (data.name, len(data.train), len(data.test), data.location) == (name, n_train, n_test, str(root))
    assert len(data.classes) == SIZES[cls][1] and data.classes[0] == f"{cls}-0"
    parts = [SIZES[cls][0][split] for split in train_splits]  # the parts in turn: labels and images
    np.testing.assert_array_equal(data.train.labels, np.concatenate([np.arange(n) % SIZES[cls][1] for n in parts]))
    assert data.train.load(n_train - 1) == f"{train_splits[-1]} {parts[-1] - 1}"
    open_dataset(name, root, download=True)
    assert calls[-1] == (cls, {"root": str(root), "download": True, "split": "test", **extra})


def test_the_old_names_read_the_papers_training_rows(calls, tmp_path):
    """The paper: DTD "40 training images and 40 testing images" a class, 40 classes kept (Table 2's 1,600 rows);
    FGVCAircraft "33 training images and 33 testing images on average" over 100 classes."""
    root = _root(tmp_path)
    dtd = open_dataset("dtd", root)
    per_class = np.bincount(dtd.train.labels)
    assert per_class.tolist() == [40] * 47 and per_class[:40].sum() == paper_row("dtd").n_train == 1_600
    assert np.bincount(dtd.test.labels)[:40].sum() == paper_row("dtd").n_test == 1_600
    fgvc = open_dataset("fgvc-aircraft", root)
    assert (len(fgvc.train), len(fgvc.test)) == (3_334, 3_333)
    assert round(len(fgvc.train) / len(fgvc.classes)) == round(len(fgvc.test) / len(fgvc.classes)) == 33
    trainval = open_dataset("dtd-trainval", root)  # twice the paper's data, the same test split
    assert len(trainval.train) == 2 * len(dtd.train) and np.array_equal(trainval.test.labels, dtd.test.labels)


def test_both_names_read_one_folder_and_say_so_when_it_is_missing(calls, tmp_path):
    for name in ("dtd", "dtd-trainval", "fgvc-aircraft", "fgvc-aircraft-trainval"):
        folder, size = ("dtd", "~600 MB") if name.startswith("dtd") else ("fgvc-aircraft-2013b", "~2.6 GB")
        assert DATASETS[name].locate(tmp_path) is None
        with pytest.raises(FoalPipeError) as refused:
            open_dataset(name, tmp_path)
        assert str(refused.value) == (f"{name} not found: looked for {tmp_path / folder} (torchvision's layout); pass "
                                      f"download=True to fetch it into {tmp_path} ({size}), or data_dir='DIR' where "
                                      f"DIR/{folder} exists")
        assert DATASETS[name].looks_in == f"~/datasets/{folder}; DIR/{folder}" and DATASETS[name].obtain == "--download"
    _root(tmp_path)
    found = {name: DATASETS[name].locate(tmp_path) for name in ("dtd", "dtd-trainval", "fgvc-aircraft",
                                                                 "fgvc-aircraft-trainval")}
    assert found == {"dtd": str(tmp_path / "dtd"), "dtd-trainval": str(tmp_path / "dtd"),
                     "fgvc-aircraft": str(tmp_path / "fgvc-aircraft-2013b"),
                     "fgvc-aircraft-trainval": str(tmp_path / "fgvc-aircraft-2013b")}


def test_datasets_command_lists_the_trainval_names(tmp_path):
    _root(tmp_path)
    result = runner.invoke(app, ["datasets", "--data-dir", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in json.loads(result.output)}
    torchvision = [name for name, row in rows.items() if row["source"] == "torchvision"]
    assert torchvision == ["cifar100", "dtd", "dtd-trainval", "fgvc-aircraft", "fgvc-aircraft-trainval", "country211"]
    assert {name: (rows[name]["classes"], rows[name]["found"]) for name in torchvision[1:5]} == {
        "dtd": (47, str(tmp_path / "dtd")), "dtd-trainval": (47, str(tmp_path / "dtd")),
        "fgvc-aircraft": (100, str(tmp_path / "fgvc-aircraft-2013b")),
        "fgvc-aircraft-trainval": (100, str(tmp_path / "fgvc-aircraft-2013b"))}
    table = runner.invoke(app, ["datasets"])
    listed = [line.split()[0] for line in table.output.splitlines()[1:] if line.strip() and line[0] != " "]
    assert listed == list(DATASETS) and {"dtd-trainval", "fgvc-aircraft-trainval"} <= set(listed)


def test_every_registered_dataset_has_a_docs_row():
    first_table = DOCS.read_text().split("\n| `--dataset` | source |", 1)[1].split("\n\n", 1)[0]
    rows = re.findall(r"^\| `([^`]+)` \| ([^|]+) \|", first_table, flags=re.M)
    assert [name for name, _ in rows] == list(DATASETS)
    source = dict(rows)
    assert "train / test (1,880 / 1,880" in source["dtd"] and "train + val / test (3,760 / 1,880)" in source["dtd-trainval"]
    assert "train / test (3,334 / 3,333" in source["fgvc-aircraft"]
    assert "trainval / test (6,667 / 3,333)" in source["fgvc-aircraft-trainval"]
