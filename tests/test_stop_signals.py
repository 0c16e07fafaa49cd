"""A stop (Ctrl-C, SIGTERM) ends a run with its status and one line, even when its KeyboardInterrupt is swallowed:
raised inside a ``__del__`` or a weakref callback, Python prints "Exception ignored in ..." and goes on, so that the
run finished and exited 0. And ``extract``'s interrupt line says what the store is: none written, complete and
unchanged, or incomplete."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import three_class_store
from typer.testing import CliRunner

import foal_pipe.extract.run as extract_run
from foal_pipe.cli import app

ROOT = Path(__file__).resolve().parents[1]
MAIN = "import sys; from foal_pipe.cli import main; sys.argv[0] = 'foal-pipe'; main()"
NAMES = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "Ctrl-C (SIGINT)"}

#: Sends the process FOAL_PIPE_TEST_STOP (a signal number) from inside a finaliser (FOAL_PIPE_TEST_IN: a weakref
#: callback or a ``__del__``) when the function FOAL_PIPE_TEST_AT of foal_pipe.io or foal_pipe.extract.run is called.
SWALLOW_SITE = """
import importlib, os, weakref
signum, inside, at = int(os.environ["FOAL_PIPE_TEST_STOP"]), os.environ["FOAL_PIPE_TEST_IN"], os.environ["FOAL_PIPE_TEST_AT"]
module, name = at.rsplit(".", 1)
module = importlib.import_module(module)
real, sent = getattr(module, name), []

class Finalised:
    def __del__(self):
        if inside == "del":
            sent.append(signum)  # once
            os.kill(os.getpid(), signum)
            sent.append(signum)  # the handler runs here: its KeyboardInterrupt is "ignored"

def stop(*args, **kwargs):
    if not sent:
        thing = Finalised()
        if inside == "weakref":
            def callback(ref):
                sent.append(signum)
                os.kill(os.getpid(), signum)
                sent.append(signum)
            ref = weakref.ref(thing, callback)
        del thing
    return real(*args, **kwargs)

setattr(module, name, stop)
"""

#: A stop while metrics.json is written, and then what finalisers print at exit: an exception in a ``__del__`` (as
#: asyncio's ``BaseEventLoop.__del__`` raised) and a coroutine never awaited (Zarr's ``open_group``).
NOISE_SITE = """
import atexit, os, signal
import foal_pipe.io as io

real, kept = io.write_json, []

class Broken:
    def __del__(self):
        raise AttributeError("'_UnixSelectorEventLoop' object has no attribute '_ssock'")

async def open_group():
    pass

def write_json(path, data):
    if str(path).endswith("metrics.json"):
        kept.extend([Broken(), open_group()])
        os.kill(os.getpid(), signal.SIGTERM)
    return real(path, data)

