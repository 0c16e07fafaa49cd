"""The non-extract commands stopped at random moments (fixed seeds) by Ctrl-C, SIGTERM, SIGHUP and SIGKILL.

After each stop ``--out`` holds the previous complete outputs untouched, the new run's complete outputs, or nothing
(when there was nothing before); nothing else is left beside it (but ``table``'s kept runs, which it resumes, and a
SIGKILL's temporaries, which the next run on ``--out`` settles), nothing in the store or in TMPDIR; a stop ends with
its conventional status and one ``Interrupted:`` line; and the same command run again writes the bytes of an
uninterrupted run (``timings.json`` aside). Every path is relative to the run's folder, and the references are made
at the same depth, so that the recorded paths agree byte for byte.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from helpers import cluster_store

from foal_pipe.io.temporaries import TEMPORARY

ROOT = Path(__file__).resolve().parents[1]
#: The console script, which catches the stops from the import of ``foal_pipe.cli`` on, as a user's shell runs it.
SCRIPT = Path(sys.executable).parent / "foal-pipe"
STORE, RUN_A, RUN_B = "../../s.zarr", "../../runA", "../../runB"
LEARN = ["--features", STORE, "--tasks", "5", "--projection-dim", "600", "--backend", "numpy"]
#: Each command as (arguments, given the output and the configuration: 0 the previous outputs, 1 the stopped run),
#: and its output's name. Configuration 0 differs from 1 so that outputs of the two side by side would show.
COMMANDS: dict[str, tuple[Callable[[str, int], list[str]], str]] = {
    "learn": (lambda out, v: ["learn", *LEARN, "--out", out, "--gamma", ("10", "1")[v]], "out"),
    "learn-orders": (lambda out, v: ["learn", *LEARN, "--out", out, "--gamma", ("10", "1")[v], "--order-seeds", "0,1,2"],
                     "out"),
    "learn-head": (lambda out, v: ["learn", *LEARN, "--out", out, "--head", ("ncm", "slda")[v]], "out"),
    "sweep": (lambda out, v: ["sweep", *LEARN, "--out", out, "--gammas", ("3,30", "0.1,1,10")[v]], "out"),
    "sweep-heads": (lambda out, v: ["sweep", *LEARN, "--out", out, "--gammas", ("3,30", "0.1,1")[v],
                                    "--heads", "ridge,ncm,slda"], "out"),
    "table": (lambda out, v: ["table", *LEARN, "--out", out, "--gamma", ("10", "1")[v], "--heads", "ridge,ncm",
                              "--order-seeds", "0,1"], "out"),
    "table-apart": (lambda out, v: ["table", "--features", STORE, "--tasks", "5", "--projection-dim", "200", "--backend",
                                    "numpy", "--out", out, "--gamma", "auto", "--loo-sample", "0", "--heads", "ridge",
                                    "--order-seeds", ("2,3", "0,1")[v]], "out"),  # ridge walked apart, in scratch folders
    "evaluate": (lambda out, v: ["evaluate", "--run", (RUN_B, RUN_A)[v], "--out", out], "out"),
    "predict": (lambda out, v: ["predict", "--model", f"{(RUN_B, RUN_A)[v]}/model.safetensors", "--features", STORE,
                                "--split", "train", "--out", out], "out.csv"),
}
STOPS = {signal.SIGINT: "Ctrl-C (SIGINT)", signal.SIGTERM: "SIGTERM", signal.SIGHUP: "SIGHUP"}
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGKILL)
#: What a command leaves beside ``--out`` by design: ``table``'s finished runs, which the same command resumes.
KEPT = {"table": ".out.table-runs", "table-apart": ".out.table-runs"}


def _default_stops() -> None:
    """The child's Ctrl-C and SIGHUP as an interactive shell's, whatever the suite's (a background job ignores them)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def start(args: list[str], cwd: Path, tmpdir: Path) -> subprocess.Popen[str]:
    env = os.environ | {"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TMPDIR": str(tmpdir), "COLUMNS": "200"}
    return subprocess.Popen([str(SCRIPT), *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_default_stops)


def finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    _, err = proc.communicate(timeout=300)
    return proc.returncode, err


def files(path: Path, timings: bool = True) -> dict[str, bytes]:
    """Every file under ``path`` (or ``path`` itself) by relative name; ``timings``: with the wall times."""
    if path.is_file():
        return {path.name: path.read_bytes()}
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file() and (timings or p.name != "timings.json")}


