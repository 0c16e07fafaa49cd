"""Which store `evaluate` scores the model on when metrics.json names it by a relative path: the run's own, whatever
folder evaluate runs in; a same-named store in the working directory is taken only when it is that one (the same
folder, a link to it, or the store of the model's generation id), and two different stores that nothing tells apart
give no per-class results, with a note naming both."""

from __future__ import annotations

from pathlib import Path

from helpers import build_store, invoke, written_copy

LEARN = ("--tasks", "3", "--projection-dim", "40", "--seed", "1")


def _evaluate(run: Path, out: Path) -> tuple[str, dict[str, bytes]]:
    """evaluate's output and the files it wrote (timings aside)."""
    result = invoke("evaluate", "--run", run, "--out", out, "--no-plots")
    assert result.exit_code == 0, result.output
    return result.output, {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.name != "timings.json"}


def _folders(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "proj").mkdir()
    (tmp_path / "else").mkdir()
    return tmp_path / "proj", tmp_path / "else"


def _learned_in(proj: Path, monkeypatch) -> Path:
    monkeypatch.chdir(proj)
    assert invoke("learn", "--features", "s.zarr", "--out", "runs/r", *LEARN).exit_code == 0
    return proj / "runs" / "r"


def _assert_scored_alike_from(other: Path, run: Path, tmp_path: Path, monkeypatch) -> None:
    """evaluate run from ``other`` writes the per-class files it writes from the folder learn ran in, byte for byte."""
    _, right = _evaluate(run, tmp_path / "ev1")
    monkeypatch.chdir(other)
    _, got = _evaluate(run, tmp_path / "ev2")
    assert "class_accuracy.csv" in right
    assert got == right


def test_a_same_named_store_without_generation_here_loses_to_the_runs_own(tmp_path, monkeypatch):
    """The run's store records a generation id, the working directory's does not: the model's ``learned_from``
    tells them apart (the working directory's used to be scored silently)."""
    proj, other = _folders(tmp_path)
    written_copy(build_store(tmp_path / "raw.zarr", seed=0), proj / "s.zarr")
    build_store(other / "s.zarr", seed=5)
    _assert_scored_alike_from(other, _learned_in(proj, monkeypatch), tmp_path, monkeypatch)


def test_two_stores_nothing_tells_apart_are_named_in_one_note(tmp_path, monkeypatch):
    proj, other = _folders(tmp_path)
    build_store(proj / "s.zarr", seed=0)
    build_store(other / "s.zarr", seed=5)
    run = _learned_in(proj, monkeypatch)
    monkeypatch.chdir(other)
    _, files = _evaluate(run, tmp_path / "ev")
    assert "class_accuracy.csv" not in files and "confusion_matrix.csv" not in files
    notes = [line for line in files["summary.md"].decode().splitlines() if "different stores" in line]
    assert len(notes) == 1, files["summary.md"].decode()
    assert str(other / "s.zarr") in notes[0] and str(proj / "s.zarr") in notes[0]
    assert "from the folder `foal-pipe learn` ran in" in notes[0]


def test_a_link_here_to_the_runs_own_store_is_that_store(tmp_path, monkeypatch):
    """The working directory's ``s.zarr`` links to the run's store: one store, not two to choose between, though
    neither records a generation id."""
    proj, other = _folders(tmp_path)
    build_store(proj / "s.zarr", seed=0)
    (other / "s.zarr").symlink_to(proj / "s.zarr")
    _assert_scored_alike_from(other, _learned_in(proj, monkeypatch), tmp_path, monkeypatch)
