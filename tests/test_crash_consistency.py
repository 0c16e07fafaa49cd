"""Kills and interrupts at the exact steps an audit found unsafe: each outcome is one whole set of outputs, no
temporaries, and one line at exit.

Each kill point is simulated in-process, not timed: a signal raised at the step (``signal.raise_signal``, so the
real handler runs), a ``KeyboardInterrupt`` where typer would see one, or a process death (the run's own clean-up
skipped, then the next run's :func:`check_output_dir`).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from helpers import MATRIX, PIXELS, TASKS, make_run

import foal_pipe.io as io
from foal_pipe.errors import FoalPipeError
from foal_pipe.io import atomic_dir, check_output_dir
from foal_pipe.report import evaluate
from foal_pipe.store.lock import exclusive_lock

ROOT = Path(__file__).resolve().parents[1]


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


@pytest.fixture
def handlers():
    """Ctrl-C and SIGTERM raise KeyboardInterrupt, as in the console script; both handlers are put back after."""
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def entries(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir())


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


# --- 1. evaluate killed after its swap: never two evaluations mixed -------------------------------------------


def _sweep() -> dict:
    """A sweep matching :func:`make_run`'s run (as tests/test_evaluate.py's ``make_sweep``)."""
    gammas = (0.1, 1.0, 10.0)
    results = [{"gamma": g, "A_avg": 0.8 + 0.01 * k, "A_last": 0.7, "F": 0.05, "F_published_code": 0.04,
                "accuracy_matrix": MATRIX} for k, g in enumerate(gammas)]
    return {"gammas": list(gammas), "best_gamma": gammas[-1], "results": results, "tasks": TASKS, "n_tasks": 3,
            "projection_dim": 1000, "batch_size": 10, "seed": 0, "dataset": "digits", "encoder": PIXELS, "seconds": 2.0}


class _Died(BaseException):
    """The process ends here: nothing after it runs, its ``finally`` clauses included (their work is skipped)."""


@pytest.mark.parametrize("how", ["interrupt", "kill", "kill-fallback"])
def test_evaluate_stopped_after_its_swap_leaves_one_evaluation(tmp_path, monkeypatch, how):
    """The previous evaluation had a sweep (gamma.csv); the new one does not. Stopped just after the swap, the
    directory must not show the old gamma.csv beside the new summary (it did: the stale files were deleted
    only after the swap, and a kill left them carried over)."""
    run = make_run(tmp_path / "run", model=False)
    (run / "sweep.json").write_text(json.dumps(_sweep()))
    out = tmp_path / "ev"
    evaluate(run, out=out, plots=False)
    assert (out / "gamma.csv").exists()
    (out / "mine.txt").write_text("a user's note")  # not an evaluation's: carried over
    (run / "sweep.json").unlink()
    reference = {f.name: f.read_bytes() for f in evaluate(run, out=tmp_path / "ref", plots=False).files}

    real_exchange, real_rename = io.exchange, os.rename
    if how == "interrupt":
        def exchange(a, b):
            assert real_exchange(a, b)
            raise KeyboardInterrupt
        monkeypatch.setattr(io, "exchange", exchange)
    else:
        monkeypatch.setattr(io, "_settle", lambda path, tmp: None)  # a dead process cleans up nothing
        renames = []

        def rename(a, b):
            real_rename(a, b)
            renames.append(a)
            if len(renames) == 2:
                raise _Died

        def exchange(a, b):
            if how == "kill-fallback":
                return False
            assert real_exchange(a, b)
            raise _Died
        monkeypatch.setattr(io, "exchange", exchange)
        monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(KeyboardInterrupt if how == "interrupt" else _Died):
        evaluate(run, out=out, plots=False)
    monkeypatch.undo()
    monkeypatch.setattr(io, "pid_alive", lambda pid, since=None: False)  # the killed run's process is gone
    check_output_dir(out)  # what the next run does first
    assert snapshot(out) == {**reference, "mine.txt": b"a user's note"}
    assert entries(tmp_path) == ["ev", "ref", "run"]


# --- 2. temporaries at a signal: made and removed with no interrupt between -----------------------------------


def _signal_at_call(monkeypatch, owner, name: str, call: int, signum: int) -> None:
    """Send ``signum`` to this process right after the ``call``-th call of ``owner.name`` did its work."""
    real, calls = getattr(owner, name), []

    def wrapped(*args, **kwargs):
        result = real(*args, **kwargs)
        calls.append(1)
        if len(calls) == call:
            signal.raise_signal(signum)
        return result
    monkeypatch.setattr(owner, name, wrapped)


def _previous(out: Path) -> dict[str, bytes]:
    with atomic_dir(out) as tmp:
        (tmp / "model").write_text("old")
        (tmp / "metrics").write_text("old")
    return snapshot(out)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_at_the_probe_of_check_output_dir(tmp_path, monkeypatch, handlers, signum):
    _signal_at_call(monkeypatch, tempfile, "mkdtemp", 1, signum)
    with pytest.raises(KeyboardInterrupt):
        check_output_dir(tmp_path / "out")
    assert entries(tmp_path) == []


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_at_the_mkdtemp_of_atomic_dir(tmp_path, monkeypatch, handlers, signum):
    out = tmp_path / "out"
    before = _previous(out)
    _signal_at_call(monkeypatch, tempfile, "mkdtemp", 2, signum)  # the first is check_output_dir's probe
    with pytest.raises(KeyboardInterrupt), atomic_dir(out) as tmp:
        (tmp / "model").write_text("new")
    assert snapshot(out) == before
    assert entries(tmp_path) == ["out"]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_while_settling_leaves_the_new_outputs_and_no_journal(tmp_path, monkeypatch, handlers, signum):
    """The swap is done when the signal comes: the new outputs stay, every temporary (``.swap`` included) goes,
    and the interrupt is delivered after, with the real handlers back."""
    out = tmp_path / "out"
    _previous(out)
    _signal_at_call(monkeypatch, io, "_remove", 1, signum)
    with pytest.raises(KeyboardInterrupt), atomic_dir(out) as tmp:
        (tmp / "model").write_text("new")
        (tmp / "metrics").write_text("new")
    assert snapshot(out) == {"model": b"new", "metrics": b"new"}
    assert entries(tmp_path) == ["out"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.getsignal(signal.SIGTERM) is _raise_interrupt


def test_held_signals_deliver_once_after_and_pass_on_later_ones(handlers):
    with pytest.raises(KeyboardInterrupt), io.held_signals():
        signal.raise_signal(signal.SIGINT)
        done = True  # reached: the signal waits
    assert done
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)  # the real handler is back


# --- 3 and 4. an interrupt at any moment of a command: one line, exit 130 or 143 ------------------------------


@pytest.fixture
def cli_main(monkeypatch, handlers):
    from foal_pipe import cli

    monkeypatch.setattr(cli, "_stopped_by", None)
    monkeypatch.setattr(cli, "_announced", False)

    def end(status):  # the process's own end (atexit handlers, os._exit) is the console script's, tested apart
        raise SystemExit(status)
    monkeypatch.setattr(cli, "_end", end)
    asyncio_logger = logging.getLogger("asyncio")
    monkeypatch.setattr(asyncio_logger, "filters", list(asyncio_logger.filters))
    return cli


def _exit_of(cli) -> SystemExit:
    """How ``main`` ends; a KeyboardInterrupt escaping it (a traceback at the console) fails the test, not the
    whole session."""
    try:
        cli.main()
    except SystemExit as exc:
        return exc
    except KeyboardInterrupt:
        pytest.fail("KeyboardInterrupt escaped main(): a traceback")
    pytest.fail("main() returned")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_while_typer_builds_the_commands(monkeypatch, capsys, cli_main, signum):
    """Typer reads every command's annotations before its own Ctrl-C handling starts: a signal then gave a
    traceback of 36-52 lines."""
    def app():
        signal.raise_signal(signum)
    monkeypatch.setattr(cli_main, "app", app)
    monkeypatch.setattr(sys, "argv", ["foal-pipe", "learn", "--help"])
    assert _exit_of(cli_main).code == 128 + signum
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Interrupted: "), lines


def test_interrupt_inside_a_command_says_so_in_one_line(monkeypatch, capsys, cli_main):
    """Typer turns a Ctrl-C the command does not handle into exit 130 and prints nothing."""
    from foal_pipe.cli import _app

    def version():
        raise KeyboardInterrupt
    monkeypatch.setattr(_app, "package_version", version)
    monkeypatch.setattr(sys, "argv", ["foal-pipe", "--version"])
    assert _exit_of(cli_main).code == 130
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Interrupted: "), lines


#: Ctrl-C while Zarr's I/O loop runs a write: the loop's pending task must not add asyncio's lines at exit.
ZARR_PENDING = """
import asyncio, sys, threading
from zarr.core.sync import _get_loop
from foal_pipe.cli import _app, main

