"""Output directories, third audit: an `--out` named by '.' or '..' whose directory holds the command's inputs is
answered with an `--out` the command takes (learn, sweep, continuation, evaluate alike), and a run replacing a run's
outputs leaves out the evaluation of the replaced run (`eval/`), keeping the user's files there."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_one_line_error, invoke

import foal_pipe.io as io
from foal_pipe.io import atomic_dir, check_output_dir
from foal_pipe.store import write_store

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _store(path: Path, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(4), 9)
    x = rng.normal(size=(y.size, 8)) + y[:, None] * 0.5
    return write_store(path, (x, y), (x[::3], y[::3]), list("abcd"), chunk_rows=7, dtype="float64")


def _learn(features, out, *extra):
    return invoke("learn", "--features", features, "--out", out, "--tasks", 2, "--projection-dim", 16,
                  "--backend", "numpy", *extra)


def _sweep(features, out, gammas="0.1,1"):
    return invoke("sweep", "--features", features, "--out", out, "--tasks", 2, "--projection-dim", 16,
                  "--gammas", gammas, "--backend", "numpy")


def _suggested(result) -> str:
    return " ".join(result.output.split()).split("--out ")[-1].rstrip(".")


# --- 1. '.' or '..' naming a directory that holds an input: the suggestion is itself accepted ---------------------

@pytest.mark.parametrize("command", ["learn", "sweep", "continue", "evaluate"])
def test_out_named_by_dots_over_the_inputs_suggests_an_out_the_command_takes(tmp_path, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    new_rows = _store(tmp_path / "data" / "b.zarr", seed=1)
    _store(tmp_path / "data" / "a.zarr")
    assert _learn("data/a.zarr", "run").exit_code == 0
    run = {"learn": lambda out: _learn("data/a.zarr", out), "sweep": lambda out: _sweep("data/a.zarr", out),
           "continue": lambda out: _learn(new_rows, out, "--init-model", "run/model.safetensors"),
           "evaluate": lambda out: invoke("evaluate", "--run", "run", "--out", out, "--no-plots")}[command]
    dots = {"learn": "data/x/..", "sweep": "data/a.zarr/..", "continue": "run/eval/..", "evaluate": "run/eval/.."}[command]
    holder = tmp_path / dots.split("/")[0]
    result = run(dots)
    assert_one_line_error(result, f"output {dots} names a directory by '.' or '..'", f"{holder} holds this command's inputs")
    suggested = _suggested(result)
    assert suggested == str(holder / ("eval" if command == "evaluate" else "run")), result.output
    again = run(suggested)
    assert again.exit_code == 0, again.output


def test_the_suggested_folder_skips_one_that_holds_an_input(tmp_path):
    features = _store(tmp_path / "run" / "a.zarr")  # tmp/run holds the store: tmp/run-2 is suggested
    with pytest.raises(io.FoalPipeError) as refused:
        check_output_dir(tmp_path / "run" / "..", inputs=[features])
    assert str(refused.value).endswith(f"holds this command's inputs; pass a folder by name, e.g. out {tmp_path / 'run-2'}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_a_dot_name_over_no_input_still_suggests_the_directory_itself(tmp_path):
    (tmp_path / "sub").mkdir()
    with pytest.raises(io.FoalPipeError) as refused:
        check_output_dir(tmp_path / "sub" / "..", inputs=[tmp_path.parent / "elsewhere"])
    assert str(refused.value) == (f"output {tmp_path / 'sub' / '..'} names a directory by '.' or '..', which cannot be "
                                  f"replaced in one rename; pass it by name, e.g. out {tmp_path}")


# --- 2. a run replacing RUN leaves out RUN/eval's evaluation of the replaced run -----------------------------------

def _evaluated_run(tmp_path: Path) -> tuple[Path, Path]:
    features = _store(tmp_path / "a.zarr")
    run = tmp_path / "run"
    assert _learn(features, run, "--gamma", "1").exit_code == 0
    assert invoke("evaluate", "--run", run, "--no-plots").exit_code == 0
    assert {"summary.md", "scores.json", "class_accuracy.csv"} <= {p.name for p in (run / "eval").iterdir()}
    return features, run


@pytest.mark.parametrize("notes", [False, True], ids=["evaluation-only", "with-user-notes"])
def test_learn_over_an_evaluated_run_leaves_out_its_evaluation(tmp_path, notes):
    features, run = _evaluated_run(tmp_path)
    if notes:
        (run / "eval" / "notes.md").write_text("mine")
    (run / "mine.txt").write_text("a user's file")
    assert _learn(features, run, "--gamma", "100").exit_code == 0
    assert json.loads((run / "metrics.json").read_text())["gamma"] == 100
    assert sorted(p.name for p in run.iterdir()) == sorted(
        ["metrics.json", "model.safetensors", "timings.json", "mine.txt"] + (["eval"] if notes else []))
    if notes:
        assert sorted(p.name for p in (run / "eval").iterdir()) == ["notes.md"]
        assert (run / "eval" / "notes.md").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.zarr", "run"]  # no temporaries


def test_sweep_into_an_evaluated_run_leaves_out_its_evaluation(tmp_path):
    features, run = _evaluated_run(tmp_path)
    assert _sweep(features, run).exit_code == 0
    assert sorted(p.name for p in run.iterdir()) == ["metrics.json", "model.safetensors", "sweep.json", "timings.json"]


def test_a_failed_run_keeps_the_evaluation(tmp_path):
    features, run = _evaluated_run(tmp_path)
    before = {p.name: p.read_bytes() for p in (run / "eval").iterdir()}
    assert _learn(features, run, "--gamma", "-1").exit_code != 0
    assert {p.name: p.read_bytes() for p in (run / "eval").iterdir()} == before


def test_an_eval_folder_evaluate_did_not_write_is_carried(tmp_path):
    """Without evaluate's scores.json, ``eval/`` is the user's own folder."""
    features = _store(tmp_path / "a.zarr")
    run = tmp_path / "run"
    assert _learn(features, run).exit_code == 0
    (run / "eval").mkdir()
    (run / "eval" / "summary.md").write_text("my own notes")
    assert _learn(features, run, "--gamma", "10").exit_code == 0
    assert (run / "eval" / "summary.md").read_text() == "my own notes"


class _Died(BaseException):
    """A process killed right after the swap: no settling runs."""


@pytest.mark.parametrize("fallback", [False, True], ids=["exchange", "two-renames"])
def test_killed_after_the_swap_the_next_check_leaves_out_the_owned_nested_files(tmp_path, monkeypatch, fallback):
    out = tmp_path / "run"
    (out / "eval").mkdir(parents=True)
    for name, text in (("model", "old"), ("eval/summary.md", "old"), ("eval/notes.md", "mine")):
        (out / name).write_text(text)
    _kill_after_swap(monkeypatch, fallback, renames=2)
    with pytest.raises(_Died), atomic_dir(out, owned=["eval/summary.md"]) as tmp:
        (tmp / "model").write_text("new")
    monkeypatch.undo()
    monkeypatch.setattr(io, "pid_alive", lambda pid, since=None: False)
    check_output_dir(out)  # what the next run does first
    assert {str(p.relative_to(out)): p.read_text() for p in out.rglob("*") if p.is_file()} == {
        "model": "new", "eval/notes.md": "mine"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_docs_say_a_run_leaves_out_the_evaluation_it_replaces():
    text = " ".join((DOCS / "learn.md").read_text().split())
    assert "Entries of `DIR` that the run does not write (`eval/`) are kept." not in text
    assert "evaluation of the replaced outputs" in text


# --- 4. an evaluate between a killed learn and its settlement; a folder both sides have is merged ---------------------

def _kill_after_swap(monkeypatch, fallback: bool, renames: int = 1) -> None:
    """The next atomic_dir dies right after its swap (exchange) or, with ``fallback``, after ``renames`` renames
    (1: between its two renames; 2: after both): no settling."""
    done: list = []
    real_exchange, real_rename = io.exchange, io.os.rename

    def exchange(a, b):
        if fallback:
            return False
        assert real_exchange(a, b)
        raise _Died

    def rename(a, b):
        real_rename(a, b)
        done.append(a)
        if len(done) == renames:
            raise _Died

    monkeypatch.setattr(io, "exchange", exchange)
    monkeypatch.setattr(io.os, "rename", rename)
    monkeypatch.setattr(io, "_settle", lambda path, tmp: None)


@pytest.mark.parametrize("fallback", [False, True], ids=["exchange", "two-renames"])
def test_evaluate_after_a_killed_learn_settles_the_run_first_and_the_users_eval_files_stay(tmp_path, monkeypatch,
                                                                                           fallback):
    features, run = _evaluated_run(tmp_path)
    (run / "eval" / "notes.md").write_text("mine")
    with monkeypatch.context() as patch:
        _kill_after_swap(patch, fallback)
        with pytest.raises(_Died):
            _learn(features, run, "--gamma", "100")
    assert any(p.name.endswith(".swap") for p in tmp_path.iterdir())  # a swap pending, its process gone
    monkeypatch.setattr(io, "pid_alive", lambda pid, since=None: False)
    result = invoke("evaluate", "--run", run, "--no-plots")
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.zarr", "run"]  # settled before the run was read
    gamma = json.loads((run / "metrics.json").read_text())["gamma"]
    assert gamma == (1 if fallback else 100)  # killed before its second rename, the learn is undone
    assert (run / "eval" / "notes.md").read_text() == "mine"
    assert json.loads((run / "eval" / "scores.json").read_text()) != {}
    assert _learn(features, run, "--gamma", "10").exit_code == 0
    assert sorted(p.name for p in (run / "eval").iterdir()) == ["notes.md"]
    assert (run / "eval" / "notes.md").read_text() == "mine"


def test_a_folder_the_settled_outputs_have_too_is_merged_not_dropped(tmp_path, monkeypatch):
    out = tmp_path / "run"
    (out / "eval" / "sub").mkdir(parents=True)
    for name, text in (("model", "old"), ("eval/summary.md", "old"), ("eval/notes.md", "mine"),
                       ("eval/sub/a.txt", "mine too")):
        (out / name).write_text(text)
    with monkeypatch.context() as patch:
        _kill_after_swap(patch, fallback=False)
        with pytest.raises(_Died), atomic_dir(out, owned=["eval/summary.md"]) as tmp:
            (tmp / "model").write_text("new")
    (out / "eval" / "sub").mkdir(parents=True)  # written into the new outputs before they were settled
    (out / "eval" / "summary.md").write_text("new")
    monkeypatch.setattr(io, "pid_alive", lambda pid, since=None: False)
    check_output_dir(out)
    assert {str(p.relative_to(out)): p.read_text() for p in out.rglob("*") if p.is_file()} == {
        "model": "new", "eval/summary.md": "new", "eval/notes.md": "mine", "eval/sub/a.txt": "mine too"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_a_run_writing_a_folder_the_previous_outputs_have_keeps_the_users_files_in_it(tmp_path):
    out = tmp_path / "run"
    (out / "eval").mkdir(parents=True)
    (out / "eval" / "summary.md").write_text("old")
    (out / "eval" / "notes.md").write_text("mine")
    with atomic_dir(out, owned=["eval/summary.md"]) as tmp:
        (tmp / "eval").mkdir()
        (tmp / "eval" / "new.md").write_text("new")
    assert {str(p.relative_to(out)): p.read_text() for p in out.rglob("*") if p.is_file()} == {
        "eval/new.md": "new", "eval/notes.md": "mine"}


def test_check_output_dir_settles_a_pending_swap_of_an_enclosing_folder_only(tmp_path, monkeypatch):
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.md").write_text("mine")
    with monkeypatch.context() as patch:
        _kill_after_swap(patch, fallback=True)  # killed between its renames: run is missing
        with pytest.raises(_Died), atomic_dir(out) as tmp:
            (tmp / "model").write_text("new")
    assert not out.exists()
    unfinished = tmp_path / ".run.tmp-99999999-abcdefgh"  # a temporary without a journal: left for a run on run
    unfinished.mkdir()
    monkeypatch.setattr(io, "pid_alive", lambda pid, since=None: False)
    check_output_dir(out / "eval")
    assert (out / "notes.md").read_text() == "mine" and unfinished.is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".run.tmp-99999999-abcdefgh", "run"]


# --- 5. RUN/eval a symlink: kept, nothing deleted through it, a note ------------------------------------------------

def test_a_symlinked_eval_is_kept_with_a_note_and_nothing_deleted_through_it(tmp_path):
    features = _store(tmp_path / "a.zarr")
    run, ev = tmp_path / "run", tmp_path / "ev"
    assert _learn(features, run, "--gamma", "1").exit_code == 0
    assert invoke("evaluate", "--run", run, "--out", ev, "--no-plots").exit_code == 0
    (run / "eval").symlink_to(ev)
    before = {p.name: p.read_bytes() for p in ev.iterdir()}
    result = _learn(features, run, "--gamma", "100")
    assert result.exit_code == 0, result.output
    assert (run / "eval").is_symlink() and {p.name: p.read_bytes() for p in ev.iterdir()} == before
    note = [line for line in result.output.splitlines() if line.startswith("note:")]
    assert note == [f"note: {run / 'eval'} is a symlink, which this run keeps as it is: the folder it links to ({ev}) holds "
                    "an evaluation of the run being replaced, left there (nothing is deleted through a link); run "
                    "`evaluate` again"]
    (ev / "scores.json").unlink()  # no evaluation there: no note
    result = _learn(features, run, "--gamma", "10")
    assert result.exit_code == 0 and "note:" not in result.output


def test_docs_say_a_symlinked_eval_is_kept_with_a_note():
    text = " ".join((DOCS / "learn.md").read_text().split())
    assert "An `eval/` that is a symlink is kept as it is, and nothing is deleted through it" in text


# --- 6. a swap that did not happen, another folder at RUN meanwhile: the previous outputs are carried into it ---------

def _files(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): p.read_text() for p in folder.rglob("*") if p.is_file()}


def test_a_pending_swap_whose_run_was_taken_by_another_folder_carries_the_previous_outputs_into_it(tmp_path, monkeypatch):
    """Two renames pending (a live or reused PID), an evaluate writing RUN/eval makes RUN through its parents."""
    run, pid = tmp_path / "RUN", 99999999
    new, old = tmp_path / f".RUN.tmp-{pid}-abcdefgh", tmp_path / f".RUN.tmp-{pid}-abcdefgh-old"
    (new / "model.npz").parent.mkdir()
    (new / "model.npz").write_text("new")
    (old / "eval").mkdir(parents=True)
    for name, text in (("model.npz", "old"), ("notes.txt", "user"), ("eval/notes.md", "mine")):
        (old / name).write_text(text)
    (tmp_path / f"{new.name}.swap").write_text(f"{new.stat().st_ino}\nmodel.npz")
    monkeypatch.setattr(io, "pid_alive", lambda pid, since=None: True)
    with atomic_dir(run / "eval") as tmp:
        (tmp / "scores.json").write_text("{}")
    monkeypatch.setattr(io, "pid_alive", lambda pid, since=None: False)  # its process gone
    check_output_dir(run)
    assert _files(run) == {"model.npz": "old", "notes.txt": "user", "eval/notes.md": "mine", "eval/scores.json": "{}"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["RUN"]


def test_a_live_run_whose_second_rename_finds_another_folder_keeps_the_previous_outputs(tmp_path, monkeypatch):
    run = tmp_path / "RUN"
    run.mkdir()
    (run / "model.npz").write_text("old")
    (run / "notes.txt").write_text("user")
    real_rename = io.os.rename

    def rename(a, b):
        real_rename(a, b)
        if Path(a) == run:  # an evaluate writes RUN/eval between the two renames
            (run / "eval").mkdir(parents=True)
            (run / "eval" / "scores.json").write_text("{}")

    monkeypatch.setattr(io, "exchange", lambda a, b: False)
    monkeypatch.setattr(io.os, "rename", rename)
    with pytest.raises(io.WriteError, match="Directory not empty"), atomic_dir(run, owned=["model.npz"]) as tmp:
        (tmp / "model.npz").write_text("new")
    assert _files(run) == {"model.npz": "old", "notes.txt": "user", "eval/scores.json": "{}"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["RUN"]


# --- 7. a settlement failing in atomic_dir: a one-line error, and this process settles the swap it left ---------------

def _failing_carry(monkeypatch, name: str) -> None:
    real_rename = io.os.rename

    def rename(a, b, *rest):
        if Path(b).name == name:
            raise OSError(5, "Input/output error", str(b))
        return real_rename(a, b, *rest)

    monkeypatch.setattr(io.os, "rename", rename)


def _run_with_notes(tmp_path: Path) -> Path:
    run = tmp_path / "RUN"
    run.mkdir()
    (run / "model.npz").write_text("old")
    (run / "notes.txt").write_text("user")
    return run


def test_a_failed_carry_is_a_one_line_write_error_naming_the_output_and_the_fix(tmp_path, monkeypatch):
    run = _run_with_notes(tmp_path)
    with monkeypatch.context() as patch:
        _failing_carry(patch, "notes.txt")
        with pytest.raises(io.WriteError) as failed, atomic_dir(run, owned=["model.npz"]) as tmp:
            (tmp / "model.npz").write_text("new")
    left = next(p.name for p in tmp_path.iterdir() if p.name.endswith(".swap")).removesuffix(".swap")
    assert str(failed.value) == (f"cannot write {run}: Input/output error (EIO); the previous outputs' files it lacks wait "
                                 f"beside it ({left}*); free some space or make it writable, then re-run: the next run on "
                                 "it moves them in")
    assert failed.value.path == run and (tmp_path / left / "notes.txt").read_text() == "user"


@pytest.mark.parametrize("again", ["atomic_dir", "check_output_dir"])
def test_a_swap_this_process_left_pending_is_settled_by_its_next_run_on_the_path(tmp_path, monkeypatch, again):
    run = _run_with_notes(tmp_path)
    with monkeypatch.context() as patch:
        _failing_carry(patch, "notes.txt")
        with pytest.raises((OSError, io.FoalPipeError)), atomic_dir(run, owned=["model.npz"]) as tmp:
            (tmp / "model.npz").write_text("new1")
    if again == "atomic_dir":  # say, the next gamma of a loop calling the API
        with atomic_dir(run, owned=["model.npz"]) as tmp:
            (tmp / "model.npz").write_text("new2")
    else:
        check_output_dir(run)
    assert _files(run) == {"model.npz": "new2" if again == "atomic_dir" else "new1", "notes.txt": "user"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["RUN"]


def test_a_check_during_this_processs_own_swap_leaves_it_alone(tmp_path, monkeypatch):
    run = _run_with_notes(tmp_path)
    real_exchange = io.exchange

    checks = []

    def exchange(a, b):
        """Another call of this process (a thread) while the swap is in progress: what it does before it waits for the
        swap (its probe waits on the folder's lock) must leave the swap alone."""
        check = threading.Thread(target=check_output_dir, args=(run,))
        checks.append(check)
        check.start()
        check.join(0.5)
        assert any(p.name.endswith(".swap") for p in tmp_path.iterdir())
        return real_exchange(a, b)

    monkeypatch.setattr(io, "exchange", exchange)
    with atomic_dir(run, owned=["model.npz"]) as tmp:
        (tmp / "model.npz").write_text("new")
    checks[0].join(30)
    assert not checks[0].is_alive()
    assert _files(run) == {"model.npz": "new", "notes.txt": "user"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["RUN"]
