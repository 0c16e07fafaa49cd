"""Hostile file systems under the commands that write: file-size limits hit mid-write, read-only places (root's
override dropped with setpriv), dangling symlinks, awkward names, previous outputs at --out.

What passed in this audit and is covered elsewhere is not repeated here: RLIMIT_FSIZE at 0 and 600 bytes for learn,
sweep, evaluate, predict (test_audit_limits_s23), extract at 0 and table at 0. Checked by hand and passing, not kept:
RLIMIT_FSIZE at every size between the first and the last file for learn, sweep, evaluate (with plots) and table
(previous outputs intact, nothing in TMPDIR), extract stopped mid-chunk (resumes byte-identical), extract --overwrite
stopped mid-write (old store intact); --out names with spaces, tabs, Unicode, leading dashes and glob characters for
every command; dangling --features/--run/--model links; --out under a file, --out a file, read-only parents.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import cluster_store, digits_pixels_spec, interrupt_after, store_files

from foal_pipe.extract import run_extract

#: Drops the capabilities that let root write a read-only folder, so a chmod binds root as it binds a user.
NOCAP = ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner,-linux_immutable", "--"]
CLI = "import sys; from foal_pipe.cli import main; sys.argv[0] = 'foal-pipe'; main()"
PIXELS = ("--dataset", "digits", "--model", "pixels", "--device", "cpu", "--workers", "0")


def foal(*args, cwd: Path, bound: bool = False) -> subprocess.CompletedProcess:
    """``foal-pipe ARGS`` in ``cwd``; ``bound``: without root's override of file permissions."""
    prefix = NOCAP if bound and os.geteuid() == 0 else []
    if prefix and shutil.which("setpriv") is None:
        pytest.skip("needs setpriv to drop root's DAC override")
    (cwd / "tmpdir").mkdir(exist_ok=True)  # TMPDIR: asserted empty after each run
    env = dict(os.environ, HF_HUB_OFFLINE="1", COLUMNS="400", MPLBACKEND="Agg", TMPDIR=str(cwd / "tmpdir"))
    env.pop("FOAL_PIPE_DEBUG", None)
    proc = subprocess.run([*prefix, sys.executable, "-c", CLI, *map(str, args)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)
    assert os.listdir(cwd / "tmpdir") == [], proc.stderr
    return proc


def one_line(proc: subprocess.CompletedProcess, *absent: str) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 1, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "Traceback" not in proc.stderr, proc.stderr
    for word in absent:
        assert word not in lines[0], lines[0]
    return lines[0]


def tree(root: Path) -> dict[str, bytes | None]:
    return {p.relative_to(root).as_posix(): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))
            if p.name != "timings.json"}


def chmod_tree(root: Path, writable: bool) -> None:
    for p in [root, *root.rglob("*")]:
        if not p.is_symlink():
            p.chmod((p.stat().st_mode | 0o200) if writable else (p.stat().st_mode & ~0o222))


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    return cluster_store(tmp_path_factory.mktemp("fs") / "s.zarr", n_classes=6, dim=16, n_test=120, chunk_rows=32,
                         seed=0, n_train=600)


LEARN = ("--tasks", "3", "--projection-dim", "20", "--gamma", "1", "--backend", "numpy")


# --- predict --out a dangling symlink --------------------------------------------------------------------------------

def test_predict_out_a_dangling_symlink_is_written_through_it(store, tmp_path):
    """``predict --out dang.csv`` (a link to a file not made yet) writes the predictions at the link's target, the
    link kept, as learn, sweep, table, evaluate and extract do and as predict does through a link to an existing file:
    check_not_an_input compares the link's target with the inputs (it called os.path.samefile on the unfollowed
    link, which said "dang.csv: No such file or directory (ENOENT)" after the work). A link to an input is still
    refused, naming the link."""
    run = tmp_path / "run"
    assert foal("learn", "--features", store, "--out", run, *LEARN, cwd=tmp_path).returncode == 0
    (tmp_path / "dang.csv").symlink_to("target.csv")
    proc = foal("predict", "--model", run / "model.safetensors", "--features", store, "--out", "dang.csv", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "dang.csv").is_symlink()
    assert (tmp_path / "target.csv").read_text().startswith("row,predicted_class")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "tmpdir") == ["dang.csv", "run", "target.csv"]
    model = (run / "model.safetensors").read_bytes()
    (tmp_path / "model.csv").symlink_to(run / "model.safetensors")
    proc = foal("predict", "--model", run / "model.safetensors", "--features", store, "--out", "model.csv", cwd=tmp_path)
    line = one_line(proc)
    assert "output model.csv is an input of this command" in line, line
    assert (run / "model.safetensors").read_bytes() == model


# --- a read-only folder inside an existing --out ---------------------------------------------------------------------

