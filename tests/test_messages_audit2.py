"""The messages audit, second pass: a refused extract leaves no folder, messages that name a real way out, the
head models' predict score and the model checksum as documented, and the smaller `datasets` / `info` fixes."""

from __future__ import annotations

import csv
import io
import json
import re
import struct
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_one_line_error, build_store, invoke, make_image_tree, unit

from foal_pipe.store import open_store, write_store

DOCS = Path(__file__).resolve().parent.parent / "docs"


# --- 1. a refused extract creates no folder --------------------------------------------------------------------

def test_refused_extract_leaves_no_out_folders(tmp_path):
    (tmp_path / "kept").mkdir()
    for out in (tmp_path / "nd5" / "a" / "s.zarr", tmp_path / "kept" / "new" / "s.zarr"):
        result = invoke("extract", "--dataset", "imagefolder", "--data-dir", tmp_path / "nonexist", "--model", "pixels",
                        "--out", out)
        assert_one_line_error(result, "imagefolder dataset not found")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"]  # the folder that existed stays, empty
    assert list((tmp_path / "kept").iterdir()) == []


def _failing_download(monkeypatch):
    """torchvision's CIFAR100 as it behaves offline: it makes the root, then the download fails."""
    import os
    import urllib.error

    import torchvision.datasets

    class Offline:
        def __init__(self, root, download, **kwargs):
            os.makedirs(root, exist_ok=True)
            raise urllib.error.URLError("Name or service not known")

    monkeypatch.setattr(torchvision.datasets, "CIFAR100", Offline)


def test_failed_download_leaves_no_data_dir_folders(tmp_path, monkeypatch):
    _failing_download(monkeypatch)
    result = invoke("extract", "--dataset", "cifar100", "--data-dir", tmp_path / "dl" / "a" / "b", "--download",
                    "--model", "pixels", "--out", tmp_path / "c.zarr")
    assert_one_line_error(result, "downloading cifar100 into")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "home").mkdir()  # the default data dir, ~/datasets
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    result = invoke("extract", "--dataset", "cifar100", "--download", "--model", "pixels", "--out", tmp_path / "c.zarr")
    assert_one_line_error(result, f"downloading cifar100 into {tmp_path / 'home' / 'datasets'} failed")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home"] and list((tmp_path / "home").iterdir()) == []


# --- 2. predict on a continued model's new store names a way out that works --------------------------------------

def test_continued_model_store_refusal_names_a_working_way_out(tmp_path):
    import foal_pipe

    rng = np.random.default_rng(0)

    def store(name, classes):
        y = np.repeat(np.arange(len(classes)), 9)
        x = rng.normal(size=(y.size, 6)) + 3 * np.eye(6)[y + (0 if name == "a" else 3)]
        return write_store(tmp_path / f"{name}.zarr", (x, y), (x[::2], y[::2]), classes, chunk_rows=8, dtype="float64")

    a, b = store("a", ["cat", "dog", "emu"]), store("b", ["fox", "gnu"])
    for args in (("--features", a, "--out", tmp_path / "run_a"),
                 ("--init-model", tmp_path / "run_a" / "model.safetensors", "--features", b, "--out", tmp_path / "run_b")):
        assert invoke("learn", *args, "--tasks", 1, "--projection-dim", 20, "--gamma", 0.5).exit_code == 0
    model = tmp_path / "run_b" / "model.safetensors"
    result = invoke("predict", "--model", model, "--features", b)
    assert_one_line_error(result, "label 0 is 'cat' in the model but 'fox' in", "`predict --images`",
                          "`evaluate --run`", "DeployedModel.store_predictions")
    assert "use a store with the model's class order" not in result.output
    deployed = foal_pipe.load_model(model)  # the way out named: classes matched by name
    true, predicted = deployed.store_predictions(b)
    names = np.array(deployed.class_names)
    stored = np.array(["fox", "gnu"])[np.asarray(open_store(b).split("test").labels)]
    assert list(names[true]) == list(stored)
    assert (names[predicted] == stored).mean() > 0.8


