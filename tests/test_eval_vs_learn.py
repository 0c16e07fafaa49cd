"""``evaluate --run RUN`` while ``learn --out RUN`` replaces RUN: the evaluation left in RUN is always of the run beside
it. Evaluate holds a shared lock on RUN's parent from reading RUN to renaming RUN/eval in, and learn's swap (which
locks that parent exclusively) looks up the evaluation it leaves out only then. Each interleaving is forced by a
hook, not by timing."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
from helpers import invoke

import foal_pipe.io as io
import foal_pipe.report.evaluation as evaluation
from foal_pipe.report import evaluate
from foal_pipe.store import write_store


def _store(path: Path) -> Path:
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(4), 9)
    x = rng.normal(size=(y.size, 8)) + y[:, None] * 0.5
    return write_store(path, (x, y), (x[::3], y[::3]), list("abcd"), chunk_rows=7, dtype="float64")


def _learn(features: Path, out: Path, gamma: str):
    return invoke("learn", "--features", features, "--out", out, "--tasks", 2, "--projection-dim", 16,
                  "--backend", "numpy", "--gamma", gamma)


@pytest.fixture
def runs(tmp_path):
    """A gamma=1 run at ``run``, and the scores ``evaluate`` gives for it and for the gamma=100 run."""
    features = _store(tmp_path / "a.zarr")
    scores = {}
    for gamma in ("100", "1"):
        assert _learn(features, tmp_path / "run", gamma).exit_code == 0
        evaluate(tmp_path / "run", plots=False)
        scores[gamma] = (tmp_path / "run" / "eval" / "scores.json").read_bytes()
        shutil.rmtree(tmp_path / "run" / "eval")
    assert scores["1"] != scores["100"]
    return features, tmp_path / "run", scores


def _gamma(run: Path) -> float:
    return json.loads((run / "metrics.json").read_text())["gamma"]


def _in_run(run: Path) -> list[str]:
    return sorted(p.name for p in run.iterdir())


def _sweep(features: Path, out: Path):
    return invoke("sweep", "--features", features, "--out", out, "--tasks", 2, "--projection-dim", 16,
                  "--backend", "numpy", "--gammas", "0.1,1")


@pytest.mark.parametrize("command", ["learn", "sweep"])
def test_an_evaluation_written_while_a_run_writes_is_left_out_of_its_outputs(runs, monkeypatch, command):
    """eval/ renamed in before the run's exchange but after the run began: of the replaced run, so left out."""
    features, run, scores = runs
    sync_tree, done = io.sync_tree, []

    def evaluated_meanwhile(top):  # the run's outputs are written, its swap still to come
        if top.name.startswith(".run.tmp-") and not done:
            done.append(evaluate(run, plots=False))
        return sync_tree(top)

    monkeypatch.setattr(io, "sync_tree", evaluated_meanwhile)
    result = _learn(features, run, "100") if command == "learn" else _sweep(features, run)
    assert result.exit_code == 0, result.output
    assert len(done) == 1 and done[0].run.metrics.gamma == 1  # it read and wrote the gamma=1 run, whole
    assert _gamma(run) == (100 if command == "learn" else 1)
    assert _in_run(run) == sorted(["metrics.json", "model.safetensors", "timings.json"] + ["sweep.json"] * (command == "sweep"))
    assert sorted(p.name for p in run.parent.iterdir()) == ["a.zarr", "run"]


