"""timings.json on a device backend as on the CPU (issue 33): the backend's start-up is a step of its own, and a
step's seconds include the device work it queued (CuPy and torch return before their kernels finish)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import build_store, invoke

from foal_pipe.core import backend

REPO = Path(__file__).resolve().parents[1]
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")


def _untimed(timings: dict[str, float]) -> float:
    """Seconds of the run that no step accounts for."""
    return timings["total"] - sum(v for step, v in timings.items() if step not in ("total", "of"))


@needs_torch
def test_torch_start_up_is_a_step_not_unexplained_seconds(tmp_path):
    """A fresh process: importing torch (seconds) used to sit in ``total`` outside every step, the torch
    backend's unexplained seconds; it is now the step ``backend``, and what no step explains is small."""
    store = build_store(tmp_path / "s.zarr")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    code = "from foal_pipe.cli import main; main()"
    proc = subprocess.run([sys.executable, "-c", code, "learn", "--features", str(store), "--out", str(tmp_path / "run"),
                           "--tasks", "3", "--projection-dim", "32", "--backend", "torch"], capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    timings = json.loads((tmp_path / "run" / "timings.json").read_text())
    assert timings["backend"] > 0
    assert _untimed(timings) < timings["backend"]  # before: the import was all untimed, 7 s of 8.5 s on 2 cores
    assert _untimed(timings) < 0.5 * timings["total"], timings
    assert "backend" in proc.stdout  # the command's summary line shows it too


@needs_torch
def test_every_step_waits_for_the_device(tmp_path, monkeypatch):
    """The device's wait (here a stand-in that takes 50 ms) ends every step: each step's seconds include it."""
    waits: list[float] = []

    def slow_device() -> None:
        time.sleep(0.05)
        waits.append(time.perf_counter())

    monkeypatch.setitem(backend.SYNCHRONIZE, "torch", slow_device)
    store = build_store(tmp_path / "s.zarr")
    result = invoke("learn", "--features", store, "--out", tmp_path / "run", "--tasks", "3", "--projection-dim", "32",
                    "--backend", "torch")
    assert result.exit_code == 0, result.output
    timings = json.loads((tmp_path / "run" / "timings.json").read_text())
    steps = {step: v for step, v in timings.items() if step not in ("total", "backend", "of")}
    assert {"read", "gram", "solve", "test", "write"} <= set(steps)
    assert all(v >= 0.05 for v in steps.values()), timings
    assert len(waits) >= len(steps)


def test_numpy_steps_wait_for_nothing(tmp_path, monkeypatch):
    """NumPy computes synchronously: no device wait is called (a call would raise here)."""
    def no_device() -> None:
        raise AssertionError("NumPy has no device to wait for")

    for name in backend.SYNCHRONIZE:
        monkeypatch.setitem(backend.SYNCHRONIZE, name, no_device)
    store = build_store(tmp_path / "s.zarr")
    result = invoke("learn", "--features", store, "--out", tmp_path / "run", "--tasks", "3", "--projection-dim", "32",
                    "--backend", "numpy")
    assert result.exit_code == 0, result.output
    timings = json.loads((tmp_path / "run" / "timings.json").read_text())
    assert timings["backend"] >= 0 and timings["total"] >= sum(v for k, v in timings.items() if k not in ("total", "of")) - 0.01
