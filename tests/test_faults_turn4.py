"""Issue 34's outside faults, each wrong on main (7ced068) and refused or handled here.

Before: a symlinked `--out` was replaced by a real folder that took the target's files (data loss), and with the
target on another filesystem the run failed on EXDEV and left temporaries that failed every later run (torn);
`learn --projection-dim 10000000` drew the projection before the memory check (hang, or a MemoryError
traceback); `learn --init-model` on the same data re-extracted with another `--chunk-rows` or `--dtype` learned
every row twice; a store or model file whose declared version was edited down skipped its integrity records;
`write_store` deleted a look-alike store folder holding a user's file.
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

import helpers
import numpy as np
import pytest
from typer.testing import CliRunner

from foal_pipe.cli import app
from foal_pipe.extract import ExtractSpec, run_extract
from foal_pipe.store import write_store

runner = CliRunner()
CLASSES = ["a", "b", "c", "d"]
assert_one_line_error = partial(helpers.assert_one_line_error, after_notes=True)


def _data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = np.tile(np.arange(4), n // 4)
    return (rng.normal(size=(n, 6)) + 3 * y[:, None]).astype(np.float32), y


@pytest.fixture
def store(tmp_path) -> Path:
    return write_store(tmp_path / "s.zarr", _data(128, 0), _data(64, 1), CLASSES, chunk_rows=32)


def _invoke(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def _learn(store: Path, out: Path, *extra: object):
    return _invoke("learn", "--features", store, "--out", out, "--tasks", 2, "--projection-dim", 16, *extra)


def _leftovers(*folders: Path) -> list[str]:
    return sorted(p.name for folder in folders for p in folder.iterdir() if p.name.startswith("."))


# -- 1. a symlinked --out: written at the target, the link kept, nothing of the target's moved ---------------------
def _other_filesystem(tmp_path: Path) -> Path:
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no second filesystem (/dev/shm) to put the link's target on")
    return Path(__import__("tempfile").mkdtemp(prefix="foal-faults-", dir=shm))


@pytest.fixture(params=["same", "other"])
def target_root(request, tmp_path):
    """Where a link's target lives: beside the link, or on another filesystem (a rename across is EXDEV)."""
    if request.param == "same":
        yield tmp_path / "there"
        return
    root = _other_filesystem(tmp_path)
    yield root
    __import__("shutil").rmtree(root, ignore_errors=True)


def _link(tmp_path: Path, target_root: Path, name: str) -> tuple[Path, Path]:
    """``tmp_path/name`` -> ``target_root/name`` holding a user's file."""
    target = target_root / name
    target.mkdir(parents=True)
    (target / "mine.txt").write_text("the user's")
    link = tmp_path / name
    link.symlink_to(target, target_is_directory=True)
    return link, target


def _assert_followed(link: Path, target: Path, *written: str) -> None:
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert (target / "mine.txt").read_text() == "the user's"
    for name in written:
        assert (target / name).is_file(), sorted(p.name for p in target.iterdir())
    assert _leftovers(link.parent, target.parent) == []


@pytest.mark.parametrize("extra", [(), ("--head", "balanced"), ("--order-seeds", "0,1")], ids=["ridge", "head", "orders"])
def test_learn_writes_a_symlinked_out_at_its_target(store, tmp_path, target_root, extra):
    link, target = _link(tmp_path, target_root, "run")
    for _ in range(2):  # the second run replaces the first one's outputs at the target
        result = _learn(store, link, *extra)
        assert result.exit_code == 0, result.output
        _assert_followed(link, target, "metrics.json")


def test_init_model_sweep_evaluate_and_predict_follow_a_symlinked_out(store, tmp_path, target_root):
    assert _learn(store, tmp_path / "first").exit_code == 0
    model = tmp_path / "first" / "model.safetensors"
    other = write_store(tmp_path / "t.zarr", _data(64, 7), _data(32, 8), CLASSES, chunk_rows=32)
    link, target = _link(tmp_path, target_root, "cont")
    result = _invoke("learn", "--init-model", model, "--features", other, "--out", link)
    assert result.exit_code == 0, result.output
    _assert_followed(link, target, "metrics.json", "model.safetensors")

    link, target = _link(tmp_path, target_root, "sweep")
    result = _invoke("sweep", "--features", store, "--out", link, "--tasks", 2, "--projection-dim", 16)
    assert result.exit_code == 0, result.output
    _assert_followed(link, target, "sweep.json")

    link, target = _link(tmp_path, target_root, "eval")
    result = _invoke("evaluate", "--run", tmp_path / "first", "--out", link)
    assert result.exit_code == 0, result.output
    _assert_followed(link, target, "summary.md")

    csv = target_root / "pred.csv"
    csv.write_text("the user's csv\n")
    (tmp_path / "pred.csv").symlink_to(csv)
    result = _invoke("predict", "--model", model, "--features", store, "--out", tmp_path / "pred.csv")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "pred.csv").is_symlink() and csv.read_text().startswith("row,")
    assert _leftovers(tmp_path, target_root) == []