def names(path: Path) -> list[str]:
    return sorted(p.relative_to(path).as_posix() for p in path.rglob("*"))


@dataclass
class Lab:
    root: Path
    refs: dict[str, list[dict[str, bytes]]]  # per command, per configuration, timings.json left out
    seconds: dict[str, float]  # an uninterrupted run of configuration 1


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Lab:
    root = tmp_path_factory.mktemp("killfuzz")
    cluster_store(root / "s.zarr", n_classes=10, dim=64, n_test=3000, chunk_rows=1000, seed=0, n_train=8000)
    (root / "tmp").mkdir()
    (root / "refs" / "runs").mkdir(parents=True)
    for run, gamma in ((RUN_A, "1"), (RUN_B, "10")):
        code, err = finish(start(["learn", *LEARN, "--out", run, "--gamma", gamma], root / "refs" / "runs", root / "tmp"))
        assert code == 0, err
    refs, seconds = {}, {}
    for command, (args, out) in COMMANDS.items():
        refs[command] = []
        for v in (0, 1):
            where = root / "refs" / f"{command}-{v}"
            where.mkdir(parents=True)
            began = time.perf_counter()
            code, err = finish(start(args(out, v), where, root / "tmp"))
            seconds[command] = time.perf_counter() - began
            assert code == 0, err
            refs[command].append(files(where / out, timings=False))
    return Lab(root, refs, seconds)


def stop_and_rerun(lab: Lab, command: str, signum: int, seed: int, previous: bool) -> int:
    """One stop of ``command`` at a random moment, its checks and its re-run's; the stopped run's exit status."""
    args, name = COMMANDS[command]
    trial = f"{command}-{signum}-{seed}-{int(previous)}"
    work, tmpdir = lab.root / "trials" / trial, lab.root / "tmps" / trial  # at the depth of the references
    work.mkdir(parents=True)
    tmpdir.mkdir(parents=True)
    out = work / name
    before: dict[str, bytes] = {}
    if previous:
        ref = lab.root / "refs" / f"{command}-0" / name
        (shutil.copytree if ref.is_dir() else shutil.copyfile)(ref, out)
        before = files(out)
    store_names = names(lab.root / "s.zarr")
    proc = start(args(name, 1), work, tmpdir)
    time.sleep(float(np.random.default_rng(seed).uniform(0.15, 1.05)) * lab.seconds[command])
    proc.send_signal(signum)
    code, err = finish(proc)
    what = f"{command} stopped by {signal.Signals(signum).name} (seed {seed}): exit {code}, stderr {err[-600:]!r}"
    early = code == -signum != -signal.SIGKILL  # before the handlers (the interpreter's start): nothing written yet
    if early:
        assert not err or err.endswith("KeyboardInterrupt\n"), what  # as Python ends it: silently, or Ctrl-C's traceback
        assert (files(out) == before) if previous else not out.exists(), what
    if code != 0 and not early:
        if signum == signal.SIGKILL:
            assert code == -signal.SIGKILL, what
        else:
            assert code == 128 + signum, what
            assert "Traceback" not in err, what
            lines = [line for line in err.splitlines() if line.startswith("Interrupted:")]
            assert lines == [f"Interrupted: stopped by {STOPS[signum]}; re-run the same command"], what
            assert err.rstrip("\n").splitlines()[-1] == lines[0], what
    if out.exists():
        got = files(out, timings=False)
        assert got in (lab.refs[command][1], {k: v for k, v in before.items() if k.rsplit("/", 1)[-1] != "timings.json"}), \
            f"{what}: outputs neither the previous ones nor the new run's"
        if got != lab.refs[command][1]:
            assert files(out) == before, f"{what}: the previous outputs were touched"
        if code == 0:
            assert got == lab.refs[command][1], what
        if out.is_dir():
            assert not [n for n in names(out) if n.rsplit("/", 1)[-1].startswith(".")], f"{what}: {names(out)}"
    else:
        assert not previous, f"{what}: the previous outputs were removed"
    left = set(os.listdir(work)) - {name, KEPT.get(command, name)}
    if signum == signal.SIGKILL:
        assert all(TEMPORARY.fullmatch(n) for n in left), f"{what}: left {left}"
    else:
        assert not left, f"{what}: left {left}"
        assert os.listdir(tmpdir) == [], f"{what}: left in TMPDIR {os.listdir(tmpdir)}"
    assert names(lab.root / "s.zarr") == store_names, f"{what}: the store's files changed"
    again, err = finish(start(args(name, 1), work, tmpdir))
    assert again == 0, f"{what}; re-run: {err}"
    assert files(out, timings=False) == lab.refs[command][1], f"{what}: the re-run's bytes differ"
    assert os.listdir(work) == [name], f"{what}: the re-run left {os.listdir(work)}"
    return code


