"""Fault injection: `foal-pipe extract` SIGKILLed at random points (between or in the middle of any file write),
then resumed, gives a store byte-identical to an uninterrupted one; a store damaged afterwards (a chunk deleted
or truncated) is refused by `learn` and by `info --verify`.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from foal_pipe.cli import app
from foal_pipe.errors import FoalPipeError
from foal_pipe.protocol.commands import run_learn
from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]  # kill-and-resume runs
REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
ARGS = ["extract", "--dataset", "digits", "--model", "pixels", "--chunk-rows", "128", "--batch-size", "50",
        "--workers", "0", "--device", "cpu"]
runner = CliRunner()

KILLER = """
import atexit, os, signal, sys
import zarr.storage._local as local
from foal_pipe.cli import main

kill_at, mode, args = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
real, calls = local._put, [0]

def put(path, value, exclusive=False):  # every file Zarr writes: chunks, array and group metadata
    calls[0] += 1
    if calls[0] == kill_at:
        if mode == "torn":  # die in the middle of the write, as Zarr does it: half a temporary file
            data = bytes(value.as_buffer_like())
            path.parent.mkdir(parents=True, exist_ok=True)
            path.with_suffix(".0123456789abcdef0123456789abcdef.partial").write_bytes(data[: len(data) // 2])
        os.kill(os.getpid(), signal.SIGKILL)
    return real(path, value, exclusive)

local._put = put
atexit.register(lambda: print("WRITES", calls[0]))
sys.argv = ["foal-pipe", *args]
main()
"""


def _files(store: Path) -> dict[str, bytes]:
    return {p.relative_to(store).as_posix(): p.read_bytes() for p in sorted(store.rglob("*")) if p.is_file()}


def _killed_run(kill_at: int, mode: str, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", KILLER, str(kill_at), mode, *ARGS, "--out", str(out)], env=ENV,
                          capture_output=True, timeout=180)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, int]:
    """An uninterrupted store, and how many files Zarr wrote to make it (the kill points to choose from)."""
    out = tmp_path_factory.mktemp("ref") / "digits.zarr"
    done = _killed_run(10**9, "none", out)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    writes = int(done.stdout.decode().split("WRITES")[-1])
    assert writes > 30  # skeleton, 15 feature chunks, a progress update per chunk, completion
    return out, writes


SEEDS = 6


@pytest.mark.parametrize("seed", range(SEEDS))
def test_killed_at_a_random_write_then_resumed_is_byte_identical(tmp_path, reference, seed):
    """Seed k kills at a random write within the k-th sixth of the run (creation, filling, completion)."""
    ref, writes = reference
    rng = np.random.default_rng(seed)
    kill_at = int(rng.integers(1 + seed * writes // SEEDS, (seed + 1) * writes // SEEDS + 1))
    mode = ("torn", "clean")[seed % 2]
    out = tmp_path / "digits.zarr"
    killed = _killed_run(kill_at, mode, out)
    assert killed.returncode == -signal.SIGKILL, (kill_at, killed.stderr.decode()[-2000:])
    resumed = runner.invoke(app, [*ARGS, "--out", str(out)])
    assert resumed.exit_code == 0, (kill_at, resumed.output)
    assert _files(out) == _files(ref), f"kill at write {kill_at} of {writes} ({mode})"
    assert not (tmp_path / "digits.zarr.lock").exists() and not (tmp_path / ".digits.zarr.creating").exists()
    shown = runner.invoke(app, ["info", str(out), "--verify"])
    assert shown.exit_code == 0 and "all intact" in shown.output, shown.output


@pytest.mark.parametrize("damage", ["delete", "truncate"])
def test_a_store_damaged_after_extraction_is_refused(tmp_path, reference, damage):
    store = tmp_path / "digits.zarr"
    shutil.copytree(reference[0], store)
    chunk = store / "train" / "features" / "c" / "7" / "0"
    if damage == "delete":
        chunk.unlink()
    else:
        chunk.write_bytes(chunk.read_bytes()[:-10])
    with pytest.raises(FoalPipeError, match="train/features .*rows 896-1,023"):
        run_learn(store, tmp_path / "run", StreamConfig(tasks=5), ModelConfig(projection_dim=32), EvaluationConfig(),
              ExecutionConfig())
    assert not (tmp_path / "run").exists()
    verify = runner.invoke(app, ["info", str(store), "--verify"])
    assert verify.exit_code == 1 and "Traceback" not in verify.output
    expected = "missing" if damage == "delete" else "damaged (checksum mismatch)"
    assert f"train/features rows 896-1,023: {expected}" in " ".join(verify.output.split())
