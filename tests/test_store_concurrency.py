"""Concurrent writers and readers of one store.

Before: two `extract`s into one store both did the full work; `extract --overwrite` deleted the store in place
while a `learn` read it, which then reported metrics from a mix of stores (or from zeros) with exit 0. Now a
writer holds `<store>.lock` (a second one is refused with the holder's pid and host; a dead holder's lock is
taken over), `--overwrite` builds the new store aside and swaps it in, and readers check the store they read
is still the one they opened.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import foal_pipe.store as st
import foal_pipe.store.lock as lk
from foal_pipe.cli import app
from foal_pipe.errors import FoalPipeError
from foal_pipe.extract import ExtractSpec, run_extract, staging_path
from foal_pipe.protocol.commands import run_learn
from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig
from foal_pipe.store import open_store, read_log, read_meta, writer_lock

pytestmark = pytest.mark.usefixtures("one_torch_thread")
REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
runner = CliRunner()
CLI_ARGS = ["--dataset", "digits", "--model", "pixels", "--chunk-rows", "128", "--batch-size", "50", "--workers", "0"]


def _spec(out: Path, **kw) -> ExtractSpec:
    base = dict(dataset="digits", model="pixels", out=str(out), chunk_rows=128, batch_size=50, workers=0, device="cpu")
    return ExtractSpec(**{**base, **kw})


def _files(store: Path) -> dict[str, bytes]:
    return {p.relative_to(store).as_posix(): p.read_bytes() for p in sorted(store.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ref") / "digits.zarr"
    run_extract(_spec(out))
    return out


def test_a_second_writer_is_refused_while_the_lock_is_held(tmp_path):
    spec = _spec(tmp_path / "digits.zarr")
    with writer_lock(spec.out_path) as lock:
        holder = json.loads(lock.read_text())
        assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
        with pytest.raises(FoalPipeError, match=rf"is being written by process {os.getpid()} on host "
                                                rf"{socket.gethostname()} since .*wait for it to finish"):
            run_extract(spec)
        result = runner.invoke(app, ["extract", *CLI_ARGS, "--out", str(spec.out_path)])
        assert result.exit_code == 1 and "Traceback" not in result.output
        assert " ".join(result.output.split()).startswith("Error: feature store")
    assert not lock.exists() and not spec.out_path.exists()  # nothing was written by the refused runs
    assert run_extract(spec).status == "created" and not lock.exists()


PAUSER = """
import json, sys, time
from pathlib import Path
import foal_pipe.store as st
import foal_pipe.extract as ex
spec, ready, go = json.loads(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
real, calls = st.FeatureWriter.write, []
def write(writer, lo, block):  # after 2 chunks: say so, then wait until told to go on
    calls.append(lo)
    if len(calls) == 3:
        ready.touch()
        while not go.exists():
            time.sleep(0.05)
    real(writer, lo, block)
st.FeatureWriter.write = write
print(ex.run_extract(ex.ExtractSpec(**spec)).status)
"""


@pytest.mark.slow
def test_two_extract_processes_one_store(tmp_path, reference):
    """A second `extract` of the same store while the first runs is refused at once, naming the first; the
    first finishes alone and its store is exact."""
    spec = _spec(tmp_path / "digits.zarr")
    ready, go = tmp_path / "ready", tmp_path / "go"
    first = subprocess.Popen([sys.executable, "-c", PAUSER, json.dumps(asdict(spec)), str(ready), str(go)], env=ENV,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert first.poll() is None, first.communicate()[1].decode()[-2000:]
            assert time.monotonic() < deadline
            time.sleep(0.05)
        for extra in ([], ["--overwrite"]):
            second = runner.invoke(app, ["extract", *CLI_ARGS, "--out", str(spec.out_path), *extra])
            assert second.exit_code == 1, second.output
            assert f"is being written by process {first.pid} on host {socket.gethostname()}" in " ".join(
                second.output.split())
        go.touch()
        out, err = first.communicate(timeout=120)
    finally:
        go.touch()
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0 and out.decode().strip() == "created", err.decode()[-2000:]
    assert _files(spec.out_path) == _files(reference)
    assert len(read_log(spec.out_path)["runs"]) == 1 and not staging_path(spec.out_path).exists()


DIES_HOLDING = """
import os, signal, sys
from foal_pipe.store import writer_lock
with writer_lock(sys.argv[1]):
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.slow
def test_a_dead_writers_lock_is_taken_over(tmp_path, reference):
    spec = _spec(tmp_path / "digits.zarr")
    proc = subprocess.Popen([sys.executable, "-c", DIES_HOLDING, str(spec.out_path)], env=ENV)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    lock = lk.lock_path(spec.out_path)
    assert json.loads(lock.read_text())["pid"] == proc.pid  # left behind by the dead holder
    assert run_extract(spec).status == "created"
    assert not lock.exists() and _files(spec.out_path) == _files(reference)


def test_without_flock_the_pid_decides(tmp_path, monkeypatch):
    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(lk.fcntl, "flock", no_flock)
    target = tmp_path / "s.zarr"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lk.lock_path(target).write_text(json.dumps({"pid": sleeper.pid, "host": socket.gethostname()}))
        with pytest.raises(FoalPipeError, match=rf"process {sleeper.pid} on host .*delete .*s.zarr.lock if that "
                                                "process is gone"), writer_lock(target):
            pass
    finally:
        sleeper.kill()
        sleeper.wait()
    with writer_lock(target) as lock:  # its holder is dead now: taken over
        assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert not lk.lock_path(target).exists()


def _overwrite_during_test_read(monkeypatch, store: Path, **changes):
    """Make the learner's read of test chunk 1 run an `extract --overwrite` of its store first (what a second
    terminal does, at a fixed moment)."""
    real, done = st.Split.read, []

    def read(split, lo, hi):
        if split.name == "test" and lo == 128 and not done:
            done.append(run_extract(_spec(store, **changes), overwrite=True))
        return real(split, lo, hi)

    monkeypatch.setattr(st.Split, "read", read)
    return done


def test_overwrite_while_learn_reads_voids_the_results(tmp_path, monkeypatch, reference):
    """The new store has the same chunks and dtype but other values (not normalised): its chunks decode fine,
    so only the generation check at the end can tell; the run is refused and writes nothing."""
    store = tmp_path / "digits.zarr"
    shutil.copytree(reference, store)
    done = _overwrite_during_test_read(monkeypatch, store, normalize=False)
    with pytest.raises(FoalPipeError, match=r"changed while it was being read \(generation \w+ -> \w+; another"):
        run_learn(store, tmp_path / "run", StreamConfig(tasks=5), ModelConfig(projection_dim=64), EvaluationConfig(),
              ExecutionConfig())
    assert done and done[0].status == "created" and not (tmp_path / "run").exists()
    assert open_store(store).meta.encoder["normalize"] is False  # the new store is complete and in place

    shutil.rmtree(store)
    shutil.copytree(reference, store)
    done.clear()
    result = runner.invoke(app, ["learn", "--features", str(store), "--out", str(tmp_path / "cli"), "--tasks", "5",
                                 "--projection-dim", "64"])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert "changed while it was being read" in " ".join(result.output.split())
    assert done and not (tmp_path / "cli").exists()


def test_a_store_swapped_for_another_layout_mid_read_is_named_as_changed(tmp_path, monkeypatch, reference):
    """float16 chunks under float32 metadata do not decode: the error says the store changed, not that it is
    damaged."""
    store = tmp_path / "digits.zarr"
    shutil.copytree(reference, store)
    _overwrite_during_test_read(monkeypatch, store, dtype="float16")
    with pytest.raises(FoalPipeError, match=r"changed while it was being read"):
        run_learn(store, tmp_path / "run", StreamConfig(tasks=5), ModelConfig(projection_dim=64), EvaluationConfig(),
              ExecutionConfig())


def test_predict_checks_the_store_it_read(tmp_path, monkeypatch, reference):
    from foal_pipe.model.predict import predict_split

    store = tmp_path / "digits.zarr"
    shutil.copytree(reference, store)
    run_learn(store, tmp_path / "run", StreamConfig(tasks=5), ModelConfig(projection_dim=64), EvaluationConfig(),
              ExecutionConfig())
    _overwrite_during_test_read(monkeypatch, store, normalize=False)
    with pytest.raises(FoalPipeError, match="changed while it was being read"):
        predict_split(tmp_path / "run" / "model.safetensors", store)


def test_check_unchanged(tmp_path, reference):
    store = tmp_path / "digits.zarr"
    shutil.copytree(reference, store)
    opened = open_store(store)
    opened.check_unchanged()
    list(opened.train.iter_chunks())
    opened.check_unchanged()
    run_extract(_spec(store), overwrite=True)  # the same contents, but another store: a reader must not mix
    assert read_meta(store)[1].generation == opened.meta.generation  # deterministic id
    with pytest.raises(FoalPipeError, match=r"changed while it was being read \(it was replaced"):
        opened.check_unchanged()
    again = open_store(store)
    st.reopen_at(store, {"train": 0, "test": 0})
    with pytest.raises(FoalPipeError, match=r"\(it is no longer complete"):
        again.check_unchanged()
    shutil.rmtree(store)
    with pytest.raises(FoalPipeError, match=r"\(it was removed"):
        again.check_unchanged()


def test_overwrite_builds_aside_and_resumes_there(tmp_path, monkeypatch, reference):
    """While `--overwrite` runs, the old store stays complete and readable at its path; an interrupted
    overwrite leaves it untouched and resumes in the staging folder; the swap moves the run log along."""
    store = tmp_path / "digits.zarr"
    shutil.copytree(reference, store)
    before = _files(store)
    new = _spec(store, normalize=False)
    fresh = tmp_path / "fresh.zarr"
    run_extract(replace(new, out=str(fresh)))
    real, seen = st.FeatureWriter.write, []

    def write(writer, lo, block):
        if not seen:
            assert writer.path == staging_path(store)
            assert open_store(store).meta.generation == read_meta(reference)[1].generation
        seen.append(lo)
        if len(seen) == 5:
            raise KeyboardInterrupt
        real(writer, lo, block)

    monkeypatch.setattr(st.FeatureWriter, "write", write)
    with pytest.raises(KeyboardInterrupt):
        run_extract(new, overwrite=True)
    monkeypatch.setattr(st.FeatureWriter, "write", real)
    assert _files(store) == before and staging_path(store).is_dir()
    assert read_log(staging_path(store))["runs"][-1]["error"] == "KeyboardInterrupt"
    report = run_extract(new, overwrite=True)
    assert report.status == "resumed" and report.resumed_from == {"train": 512, "test": 0}
    assert report.path == store and not staging_path(store).exists()
    assert _files(store) == _files(fresh)
    runs = read_log(store)["runs"]
    assert [r["status"] for r in runs] == ["created", "resumed"] and runs[-1]["generation"] == report.generation
    assert not Path(str(staging_path(store)) + ".log.json").exists()


@pytest.mark.slow
def test_readers_see_the_old_or_the_new_store_never_a_mix(tmp_path, reference):
    """A loop of `info --verify` in another process during an `extract --overwrite` never sees a damaged or
    incomplete store at the path (the swap is one atomic exchange)."""
    store = tmp_path / "digits.zarr"
    shutil.copytree(reference, store)
    progress = tmp_path / "checks"
    watcher = subprocess.Popen(
        [sys.executable, "-c", WATCHER, str(store), str(tmp_path / "stop"), str(progress)], env=ENV,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _wait_for_checks(progress, 1)  # the watcher has read the old store (however slow its start under load)
        for normalize in (False, True, False):
            run_extract(_spec(store, normalize=normalize), overwrite=True)
        _wait_for_checks(progress, int(progress.read_text()) + 1)  # ... and reads the new one before it stops
    finally:
        (tmp_path / "stop").touch()
        out, err = watcher.communicate(timeout=60)
    seen = json.loads(out.decode().strip().splitlines()[-1])
    assert seen["bad"] == [], seen
    assert seen["checks"] > 0 and len(seen["generations"]) >= 2, (seen, err.decode()[-1000:])


def _wait_for_checks(progress: Path, count: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not (progress.exists() and int(progress.read_text() or 0) >= count):
        assert time.monotonic() < deadline, f"the watcher made fewer than {count} checks in {timeout:.0f} s"
        time.sleep(0.05)


WATCHER = """
import json, os, sys
from pathlib import Path
from foal_pipe.errors import FoalPipeError
from foal_pipe.store import open_store
store, stop, progress = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
checks, bad, generations = 0, [], set()
while not stop.exists():
    try:
        s = open_store(store)
        x = [b.sum() for _, b in s.test.iter_chunks()]
        s.check_unchanged()
        generations.add(s.meta.generation)
        checks += 1
        progress.with_suffix(".tmp").write_text(str(checks))
        os.replace(progress.with_suffix(".tmp"), progress)
    except FoalPipeError as exc:
        if "changed while it was being read" not in str(exc):
            bad.append(str(exc))
print(json.dumps({"checks": checks, "bad": bad[:3], "generations": sorted(generations)}))
"""


def test_learn_outputs_are_unchanged_when_the_store_changed(tmp_path, monkeypatch, reference):
    """A previous run's outputs survive a run refused because its store changed underneath."""
    store = tmp_path / "digits.zarr"
    shutil.copytree(reference, store)
    run = tmp_path / "run"
    run_learn(store, run, StreamConfig(tasks=5), ModelConfig(projection_dim=64), EvaluationConfig(), ExecutionConfig())
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    _overwrite_during_test_read(monkeypatch, store, normalize=False)
    with pytest.raises(FoalPipeError, match="changed while it was being read"):
        run_learn(store, run, StreamConfig(tasks=5, seed=1), ModelConfig(projection_dim=64), EvaluationConfig(),
                  ExecutionConfig())
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    assert np.isfinite(json.loads((run / "metrics.json").read_text())["A_avg"])