# --- 3. an incomplete cifar100 folder is named as such, and not found by `datasets` --------------------------------

def test_incomplete_cifar100_is_named_and_not_found(tmp_path):
    folder = tmp_path / "dd" / "cifar-100-python"
    folder.mkdir(parents=True)
    (folder / "meta").write_bytes(b"")
    result = invoke("extract", "--dataset", "cifar100", "--data-dir", tmp_path / "dd", "--model", "pixels",
                    "--out", tmp_path / "c.zarr")
    assert_one_line_error(result, f"cifar100 at {folder} is incomplete: it lacks train, test;", "--download")
    listed = invoke("datasets", "--data-dir", tmp_path / "dd", "--json")
    assert {r["name"]: r["found"] for r in json.loads(listed.output)}["cifar100"] is None
    for name in ("train", "test"):
        (folder / name).write_bytes(b"")
    result = invoke("extract", "--dataset", "cifar100", "--data-dir", tmp_path / "dd", "--model", "pixels",
                    "--out", tmp_path / "c.zarr")
    assert_one_line_error(result, f"cifar100 at {folder} is damaged: torchvision refused it")
    listed = invoke("datasets", "--data-dir", tmp_path / "dd", "--json")
    assert {r["name"]: r["found"] for r in json.loads(listed.output)}["cifar100"] == str(folder)
    assert not (tmp_path / "c.zarr").exists()


# --- 4. predict's score for a head model is documented, and is what the CSV holds ---------------------------------

def test_head_predict_scores_are_the_documented_ones(tmp_path):
    store = build_store(tmp_path / "s.zarr", n_train=120, n_test=40, chunk=32)
    data = open_store(store)
    X, y = np.asarray(data.split("train").features[:], np.float64), np.asarray(data.split("train").labels[:])
    T = np.asarray(data.split("test").features[:], np.float64)
    classes = np.unique(y)
    means = np.array([unit(X)[y == c].mean(axis=0) for c in classes])
    prototypes = unit(np.array([X[y == c].mean(axis=0) for c in classes]))
    documented = {"ncm": -((unit(T)[:, None, :] - means[None]) ** 2).sum(axis=2),  # minus the squared distance
                  "cosine": unit(T) @ prototypes.T}
    for head, scores in documented.items():
        out = tmp_path / head
        assert invoke("learn", "--features", store, "--out", out, "--tasks", 3, "--head", head).exit_code == 0
        result = invoke("predict", "--model", out / "model.safetensors", "--features", store, "--out", out / "p.csv")
        assert result.exit_code == 0, result.output
        rows = list(csv.DictReader(io.StringIO((out / "p.csv").read_text())))
        np.testing.assert_allclose([float(r["score"]) for r in rows], scores.max(axis=1), rtol=1e-9, atol=1e-12)
    page = (DOCS / "cli.md").read_text()
    section = page[page.index("## `foal-pipe predict`"):page.index("## `foal-pipe evaluate`")]
    for head in ("ridge", "balanced", "dual", "ncm", "fecam", "slda", "cosine"):
        assert f"`{head}`" in section, head
    assert "minus the squared distance to the class mean" in section and "the cosine to the class prototype" in section
    assert "another head's own score" in (DOCS / "deploy.md").read_text()


# --- 5. the checksum recipe of model-file.md, run as written -------------------------------------------------------