atexit.register(kept.clear)
io.write_json = write_json
"""


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return three_class_store(tmp_path / "s.zarr")


def _learn_args(store: Path, out: Path, gamma: float) -> list[str]:
    return ["learn", "--features", str(store), "--out", str(out), "--tasks", "3", "--projection-dim", "8",
            "--backend", "numpy", "--gamma", str(gamma)]


def _cli(tmp_path: Path, site: str, args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    folder = tmp_path / "site"
    folder.mkdir(exist_ok=True)
    (folder / "sitecustomize.py").write_text(site)
    environ = os.environ | {"PYTHONPATH": f"{folder}{os.pathsep}{ROOT}", **env}
    return subprocess.run([sys.executable, "-c", MAIN, *args], env=environ, cwd=ROOT, capture_output=True, text=True,
                          timeout=300, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.default_int_handler))


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(("signum", "inside"), [(signal.SIGTERM, "weakref"), (signal.SIGINT, "del")])
def test_a_swallowed_stop_ends_learn_with_its_status_and_keeps_the_previous_outputs(tmp_path, store, signum, inside):
    """Before: "Exception ignored in ... KeyboardInterrupt", the new outputs swapped in, exit 0."""
    out = tmp_path / "work" / "run"
    assert CliRunner().invoke(app, _learn_args(store, out, 1.0)).exit_code == 0
    before = _snapshot(out)
    proc = _cli(tmp_path, SWALLOW_SITE, _learn_args(store, out, 0.05), FOAL_PIPE_TEST_STOP=str(int(signum)),
                FOAL_PIPE_TEST_IN=inside, FOAL_PIPE_TEST_AT="foal_pipe.io.write_json")
    assert (proc.returncode, proc.stderr) == (128 + signum, f"Interrupted: stopped by {NAMES[signum]}; re-run the same "
                                              "command\n")
    assert _snapshot(out) == before
    assert sorted(p.name for p in out.parent.iterdir()) == ["run"]  # no temporaries


def test_after_a_stop_finalisers_print_nothing(tmp_path, store):
    """Before: "Exception ignored in ... AttributeError" and "coroutine 'open_group' was never awaited" after the
    Interrupted line."""
    proc = _cli(tmp_path, NOISE_SITE, _learn_args(store, tmp_path / "run", 1.0))
    assert (proc.returncode, proc.stderr) == (143, "Interrupted: stopped by SIGTERM; re-run the same command\n")


def _extract_args(out: Path, *more: str) -> list[str]:
    return ["extract", "--dataset", "digits", "--model", "pixels", "--out", str(out), "--chunk-rows", "128",
            "--batch-size", "50", "--workers", "0", "--device", "cpu", *more]


def _complete(out: Path) -> bool:
    return json.loads((out / "zarr.json").read_bytes())["attributes"]["complete"] is True


def test_a_stop_swallowed_while_extracting_leaves_the_store_incomplete(tmp_path):
    """Before: the store was completed and the run exited 0."""
    out = tmp_path / "d.zarr"
    proc = _cli(tmp_path, SWALLOW_SITE, _extract_args(out), FOAL_PIPE_TEST_STOP=str(int(signal.SIGTERM)),
                FOAL_PIPE_TEST_IN="weakref", FOAL_PIPE_TEST_AT="foal_pipe.extract.run.mark_progress")
    assert proc.returncode == 143, proc.stderr
    assert proc.stderr.splitlines() == [f"Interrupted: {out} is incomplete; re-run the same command to resume after "
                                        "the last written chunk."]
    assert not _complete(out)
    assert CliRunner().invoke(app, _extract_args(out)).exit_code == 0 and _complete(out)


def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


def _interrupted_line(out: Path, *more: str) -> str:
    result = CliRunner().invoke(app, _extract_args(out, *more))
    assert result.exit_code == 130, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_extract_stopped_before_its_store_exists_says_none_was_written(tmp_path, monkeypatch):
    """Before: "d.zarr is incomplete; re-run the same command to resume after the last written chunk"."""
    out = tmp_path / "d.zarr"
    monkeypatch.setattr(extract_run, "load_inputs", _interrupt)  # stopped while the weights load
    assert _interrupted_line(out) == (f"Interrupted: no store was written to {out}; re-run the same command to start "
                                      "the extraction.")
    assert not out.exists()


def test_extract_stopped_while_rechecking_a_complete_store_says_it_is_unchanged(tmp_path, monkeypatch):
    """Before: "d.zarr is incomplete; re-run ..." of a complete store that was not touched."""
    out = tmp_path / "d.zarr"
    assert CliRunner().invoke(app, _extract_args(out)).exit_code == 0
    before = _snapshot(out)
    monkeypatch.setattr(extract_run, "check_store", _interrupt)  # stopped while the store is checked against the inputs
    assert _interrupted_line(out) == f"Interrupted: {out} is complete and unchanged; nothing to resume."
    monkeypatch.setattr(extract_run, "open_inputs", _interrupt)  # --overwrite stopped before the replacement is begun
    assert _interrupted_line(out, "--overwrite") == (f"Interrupted: {out} is unchanged and no replacement was "
                                                     "written; re-run the same command to start it.")
    assert _snapshot(out) == before
