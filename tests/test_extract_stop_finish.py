"""A stop that a finaliser swallowed (recorded by the command line's ``sys.unraisablehook``) while ``extract`` writes
its last chunk or seals its store: before the seal it is raised there, and the store stays incomplete (resumable),
never sealed by a run that exits as stopped; while the store is sealed it can no longer undo that, so the run log
records the finish and the command says the store is complete."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

import foal_pipe.extract.run as extract_run
import foal_pipe.extract.state as extract_state
from foal_pipe.cli import app
from foal_pipe.durable import swallowed_stop

ROOT = Path(__file__).resolve().parents[1]
MAIN = "import sys; from foal_pipe.cli import main; sys.argv[0] = 'foal-pipe'; main()"
#: SIGTERM sent from inside a weakref callback (its KeyboardInterrupt swallowed) as finish_store is called.
SWALLOW_AT_FINISH = """
import os, signal, weakref
import foal_pipe.extract.run as run

real = run.finish_store

class Finalised:
    pass

def finish_store(state):
    thing = Finalised()
    ref = weakref.ref(thing, lambda ref: os.kill(os.getpid(), signal.SIGTERM))
    del thing
    return real(state)

run.finish_store = finish_store
"""


def _args(out: Path) -> list[str]:
    return ["extract", "--dataset", "digits", "--model", "pixels", "--out", str(out), "--chunk-rows", "128",
            "--batch-size", "50", "--workers", "0", "--device", "cpu"]


def _attributes(out: Path) -> dict:
    return json.loads((out / "zarr.json").read_bytes())["attributes"]


def _last_run(out: Path) -> dict:
    return json.loads(out.with_name(f"{out.name}.log.json").read_text())["runs"][-1]


def _stopped_line(out: Path) -> str:
    result = CliRunner().invoke(app, _args(out))
    assert result.exit_code == 130, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_a_stop_swallowed_with_the_last_chunk_leaves_the_store_incomplete(tmp_path, monkeypatch):
    """Before: the store was sealed complete, then the stop was raised (exit 130: "... is complete: its extraction
    ended before the stop")."""
    out = tmp_path / "d.zarr"
    real = extract_run.mark_progress

    def mark_progress(path, split, hi):
        real(path, split, hi)
        if split == "test" and hi == extract_run.read_meta(path)[0]["test/features"].shape[0]:  # the last chunk's
            swallowed_stop()

    monkeypatch.setattr(extract_run, "mark_progress", mark_progress)
    assert _stopped_line(out) == (f"Interrupted: {out} is incomplete; re-run the same command to resume after the last "
                                  "written chunk.")
    attributes = _attributes(out)
    assert attributes["complete"] is False and "generation" not in attributes
    assert attributes["progress"] == {"train": 1442, "test": 355}  # every row written: the re-run only seals it
    assert _last_run(out)["error"] == "KeyboardInterrupt" and "finished" not in _last_run(out)
    monkeypatch.undo()
    result = CliRunner().invoke(app, _args(out))
    assert result.exit_code == 0, result.output
    assert "resumed from train 1,442, test 355" in result.stdout and _attributes(out)["complete"] is True


def test_a_stop_swallowed_while_the_store_is_sealed_ends_with_it_complete(tmp_path, monkeypatch):
    """Before: the stop was raised while the run log was written, which then did not record the finish."""
    out = tmp_path / "d.zarr"
    real = extract_state.complete_store

    def complete_store(path):
        generation = real(path)
        swallowed_stop()  # a finaliser ran during the seal's last write
        return generation

    monkeypatch.setattr(extract_state, "complete_store", complete_store)
    assert _stopped_line(out) == f"Interrupted: {out} is complete: its extraction ended before the stop."
    attributes = _attributes(out)
    assert attributes["complete"] is True
    assert _last_run(out)["generation"] == attributes["generation"] and "finished" in _last_run(out)
    assert "error" not in _last_run(out)


def test_a_sigterm_swallowed_before_the_seal_exits_143_with_the_store_incomplete(tmp_path):
    """The command line: exit 143 and one line; before, the store was sealed complete although the run was stopped."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SWALLOW_AT_FINISH)
    out = tmp_path / "d.zarr"
    proc = subprocess.run([sys.executable, "-c", MAIN, *_args(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=os.environ | {"PYTHONPATH": f"{site}{os.pathsep}{ROOT}"},
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.default_int_handler))
    assert proc.returncode == 143, proc.stderr
    assert proc.stderr.splitlines() == [f"Interrupted: {out} is incomplete; re-run the same command to resume after the "
                                        "last written chunk."]
    assert _attributes(out)["complete"] is False
