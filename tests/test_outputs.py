"""Run outputs as one unit: checked before training, byte-stable, whole or untouched after a failure or a kill.

`learn` writes model.safetensors, metrics.json and timings.json, `sweep` sweep.json and timings.json, into a
temporary sibling directory that replaces `--out` in one rename (foal_pipe/io/). Faults are injected three
ways: monkeypatched system calls (ENOSPC, EROFS), real small or read-only file systems where this machine
lets the tests mount them, and SIGKILL of the real CLI at random moments and at each step of the swap.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from foal_pipe.cli import app
from foal_pipe.io import check_output_dir
from foal_pipe.model.modelfile import read_model
from foal_pipe.store import write_store

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()
N_CLASSES = 6
LEARN_FILES = {"model.safetensors", "metrics.json", "timings.json"}
SWEEP_FILES = {"sweep.json", "timings.json"}


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    rng = np.random.default_rng(0)
    means = rng.normal(size=(N_CLASSES, 16)) * 2

    def split(n):
        y = np.arange(n) % N_CLASSES
        return (means[y] + rng.normal(size=(n, 16))).astype(np.float32), y

    path = tmp_path_factory.mktemp("store") / "blobs.zarr"
    return write_store(path, split(600), split(120), [f"class {i}" for i in range(N_CLASSES)], chunk_rows=64)


def learn_args(store: Path, out: Path, gamma: float = 1.0, dim: int = 32) -> list[str]:
    return ["learn", "--features", str(store), "--out", str(out), "--tasks", "3", "--projection-dim", str(dim),
            "--gamma", str(gamma), "--backend", "numpy"]


def sweep_args(store: Path, out: Path, gammas: str = "0.1,1", dim: int = 32) -> list[str]:
    return ["sweep", "--features", str(store), "--out", str(out), "--tasks", "3", "--projection-dim", str(dim),
            "--gammas", gammas, "--backend", "numpy"]


def invoke(args: list[str]):
    return runner.invoke(app, [str(a) for a in args])


def one_line_error(result, *fragments: str) -> str:
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("Error: ") and "Traceback" not in result.output, result.output
    for fragment in fragments:
        assert fragment in lines[-1], result.output
    return lines[-1]


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def no_temporaries(parent: Path, *names: str) -> None:
    assert sorted(p.name for p in parent.iterdir()) == sorted(names)


# --- what the outputs hold ---------------------------------------------------------------------------------


def test_outputs_hold_no_wall_times_and_timings_sit_beside_them(tmp_path, store):
    result = invoke(learn_args(store, tmp_path / "run"))
    assert result.exit_code == 0, result.output
    assert re.search(r"rows, [0-9.]+ s: ", result.output)  # the CLI still says how long it took
    assert {p.name for p in (tmp_path / "run").iterdir()} == LEARN_FILES
    metrics = json.loads((tmp_path / "run/metrics.json").read_text())
    timings = json.loads((tmp_path / "run/timings.json").read_text())
    assert "seconds" not in metrics
    phases = {step: v for step, v in timings.items() if step not in ("total", "of")}  # of: the record they are of
    assert timings["of"]["file"] == "metrics.json"
    assert {"read", "gram", "solve", "test", "write"} <= set(phases)
    assert all(v >= 0 for v in phases.values()) and timings["total"] >= sum(phases.values()) - 0.01
    tensors, meta = read_model(tmp_path / "run/model.safetensors")  # validates
    assert meta["class_names"] == [f"class {c}" for c in tensors["classes"]]
    assert (meta["gamma"], meta["engine"], meta["n_samples_seen"], meta["activation"]) == (1.0, "gram", 600, "sigmoid")

    result = invoke(sweep_args(store, tmp_path / "sweep"))
    assert result.exit_code == 0, result.output
    assert {p.name for p in (tmp_path / "sweep").iterdir()} == SWEEP_FILES
    assert "seconds" not in json.loads((tmp_path / "sweep/sweep.json").read_text())
    timings = json.loads((tmp_path / "sweep/timings.json").read_text())
    assert {"read", "gram", "solve", "test", "total"} <= set(timings)


def cli(args: list[str], **env: str) -> subprocess.Popen:
    script = "from foal_pipe.cli import app; app(prog_name='foal-pipe')"
    environ = os.environ | {"PYTHONPATH": str(ROOT), **env}
    return subprocess.Popen([sys.executable, "-c", script, *args], env=environ, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def run_cli(args: list[str], **env: str) -> None:
    proc = cli(args, **env)
    _, err = proc.communicate()
    assert proc.returncode == 0, err


def test_same_command_twice_gives_the_same_bytes(tmp_path, store):
    """Separate processes (different hash seeds): the outputs DVC tracks are byte-identical, timings aside."""
    for seed, name in (("1", "a"), ("2", "b")):
        run_cli(learn_args(store, tmp_path / f"learn-{name}"), PYTHONHASHSEED=seed)
        run_cli(sweep_args(store, tmp_path / f"sweep-{name}"), PYTHONHASHSEED=seed)
    for kind, files in (("learn", LEARN_FILES), ("sweep", SWEEP_FILES)):
        for file in files - {"timings.json"}:
            a, b = (tmp_path / f"{kind}-a" / file).read_bytes(), (tmp_path / f"{kind}-b" / file).read_bytes()
            assert a == b, f"{kind} {file} differs between two identical runs"


# --- refused before any work ---------------------------------------------------------------------------------


def _trained(*args, **kwargs):
    raise AssertionError("work started although --out cannot be written")


def _bad_out(tmp_path: Path, kind: str) -> tuple[Path, str]:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    if kind == "file":
        return blocker, "is a file"
    if kind == "under-file":
        return blocker / "run" / "deeper", f"{blocker} is a file, not a directory"
    if kind == "immutable":  # root ignores permission bits; an immutable directory refuses even root
        parent = tmp_path / "frozen"
        parent.mkdir()
        if subprocess.run(["chattr", "+i", str(parent)], capture_output=True).returncode != 0:
            pytest.skip("chattr +i is not permitted here")
        return parent / "run", "Operation not permitted"
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["file", "under-file", "immutable"])
@pytest.mark.parametrize("command", ["learn", "sweep"])
def test_unwritable_out_is_refused_before_training(tmp_path, store, monkeypatch, command, kind):
    import foal_pipe.protocol.commands as learn

    monkeypatch.setattr(learn, "prepare", _trained)
    out, message = _bad_out(tmp_path, kind)
    try:
        args = learn_args(store, out) if command == "learn" else sweep_args(store, out)
        one_line_error(invoke(args), "cannot write" if kind != "file" else "output", str(out), message)
    finally:
        subprocess.run(["chattr", "-i", str(tmp_path / "frozen")], capture_output=True)


def test_read_only_directory_by_monkeypatch(tmp_path, store, monkeypatch):
    """The same refusal where the machine allows no chattr: the probe directory cannot be created."""
    import tempfile

    import foal_pipe.protocol.commands as learn

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), kwargs.get("dir"))

    monkeypatch.setattr(learn, "prepare", _trained)
    monkeypatch.setattr(tempfile, "mkdtemp", read_only)
    one_line_error(invoke(learn_args(store, tmp_path / "run")), "Read-only file system", str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


# --- a failed write leaves the previous outputs ----------------------------------------------------------------


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class _FullDisk:
    """A file whose second write fails with ENOSPC (the first, the header, fits)."""

    def __init__(self, path, mode):
        self._fh, self._writes = open(path, mode), 0  # noqa: SIM115

    def write(self, data):
        self._writes += 1
        if self._writes > 1:
            _enospc()
        return self._fh.write(data)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._fh.close()


def _text_fails(marker: str):
    """Path.write_text raising ENOSPC for names containing ``marker``: the JSON outputs or the swap's journal."""
    real = Path.write_text

    def write_text(self, *args, **kwargs):
        if marker in self.name:
            _enospc()
        return real(self, *args, **kwargs)

    return lambda mp: mp.setattr(Path, "write_text", write_text)


