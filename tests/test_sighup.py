"""SIGHUP (the terminal closed) unwinds as Ctrl-C and SIGTERM do: exit 129, one line, the temporary outputs removed
and the previous ones kept; a SIGHUP the caller ignores (``nohup``) stays ignored and the run finishes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import three_class_store

ROOT = Path(__file__).resolve().parents[1]
HUP_SITE = """
import os, signal
import foal_pipe.io as io

real_write = io.write_json

def write_json(path, data):
    if str(path).endswith("metrics.json"):
        os.kill(os.getpid(), signal.SIGHUP)
    return real_write(path, data)

io.write_json = write_json
"""


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return three_class_store(tmp_path / "s.zarr")


def _learn(tmp_path: Path, store: Path, out: Path, ignored: bool) -> subprocess.CompletedProcess[str]:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(HUP_SITE)
    script = "import sys; from foal_pipe.cli import main; sys.argv[0] = 'foal-pipe'; main()"
    args = ["learn", "--features", str(store), "--out", str(out), "--tasks", "3", "--projection-dim", "8",
            "--backend", "numpy"]
    how = signal.SIG_IGN if ignored else signal.SIG_DFL  # not inherited: a suite run under nohup ignores SIGHUP
    hold = lambda: signal.signal(signal.SIGHUP, how)  # noqa: E731
    return subprocess.run([sys.executable, "-c", script, *args], env=os.environ | {"PYTHONPATH": f"{site}{os.pathsep}{ROOT}"},
                          cwd=ROOT, capture_output=True, text=True, preexec_fn=hold)


def test_sighup_leaves_no_outputs_and_no_temporaries(tmp_path, store):
    out = tmp_path / "work" / "run"
    proc = _learn(tmp_path, store, out, ignored=False)
    assert proc.returncode == 128 + signal.SIGHUP, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "Interrupted: stopped by SIGHUP; re-run the same command"
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "work").exists() or not any((tmp_path / "work").iterdir())


def test_an_ignored_sighup_stays_ignored(tmp_path, store):
    out = tmp_path / "run"
    proc = _learn(tmp_path, store, out, ignored=True)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["metrics.json", "model.safetensors", "timings.json"]