#: The default part: each command once, the signals dealt round, over previous outputs.
QUICK = [(command, SIGNALS[k % len(SIGNALS)]) for k, command in enumerate(COMMANDS)]


@pytest.mark.parametrize(("command", "signum"), QUICK)
def test_a_stop_leaves_whole_outputs_and_the_rerun_the_same_bytes(lab, command, signum):
    stop_and_rerun(lab, command, signum, seed=0, previous=True)


def test_a_stopped_table_resumes_its_kept_runs_to_the_same_bytes(lab):
    """Stopped once its first run is kept: the kept runs stay beside --out, and the same command resumes them to the
    table an uninterrupted run writes, then removes them."""
    args, name = COMMANDS["table"]
    work, tmpdir = lab.root / "trials" / "table-resumed", lab.root / "tmps" / "table-resumed"
    work.mkdir(parents=True)
    tmpdir.mkdir(parents=True)
    proc = start(args(name, 1), work, tmpdir)
    kept = work / KEPT["table"]
    while proc.poll() is None and not list(kept.glob("*.json")):
        time.sleep(0.005)
    proc.send_signal(signal.SIGTERM)
    code, err = finish(proc)
    assert code == 128 + signal.SIGTERM, err
    assert sorted(os.listdir(work)) == [KEPT["table"]] and list(kept.glob("*.json"))
    again, err = finish(start(args(name, 1), work, tmpdir))
    assert again == 0, err
    assert "resumed" in err and "finished run" in err, err
    assert files(work / name, timings=False) == lab.refs["table"][1]
    assert os.listdir(work) == [name]


#: A stop that lands while Python runs a descriptor's ``__set_name__`` (as the lazy import of matplotlib.ticker in
#: ``table`` and ``evaluate`` does: seen once in the random stops above), here as learn writes metrics.json.
SET_NAME_SITE = """
import os, signal
import foal_pipe.io as io

real = io.write_json

def write_json(path, data):
    if str(path).endswith("metrics.json"):
        class Named:
            def __set_name__(self, owner, name):
                os.kill(os.getpid(), signal.SIGTERM)

        class Owner:
            attribute = Named()
    return real(path, data)

io.write_json = write_json
"""


def test_a_stop_inside_set_name_ends_with_its_status_and_one_line(lab, tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SET_NAME_SITE)
    args, name = COMMANDS["learn"]
    work = lab.root / "trials" / "set-name"
    work.mkdir(parents=True)
    env = os.environ | {"PYTHONPATH": f"{site}{os.pathsep}{ROOT}", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([str(SCRIPT), *args(name, 1)], cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert os.listdir(work) == []  # the outputs are not half-written either way
    assert (proc.returncode, proc.stderr) == (143, "Interrupted: stopped by SIGTERM; re-run the same command\n")