FAULTS = {
    "rename of a file": lambda mp: mp.setattr(os, "replace", _enospc),
    "swap of the directory": lambda mp: mp.setattr("foal_pipe.io.exchange", _enospc),
    "JSON text": _text_fails(".json.tmp-"),
    "journal": _text_fails(".swap"),
    "model bytes": lambda mp: mp.setattr("foal_pipe.model.modelfile.open", _FullDisk, raising=False),
}


@pytest.mark.parametrize(
    ("command", "fault"),
    [(c, f) for c in ("learn", "sweep") for f in sorted(FAULTS) if (c, f) != ("sweep", "model bytes")],
)
def test_full_disk_leaves_previous_outputs(tmp_path, store, monkeypatch, command, fault):
    out = tmp_path / "run"

    def args(gamma: float) -> list[str]:
        return learn_args(store, out, gamma=gamma) if command == "learn" else sweep_args(store, out, f"{gamma},3")

    assert invoke(args(1.0)).exit_code == 0
    (out / "eval").mkdir()
    (out / "eval/summary.md").write_text("an earlier evaluation")
    before = snapshot(out)
    FAULTS[fault](monkeypatch)
    result = invoke(args(0.25))
    one_line_error(result, "No space left on device", f"cannot write {out}")
    assert ".tmp-" not in result.output  # the output is named, not the temporary folder it is written in
    monkeypatch.undo()
    assert snapshot(out) == before
    no_temporaries(tmp_path, "run")


