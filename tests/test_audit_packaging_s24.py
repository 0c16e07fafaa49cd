"""Audit s24: foal-pipe as an installed package (a built wheel, an sdist), not an editable checkout.

Method (scratch, not kept here): the wheel and sdist of ``git archive HEAD`` (setuptools, ``--no-build-isolation``),
installed into fresh venvs on Python 3.11 (the light install, and ``[dist,pipeline]``), run from /tmp: --help of every
command, info, datasets, extract --model pixels (digits, an image folder), learn, sweep, evaluate, summary, predict
(store and --images), table, the walkthrough's continuation, --scheduler dask; every missing extra (torch, cupy, dask,
torchvision, h5py, timm) refused in one line. All of that worked: outputs equal the checkout's. What failed are the
declared dependency bounds, tried one by one in a venv of the lowest versions pyproject.toml admits:

- ``requires-python = ">=3.10"``, but every zarr 3.0/3.1 requires Python >= 3.11: ``pip install`` on 3.10 cannot
  resolve (``No matching distribution found for zarr<3.2,>=3.0``); the code also uses ``BaseException.add_note``
  (3.11, foal_pipe/model/ondemand.py).
- ``zarr>=3.0``: ``Array.with_config`` (foal_pipe/store/write.py, FeatureWriter) first exists in zarr 3.1.6; with
  zarr 3.0.0-3.1.5 every extraction ends in ``AttributeError: 'Array' object has no attribute 'with_config'`` (a
  traceback, a half-written store left behind).
- ``typer>=0.19``: with typer 0.19.0 (click 8.2+) every ``learn`` ends in ``TypeError: object of type 'NoneType' has no
  len()`` inside typer; with typer 0.19.1-0.22.x, which accept click 8.0/8.1, every command fails at import
  (``cannot import name 'NoArgsIsHelpError' from 'click.exceptions'``: click 8.2, foal_pipe/cli/_app.py).

The two wheel tests pass today; they are the only ones that build the package and run it from outside the checkout
(package data a future module adds without ``package-data`` would fail them).
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _requirement(name: str) -> Requirement | None:
    for text in PROJECT["dependencies"]:
        req = Requirement(text)
        if req.name.lower() == name:
            return req
    return None


# -- 1. requires-python admits 3.10, where the zarr pin has no release ----------------------------------------------
def test_requires_python_admits_no_python_that_the_zarr_pin_cannot_install():
    """Every zarr release inside ``zarr>=3.0,<3.2`` (3.0.0 ... 3.1.6) declares Requires-Python >= 3.11 on PyPI; the
    installed one says so too. A Python that requires-python admits must be one zarr admits."""
    zarr_python = SpecifierSet(importlib.metadata.metadata("zarr")["Requires-Python"])
    assert not zarr_python.contains("3.10")  # the fact the test rests on (zarr 3.x: python >= 3.11)
    ours = SpecifierSet(PROJECT["requires-python"])
    admitted = [v for v in ("3.9", "3.10", "3.11", "3.12", "3.13") if ours.contains(v)]
    cannot = [v for v in admitted if not zarr_python.contains(v)]
    pin = _requirement("zarr").specifier
    assert not cannot, (f"requires-python {ours} admits Python {', '.join(cannot)}, where no zarr{pin} installs "
                        f"(zarr: Requires-Python {zarr_python}); make it >=3.11 (and README/docs/install.md)")


# -- 2. zarr>=3.0 admits releases without Array.with_config ---------------------------------------------------------
def test_zarr_floor_has_the_array_api_the_writer_uses():
    """FeatureWriter calls ``zarr.Array.with_config`` (first in zarr 3.1.6; 3.0.0-3.1.5 lack it: extract ends in an
    AttributeError traceback). The pin must exclude the releases without it."""
    import zarr

    assert hasattr(zarr.Array, "with_config")  # the API the writer calls (foal_pipe/store/write.py)
    spec = _requirement("zarr").specifier
    lacking = [v for v in ("3.0.0", "3.0.10", "3.1.0", "3.1.5") if spec.contains(v, prereleases=False)]
    assert not lacking, f"zarr{spec} admits {lacking}, which have no Array.with_config; pin zarr>=3.1.6,<3.2"


# -- 3. typer>=0.19 admits a typer that crashes, and typers that take a click the CLI cannot import from -----------
def test_typer_floor_runs_the_cli():
    """typer 0.19.0 (with click >= 8.2) raises a TypeError on every `learn`; typer 0.19.1-0.22.x accept click 8.0/8.1,
    which has no ``click.exceptions.NoArgsIsHelpError`` (click 8.2) that foal_pipe/cli/_app.py imports with a typer
    older than 0.29. typer 0.23+ requires click >= 8.2.1 on Python >= 3.10 (later ones carry their own click)."""
    spec = _requirement("typer").specifier
    assert not spec.contains("0.19.0"), f"typer{spec} admits 0.19.0, whose learn fails with a TypeError; pin typer>=0.23"
    click = _requirement("click")
    click_ok = click is not None and not click.specifier.contains("8.1.8")
    assert click_ok or not spec.contains("0.22.0"), (
        f"typer{spec} admits 0.19.1-0.22.x with click 8.1 (their own pin click>=8.0.0), where the CLI fails at import; "
        "pin typer>=0.23 (or add click>=8.2.1)")


# -- 4. the wheel and the sdist's wheel hold the package's files, nothing else --------------------------------------
def _tracked(prefix: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", prefix], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return sorted(p for p in out.split() if (ROOT / p).is_file())


def _offline_env() -> dict[str, str]:
    return {**os.environ, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": "1"}


def _build_wheel(src: Path, dist: Path) -> Path:
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist),
                           str(src)], capture_output=True, text=True, env=_offline_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = dist.glob("foal_pipe-*.whl")
    return wheel


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path]:
    """(the tree's tracked package files with pyproject.toml and README.md, the wheel built from it offline)"""
    try:
        import setuptools
    except ImportError:
        pytest.skip("setuptools (the build backend) is not importable")
    if Version(setuptools.__version__) < Version("77"):
        pytest.skip(f"setuptools {setuptools.__version__} < 77, which pyproject's build-system requires")
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    src = tmp_path_factory.mktemp("src")
    for name in ["pyproject.toml", "README.md", *_tracked("foal_pipe")]:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, src / name)
    return src, _build_wheel(src, tmp_path_factory.mktemp("dist"))


