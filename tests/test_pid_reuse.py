"""A killed run's temporaries whose process id the system has given to another process since: the maker is gone, so
its replacement is settled and its scratch removed, instead of waiting for the unrelated process to end."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from datetime import UTC

import pytest

from foal_pipe import durable, io
from foal_pipe.durable import changed_at, pid_alive, process_start
from foal_pipe.io import atomic_dir, check_output_dir
from foal_pipe.protocol.tablekept import KeptRuns

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="process start times need /proc")


def test_process_start_is_when_the_process_began():
    before = time.time()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        started = process_start(child.pid)
        assert started is not None and before - 1.5 <= started <= time.time() + 1.5
    finally:
        child.kill()
        child.wait()
    assert process_start(child.pid) is None  # reaped: no such process
    assert process_start(os.getpid()) <= before


def test_a_live_process_started_after_the_temporary_is_another_one(tmp_path):
    made = tmp_path / "made"
    made.mkdir()
    since = changed_at(made)
    assert since is not None
    assert pid_alive(os.getpid(), since)  # this process made it: alive
    began = process_start(os.getpid())
    assert began is not None  # said to have made something long before it began: another process's
    assert not pid_alive(os.getpid(), began - 2 * durable._START_SLACK)
    assert pid_alive(os.getpid(), None)  # no change time known: the id alone, as before
    assert changed_at(tmp_path / "gone") is None


class _Died(BaseException):
    """A process killed right after its swap: the journal is left for the next run to settle."""


def _killed_swap(tmp_path, monkeypatch):
    out = tmp_path / "run"
    out.mkdir()
    (out / "model").write_text("old")
    real_exchange = io.exchange

    def exchange(a, b):
        assert real_exchange(a, b)
        raise _Died

    with monkeypatch.context() as patch:
        patch.setattr(io, "exchange", exchange)
        patch.setattr(io, "_settle", lambda path, tmp: None)
        with pytest.raises(_Died), atomic_dir(out) as tmp:
            (tmp / "model").write_text("new")
    return out


def test_a_killed_swap_whose_pid_runs_again_is_settled(tmp_path, monkeypatch):
    out = _killed_swap(tmp_path, monkeypatch)
    left = sorted(p.name for p in tmp_path.iterdir() if p.name != "run")
    assert left, "the killed swap left its temporaries"
    # The temporaries are named with this (live) process's id: as far as the id goes, their maker still runs.
    monkeypatch.setattr(io, "_left_by_this_process", lambda pid, base: False)
    check_output_dir(out)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "run") == left  # a live maker's: untouched
    # The same id, but a process that started after the temporaries were last changed: another process.
    monkeypatch.setattr(durable, "process_start", lambda pid: time.time() + 2 * durable._START_SLACK)
    check_output_dir(out)
    assert [p.name for p in tmp_path.iterdir()] == ["run"]
    assert (out / "model").read_text() == "new"


def test_a_tables_scratch_whose_pid_runs_again_is_removed(tmp_path, monkeypatch):
    out = tmp_path / "table"
    scratch = tmp_path / f".{out.name}.table-runs-{os.getpid()}-abcdefgh"
    scratch.mkdir()
    KeptRuns(out)
    assert scratch.exists()  # this live process's: kept
    monkeypatch.setattr(durable, "process_start", lambda pid: time.time() + 2 * durable._START_SLACK)
    KeptRuns(out)
    assert not scratch.exists()


def test_a_store_lock_whose_holder_id_runs_again_is_free():
    from datetime import datetime, timedelta

    from foal_pipe.store.lock import _alive_here

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        def holder(ago: float) -> dict:
            since = datetime.now(UTC) - timedelta(seconds=ago)
            return {"pid": child.pid, "host": socket.gethostname(), "since": since.isoformat(timespec="seconds")}

        assert _alive_here(holder(0))  # written by the process that runs now
        assert not _alive_here(holder(10 * durable._START_SLACK))  # written long before this process began
        assert _alive_here({"pid": child.pid, "host": socket.gethostname()})  # no time recorded: the id alone
    finally:
        child.kill()
        child.wait()