# --- real file systems: a tiny tmpfs that fills up, a read-only mount ------------------------------------------


@pytest.fixture
def mount(tmp_path):
    """``mount(options) -> Path``: a tmpfs under tmp_path; skipped where this machine does not allow mounting."""
    mounted = []

    def make(options: str) -> Path:
        point = tmp_path / f"mnt{len(mounted)}"
        point.mkdir()
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)], capture_output=True)
        if result.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {result.stderr.decode().strip()}")
        mounted.append(point)
        return point

    yield make
    for point in reversed(mounted):
        subprocess.run(["umount", "-l", str(point)], capture_output=True)


def test_real_full_disk(tmp_path, store, mount):
    disk = mount("size=256k")
    out = disk / "run"
    assert invoke(learn_args(store, out, dim=16)).exit_code == 0
    before = snapshot(out)
    # D = 300: G alone is 300 x 300 x 8 = 720 kB, more than the whole disk
    one_line_error(invoke(learn_args(store, out, dim=300)), "No space left on device", str(disk))
    assert snapshot(out) == before
    no_temporaries(disk, "run")

    sweep = disk / "sweep"
    assert invoke(sweep_args(store, sweep)).exit_code == 0
    before = snapshot(sweep)
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    one_line_error(invoke(sweep_args(store, sweep, "0.5,5")), "No space left on device", str(disk))
    assert snapshot(sweep) == before
    no_temporaries(disk, "filler", "run", "sweep")


def test_real_read_only_mount(tmp_path, store, mount, monkeypatch):
    import foal_pipe.protocol.commands as learn

    disk = mount("size=1m")
    out = disk / "run"
    assert invoke(learn_args(store, out)).exit_code == 0
    predict = ["predict", "--model", out / "model.safetensors", "--features", store, "--out", disk / "p.csv"]
    assert invoke(predict).exit_code == 0
    before = snapshot(disk)
    if subprocess.run(["mount", "-o", "remount,ro", str(disk)], capture_output=True).returncode != 0:
        pytest.skip("cannot remount read-only here")
    monkeypatch.setattr(learn, "prepare", _trained)
    one_line_error(invoke(learn_args(store, out, gamma=0.5)), "Read-only file system", str(out))
    one_line_error(invoke(sweep_args(store, disk / "sweep")), "Read-only file system")
    result = invoke(predict)
    one_line_error(result, "Read-only file system", str(disk / "p.csv"))
    assert "rows, accuracy" not in result.output  # refused before predicting
    assert snapshot(disk) == before


