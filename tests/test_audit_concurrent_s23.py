"""Two foal-pipe processes at once on the same paths (audit s23, "conc").

Found: every command checks its ``--out`` before any work by making a probe inside it and removing it again
(``check_output_dir``: a folder in ``--out``; ``check_output_file``: a file in the output's folder). When another
run's swap (``atomic_dir``: exchange, then carry the previous outputs' other entries into the new folder) lands
between those two steps, the removal finds no probe: the run is refused with "No such file or directory (ENOENT);
choose a writable --out" although the folder is writable, and its probe, left in the replaced folder, is carried
into the new outputs and stays there for good (each later run carries it again). Seen with real processes: two
``evaluate --out O`` at once; ``learn --out O`` beside a loop of swaps of O. The tests fix that moment with two
real processes, each paused at its step by a file.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import cluster_store

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}

#: A foal-pipe process paused once at one step until the file ``go`` exists (it touches ``ready`` there):
#: ``probe``: just after making its probe in ``folder``; ``swap``: between its swap of ``folder`` and the carrying.
PAUSED = """
import os, sys, tempfile, time
from pathlib import Path
import foal_pipe.io as fio
from foal_pipe.cli import main
role, folder, ready, go, *args = sys.argv[1:]
def pause():
    Path(ready).touch()
    end = time.monotonic() + 90
    while not Path(go).exists() and time.monotonic() < end:
        time.sleep(0.02)
def probing(real):
    def made(*a, **kw):
        result = real(*a, **kw)
        if role == "probe" and not Path(ready).exists() and os.path.realpath(str(kw.get("dir"))) == folder:
            pause()
        return result
    return made
tempfile.mkdtemp, tempfile.mkstemp = probing(tempfile.mkdtemp), probing(tempfile.mkstemp)
settle = fio._settle
def settling(path, tmp):
    if role == "swap" and not Path(ready).exists() and os.path.realpath(path) == folder:
        pause()
    return settle(path, tmp)
fio._settle = settling
sys.argv = ["foal-pipe", *args]
main()
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    return cluster_store(tmp_path_factory.mktemp("conc") / "s.zarr", n_classes=6, dim=16, n_test=240, chunk_rows=256,
                         seed=3, n_train=1200)


def _cli(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from foal_pipe.cli import main; main()", *args], env=ENV, cwd=REPO,
                          capture_output=True, text=True, timeout=300)


def _learn(store: Path, out: Path, gamma: str) -> list[str]:
    return ["learn", "--features", str(store), "--out", str(out), "--tasks", "3", "--gamma", gamma, "--projection-dim", "40"]


def _paused(role: str, folder: Path, flags: Path, args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", PAUSED, role, os.path.realpath(folder), str(flags / f"{role}.ready"),
                             str(flags / f"{role}.go"), *args], env=ENV, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _wait_for(condition, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True


def _done_or_waiting_on_a_lock(proc: subprocess.Popen) -> bool:
    if proc.poll() is not None:
        return True
    try:
        return "lock" in Path(f"/proc/{proc.pid}/wchan").read_text()
    except OSError:
        return False


def _prober_meets_a_swap(tmp_path: Path, folder: Path, probe_args: list[str], swap_args: list[str]):
    """The prober pauses with its probe made in ``folder``; the swapper replaces ``folder`` and pauses before carrying;
    the prober goes on (to its end, or until it waits on a lock), then the swapper. A fixed version that makes either
    wait on the other's lock is let through by the timeouts. The two finished processes, prober first."""
    flags = tmp_path / "flags"
    flags.mkdir()
    prober = _paused("probe", folder, flags, probe_args)
    swapper = None
    try:
        assert _wait_for(lambda: (flags / "probe.ready").exists() or prober.poll() is not None, 120), "prober never probed"
        swapper = _paused("swap", folder, flags, swap_args)
        _wait_for(lambda: (flags / "swap.ready").exists() or _done_or_waiting_on_a_lock(swapper), 20)
        (flags / "probe.go").touch()
        _wait_for(lambda: _done_or_waiting_on_a_lock(prober), 30)
        (flags / "swap.go").touch()
        return prober.communicate(timeout=120), prober.returncode, swapper.communicate(timeout=120), swapper.returncode
    finally:
        for proc in (prober, swapper):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


def _temporaries(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if ".tmp-" in p.name)


def _model_gamma(model: Path) -> float:
    from safetensors import safe_open

    with safe_open(str(model), "np") as f:
        return float(json.loads(f.metadata()["gamma"]))


def test_learn_meets_another_learns_swap_of_its_out(tmp_path, store):
    """learn --gamma 1 --out R checks R while learn --gamma 100 --out R swaps it: both finish (R is writable), R then
    holds the later run's complete files (gamma 1, in metrics.json and the model alike) and no probe of either."""
    out = tmp_path / "R"
    assert _cli(_learn(store, out, "10")).returncode == 0  # an earlier run: the probe is made inside R
    (_, p_err), p_rc, (_, s_err), s_rc = _prober_meets_a_swap(tmp_path, out, _learn(store, out, "1"),
                                                             _learn(store, out, "100"))
    assert s_rc == 0, s_err[-1000:]
    assert p_rc == 0, p_err[-1000:]
    assert json.loads((out / "metrics.json").read_text())["gamma"] == 1.0 == _model_gamma(out / "model.safetensors")
    assert _temporaries(tmp_path) == []


def test_evaluate_meets_another_evaluates_swap_of_its_out(tmp_path, store):
    """Two `evaluate --out O` of two runs at once (seen failing unpatched): both finish, O holds one evaluation whole."""
    runs, out = tmp_path / "runs", tmp_path / "O"
    for gamma in ("1", "100"):
        assert _cli(_learn(store, runs / gamma, gamma)).returncode == 0
    evaluate = lambda run: ["evaluate", "--run", str(runs / run), "--out", str(out), "--no-plots"]  # noqa: E731
    assert _cli(evaluate("1")).returncode == 0
    expected = {p.name: p.read_bytes() for p in out.iterdir()}
    (_, p_err), p_rc, (_, s_err), s_rc = _prober_meets_a_swap(tmp_path, out, evaluate("1"), evaluate("100"))
    assert s_rc == 0, s_err[-1000:]
    assert p_rc == 0, p_err[-1000:]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == expected  # the prober's evaluation, written last
    assert _temporaries(tmp_path) == []


def test_predict_into_a_run_that_learn_swaps_meanwhile(tmp_path, store):
    """`predict --out R/pred.csv` (the README's tour) while `learn --out R` finishes: predict writes its CSV, and
    no probe file is left in R."""
    run = tmp_path / "R"
    assert _cli(_learn(store, run, "1")).returncode == 0
    model = shutil.copy(run / "model.safetensors", tmp_path / "m.safetensors")
    assert _cli(["predict", "--model", str(model), "--features", str(store), "--out", str(tmp_path / "e.csv")]).returncode == 0
    predict = ["predict", "--model", str(model), "--features", str(store), "--out", str(run / "pred.csv")]
    (_, p_err), p_rc, (_, s_err), s_rc = _prober_meets_a_swap(tmp_path, run, predict, _learn(store, run, "100"))
    assert s_rc == 0, s_err[-1000:]
    assert p_rc == 0, p_err[-1000:]
    assert (run / "pred.csv").read_bytes() == (tmp_path / "e.csv").read_bytes()
    assert _model_gamma(run / "model.safetensors") == 100.0 and _temporaries(tmp_path) == []