def test_the_wheel_holds_every_tracked_package_file_and_nothing_else(built, tmp_path):
    src, wheel = built
    names = zipfile.ZipFile(wheel).namelist()
    info = wheel.name.split("-py3")[0] + ".dist-info/"
    assert sorted(n for n in names if not n.startswith(info)) == _tracked("foal_pipe")  # py.typed among them
    assert not [n for n in names if "__pycache__" in n or n.startswith("tests/") or n.endswith(".pyc")]
    assert "foal-pipe = foal_pipe.cli:main" in zipfile.ZipFile(wheel).read(info + "entry_points.txt").decode()
    # the sdist of the same tree builds a wheel of the same files
    build = f"from setuptools.build_meta import build_sdist; build_sdist({str(tmp_path / 'sdist')!r})"
    proc = subprocess.run([sys.executable, "-c", build], cwd=src, capture_output=True, text=True, env=_offline_env(),
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (archive,) = (tmp_path / "sdist").glob("foal_pipe-*.tar.gz")
    shutil.unpack_archive(archive, tmp_path / "unpacked")
    (unpacked,) = (tmp_path / "unpacked").iterdir()
    assert sorted(zipfile.ZipFile(_build_wheel(unpacked, tmp_path / "dist2")).namelist()) == sorted(names)


# -- 5. the installed copy runs from outside the checkout -----------------------------------------------------------
def test_the_installed_wheel_runs_the_light_commands_outside_the_checkout(built, tmp_path):
    wheel = built[1]
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
                          capture_output=True, text=True, env=_offline_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    work = tmp_path / "work"
    work.mkdir()
    env = {**_offline_env(), "PYTHONPATH": str(site), "COLUMNS": "200"}

    def run(*args: str) -> str:
        code = "import sys; from foal_pipe.cli import main; sys.argv = ['foal-pipe', *sys.argv[1:]]; main()"
        done = subprocess.run([sys.executable, "-c", code, *args], cwd=work, capture_output=True, text=True, env=env,
                              timeout=120)
        assert done.returncode == 0, (args, done.stdout[-1500:], done.stderr[-1500:])
        assert "Traceback" not in done.stderr, done.stderr[-1500:]
        return done.stdout

    where = subprocess.run([sys.executable, "-c", "import foal_pipe; print(foal_pipe.__file__)"], cwd=work,
                           capture_output=True, text=True, env=env, check=True).stdout.strip()
    assert Path(where).resolve().is_relative_to(site.resolve()), where  # the installed copy, not the checkout's
    assert run("--version").strip() == "foal-pipe 0.1.0"
    for command in ("extract", "info", "datasets", "learn", "sweep", "predict", "evaluate", "summary", "table"):
        assert "Usage" in run(command, "--help")
    assert "digits" in run("datasets")
    run("extract", "--dataset", "digits", "--model", "pixels", "--out", "d.zarr", "--workers", "0")
    assert "1,442" in run("info", "d.zarr")
    run("learn", "--features", "d.zarr", "--out", "runs/r", "--tasks", "5", "--projection-dim", "200")
    run("sweep", "--features", "d.zarr", "--out", "runs/s", "--tasks", "5", "--projection-dim", "200")
    run("evaluate", "--run", "runs/r", "--sweep", "runs/s")
    assert (work / "runs/r/eval/summary.md").is_file() and (work / "runs/r/eval/steps.png").is_file()
    assert "runs/s" in run("summary")
    run("predict", "--model", "runs/r/model.safetensors", "--features", "d.zarr", "--out", "p.csv")
    assert len((work / "p.csv").read_text().splitlines()) == 356  # header + 355 test rows
