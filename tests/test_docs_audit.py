"""The docs audit's findings: what the docs and --help promise is what the commands do (an edited-down store version,
--drop-last emptying a task, one-line usage errors, --tasks with --class-order FILE, the light install's error, split
manifests across split folders, the mypy paths, --export-manifest's reason, the gamma grid's decades)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_one_line_error, invoke, make_image_tree

from foal_pipe.core.statistics import DEFAULT_GAMMA_GRID
from foal_pipe.errors import FoalPipeError
from foal_pipe.protocol.stream import build_stream, si_blurry
from foal_pipe.store import write_store

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _words(text: str) -> str:
    """``text`` with rich's box characters and every run of whitespace as one space (folded --help, wrapped docs)."""
    return " ".join(text.replace("│", " ").split())


def _set_version(store: Path, version: int) -> None:
    doc = json.loads((store / "zarr.json").read_text())
    doc["attributes"]["format_version"] = version
    (store / "zarr.json").write_text(json.dumps(doc))


def _small_store(path: Path, n_classes: int = 4, per_class: int = 30, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(n_classes), per_class)
    x = rng.normal(size=(y.size, 6)).astype(np.float32) + y[:, None]
    return write_store(path, (x, y), (x[::3], y[::3]), [f"c{i}" for i in range(n_classes)], chunk_rows=32)


@pytest.fixture
def photos_store(tmp_path) -> Path:
    """A format-5 store with a split manifest: pixels of a tiny image tree (no torch)."""
    tree = make_image_tree(tmp_path / "photos", {"ant": 3, "bee": 3}, test_per_class=2)
    store = tmp_path / "photos.zarr"
    result = invoke("extract", "--dataset", "imagefolder", "--data-dir", tree, "--model", "pixels", "--image-size", 8,
                    "--out", store, "--workers", 0)
    assert result.exit_code == 0, result.output
    return store


# -- 2. a format_version edited below what the store's content proves ------------------------------------------------
@pytest.mark.parametrize("version", [3, 4])
def test_info_refuses_a_store_edited_below_its_manifests_version_and_names_the_one_to_restore(photos_store, tmp_path,
                                                                                             version):
    _set_version(photos_store, version)
    for args in (("info", photos_store), ("info", photos_store, "--verify")):
        assert_one_line_error(invoke(*args), f"it declares format_version {version} but carries the split manifest of "
                              "format 5", "restore format_version 5", after_notes=True)
    assert_one_line_error(invoke("learn", "--features", photos_store, "--out", tmp_path / "run", "--tasks", 2),
                          f"declares format_version {version} but carries the split manifest of format 5",
                          "restore format_version 5")
    _set_version(photos_store, 5)  # the advice followed: the store is whole again
    assert invoke("info", photos_store, "--verify").exit_code == 0


def test_info_refuses_a_store_edited_below_its_chunk_records(tmp_path):
    store = _small_store(tmp_path / "s.zarr")
    _set_version(store, 3)
    assert_one_line_error(invoke("info", store), "it declares format_version 3 but carries the chunk records of format 4",
                          "restore format_version 4", after_notes=True)


# -- 3. --drop-last emptying a task is blamed on --drop-last; tasks numbered from 1 ------------------------------------
def test_drop_last_emptying_a_disjoint_task_names_drop_last_and_the_task_from_1():
    labels = np.repeat(np.arange(4), [50, 7, 50, 50])
    plain = build_stream(labels, 4, None, 10, seed=0, class_order=[[0], [1], [2, 3]])
    assert [r.size for r in plain.rows] == [50, 7, 100]  # independent: the class counts
    with pytest.raises(FoalPipeError, match=re.escape("drop_last would drop all 7 rows of task 2 (fewer than "
                                                      "batch_size 10)")):
        build_stream(labels, 4, None, 10, seed=0, class_order=[[0], [1], [2, 3]], drop_last=True)
    with pytest.raises(FoalPipeError, match=r"^task 2 \(classes 1\) has no training rows"):
        build_stream(np.repeat([0, 2, 3], 20), 4, None, 10, seed=0, class_order=[[0], [1], [2, 3]])


