"""CuPy compiles with foal-pipe's settings (foal_pipe.cupyenv): set before CuPy is imported, by zarr or anyone,
what the environment sets kept, and a process that imported CuPy first left as it is."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import foal_pipe.cupyenv as cupyenv

REPO = Path(__file__).resolve().parents[1]


def test_the_settings_fill_what_the_environment_leaves_unset(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(cupyenv.importlib.util, "find_spec", lambda name: object() if name == "cupy" else real(name))
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    monkeypatch.delenv("CUPY_NVRTC_USE_PCH", raising=False)
    monkeypatch.setenv("CUPY_ACCELERATORS", "cub")
    cupyenv.cupy_environment()
    assert os.environ["CUPY_NVRTC_USE_PCH"] == "1" and os.environ["CUPY_ACCELERATORS"] == "cub"
    monkeypatch.delenv("CUPY_ACCELERATORS")
    cupyenv.cupy_environment()
    assert os.environ["CUPY_ACCELERATORS"] == ""
    monkeypatch.delenv("CUPY_ACCELERATORS")
    monkeypatch.setitem(sys.modules, "cupy", object())  # imported before foal-pipe was
    cupyenv.cupy_environment()
    assert "CUPY_ACCELERATORS" not in os.environ


def test_cupy_sees_the_settings_when_zarr_imports_it(tmp_path):
    """zarr imports CuPy for its GPU buffers wherever CuPy is installed: a stand-in ``cupy`` package records the
    environment it was imported with."""
    (tmp_path / "cupy").mkdir()
    (tmp_path / "cupy" / "__init__.py").write_text(
        "import os\nSEEN = {k: os.environ.get(k) for k in ('CUPY_ACCELERATORS', 'CUPY_NVRTC_USE_PCH')}\n")
    code = "import foal_pipe.cli, zarr, sys, json; print(json.dumps(sys.modules['cupy'].SEEN))"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUPY_")}
    for given, seen in (({}, {"CUPY_ACCELERATORS": "", "CUPY_NVRTC_USE_PCH": "1"}),
                        ({"CUPY_NVRTC_USE_PCH": "0"}, {"CUPY_ACCELERATORS": "", "CUPY_NVRTC_USE_PCH": "0"})):
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                              env={**env, **given, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"})
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout) == seen