def interrupted_write():
    started = threading.Event()

    async def write():
        started.set()
        await asyncio.sleep(3600)

    asyncio.run_coroutine_threadsafe(write(), _get_loop())
    started.wait()
    raise KeyboardInterrupt

_app.package_version = interrupted_write
sys.argv = ["foal-pipe", "--version"]
main()
"""


def test_interrupt_during_a_zarr_write_prints_one_line(tmp_path):
    pytest.importorskip("zarr")
    proc = subprocess.run([sys.executable, "-c", ZARR_PENDING], capture_output=True, text=True, timeout=60,
                          env=os.environ | {"PYTHONPATH": str(ROOT)}, cwd=tmp_path)
    assert proc.returncode == 130, proc.stderr
    assert "Task was destroyed" not in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Interrupted: "), proc.stderr


# --- 5. a lock under a file -------------------------------------------------------------------------------


def test_lock_under_a_file_names_the_file(tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(FoalPipeError) as refused, exclusive_lock(tmp_path / "afile" / "x"):
        pass
    message = str(refused.value)
    assert f"{tmp_path / 'afile'} is a file, not a directory" in message and "\n" not in message, message
    assert entries(tmp_path) == ["afile"]


# --- 6. power loss: the outputs are flushed before the swap, the swap after -----------------------------------


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names fsync'd descriptors through /proc")
def test_outputs_are_synced_before_the_swap_and_the_swap_after(tmp_path, monkeypatch):
    out = tmp_path / "out"
    _previous(out)
    events: list[str] = []
    real_fsync, real_exchange = os.fsync, io.exchange

    def fsync(fd):
        events.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real_fsync(fd)

    def exchange(a, b):
        events.append("exchange")
        return real_exchange(a, b)
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(io, "exchange", exchange)
    with atomic_dir(out) as tmp:
        (tmp / "model").write_text("new")
    swap = events.index("exchange")
    assert str(tmp / "model") in events[:swap] and str(tmp) in events[:swap]
    assert str(tmp_path) in events[swap + 1:]