@pytest.mark.parametrize("earlier", [False, True], ids=["first-evaluation", "over-an-earlier-one"])
def test_learn_swapping_inside_evaluates_window_waits_for_it(runs, monkeypatch, earlier):
    """evaluate has read RUN and written its temporary when learn swaps: learn waits for its rename (old code: the
    temporary was carried into the new run and renamed to eval/ there, an evaluation of gamma=1 beside gamma=100)."""
    features, run, scores = runs
    if earlier:
        evaluate(run, plots=False)
    paused, release = threading.Event(), threading.Event()
    summary, lock_folder = evaluation.summary_markdown, io.lock_folder

    def pausing_summary(*args, **kwargs):  # evaluate's files but its summary are in its temporary
        paused.set()
        assert release.wait(30)
        return summary(*args, **kwargs)

    def watched_lock(folder, *args, **kwargs):
        """Learn's swap: let evaluate go on once learn would have to wait for it, or, if not, once learn is done."""
        if threading.current_thread() is threading.main_thread() and os.path.samefile(folder, run.parent):
            probe = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
            try:
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                release.set()  # evaluate holds it: learn waits below until evaluate is done
            finally:
                os.close(probe)
        return lock_folder(folder, *args, **kwargs)

    monkeypatch.setattr(evaluation, "summary_markdown", pausing_summary)
    monkeypatch.setattr(io, "lock_folder", watched_lock)
    done: list = []
    worker = threading.Thread(target=lambda: done.append(evaluate(run, plots=False)))
    worker.start()
    assert paused.wait(30)
    try:
        result = _learn(features, run, "100")
    finally:
        release.set()
        worker.join(30)
    assert result.exit_code == 0, result.output
    assert not worker.is_alive() and done and done[0].run.metrics.gamma == 1
    assert _gamma(run) == 100
    assert _in_run(run) == ["metrics.json", "model.safetensors", "timings.json"]
    assert sorted(p.name for p in run.parent.iterdir()) == ["a.zarr", "run"]
    assert evaluate(run, plots=False).run.metrics.gamma == 100  # evaluated again: the new run's
    assert (run / "eval" / "scores.json").read_bytes() == scores["100"]


def test_an_evaluation_after_learns_swap_is_of_the_new_run(runs, monkeypatch):
    """learn's swap first (evaluate waits for its lock, held from the exchange to the settlement): evaluate reads the
    new run."""
    features, run, scores = runs
    exchange, done, workers = io.exchange, [], []

    def evaluated_after(a, b):
        swapped = exchange(a, b)
        if Path(b) == run:  # exchanged, not yet settled: evaluate waits for learn's lock (old code: reads it now)
            workers.append(threading.Thread(target=lambda: done.append(evaluate(run, plots=False))))
            workers[0].start()
        return swapped

    monkeypatch.setattr(io, "exchange", evaluated_after)
    result = _learn(features, run, "100")
    assert result.exit_code == 0, result.output
    workers[0].join(30)
    assert done and done[0].run.metrics.gamma == 100
    assert (run / "eval" / "scores.json").read_bytes() == scores["100"]


@pytest.mark.parametrize("pending", [False, True], ids=["unfinished", "journaled"])
def test_learn_never_carries_an_evaluations_temporary(runs, pending):
    """A killed evaluate's temporaries in RUN are of the replaced run: left out, never settled into the new one."""
    features, run, scores = runs
    tmp = run / ".eval.tmp-99999999-abcdefgh"
    tmp.mkdir()
    (tmp / "scores.json").write_bytes(scores["1"])
    if pending:  # killed between its two renames: RUN/eval missing, the previous evaluation in -old
        old = run / f"{tmp.name}-old"
        old.mkdir()
        (old / "scores.json").write_bytes(scores["1"])
        (run / f"{tmp.name}.swap").write_text(f"{tmp.stat().st_ino}\nscores.json")
    result = _learn(features, run, "100")
    assert result.exit_code == 0, result.output
    assert _in_run(run) == ["metrics.json", "model.safetensors", "timings.json"]
    evaluate(run, plots=False)  # settles nothing of gamma=1's
    assert (run / "eval" / "scores.json").read_bytes() == scores["100"]


def test_an_evaluation_written_elsewhere_holds_no_lock_while_it_writes(runs, monkeypatch):
    """``--out`` outside RUN: RUN's lock is let go once it is read, so evaluations writing into each other's folders
    never wait on each other."""
    features, run, scores = runs
    states = []
    atomic_dir = evaluation.atomic_dir

    def probing(path, *args, **kwargs):
        probe = os.open(run.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
            states.append("free")
        except BlockingIOError:
            states.append("held")
        finally:
            os.close(probe)
        return atomic_dir(path, *args, **kwargs)

    monkeypatch.setattr(evaluation, "atomic_dir", probing)
    evaluate(run, out=run.parent / "elsewhere", plots=False)
    evaluate(run, plots=False)
    assert states == ["free", "held"]
    assert (run.parent / "elsewhere" / "scores.json").read_bytes() == scores["1"]