def test_drop_last_emptying_a_si_blurry_task_numbers_it_from_1():
    labels = np.random.default_rng(1).integers(0, 10, 400)
    plain = si_blurry(labels, 10, 5, 1, seed=0)
    sizes = [r.size for r in plain.rows]
    batch = sorted(sizes)[len(sizes) // 2] + 1  # some task smaller, the first such one refused
    first = next(t for t, n in enumerate(sizes) if n < batch)
    with pytest.raises(FoalPipeError, match=re.escape(f"all {sizes[first]} rows of task {first + 1} (fewer than")):
        si_blurry(labels, 10, 5, batch, seed=0, drop_last=True)


def test_cli_drop_last_refusal_on_a_store(tmp_path):
    store = _small_store(tmp_path / "s.zarr", per_class=30)
    out = tmp_path / "run"
    assert_one_line_error(invoke("learn", "--features", store, "--out", out, "--tasks", 2, "--drop-last",
                                 "--batch-size", 100), "--drop-last would drop all 60 rows of task 1 (fewer than "
                          "--batch-size 100); use a smaller --batch-size or leave out --drop-last")
    assert not out.exists()


# -- 4. usage errors: one line, no box, exit 2 (as docs/cli.md says) ---------------------------------------------------
@pytest.mark.parametrize(("args", "fragment"), [
    (("learn", "--features", "S", "--out", "O", "--activation", "tanh"),
     "Error: Invalid value for '--activation': 'tanh' is not one of 'sigmoid', 'relu', 'identity', 'cos'; see "
     "`foal-pipe learn --help`"),
    (("learn", "--features", "S", "--out", "O", "--tasks", "abc"), "Error: --tasks 'abc' is not an integer"),
    (("learn", "--features", "S"), "Error: Missing option '--out'; see `foal-pipe learn --help`"),
    (("learn", "--features", "S", "--out", "O", "--bogus"), "Error: No such option: --bogus"),
    (("sweep", "--head-rows", "3"), "Error: No such option: --head-rows"),
    (("nonsense",), "Error: No such command 'nonsense'; see `foal-pipe --help`"),
])
def test_usage_errors_are_one_unboxed_line_with_exit_status_2(tmp_path, args, fragment):
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(fragment) and "╭" not in result.output, result.output
    assert "exit status 2 (click's convention for usage errors)" in _words((DOCS / "cli.md").read_text())


# -- 7. --tasks with --class-order FILE: the help and docs say what happens --------------------------------------------
def test_tasks_with_a_class_order_file_must_match_as_help_and_docs_say(tmp_path):
    store = _small_store(tmp_path / "s.zarr")
    order = tmp_path / "order.json"
    order.write_text("[[0,1],[2,3]]")
    assert invoke("learn", "--features", store, "--out", tmp_path / "a", "--tasks", 2, "--class-order", order,
                  "--projection-dim", 8).exit_code == 0
    assert_one_line_error(invoke("learn", "--features", store, "--out", tmp_path / "b", "--tasks", 3, "--class-order",
                                 order), "which lists 2 tasks; drop --tasks")
    assert "(--tasks, if given, must equal its number of tasks)" in _words(invoke("learn", "--help").output)
    docs = _words((DOCS / "cli.md").read_text())
    assert "`--tasks` needs no `--class-order FILE`" not in docs
    assert "must equal the number of tasks the file lists" in docs


# -- 8. the light install's error, quoted as it is ------------------------------------------------------------------
def test_install_docs_quote_the_light_installs_error(tmp_path, monkeypatch):
    import foal_pipe.encoders.runtime as runtime

    class _NoTorch:
        @staticmethod
        def import_module(name: str):
            raise ImportError(name)

    monkeypatch.setattr(runtime, "importlib", _NoTorch)
    model = "vit_base_patch16_224.augreg2_in21k_ft_in1k"
    result = invoke("extract", "--dataset", "digits", "--model", model, "--out", tmp_path / "x.zarr")
    assert_one_line_error(result, f"--model {model} needs torch")
    said = _words(result.output)
    assert said.startswith("Error: ") and said in _words((DOCS / "install.md").read_text().replace("`", " ` ")
                                                         ).replace(" ` ", "")


# -- 9. a split manifest takes images from either split's folder, a whole class from one -------------------------------
def test_split_manifest_takes_a_class_that_lies_in_one_split_folder_only(tmp_path):
    flat = make_image_tree(tmp_path / "flat", {"ant": 4, "bee": 4, "emu": 4}, split=False)
    a = tmp_path / "a.zarr"
    assert invoke("extract", "--dataset", "imagefolder", "--data-dir", flat, "--test-split", 0.5, "--model", "pixels",
                  "--image-size", 8, "--out", a, "--workers", 0).exit_code == 0
    copy = tmp_path / "copy"
    for image in sorted(flat.rglob("*.png")):  # the same files; emu only under test/, the others under train/
        target = copy / ("test" if image.parent.name == "emu" else "train") / image.parent.name / image.name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(image.read_bytes())
    (copy / "test" / "ant").mkdir()
    (copy / "test" / "ant" / "x.png").write_bytes((flat / "ant" / "img000.png").read_bytes())
    b = tmp_path / "b.zarr"
    result = invoke("extract", "--dataset", "imagefolder", "--data-dir", copy, "--split-manifest", a, "--model",
                    "pixels", "--image-size", 8, "--out", b, "--workers", 0)
    assert result.exit_code == 0, result.output
    for store, name in ((a, "a.json"), (b, "b.json")):
        assert invoke("info", store, "--export-manifest", tmp_path / name).exit_code == 0
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    refused = invoke("extract", "--dataset", "imagefolder", "--data-dir", copy, "--model", "pixels", "--out",
                     tmp_path / "c.zarr", "--workers", 0)  # without a manifest the layout check still holds
    assert_one_line_error(refused, "class 'emu' has images in")


# -- 10. the mypy paths install.md lists are pyproject's ------------------------------------------------------------
def test_install_docs_list_every_mypy_path():
    mypy = (ROOT / "pyproject.toml").read_text().split("[tool.mypy]")[1]
    files = json.loads(re.search(r"^files = (\[.*\])$", mypy, re.M).group(1))  # tomllib: Python 3.11+
    row = next(line for line in (DOCS / "install.md").read_text().splitlines() if line.startswith("| `make lint`"))
    listed = re.findall(r"`([^`]+)`", row.split("pyproject.toml:")[1])
    want = [f.removeprefix("foal_pipe/") + ("/" if (ROOT / f).is_dir() else "") for f in files]
    assert sorted(listed) == sorted(want), (listed, want)


# -- 11. --export-manifest names why a store keeps no manifest -------------------------------------------------------
def test_export_manifest_of_a_write_store_store_names_write_store(tmp_path):
    store = _small_store(tmp_path / "s.zarr")
    out = tmp_path / "m.json"
    result = invoke("info", store, "--export-manifest", out)
    assert_one_line_error(result, "records no split manifest: it was written by foal_pipe.store.write_store")
    assert "format 4 or older" not in result.output and not out.exists()


# -- 12. the default gamma grid: 13 powers of ten spanning 12 decades ---------------------------------------------------
def test_docs_count_the_default_grids_points_and_decades():
    points, decades = len(DEFAULT_GAMMA_GRID), round(math.log10(DEFAULT_GAMMA_GRID[-1] / DEFAULT_GAMMA_GRID[0]))
    cli, gamma = _words((DOCS / "cli.md").read_text()), _words((DOCS / "gamma.md").read_text())
    for text in (cli, gamma):
        assert f"{points} decades" not in text
        assert f"{points} powers of ten" in text and f"spanning {decades} decades" in text
