"""The light install (`pip install -e .`, no extras): learn, sweep, predict, evaluate, summary, info, every
`--help` and the Python learner work without PyTorch, timm, torchvision, h5py or Dask; `extract` says what to
install. Checked in a child process where importing those modules fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np

from foal_pipe.store import write_store

ROOT = Path(__file__).resolve().parent.parent
BLOCKED = ("torch", "torchvision", "timm", "h5py", "dask", "distributed")

# Runs in the child: a finder that refuses the blocked modules, then the commands given as JSON in argv[1].
CHILD = f"""
import importlib.abc, json, sys

BLOCKED = {BLOCKED!r}


class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (not in the light install)", name=name)
        return None


sys.meta_path.insert(0, Refuse())
try:
    import torch
except ModuleNotFoundError:
    print("BLOCKED torch", flush=True)

from foal_pipe.cli import app

for args in json.loads(sys.argv[1]):
    try:
        app(args, prog_name="foal-pipe")
    except SystemExit as exc:
        print("EXIT", " ".join(args[:2]), exc.code or 0, flush=True)

import numpy as np
from foal_pipe import AnalyticClassifier, SmoothProjection

rng = np.random.default_rng(0)
X, y = rng.normal(size=(60, 5)), np.repeat(np.arange(3), 20)
H = SmoothProjection(n_components=32, random_state=0).fit(X).transform(X)
clf = AnalyticClassifier(gamma=1.0).partial_fit(H[:30], y[:30]).partial_fit(H[30:], y[30:])
print("LEARNER", clf.predict(H).shape[0], flush=True)
print("LOADED", sorted({{m.split(".")[0] for m in sys.modules}} & set(BLOCKED)), flush=True)
"""


def _store(path: Path) -> None:
    rng = np.random.default_rng(1)
    centers = rng.normal(size=(4, 6))
    y_train, y_test = np.repeat(np.arange(4), 25), np.repeat(np.arange(4), 5)
    write_store(path, (centers[y_train] + 0.2 * rng.normal(size=(100, 6)), y_train),
                (centers[y_test] + 0.2 * rng.normal(size=(20, 6)), y_test), ["a", "b", "c", "d"], dataset="toy")


def test_light_commands_run_without_torch_timm_or_dask(tmp_path):
    _store(tmp_path / "s.zarr")
    stream = ["--tasks", "2", "--projection-dim", "16"]
    commands = [
        ["--help"], *([name, "--help"] for name in ("extract", "info", "learn", "sweep", "predict", "evaluate",
                                                     "summary")),
        ["info", "s.zarr"],
        ["datasets", "--data-dir", "."],
        ["learn", "--features", "s.zarr", "--out", "runs/toy", *stream],
        ["sweep", "--features", "s.zarr", "--out", "runs/toy-sweep", "--gammas", "0.1,1", *stream],
        ["predict", "--model", "runs/toy/model.safetensors", "--features", "s.zarr", "--out", "pred.csv"],
        ["evaluate", "--run", "runs/toy"],
        ["summary", "runs"],
        ["extract", "--model", "vit_tiny_patch16_224", "--out", "vit.zarr"],
        ["extract", "--out", "x.zarr", "--model", "pixels"],  # pixels needs no torch
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    env.pop("FOAL_PIPE_DEBUG", None)
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(commands)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "BLOCKED torch" in lines
    exits = {line.split(" ", 1)[1].rsplit(" ", 1)[0]: int(line.rsplit(" ", 1)[1])
             for line in lines if line.startswith("EXIT ")}
    assert len(exits) == len(commands)
    assert {cmd: code for cmd, code in exits.items() if code != 0} == {"extract --model": 1}, proc.stderr
    assert "pip install -e '.[extract]' in the foal-pipe clone" in proc.stderr and not (tmp_path / "vit.zarr").exists()
    assert (tmp_path / "x.zarr" / "zarr.json").is_file()
    assert (tmp_path / "runs/toy/eval/gamma.png").is_file() and (tmp_path / "pred.csv").is_file()
    assert "LEARNER 60" in lines and "LOADED []" in lines


def test_light_install_dependencies():
    """The base dependencies are the light set; PyTorch and friends only come with `[extract]`, Dask with `[dist]`."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def names(requirements: list[str]) -> set[str]:
        return {req.split("[")[0].split(">")[0].split("=")[0].split("<")[0].strip().lower() for req in requirements}

    assert names(project["dependencies"]) == {
        "numpy", "zarr", "safetensors", "typer", "rich", "scikit-learn", "matplotlib", "array-api-compat",
        "threadpoolctl"}
    extras = project["optional-dependencies"]
    assert names(extras["extract"]) == {"torch", "torchvision", "timm", "h5py", "pillow"}
    assert names(extras["dist"]) == {"dask"} and "distributed" in extras["dist"][0]
    assert not any("==" in req for group in (project["dependencies"], *extras.values()) for req in group)


def test_the_package_ships_its_type_hints():
    """PEP 561: the py.typed marker, and the package data that puts it in the wheel."""
    assert (ROOT / "foal_pipe" / "py.typed").is_file()
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "py.typed" in setuptools["package-data"]["foal_pipe"]