@pytest.mark.parametrize("command", ["learn", "sweep"])
def test_a_read_only_folder_in_the_previous_outputs_is_refused_up_front(store, tmp_path, command):
    """An --out holding a read-only folder (an ``eval/`` the user protected with chmod 555) is refused before any
    work, naming the folder and the chmod that fixes it (check_output_dir: check_entries_movable): carrying it into
    the new outputs after the swap needs write permission on it (renaming a folder to another parent does), and
    failed there, after the new outputs replaced the old ones, leaving ``eval/`` hidden in ``.run.tmp-PID-*``."""
    out = tmp_path / "run"
    args = [command, "--features", store, "--out", out, *LEARN]
    if command == "sweep":
        args = [a for a in args if a != "--gamma" and a != "1"]
    assert foal(*args, cwd=tmp_path).returncode == 0
    (out / "eval").mkdir()
    (out / "eval" / "summary.md").write_text("my evaluation")
    before = tree(out)
    (out / "eval").chmod(0o555)
    try:
        proc = foal(*args, "--seed", "4", cwd=tmp_path, bound=True)
        left = sorted(p.name for p in tmp_path.iterdir() if p.name != "tmpdir")
    finally:
        for p in tmp_path.rglob("eval"):
            p.chmod(0o755)
    assert left == ["run"], left  # no .run.tmp-* folder holding the user's eval/, no journal
    assert (out / "eval" / "summary.md").read_text() == "my evaluation"
    line = one_line(proc, "free some space")
    assert f"holds the read-only folder {out / 'eval'}" in line and f"chmod u+w {out / 'eval'}" in line, line
    assert tree(out) == before  # the refused run leaves the previous outputs as they were


# --- extract over a read-only store ----------------------------------------------------------------------------------

def _incomplete_digits(out: Path, monkeypatch) -> None:
    """``extract --dataset digits --model pixels`` stopped after one of its chunks: resumable, with a manifest."""
    interrupt_after(monkeypatch, 1)
    with pytest.raises(KeyboardInterrupt):
        run_extract(digits_pixels_spec(out))
    monkeypatch.undo()


def test_resuming_a_read_only_incomplete_store_is_one_line(tmp_path, monkeypatch):
    """Re-running the extract of an incomplete store that is read-only (chmod -R a-w, a read-only mount) is refused
    before the weights load, in one line naming the store and the chmod that fixes it (check_store). It printed
    zarr's ContainsArrayError traceback: replace_manifest removed the old manifest with ``ignore_errors=True``, which
    failed silently, then made it again (test_replace_manifest_of_a_read_only_store_is_one_line)."""
    out = tmp_path / "s.zarr"
    _incomplete_digits(out, monkeypatch)
    before = store_files(out)
    chmod_tree(out, writable=False)
    try:
        proc = foal("extract", *PIXELS, "--chunk-rows", "128", "--batch-size", "50", "--out", out, cwd=tmp_path,
                    bound=True)
    finally:
        chmod_tree(out, writable=True)
    line = one_line(proc, "ContainsArrayError")
    assert line.startswith(f"Error: {out} cannot be resumed: ") and "read-only" in line, line
    assert f"chmod -R u+w {out}" in line, line
    assert store_files(out) == before


def test_overwrite_of_a_read_only_store_keeps_it(tmp_path):
    """``extract --overwrite`` over a complete, read-only store (other settings) is refused before the work, naming
    the store and the chmod that fixes it, the store kept whole (check_store): it extracted the new store aside,
    swapped it in, then failed deleting the old one, leaving the new store at s.zarr beside the old store's log.
    A deletion that fails after the swap all the same: test_a_replaced_store_left_undeleted_leaves_the_new_one_whole."""
    out = tmp_path / "s.zarr"
    assert foal("extract", *PIXELS, "--chunk-rows", "512", "--out", out, cwd=tmp_path).returncode == 0
    before = store_files(out)
    chmod_tree(out, writable=False)
    try:
        proc = foal("extract", *PIXELS, "--chunk-rows", "256", "--overwrite", "--out", out, cwd=tmp_path, bound=True)
        left = sorted(p.name for p in tmp_path.iterdir() if p.name != "tmpdir")
    finally:
        for p in tmp_path.iterdir():
            if p.is_dir():
                chmod_tree(p, writable=True)
    assert left == ["s.zarr", "s.zarr.log.json"], left
    line = one_line(proc, "free some space")
    assert line.startswith(f"Error: --overwrite cannot replace {out}: ") and "read-only" in line, line
    assert f"chmod -R u+w {out}" in line, line
    assert store_files(out) == before


def bound_python(code: str, *args: object, cwd: Path) -> subprocess.CompletedProcess:
    """``python -c CODE ARGS`` in ``cwd`` without root's override of file permissions."""
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        pytest.skip("needs setpriv to drop root's DAC override")
    prefix = NOCAP if os.geteuid() == 0 else []
    return subprocess.run([*prefix, sys.executable, "-c", code, *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, HF_HUB_OFFLINE="1", COLUMNS="400"))


