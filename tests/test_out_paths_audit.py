"""Output paths the audit found mishandled: a killed run's temporary counted by ``summary``, special files replaced
by ``predict --out``, glob characters in a name settling another output's temporaries, an ``--out`` holding an input,
two runs swapping one output at once, an output that cannot be replaced, names too long for the temporaries, and
permission bits lost by the replacement."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_one_line_error, invoke

import foal_pipe.io as io
from foal_pipe.errors import FoalPipeError
from foal_pipe.report.discovery import find_runs
from foal_pipe.store import write_store

DEAD_PID = 9999999  # above any pid_max (at most 2**22): never a running process
LEARN = ("--tasks", "3", "--projection-dim", "20")


@pytest.fixture
def store(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    y, yt = np.repeat(np.arange(3), 10), np.repeat(np.arange(3), 4)
    return write_store(tmp_path / "data" / "s.zarr", ((rng.normal(size=(y.size, 4)) + y[:, None]).astype(np.float32), y),
                       ((rng.normal(size=(yt.size, 4)) + yt[:, None]).astype(np.float32), yt), ["a", "b", "c"])


@pytest.fixture
def run(store: Path, tmp_path: Path) -> Path:
    out = tmp_path / "runs" / "k"
    result = invoke("learn", "--features", store, "--out", out, *LEARN)
    assert result.exit_code == 0, result.output
    return out


def test_summary_skips_the_temporaries_of_killed_runs_and_tables(run):
    """A killed learn leaves its complete files in ``.k.tmp-PID-RANDOM``; a table's scratch holds runs too."""
    runs = run.parent
    shutil.copytree(run, runs / f".k.tmp-{DEAD_PID}-abcdefgh")
    shutil.copytree(run, runs / f".k.tmp-{DEAD_PID}-abcdefgh-old")
    shutil.copytree(run, runs / f".t.table-runs-{DEAD_PID}-abcd_fgh" / "r")
    shutil.copytree(run, runs / ".hidden-but-mine")  # a user's own dot-folder is a run
    assert [r.path for r in find_runs([runs])] == [runs / ".hidden-but-mine", run]


@pytest.mark.parametrize("kind", ["fifo", "device", "link to fifo"])
def test_predict_refuses_an_out_that_is_not_a_regular_file(store, run, tmp_path, kind):
    target = tmp_path / "special"
    if kind == "device":
        try:
            os.mknod(target, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # /dev/null's numbers, in tmp_path
        except PermissionError:
            pytest.skip("mknod needs CAP_MKNOD")
    else:
        os.mkfifo(target)
    out = target if kind != "link to fifo" else tmp_path / "link"  # as /dev/stdout links to a pipe
    if out != target:
        out.symlink_to(target)
    result = invoke("predict", "--model", run / "model.safetensors", "--features", store, "--out", out)
    assert_one_line_error(result, "FIFO" if kind != "device" else "device", "--out")
    mode = os.stat(target).st_mode
    assert stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)  # still the special file


def test_glob_characters_in_a_name_do_not_settle_another_outputs_temporaries(tmp_path):
    """A run on ``run1`` killed between its two renames; a check of ``run[1]`` must leave that state to ``run1``."""
    run1 = tmp_path / "run1"
    (run1 / "eval").mkdir(parents=True)
    (run1 / "eval" / "summary.md").write_text("run1's evaluation")
    tmp = tmp_path / f".run1.tmp-{DEAD_PID}-abcdefgh"
    tmp.mkdir()
    (tmp / "metrics.json").write_text("{}")
    run1.rename(tmp.with_name(tmp.name + "-old"))
    tmp.with_name(tmp.name + ".swap").write_text(str(tmp.stat().st_ino))
    io.check_output_dir(tmp_path / "run[1]")
    assert sorted(p.name for p in tmp_path.iterdir()) == [tmp.name, tmp.name + "-old", tmp.name + ".swap"]
    io.check_output_dir(run1)  # its own check puts the previous outputs back
    assert (run1 / "eval" / "summary.md").read_text() == "run1's evaluation"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run1"]


