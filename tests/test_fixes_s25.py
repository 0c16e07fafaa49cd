"""Fixes of the twenty-fifth stop that no audit file holds: the sdist, the heads' scoring bytes on their classes, and
summary.md's class names for a head without weights."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from helpers import invoke

from foal_pipe.heads import HEADS
from foal_pipe.heads.base import HeadBase
from foal_pipe.store import write_store

ROOT = Path(__file__).resolve().parents[1]


def test_the_sdist_holds_no_tests_that_could_not_run(tmp_path: Path) -> None:
    """The tests need the checkout (conftest.py, helpers.py, docs/, stages/, dvc.yaml): an sdist that shipped
    tests/test_*.py alone (setuptools' default) offered a suite that fails on import. The sdist is the package."""
    pytest.importorskip("setuptools")
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    src = tmp_path / "src"
    for name in tracked:
        if (ROOT / name).is_file() and not name.startswith((".dvc/", "data/", "benchmarks/results/")):
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    build = f"from setuptools.build_meta import build_sdist; build_sdist({str(tmp_path / 'sdist')!r})"
    env = {**os.environ, "PIP_NO_INDEX": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", build], cwd=src, capture_output=True, text=True, env=env, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (archive,) = (tmp_path / "sdist").glob("foal_pipe-*.tar.gz")
    with tarfile.open(archive) as tar:
        names = [n.split("/", 1)[1] for n in tar.getnames() if "/" in n]
    assert not [n for n in names if n.startswith("tests/")]
    assert {"LICENSE", "README.md", "pyproject.toml", "foal_pipe/cli/__init__.py"} <= set(names)


def test_every_head_states_its_scoring_bytes_on_its_class() -> None:
    """The memory checks of learn, evaluate and predict read a head's per-row, per-class scoring bytes from its
    class (``score_bytes``), not from a table keyed by name that a new head would miss: each is a non-negative
    int, the base's is 0, and the heads that score through temporaries (fecam, dual, ncm, slda) state some."""
    assert HeadBase.score_bytes == 0
    for name, entry in HEADS.items():
        assert isinstance(entry.head.score_bytes, int) and entry.head.score_bytes >= 0, name
    assert all(HEADS[name].head.score_bytes > 0 for name in ("fecam", "dual", "ncm", "slda"))
    import foal_pipe.memory as memory

    assert not hasattr(memory, "SCORE_EXTRA_BYTES")


def test_summary_names_a_weightless_heads_classes_per_task(tmp_path: Path) -> None:
    """An ncm run has no weight norms, whose names summary.md's "Classes per task" line read: it listed label ids
    (``T1: 0, 4``) where docs/evaluate.md promises each task's class names, which the run's store holds. The line now
    names them from the store, task by task in stream order as metrics.json's ``tasks`` give them."""
    names = ["cat", "dog", "emu", "fox"]
    rng = np.random.default_rng(0)
    y, yt = np.arange(80) % 4, np.arange(40) % 4
    centres = 4.0 * rng.normal(size=(4, 6))
    store = write_store(tmp_path / "s.zarr", ((centres[y] + rng.normal(size=(80, 6))).astype(np.float32), y),
                        ((centres[yt] + rng.normal(size=(40, 6))).astype(np.float32), yt), names, chunk_rows=32)
    run = tmp_path / "run"
    done = invoke("learn", "--features", store, "--out", run, "--head", "ncm", "--tasks", 2, "--backend", "numpy")
    assert done.exit_code == 0, done.output
    done = invoke("evaluate", "--run", run, "--no-plots")
    assert done.exit_code == 0, done.output
    tasks = json.loads((run / "metrics.json").read_text())["tasks"]
    expected = "; ".join(f"T{t + 1}: " + ", ".join(names[c] for c in ids) for t, ids in enumerate(tasks))
    line = next(ln for ln in (run / "eval" / "summary.md").read_text().splitlines() if ln.startswith("Classes per task"))
    assert line.endswith(f": {expected}"), (line, expected)


def test_run_extract_under_python_optimize_refuses_before_writing(tmp_path: Path) -> None:
    """Under ``python -O`` zarr 3.1 cannot read group metadata (an ``assert`` it relies on is stripped): the CLI
    refuses at start-up, and ``run_extract`` from Python ran the whole extraction to fail at the end, leaving an
    incomplete store. It now refuses first, in one FoalPipeError naming -O, with nothing written."""
    out = tmp_path / "d.zarr"
    code = ("import sys; sys.path.insert(0, sys.argv[2]); from helpers import digits_pixels_spec\n"
            "from foal_pipe.errors import FoalPipeError\nfrom foal_pipe.extract import run_extract\n"
            "try:\n    run_extract(digits_pixels_spec(sys.argv[1]))\nexcept FoalPipeError as exc:\n    print(exc)\n"
            "else:\n    print('ran')\n")
    done = subprocess.run([sys.executable, "-O", "-c", code, str(out), str(ROOT / "tests")], capture_output=True,
                          text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "-O" in done.stdout and "ran" not in done.stdout, done.stdout
    assert not out.exists() and not list(tmp_path.iterdir())


def test_a_ptm_cil_benchmark_refuses_a_test_folder_linked_to_a_train_one(tmp_path: Path) -> None:
    """The PTM-CIL loaders searched train/ and test/ each with its own record of folders, so a link from a test class
    folder to its train folder made the training images test rows too (exit 0, accuracy inflated): imagefolder
    refuses it ("a folder reached twice", docs/datasets.md), and the benchmarks now share one record as it does."""
    from test_benchmark_datasets import BENCHMARKS, make_ptm_cil

    from foal_pipe.datasets import open_dataset
    from foal_pipe.errors import FoalPipeError

    classes = make_ptm_cil(tmp_path / "imagenet-r", BENCHMARKS["imagenet-r"])
    open_dataset("imagenet-r", tmp_path)  # the tree as unpacked reads
    (tmp_path / "imagenet-r" / "test" / classes[1] / "leak").symlink_to(tmp_path / "imagenet-r" / "train" / classes[1])
    with pytest.raises(FoalPipeError, match="twice"):
        open_dataset("imagenet-r", tmp_path)
