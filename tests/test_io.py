"""Atomic outputs: a run directory appears whole or not at all, and earlier outputs survive a failure."""

from __future__ import annotations

import os

import pytest

from foal_pipe.errors import FoalPipeError
from foal_pipe.io import atomic_dir, check_output_dir


def test_atomic_dir_replaces_outputs_and_keeps_foreign_entries(tmp_path):
    out = tmp_path / "run"
    with atomic_dir(out) as tmp:
        (tmp / "model").write_text("old model")
        (tmp / "metrics").write_text("old metrics")
    (out / "eval").mkdir()
    (out / "eval" / "summary.md").write_text("evaluation")
    with atomic_dir(out) as tmp:
        (tmp / "model").write_text("new model")
        (tmp / "metrics").write_text("new metrics")
    assert (out / "model").read_text() == "new model"
    assert (out / "metrics").read_text() == "new metrics"
    assert (out / "eval" / "summary.md").read_text() == "evaluation"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_failed_run_leaves_previous_outputs(tmp_path):
    out = tmp_path / "run"
    with atomic_dir(out) as tmp:
        (tmp / "model").write_text("old")
    with pytest.raises(RuntimeError), atomic_dir(out) as tmp:
        (tmp / "model").write_text("half")
        raise RuntimeError("killed")
    assert (out / "model").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_output_that_is_a_file_is_refused_before_work(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(FoalPipeError, match="is a file"):
        check_output_dir(tmp_path / "f")
    with pytest.raises(FoalPipeError, match="cannot write"):
        check_output_dir(tmp_path / "f" / "run")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_read_only_parent_is_refused(tmp_path):
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o500)
    try:
        with pytest.raises(FoalPipeError, match="cannot write"):
            check_output_dir(parent / "run")
    finally:
        parent.chmod(0o700)


def test_stale_temporaries_of_dead_processes_are_removed(tmp_path):
    stale = tmp_path / ".run.tmp-999999999-abc"
    stale.mkdir()
    check_output_dir(tmp_path / "run")
    assert not stale.exists()