def test_an_out_holding_an_input_is_refused(store, run, tmp_path):
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    result = invoke("learn", "--features", store, "--out", tmp_path, *LEARN)
    assert_one_line_error(result, "holds an input", str(store))
    result = invoke("sweep", "--features", store, "--out", store.parent, "--tasks", "3", "--projection-dim", "20")
    assert_one_line_error(result, "holds an input", str(store))
    result = invoke("learn", "--init-model", run / "model.safetensors", "--features", store, "--out", run, "--tasks", "3")
    assert_one_line_error(result, "holds an input", str(run / "model.safetensors"))
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_two_runs_swapping_one_out_at_once_keep_its_other_entries(tmp_path, monkeypatch):
    """The second run swaps while the first has swapped but not yet carried ``eval/`` back."""
    out = tmp_path / "out"
    (out / "eval").mkdir(parents=True)
    (out / "eval" / "keep").write_text("k")
    swapped, original = threading.Event(), io.exchange

    def slow_exchange(a: Path, b: Path) -> bool:
        done = original(a, b)
        if not swapped.is_set():
            swapped.set()
            time.sleep(0.3)  # a descheduled first run: the second lands in this window
        return done

    monkeypatch.setattr(io, "exchange", slow_exchange)
    errors = []

    def write(i: int, wait: bool) -> None:
        try:
            if wait:
                swapped.wait(5)
            with io.atomic_dir(out) as tmp:
                (tmp / "metrics.json").write_text(json.dumps({"run": i}))
                (tmp / "model").write_text(str(i))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i, i == 1)) for i in (0, 1)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert errors == []
    assert sorted(p.name for p in out.iterdir()) == ["eval", "metrics.json", "model"]
    assert json.loads((out / "metrics.json").read_text())["run"] == int((out / "model").read_text()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_mount_point_out_is_refused_up_front(tmp_path, monkeypatch):
    out = tmp_path / "volume"
    out.mkdir()
    monkeypatch.setattr(os.path, "ismount", lambda p: Path(p) == out)
    with pytest.raises(FoalPipeError, match="mount point.*choose a folder inside it"):
        io.check_output_dir(out)


NOCAP = ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner,-linux_immutable", "--"]


def _without_override(code: str) -> subprocess.CompletedProcess:
    """Run Python ``code`` as this user without the capabilities that let root write a read-only folder."""
    prefix = NOCAP if os.geteuid() == 0 else []
    if prefix and shutil.which("setpriv") is None:
        pytest.skip("needs setpriv to drop root's DAC override")
    return subprocess.run([*prefix, sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_a_read_only_out_is_refused_up_front_and_read_only_leftovers_are_removed(tmp_path):
    out, left = tmp_path / "ro", tmp_path / f".ro.tmp-{DEAD_PID}-abcdefgh"
    out.mkdir()
    (out / "metrics.json").write_text("{}")
    out.chmod(0o555)
    (left / "plots").mkdir(parents=True)
    (left / "plots" / "a.png").write_text("x")
    (left / "plots").chmod(0o555)
    try:
        done = _without_override(
            "import foal_pipe.io as io\n"
            f"try:\n    io.check_output_dir({str(out)!r})\nexcept io.FoalPipeError as e:\n    print(e)\n")
    finally:
        out.chmod(0o755)
    assert done.returncode == 0, done.stderr
    assert "Permission denied" in done.stdout and str(out) in done.stdout
    assert not left.exists()  # the dead run's temporary, read-only folder and all


def test_a_name_too_long_for_the_temporaries_is_refused_up_front(tmp_path):
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    longest = limit - len(f"..tmp-{DEAD_PID}-abcdefgh.swap")  # the journal beside an output, with a 7-digit pid
    with pytest.raises(FoalPipeError, match=f"at most {longest} bytes"):
        io.check_output_dir(tmp_path / ("f" * (longest + 1)))
    out = tmp_path / ("f" * longest)
    for i in range(2):  # made, then replaced: the second swap writes the journal
        with io.atomic_dir(out) as tmp:
            (tmp / "m").write_text(str(i))
    assert (out / "m").read_text() == "1"


def test_replacing_an_out_keeps_its_permission_bits_and_group(tmp_path):
    private, shared, csv = tmp_path / "private", tmp_path / "shared", tmp_path / "p.csv"
    private.mkdir(mode=0o700)
    private.chmod(0o700)
    shared.mkdir()
    gid = 65534 if os.geteuid() == 0 else os.getegid()
    os.chown(shared, -1, gid)
    shared.chmod(0o2770)
    csv.write_text("old")
    csv.chmod(0o600)
    for folder in (private, shared):
        with io.atomic_dir(folder) as tmp:
            (tmp / "m").write_text("new")
    with io.atomic_path(csv) as tmp:
        tmp.write_text("new")
    assert stat.S_IMODE(private.stat().st_mode) == 0o700
    assert (stat.S_IMODE(shared.stat().st_mode), shared.stat().st_gid) == (0o2770, gid)
    assert (stat.S_IMODE(csv.stat().st_mode), csv.read_text()) == (0o600, "new")
