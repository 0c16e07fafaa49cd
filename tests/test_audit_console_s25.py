"""Audit s25: what the commands print, and where (stdout vs stderr, a pipe vs a terminal, a closed or full stdout).

Checked and found right (scratch runs, not kept here): every command's piped stdout (info/datasets --json parse,
predict's CSV, summary, table, sweep) holds no progress, warning or ANSI code; progress goes to stderr as plain lines
when piped (no carriage-return frames), as a transient bar on a terminal that is erased before an error raised inside
it (a chunk damaged mid-read), before Ctrl-C's or SIGTERM's one line, and before predict --skip-bad's lines; errors are
one line on stderr, also for a store damaged mid-read; `--help` of every command at COLUMNS=20 and 1, and on a
20- and 5-column terminal, exits 0.

The faults below, fixed: a result line was hard-wrapped on a terminal (its text differed from the piped one, a path
folded in two); a closed pipe ended some commands with a silent status 1 (others 141); a full stdout (/dev/full) gave
a traceback or a line that named nothing; a store's dataset name reached stdout with its control characters.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
from helpers import three_class_store

ROOT = Path(__file__).resolve().parent.parent
CODE = "import sys; from foal_pipe.cli import main; sys.argv[0] = 'foal-pipe'; main()"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("COLUMNS", "LINES", "FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "FOAL_PIPE_DEBUG")}
    return {**env, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TERM": "xterm-256color"}


def _piped(*args: str, cwd: Path, stdout=subprocess.PIPE) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CODE, *args], cwd=cwd, env=_env(), stdout=stdout,
                          stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, timeout=300)


def _on_a_terminal(*args: str, cwd: Path, columns: int = 40) -> tuple[int, str, str]:
    """``foal-pipe ARGS`` with stdout and stderr each on a pseudo-terminal ``columns`` wide: (status, stdout, stderr),
    colour codes removed and the terminal's CR LF read as LF."""
    out_master, out_slave = pty.openpty()
    err_master, err_slave = pty.openpty()
    for fd in (out_slave, err_slave):
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    proc = subprocess.Popen([sys.executable, "-c", CODE, *args], cwd=cwd, env=_env(), stdout=out_slave,
                            stderr=err_slave, stdin=subprocess.DEVNULL)
    os.close(out_slave)
    os.close(err_slave)
    texts, live, start = {out_master: b"", err_master: b""}, {out_master, err_master}, time.monotonic()
    while live and time.monotonic() - start < 300:
        ready, _, _ = select.select(list(live), [], [], 0.2)
        for fd in ready:
            try:
                data = os.read(fd, 1 << 16)
            except OSError:  # EIO: the child closed its end
                data = b""
            if not data:
                live.discard(fd)
            texts[fd] += data
        if not ready and proc.poll() is not None:
            break
    status = proc.wait(timeout=60)
    for fd in texts:
        os.close(fd)

    def plain(raw: bytes) -> str:
        return ANSI.sub("", raw.decode()).replace("\r\n", "\n")

    return status, plain(texts[out_master]), plain(texts[err_master])


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    return three_class_store(tmp_path_factory.mktemp("console") / "s.zarr")


# --------------------------------------------------------------------------------------------------
# A result line on a terminal: the terminal wraps it, the text stays the piped one


@pytest.mark.parametrize("command", ["learn", "sweep"])
def test_the_result_line_on_a_terminal_is_the_piped_line_unfolded(store, tmp_path, command):
    """`learn`'s one line (and `sweep`'s last) on a 40-column terminal was hard-wrapped by rich: newlines and trailing
    spaces put into the text and the --out path cut in two (`.../a-long-out\\nput-folder`), so what a user copies from
    the terminal is not the path; `evaluate` and `extract` print theirs with soft_wrap (the terminal wraps, the text is
    the piped one)."""
    out = tmp_path / "a-long-output-folder-name-for-this-run" / command
    status, stdout, _ = _on_a_terminal(command, "--features", str(store), "--out", str(out), "--tasks", "3",
                                       "--projection-dim", "8", "--gamma" if command == "learn" else "--gammas", "1",
                                       cwd=tmp_path)
    assert status == 0, stdout
    last = stdout.rstrip("\n").split("\n")[-1]
    first = "A_avg " if command == "learn" else "1 gamma in "
    assert last.startswith(first) and last.endswith(f"-> {out / 'sweep.json' if command == 'sweep' else out}"), stdout
    if command == "learn":
        assert stdout == last + "\n", stdout  # one line, as piped: no line break or trailing space put in