def test_extract_writes_a_symlinked_out_at_its_target(tmp_path, target_root):
    target = target_root / "px.zarr"
    target.mkdir(parents=True)
    link = tmp_path / "px.zarr"
    link.symlink_to(target, target_is_directory=True)
    spec = dict(dataset="imagefolder", data_dir=str(helpers.make_image_tree(tmp_path / "tree", {"a": 4, "b": 4})),
                model="pixels", image_size=8, out=str(link), device="cpu", workers=0, batch_size=4, chunk_rows=4)
    run_extract(ExtractSpec(**spec))
    first = helpers.store_files(target)
    run_extract(ExtractSpec(**{**spec, "chunk_rows": 2}), overwrite=True)
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert helpers.store_files(target) != first and (target / "zarr.json").is_file()
    assert _leftovers(tmp_path, target_root) == []


def test_a_symlink_loop_as_out_is_refused(store, tmp_path):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    assert_one_line_error(_learn(store, loop), f"output {loop} is a symlink that never reaches", "choose another --out")
    assert loop.is_symlink()


# -- 2. a huge --projection-dim: refused by the memory estimate before the projection is drawn ----------------------
@pytest.mark.parametrize("command", [
    ("learn",), ("sweep",), ("learn", "--head", "balanced"), ("learn", "--head", "dual"),
    ("learn", "--order-seeds", "0,1"), ("sweep", "--order-seeds", "0,1"),
], ids=" ".join)
def test_a_huge_projection_dim_is_refused_before_it_is_drawn(store, tmp_path, monkeypatch, command):
    from foal_pipe.core.expansion import Expansion

    def drawn(*args, **kwargs):
        raise AssertionError(f"the projection was drawn: {args}")

    monkeypatch.setattr(Expansion, "draw", drawn)
    out = tmp_path / "run"
    result = _invoke(*command, "--features", store, "--out", out, "--tasks", 2, "--projection-dim", 10_000_000)
    assert_one_line_error(result, f"{command[0]} needs about", "the projection (6 x 10,000,000)",
                          "is available;", "--projection-dim")
    assert not out.exists() and _leftovers(tmp_path) == []


# -- 3. learn --init-model on the same images re-extracted with another --chunk-rows or --dtype --------------------
@pytest.fixture(scope="module")
def extractions(tmp_path_factory) -> dict[str, Path]:
    """The same image tree extracted three times (4-row chunks, 2-row chunks, float16), and another tree of the
    same shape (same labels and row indices, other images)."""
    root = tmp_path_factory.mktemp("reextracted")
    trees = {name: helpers.make_image_tree(root / name, {"a": 6, "b": 6, "c": 6}, seed=seed)
             for name, seed in (("tree", 0), ("other_tree", 1))}
    stores = {}
    for name, tree, extra in (("a", "tree", {}), ("rechunked", "tree", {"chunk_rows": 2}),
                              ("float16", "tree", {"dtype": "float16"}), ("other", "other_tree", {})):
        spec = dict(dataset="imagefolder", data_dir=str(trees[tree]), model="pixels", image_size=4,
                    out=str(root / f"{name}.zarr"), device="cpu", workers=0, batch_size=4, chunk_rows=4)
        run_extract(ExtractSpec(**{**spec, **extra}))
        stores[name] = root / f"{name}.zarr"
    return stores


@pytest.mark.parametrize("head", ["ridge", "ncm", "slda", "fecam", "balanced", "dual"])
def test_init_model_refuses_the_same_rows_re_extracted(extractions, tmp_path, head):
    projected = ("--projection-dim", 8) if head in ("ridge", "balanced", "dual") else ()
    first = _invoke("learn", "--features", extractions["a"], "--out", tmp_path / "first", "--head", head,
                    "--tasks", 1, *projected)
    assert first.exit_code == 0, first.output
    model = tmp_path / "first" / "model.safetensors"
    for again in ("a", "rechunked", "float16"):
        result = _invoke("learn", "--init-model", model, "--features", extractions[again], "--out", tmp_path / "x")
        assert_one_line_error(result, f"has already learned the training rows of {extractions[again]}",
                              "would count every row twice")
        assert not (tmp_path / "x").exists()
    result = _invoke("learn", "--init-model", model, "--features", extractions["other"], "--out", tmp_path / "next")
    assert result.exit_code == 0, result.output
    result = _invoke("learn", "--init-model", tmp_path / "next" / "model.safetensors", "--features",
                     extractions["rechunked"], "--out", tmp_path / "x")
    assert_one_line_error(result, "the same rows extracted again: data identity", "would count every row twice")
