"""The console script ends a command, successful, failed or stopped, without the interpreter's teardown, after what
a normal exit does first: other threads joined, ``atexit`` handlers run, output flushed. After a SIGTERM, the
teardown once aborted (Python 3.11, "Fatal Python error: PyThreadState_Get", exit -6, under Zarr's daemon read
threads; CI of 2026-12-01). Under a profiler or a tracer, and after an unexpected exception, it exits the normal
way."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
import atexit, sys, threading, time
from pathlib import Path
out = Path(sys.argv[1])
atexit.register(lambda: (out / "atexit").write_text("ran"))
threading.Thread(target=lambda: (time.sleep(0.3), (out / "thread").write_text("done"))).start()

class Teardown:  # freed in the interpreter's teardown: its names are bound now, the module's are gone by then
    def __del__(self, open=open, path=str(out / "teardown")):
        open(path, "w").close()

keep = Teardown()
sys.argv = ["foal-pipe", *sys.argv[2:]]
from foal_pipe.cli import _app, main
END = {"stop": lambda: os.kill(os.getpid(), signal.SIGTERM), "message": lambda: sys.exit("a message for the user"),
       "bug": lambda: 1 / 0}
if out.name in END:  # the command's work replaced by a stop, an exit with a message, or a bug
    import os, signal
    _app.package_version = END[out.name]
main()
"""


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), *args], capture_output=True, text=True,
                          timeout=120)


def test_a_successful_command_skips_only_the_teardown(tmp_path):
    proc = _run(tmp_path, "--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("foal-pipe ") and proc.stdout.endswith("\n")  # flushed into a pipe
    assert (tmp_path / "thread").read_text() == "done"  # joined, not killed
    assert (tmp_path / "atexit").read_text() == "ran"
    assert not (tmp_path / "teardown").exists()


def test_a_failed_command_skips_only_the_teardown(tmp_path):
    proc = _run(tmp_path, "learn", "--features", str(tmp_path / "missing.zarr"), "--out", str(tmp_path / "run"))
    assert proc.returncode == 1
    assert "feature store" in proc.stderr and "does not exist" in proc.stderr
    assert (tmp_path / "atexit").exists() and (tmp_path / "thread").exists()
    assert not (tmp_path / "teardown").exists()


@pytest.mark.parametrize(("end", "status", "said"), [
    ("stop", 128 + signal.SIGTERM, "Interrupted: stopped by SIGTERM; re-run the same command\n"),
    ("message", 1, "a message for the user\n"),
])
def test_a_stopped_command_and_an_exit_message_skip_only_the_teardown(tmp_path, end, status, said):
    (tmp_path / end).mkdir()
    proc = _run(tmp_path / end, "--version")
    assert (proc.returncode, proc.stderr) == (status, said)
    assert (tmp_path / end / "thread").read_text() == "done"
    assert (tmp_path / end / "atexit").read_text() == "ran"
    assert not (tmp_path / end / "teardown").exists()


def test_an_unexpected_exception_exits_the_normal_way(tmp_path):
    """Its traceback is the interpreter's to print."""
    (tmp_path / "bug").mkdir()
    proc = _run(tmp_path / "bug", "--version")
    assert proc.returncode == 1 and proc.stderr.rstrip().endswith("ZeroDivisionError: division by zero"), proc.stderr
    assert (tmp_path / "bug" / "teardown").exists()


def test_a_command_under_a_profiler_exits_the_normal_way(tmp_path):
    """cProfile writes its file after the program returns: a fast exit would lose it."""
    script = tmp_path / "cli.py"
    script.write_text("import sys\nsys.argv[0] = 'foal-pipe'\nfrom foal_pipe.cli import main\nmain()\n")
    proc = subprocess.run([sys.executable, "-m", "cProfile", "-o", str(tmp_path / "cli.prof"), str(script),
                           "--version"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "cli.prof").stat().st_size > 0


def test_a_profiler_registered_with_sys_monitoring_counts_as_attached(monkeypatch):
    """From Python 3.12 cProfile registers as a ``sys.monitoring`` tool and ``sys.getprofile()`` stays None."""
    import types

    from foal_pipe import cli

    monkeypatch.setattr(sys, "gettrace", lambda: None)  # as without coverage or a debugger
    monkeypatch.setattr(sys, "getprofile", lambda: None)
    monkeypatch.setattr(sys, "monitoring", types.SimpleNamespace(get_tool=lambda tool: None), raising=False)
    assert not cli._observed()
    monkeypatch.setattr(sys.monitoring, "get_tool", lambda tool: "cProfile" if tool == 2 else None)
    assert cli._observed()