# --- any other I/O error is one line too ------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["learn", "sweep", "predict"])
def test_unexpected_os_errors_are_one_line(tmp_path, store, monkeypatch, command):
    """An OSError the library does not name itself still ends as one line naming the path and the reason."""
    import foal_pipe.model.predict
    import foal_pipe.protocol.commands

    def fail(*args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), "/data/somewhere")

    if command == "predict":
        monkeypatch.setattr(foal_pipe.model.predict, "predict_split", fail)
    else:
        monkeypatch.setattr(foal_pipe.protocol.commands, "prepare", fail)
    args = {"learn": learn_args(store, tmp_path / "run"), "sweep": sweep_args(store, tmp_path / "run"),
            "predict": ["predict", "--model", tmp_path / "m.safetensors", "--features", store]}[command]
    line = one_line_error(invoke(args))
    assert line.startswith("Error: /data/somewhere: Permission denied (EACCES); check the path"), line


# --- kills --------------------------------------------------------------------------------------------------------

#: A child that writes a run's outputs with atomic_dir and dies (os._exit, like SIGKILL: no cleanup runs) at
#: one step of the swap. ``argv``: out directory, kill point.
CHILD = r"""
import os, sys
from pathlib import Path
import foal_pipe.io as io

out, point = Path(sys.argv[1]), sys.argv[2]
real_exchange, real_rename, renames = io.exchange, os.rename, []

def exchange(a, b):
    if point == "journal":
        os._exit(9)
    if point.startswith("fallback"):
        return False
    done = real_exchange(a, b)
    if point == "exchanged":
        os._exit(9)
    return done

def rename(a, b):
    renames.append(a)
    limit = {"fallback-away": 1, "fallback-both": 2, "carrying": 1}.get(point)
    real_rename(a, b)
    if limit is not None and len(renames) == limit:
        os._exit(9)

io.exchange, os.rename = exchange, rename
with io.atomic_dir(out) as tmp:
    (tmp / "model").write_text("new")
    if point == "writing":
        os._exit(9)
    (tmp / "metrics").write_text("new")
"""

#: Where each kill point leaves the outputs once settled: the previous run's or the new one's.
KILL_POINTS = {"writing": "old", "journal": "old", "exchanged": "new", "carrying": "new",
               "fallback-away": "old", "fallback-both": "new"}