def test_replace_manifest_of_a_read_only_store_is_one_line(tmp_path, monkeypatch):
    """replace_manifest over a read-only store (made so after extract's checks) is writing()'s one-line error naming
    the store, the manifest untouched: the old one's removal no longer fails silently, to end in Zarr's
    ContainsArrayError when the array is made again over it."""
    out = tmp_path / "s.zarr"
    _incomplete_digits(out, monkeypatch)
    before = store_files(out)
    chmod_tree(out, writable=False)
    try:
        proc = bound_python("import sys\nfrom foal_pipe.errors import FoalPipeError\nfrom foal_pipe.store.write import "
                            "replace_manifest\ntry:\n    replace_manifest(sys.argv[1], b'[]')\nexcept FoalPipeError as exc:\n"
                            "    print(exc)", out, cwd=tmp_path)
    finally:
        chmod_tree(out, writable=True)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout.startswith(f"cannot write the split manifest of {out}: Permission denied"), proc.stdout
    assert store_files(out) == before


def test_a_replaced_store_left_undeleted_leaves_the_new_one_whole(tmp_path):
    """Where the old store cannot be deleted after the swap all the same (made read-only once the run's checks
    passed; here the check is skipped), the new store is at s.zarr with its own log beside it (the log moves
    before the deletion), the old one at .s.zarr.replacing, and the line says so and how to finish: a re-run without
    --overwrite refuses, naming the folder, while it is read-only, then removes it once it is writable."""
    out, staged = tmp_path / "s.zarr", tmp_path / ".s.zarr.replacing"
    assert foal("extract", *PIXELS, "--chunk-rows", "512", "--out", out, cwd=tmp_path).returncode == 0
    old_log = (tmp_path / "s.zarr.log.json").read_bytes()
    chmod_tree(out, writable=False)
    skip_check = ("import sys\nimport foal_pipe.extract.state as state\nstate._check_writable = lambda *a, **k: None\n"
                  "from foal_pipe.cli import main\nsys.argv[0] = 'foal-pipe'\nmain()")
    try:
        proc = bound_python(skip_check, "extract", *PIXELS, "--chunk-rows", "256", "--overwrite", "--out", out, cwd=tmp_path)
        left = sorted(p.name for p in tmp_path.iterdir() if p.name != "tmpdir")
        again = foal("extract", *PIXELS, "--chunk-rows", "256", "--out", out, cwd=tmp_path, bound=True)
    finally:
        chmod_tree(staged, writable=True)
    line = one_line(proc)
    assert line == (f"Error: {out} now holds the new store, but the one it replaced, left at {staged}, could not be deleted: "
                    f"Permission denied; make it writable (chmod -R u+w {staged}), then run the extract again without "
                    "--overwrite, which removes it"), line
    assert left == [".s.zarr.replacing", "s.zarr", "s.zarr.log.json"], left
    assert json.loads((out / "zarr.json").read_text())["attributes"]["extract"]["chunk_rows"] == 256
    assert json.loads((staged / "zarr.json").read_text())["attributes"]["extract"]["chunk_rows"] == 512
    log = (tmp_path / "s.zarr.log.json").read_bytes()
    assert log != old_log and json.loads(log)["runs"][-1]["error"].startswith(f"{out} now holds the new store")
    assert one_line(again).startswith(f"Error: {staged}, left by an interrupted overwrite of {out}, cannot be removed: ")
    new = store_files(out)
    proc = foal("extract", *PIXELS, "--chunk-rows", "256", "--out", out, cwd=tmp_path)
    assert proc.returncode == 0 and f"note: removed {staged}" in proc.stderr, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "tmpdir") == ["s.zarr", "s.zarr.log.json"]
    assert store_files(out) == new


def test_a_swap_left_unsettled_by_a_read_only_folder_names_it(tmp_path):
    """A replacement whose previous outputs could not all be carried in (a folder of them made read-only once the
    checks passed; here check_entries_movable is skipped) names that folder and the fix, in this run and in every
    later one until it is writable; the run after that carries it in and leaves no temporary."""
    (tmp_path / "run" / "eval").mkdir(parents=True)
    (tmp_path / "run" / "eval" / "summary.md").write_text("mine")
    (tmp_path / "run" / "eval").chmod(0o555)
    write = ("import sys\nimport foal_pipe.io as io\nfrom foal_pipe.errors import FoalPipeError\n"
             "if sys.argv[1] == 'skip':\n    io.check_entries_movable = lambda path: None\n"
             "try:\n    with io.atomic_dir('run') as tmp:\n        (tmp / 'model').write_text(sys.argv[1])\n"
             "except FoalPipeError as exc:\n    print(exc)")
    try:
        runs = [bound_python(write, mode, cwd=tmp_path) for mode in ("skip", "check")]
        stranded = next(tmp_path.glob(".run.tmp-*/eval"))
    finally:
        for folder in tmp_path.rglob("eval"):
            folder.chmod(0o755)
    for proc in runs:
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr
        assert proc.stdout.startswith(f"cannot write {stranded.relative_to(tmp_path)}: Permission denied"), proc.stdout
        assert f"make {stranded.relative_to(tmp_path)} writable" in proc.stdout, proc.stdout
    proc = bound_python(write, "check", cwd=tmp_path)
    assert proc.stdout == "" and proc.stderr == "", proc.stdout + proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    assert (tmp_path / "run" / "eval" / "summary.md").read_text() == "mine"
    assert (tmp_path / "run" / "model").read_text() == "check"