# --------------------------------------------------------------------------------------------------
# A closed pipe: stop quietly with 141 (128 + SIGPIPE), as `predict`, `summary`, `sweep` and `datasets` do


@pytest.mark.parametrize("args", [["info", "--json", "{store}"], ["learn", "--features", "{store}", "--out", "run",
                                  "--tasks", "3", "--projection-dim", "8"], ["--version"], ["learn", "--help"]],
                         ids=["info-json", "learn", "version", "help"])
def test_a_closed_stdout_pipe_ends_with_status_141_like_the_other_commands(store, tmp_path, args):
    """`foal-pipe learn ... | head -0`: learn, info --json, evaluate, --version and --help exited 1 with nothing on
    stderr (rich's Console.on_broken_pipe raises SystemExit(1)), while predict, summary, sweep and datasets (whose
    writes reach cli/_app.user_errors' BrokenPipeError) exit 141; a script under `set -o pipefail` read the first as a
    failure with no reason."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first write
    try:
        proc = _piped(*[a.format(store=store) for a in args], cwd=tmp_path, stdout=write_end)
    finally:
        os.close(write_end)
    assert b"Traceback" not in proc.stderr and b"Error" not in proc.stderr, proc.stderr
    assert proc.returncode == 141, (proc.returncode, proc.stderr)


# --------------------------------------------------------------------------------------------------
# A full stdout: one line naming standard output, no traceback


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("args", [["--version"], ["info", "--help"], ["info", "--json", "{store}"]],
                         ids=["version", "help", "info-json"])
def test_a_full_stdout_is_one_line_naming_standard_output(store, tmp_path, args):
    """`foal-pipe --version > /dev/full` and any `--help > /dev/full` ended with a traceback (OSError ENOSPC from rich,
    outside user_errors); `info --json s.zarr > /dev/full` said "Error: No space left on device (ENOSPC); check the path,
    ..." naming no path nor stdout (predict's line names "standard output": _stdout_of finds no frame holding the
    stream, rich's Console reads it through a property)."""
    with open("/dev/full", "wb") as full:
        proc = _piped(*[a.format(store=store) for a in args], cwd=tmp_path, stdout=full)
    err = proc.stderr.decode()
    assert proc.returncode == 1 and "Traceback" not in err, err
    assert err.count("\n") == 1 and err.startswith("Error: standard output: No space left on device"), err


# --------------------------------------------------------------------------------------------------
# A store's names: no control character reaches stdout


@pytest.fixture(scope="module")
def escape_store(tmp_path_factory) -> Path:
    """A store whose dataset name holds an escape sequence (ESC [2J clears a terminal) and a line break."""
    import numpy as np

    from foal_pipe.store import write_store

    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(2), 20)
    x = rng.normal(size=(40, 4)) + 3 * y[:, None]
    return write_store(tmp_path_factory.mktemp("esc") / "e.zarr", (x, y), (x, y), ["a", "b"],
                       dataset="blobs\x1b[2J\nfake: A_avg 100.00")


def test_a_stores_dataset_name_reaches_stdout_without_control_characters(escape_store, tmp_path):
    """`info`, `sweep`'s title, `evaluate`'s result line and `summary`'s run cell printed the store's dataset name raw:
    an ESC sequence from a store (another lab's) was obeyed by the terminal, and in a piped stdout a line break made a
    line of its own (`fake: A_avg 100.00`). `info` escapes class names (cli/info._class_name) and errors escape control
    characters (cli/_app.one_line); the dataset name gets neither."""
    runs = tmp_path / "runs"
    commands = [["info", str(escape_store)],
                ["learn", "--features", str(escape_store), "--out", str(runs / "r"), "--tasks", "2", "--projection-dim", "4"],
                ["sweep", "--features", str(escape_store), "--out", str(runs / "sw"), "--tasks", "2", "--projection-dim", "4",
                 "--gammas", "1,10"],
                ["evaluate", "--run", str(runs / "r"), "--no-plots"],
                ["summary", str(runs)]]
    bad = {}
    for args in commands:
        proc = _piped(*args, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        text = proc.stdout.decode()
        if "\x1b" in text or any(line.startswith("fake: ") for line in text.splitlines()):
            bad[args[0]] = [line for line in text.splitlines() if "\x1b" in line or line.startswith("fake: ")]
    assert not bad, bad
