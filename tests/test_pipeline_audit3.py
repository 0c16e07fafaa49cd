"""The pipeline audit's third fault: `dvc repro` did not rerun extract@NAME when the images it reads (or the checkpoint
file) changed, so every later result was silently stale. settings@NAME now writes a fingerprint of those inputs into
extract.settings.json on every `dvc repro` (docs/pipeline.md, "What reruns")."""

from __future__ import annotations

import json
import os
import shutil
import time

import numpy as np
import pytest
import yaml
from helpers import read, stage_module
from test_pipeline import _dvc, _env, _fresh_clone, _ran, _run

SHAPES = {"dataset": "imagefolder", "extract": {"data_dir": "data/shapes", "test_split": 0.25, "image_size": 8}}


def _png(path, seed: int) -> None:
    from PIL import Image

    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(path)


def _fingerprint_module():
    """stages/settings.py as a module."""
    return stage_module("settings")


def _inputs(tmp_path, extract: dict, dataset: str = "imagefolder") -> dict:
    """What settings@NAME records of the extraction's inputs for these `extract` settings, run in ``tmp_path``."""
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        return _fingerprint_module().extract_inputs({"dataset": dataset, "extract": extract})
    finally:
        os.chdir(cwd)


def test_the_fingerprint_follows_every_change_of_the_images_and_checkpoint(tmp_path):
    """Added, removed, replaced (same size) and renamed images and a replaced checkpoint each change the fingerprint; a
    second look at an unchanged tree gives the same one; digits, and a folder that is not there, record nothing."""
    folder = tmp_path / "data/shapes"
    for cls in ("a", "b"):
        (folder / cls).mkdir(parents=True)
        for i in range(3):
            _png(folder / cls / f"{i}.png", 10 * ord(cls) + i)
    (tmp_path / "w.safetensors").write_bytes(b"weights-1")
    extract = {"data_dir": "data/shapes", "checkpoint": "w.safetensors"}
    first = _inputs(tmp_path, extract)
    assert set(first) == {"data_dir", "checkpoint"} and len(first["data_dir"]["sha256"]) == 64
    assert first["data_dir"]["path"] == "data/shapes" and first["data_dir"]["files"] == 6
    assert _inputs(tmp_path, extract) == first

    seen = [first]

    def changed() -> None:
        now = _inputs(tmp_path, extract)
        assert now not in seen, now
        seen.append(now)

    image = folder / "a" / "0.png"
    stat = image.stat()
    _png(image, 999)  # same size, new bytes: its modification time tells
    os.utime(image, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert image.stat().st_size == stat.st_size
    changed()
    _png(folder / "b" / "3.png", 7)  # added
    changed()
    (folder / "b" / "3.png").unlink()  # removed: the same files as before, but the fingerprint of that tree was seen
    assert _inputs(tmp_path, extract) == seen[1]
    (folder / "b" / "2.png").rename(folder / "b" / "9.png")  # renamed
    changed()
    (tmp_path / "w.safetensors").write_bytes(b"weights-22")  # the checkpoint replaced
    changed()
    assert _inputs(tmp_path, {"data_dir": None, "checkpoint": None}, dataset="digits") == {}
    assert _inputs(tmp_path, {"data_dir": "nowhere", "checkpoint": None}) == {}  # extract says it is missing


def test_a_datasets_default_place_is_fingerprinted(tmp_path, monkeypatch):
    """No data_dir: the folder the registry looks in (core50's ~/datasets/core50_128x128), once it is there."""
    monkeypatch.setenv("HOME", str(tmp_path))
    extract = {"data_dir": None, "checkpoint": None}
    assert _inputs(tmp_path, extract, dataset="core50") == {}
    folder = tmp_path / "datasets/core50_128x128/s1/o1"
    folder.mkdir(parents=True)
    _png(folder / "C_01_01_000.png", 1)
    found = _inputs(tmp_path, extract, dataset="core50")
    assert found["data_dir"]["path"] == str(tmp_path / "datasets/core50_128x128") and found["data_dir"]["files"] == 1


@pytest.mark.slow
def test_changed_images_rerun_extract_and_an_unchanged_tree_does_not(tmp_path):
    """Repro, replace one image: `dvc repro` reruns extract@shapes and what follows, and one row of the store changes;
    a repro without change reruns settings@shapes alone, never extract."""
    repo = _fresh_clone(tmp_path / "clone")
    env = _env(repo)
    _run([_dvc(), "config", "core.analytics", "false"], repo, env)
    folder = repo / "data/shapes"
    for c, cls in enumerate(("a", "b")):
        (folder / cls).mkdir(parents=True)
        for i in range(4):
            _png(folder / cls / f"{i}.png", 10 * c + i)
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["datasets"] = {"shapes": SHAPES}
    params["learn"].update(tasks=2, projection_dim=16)
    params["sweep"]["gammas"] = [1.0]
    params["table"].update(heads=["ncm"], order_seeds=[0], tasks=[2])
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    stages = {f"{s}@shapes" for s in ("settings", "extract", "learn", "sweep", "evaluate", "table")}

    first = _run([_dvc(), "repro"], repo, env)
    assert _ran(first) == stages, first.stdout
    store = repo / "data/features/shapes.zarr"
    before = read(store)

    _png(folder / "b" / "2.png", 99)  # one image, new pixels: its row of the store changes, and no other
    changed = _run([_dvc(), "repro"], repo, env)
    assert _ran(changed) == stages, changed.stdout
    after = read(store)
    rows = [np.vstack([split[0], split[2]]) for split in (before, after)]
    assert rows[0].shape == rows[1].shape == (8, 192)
    assert int((rows[0] != rows[1]).any(axis=1).sum()) == 1

    again = _run([_dvc(), "repro"], repo, env)
    assert _ran(again) == {"settings@shapes"}, again.stdout
    assert json.loads(_run([_dvc(), "status", "--json"], repo, env).stdout) == {"settings@shapes": ["always changed"]}
    assert all(np.array_equal(x, y) for x, y in zip(read(store), after))

    # `dvc status` runs nothing: it names extract@shapes once settings@shapes has looked (docs/pipeline.md)
    (folder / "a" / "0.png").unlink()
    assert json.loads(_run([_dvc(), "status", "--json"], repo, env).stdout) == {"settings@shapes": ["always changed"]}
    _run([_dvc(), "repro", "settings@shapes"], repo, env)
    status = json.loads(_run([_dvc(), "status", "--json"], repo, env).stdout)
    assert status["extract@shapes"] == [{"changed deps": {"runs/shapes-settings/extract.settings.json": "modified"}}]


def test_a_file_replaced_with_its_old_size_and_modification_time_changes_the_fingerprint(tmp_path):
    """``cp -p`` or ``rsync -t`` of a same-sized file over an image leaves size and modification time as they were:
    the change time, which no user sets, still tells (the extraction would otherwise keep the old features)."""
    folder = tmp_path / "data/shapes/a"
    folder.mkdir(parents=True)
    image, other = folder / "0.png", tmp_path / "other.png"
    image.write_bytes(b"a" * 100)
    extract = {"data_dir": "data/shapes", "checkpoint": None}
    first = _inputs(tmp_path, extract)
    stat = image.stat()
    other.write_bytes(b"b" * 100)
    os.utime(other, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    time.sleep(0.05)  # a change time the filesystem's clock tells from the first
    shutil.copy2(other, image)  # as cp -p: the bytes, then the source's times
    assert (image.stat().st_size, image.stat().st_mtime_ns, image.read_bytes()) == (100, stat.st_mtime_ns, b"b" * 100)
    assert _inputs(tmp_path, extract) != first