def test_model_file_checksum_recipe_reproduces_the_checksum(tmp_path):
    rng = np.random.default_rng(1)
    y = np.repeat(np.arange(3), 6)
    x = rng.normal(size=(y.size, 5)) + y[:, None]
    store = write_store(tmp_path / "s.zarr", (x, y), (x, y), ["café", "naïve", "ü|x"], chunk_rows=8, dtype="float64")
    assert invoke("learn", "--features", store, "--out", tmp_path / "run", "--tasks", 1, "--projection-dim", 12,
                  "--gamma", 0.5).exit_code == 0
    page = (DOCS / "model-file.md").read_text()
    code = next(block for block in re.findall(r"```python\n(.*?)```", page, re.S) if "def model_checksum" in block)
    namespace: dict = {}
    exec(code, namespace)
    path = tmp_path / "run" / "model.safetensors"
    raw = path.read_bytes()
    stored = json.loads(json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])["__metadata__"]["checksum"])
    assert namespace["model_checksum"](path) == stored
    assert '`"gamma":"0.5"`' in page and "JSON-encoded twice" in page


# --- 6. the nits: `datasets` defaults, `info` -----------------------------------------------------------------------

def test_datasets_lists_the_default_locations():
    from foal_pipe.cli.datasets import dataset_rows

    looks = {row["name"]: row["looks_in"] for row in dataset_rows(None)}
    assert looks["core50"].startswith("~/datasets/core50_128x128; ")
    assert looks["tiny-imagenet"].startswith("~/datasets/tiny-imagenet-200; ")
    assert looks["cifar100"] == "~/datasets/cifar-100-python; DIR/cifar-100-python"


def test_info_shows_model_kwargs(tmp_path):
    encoder = {"name": "vit_tiny_patch16_224", "fusion": "none", "image_size": 32, "normalize": False,
               "model_kwargs": {"depth": 2, "embed_dim": 32}}
    store = build_store(tmp_path / "s.zarr", n_train=100, n_test=40, chunk=32, attrs={"encoder": encoder})
    result = invoke("info", store)
    assert result.exit_code == 0, result.output
    assert "vit_tiny_patch16_224 with --model-kwargs depth=2,embed_dim=32" in result.output


def test_info_counts_one_problem_in_the_singular(tmp_path):
    store = build_store(tmp_path / "s.zarr", n_train=100, n_test=40, chunk=32)
    chunk = next(p for p in sorted((store / "train" / "features").rglob("*")) if p.is_file() and p.name != "zarr.json")
    chunk.unlink()
    result = invoke("info", store)
    assert result.exit_code == 1
    assert re.search(r"damaged\s+1 problem \(", result.output), result.output


def test_info_usage_names_store():
    usage = invoke("info", "--help").output
    assert "{store}" not in usage and "STORE" in usage


def test_info_export_manifest_says_where_it_wrote(tmp_path):
    tree = make_image_tree(tmp_path / "images", {"cat": 3, "dog": 3}, test_per_class=1)
    assert invoke("extract", "--dataset", "imagefolder", "--data-dir", tree, "--model", "pixels", "--image-size", 8,
                  "--out", tmp_path / "s.zarr").exit_code == 0
    result = invoke("info", tmp_path / "s.zarr", "--export-manifest", tmp_path / "m.json")
    assert result.exit_code == 0, result.output
    assert f"wrote {tmp_path / 'm.json'}" in result.output and (tmp_path / "m.json").is_file()


def test_synthetic_make_store_docstring_names_no_old_format():
    import importlib.util

    spec = importlib.util.spec_from_file_location("synthetic", DOCS.parent / "benchmarks" / "synthetic.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert "format 4" not in module.make_store.__doc__


def test_synthetic_make_store_writes_a_split_whose_labels_are_all_zero(tmp_path):
    """zarr skips a chunk equal to its fill value: a one-row test split of label 0 was a missing chunk file."""
    import importlib.util

    from foal_pipe.store import open_store

    spec = importlib.util.spec_from_file_location("synthetic", DOCS.parent / "benchmarks" / "synthetic.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    store = module.make_store(tmp_path / "one.zarr", 200, 1, chunk=64, n_classes=4, dim=16)  # its test label is 0
    assert open_store(store).test.labels.tolist() == [0]


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