@pytest.mark.slow
@pytest.mark.parametrize("point", sorted(KILL_POINTS))
def test_kill_at_each_step_of_the_swap(tmp_path, point):
    out = tmp_path / "run"
    for name, text in (("model", "old"), ("metrics", "old"), ("eval/summary.md", "evaluation"), ("notes", "mine")):
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
    proc = subprocess.run([sys.executable, "-c", CHILD, str(out), point], env=os.environ | {"PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True)
    assert proc.returncode == 9, proc.stderr
    if out.exists():  # readers before any settling see a whole run (only a kill between two renames hides it)
        assert (out / "model").read_text() == (out / "metrics").read_text()
    else:
        assert point == "fallback-away"
    check_output_dir(out)  # what the next run does first
    expected = KILL_POINTS[point]
    assert snapshot(out) == {"eval/summary.md": b"evaluation", "notes": b"mine",
                             "metrics": expected.encode(), "model": expected.encode()}
    no_temporaries(tmp_path, "run")


#: A sitecustomize that sends the process SIGTERM at one point of writing its outputs: inside the temporary
#: directory (``writing``: before metrics.json) or just before the swap (``swap``).
TERM_SITE = """
import os, signal
import foal_pipe.io as io

point, real_write, real_exchange = os.environ["FOAL_PIPE_TEST_TERM"], io.write_json, io.exchange

def write_json(path, data):
    if point == "writing" and str(path).endswith("metrics.json"):
        os.kill(os.getpid(), signal.SIGTERM)
    return real_write(path, data)

def exchange(a, b):
    if point == "swap":
        os.kill(os.getpid(), signal.SIGTERM)
    return real_exchange(a, b)

io.write_json, io.exchange = write_json, exchange
"""


@pytest.mark.parametrize("point", ["writing", "swap"])
def test_sigterm_leaves_the_previous_outputs_and_no_temporaries(tmp_path, store, point):
    """SIGTERM (a scheduler's or a container's stop) unwinds as Ctrl-C does: exit 143, the temporary directory
    removed, the previous outputs as they were; before, it ended the process where it stood."""
    out = tmp_path / "work" / "run"
    assert invoke(learn_args(store, out)).exit_code == 0
    before = snapshot(out)
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(TERM_SITE)
    script = "import sys; from foal_pipe.cli import main; sys.argv[0] = 'foal-pipe'; main()"
    environ = os.environ | {"PYTHONPATH": f"{site}{os.pathsep}{ROOT}", "FOAL_PIPE_TEST_TERM": point}
    proc = subprocess.run([sys.executable, "-c", script, *learn_args(store, out, gamma=0.05)], env=environ, cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert snapshot(out) == before
    no_temporaries(out.parent, "run")


#: A sitecustomize for the killed runs: with FOAL_PIPE_TEST_SLOW_RENAMES set, every rename and swap first sleeps,
#: so that random kills often land while the outputs are being written and moved.
SLOW = "FOAL_PIPE_TEST_SLOW_RENAMES"
SLOW_SITE = f"""
import os, time
if os.environ.get({SLOW!r}):
    import foal_pipe.io as io

    def slow(f):
        def call(*args, **kwargs):
            time.sleep(0.2)
            return f(*args, **kwargs)
        return call

    os.replace, os.rename, io.exchange = slow(os.replace), slow(os.rename), slow(io.exchange)
"""


def _timed_run(args: list[str], **env: str) -> float:
    started = time.perf_counter()
    run_cli(args, **env)
    return time.perf_counter() - started


@pytest.mark.slow
@pytest.mark.parametrize("command", ["learn", "sweep"])
def test_sigkill_at_random_moments(tmp_path, store, command):
    """Kill the real CLI at random moments (fixed seeds): the outputs are always one whole run's."""
    args = {"learn": lambda out, i: learn_args(store, out, gamma=(1.0, 0.05)[i], dim=200),
            "sweep": lambda out, i: sweep_args(store, out, ("0.1,1", "3,30")[i], dim=200)}[command]
    own = LEARN_FILES if command == "learn" else SWEEP_FILES
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SLOW_SITE)
    path = f"{site}{os.pathsep}{ROOT}"
    # each configuration run whole once: the bytes it writes, and how long a run takes, fast and slowed
    whole = {False: _timed_run(args(tmp_path / "ref0", 0), PYTHONPATH=path),
             True: _timed_run(args(tmp_path / "ref1", 1), PYTHONPATH=path, **{SLOW: "1"})}
    refs = [{f: (tmp_path / f"ref{i}" / f).read_bytes() for f in own - {"timings.json"}} for i in (0, 1)]
    work = tmp_path / "work"
    out = work / "run"
    shutil.copytree(tmp_path / "ref0", out)
    (out / "eval").mkdir()
    (out / "eval/summary.md").write_text("an earlier evaluation")
    outcomes, current = [], 0
    for seed in (0, 1, 2):
        rng = np.random.default_rng(seed)
        for k in range(4):
            fresh, slow = k == 0, k % 2 == 1
            target = work / f"fresh-{seed}" if fresh else out
            config = 1 - current  # the other configuration, so that a mix of the two shows
            proc = cli(args(target, config), PYTHONPATH=path, **({SLOW: "1"} if slow else {}))
            time.sleep(float(rng.uniform(0.3, 1.1)) * whole[slow])
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            outcomes.append(proc.returncode)
            if target.exists():  # as a reader sees it right after the kill
                names = {p.name for p in target.iterdir()}
                assert own <= names <= own | {"eval"}, names  # whole, and no temporaries inside
                got = {f: (target / f).read_bytes() for f in refs[0]}
                assert got in refs, "outputs from different runs side by side"
                if proc.returncode == 0:
                    assert got == refs[config]
                if not fresh:
                    current = refs.index(got)
                if command == "learn":
                    read_model(target / "model.safetensors")
            else:
                assert fresh, "a kill removed the previous outputs"
            check_output_dir(target)  # what the next run does first: settle what the killed one left
            assert (out / "eval/summary.md").read_text() == "an earlier evaluation"
            no_temporaries(work, *sorted({"run"} | {p.name for p in work.glob("fresh-*")}))
    assert -signal.SIGKILL in outcomes  # the test did kill runs midway
