"""Console output as it lands in logs (no blank lines from progress bars, one-line errors, no folded paths)
and a `--help` that lists choices, shows no value placeholder on flags and states each default once."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import numpy as np
import pytest
import typer.main
from rich.console import Console
from typer.testing import CliRunner

from foal_pipe.cli import app
from foal_pipe.cli._app import choice
from foal_pipe.progress import new_progress, progress_bar
from foal_pipe.store import write_store

ROOT = Path(__file__).resolve().parent.parent


def _foal_pipe(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``foal-pipe ARGS`` in a child process whose stdout and stderr are pipes (as in a log or CI)."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "FORCE_COLOR", "FOAL_PIPE_DEBUG")}
    env.update(PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    code = "import sys; from foal_pipe.cli import main; sys.argv[0] = 'foal-pipe'; main()"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=300)


# --------------------------------------------------------------------------------------------------
# Progress bars


def test_progress_draws_only_on_a_terminal():
    log = Console(file=io.StringIO(), force_terminal=False)
    assert new_progress(console=log).disable
    assert not new_progress(console=Console(file=io.StringIO(), force_terminal=True)).disable
    with new_progress(console=log) as progress:  # disabled, the task is still counted
        task = progress.add_task("rows", total=10)
        progress.advance(task, 4)
        assert progress.tasks[task].completed == 4
    assert log.file.getvalue() == ""


def test_progress_bar_writes_nothing_to_a_log(capfd):
    with progress_bar("train", 100) as advance:
        for _ in range(10):
            advance(10)
    captured = capfd.readouterr()
    assert captured.err == "" and captured.out == ""


def test_progress_prints_plain_lines_when_not_a_terminal():
    """Every further 10% or after 30 s without a line, once the task has run 2 s; none before."""
    log = Console(file=io.StringIO(), force_terminal=False)
    now = [0.0]
    progress = new_progress(console=log, unit="images")
    progress.get_time = lambda: now[0]
    with progress:
        task = progress.add_task("train", total=1000)
        for t, n in [(1.0, 150), (2.5, 0), (2.6, 50), (3.0, 10), (40.0, 10), (41.0, 780)]:
            now[0] = t
            progress.advance(task, n)
    lines = log.file.getvalue().splitlines()
    assert [line.split(",")[0] for line in lines] == [
        "train: 150/1", "train: 200/1", "train: 220/1", "train: 1"]
    assert lines[0].startswith("train: 150/1,000 images (15%), ") and lines[0].endswith(" left")
    assert lines[2].startswith("train: 220/1,000 images (22%)")  # 30 s since the last line
    assert lines[3].startswith("train: 1,000/1,000 images (100%)") and lines[3].endswith("0:00:41 elapsed")


def test_extract_in_a_pipe_prints_progress_lines(tmp_path):
    code = ("import sys, foal_pipe.progress as p; p.QUIET_SECONDS = 0; from foal_pipe.cli import main; "
            "sys.argv[0] = 'foal-pipe'; main()")
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "FORCE_COLOR", "FOAL_PIPE_DEBUG")}
    proc = subprocess.run([sys.executable, "-c", code, "extract", "--model", "pixels", "--out", "d.zarr", "--workers",
                           "0", "--batch-size", "64"], cwd=tmp_path, env={**env, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert [line.split(":")[0] for line in lines] == ["train"] * 10 + ["test"] * 6, proc.stderr
    assert lines[9].startswith("train: 1,442/1,442 images (100%), ") and "\x1b" not in proc.stderr
    assert lines[-1].startswith("test: 355/355 images (100%), ")


def test_learn_in_a_log_has_no_blank_lines(tmp_path):
    rng = np.random.default_rng(0)
    y_train, y_test = np.repeat(np.arange(4), 30), np.repeat(np.arange(4), 5)
    centers = rng.normal(size=(4, 6))
    write_store(tmp_path / "s.zarr", (centers[y_train] + 0.1 * rng.normal(size=(120, 6)), y_train),
                (centers[y_test] + 0.1 * rng.normal(size=(20, 6)), y_test), ["a", "b", "c", "d"], dataset="toy")
    proc = _foal_pipe("learn", "--features", "s.zarr", "--out", "run", "--tasks", "2", "--projection-dim", "16",
                      cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "" not in proc.stderr.splitlines(), f"blank lines on stderr: {proc.stderr!r}"
    assert "\x1b" not in proc.stderr + proc.stdout, "terminal control codes in a log"
    assert [line for line in proc.stdout.splitlines() if line.strip()] == proc.stdout.splitlines()


def test_tables_in_a_log_have_no_trailing_spaces(tmp_path):
    rng = np.random.default_rng(0)
    write_store(tmp_path / "s.zarr", (rng.normal(size=(12, 3)), np.arange(12) % 2), (rng.normal(size=(4, 3)),
                np.arange(4) % 2), ["a", "b"], dataset="toy")
    for args in (["info", "s.zarr"], ["sweep", "--features", "s.zarr", "--out", "sw", "--tasks", "1",
                                      "--projection-dim", "4", "--gammas", "1,10"], ["summary", "."]):
        proc = _foal_pipe(*args, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert len(proc.stdout.splitlines()) > 3
        assert not [line for line in proc.stdout.splitlines() if line != line.rstrip()], proc.stdout


# --------------------------------------------------------------------------------------------------
# Errors and long paths


def test_error_with_a_long_path_is_one_unwrapped_line(tmp_path):
    deep = tmp_path / ("a-rather-long-directory-name-" * 4) / "runs" / "digits"
    proc = _foal_pipe("evaluate", "--run", str(deep), cwd=tmp_path)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.endswith("\n") and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"Error: run directory {deep} does not exist;")
    assert len(proc.stderr) > 200  # longer than any terminal default, and still one line


def test_summary_table_in_a_log_keeps_paths_whole(tmp_path):
    from helpers import make_run

    run = make_run(tmp_path / ("long-experiment-directory-" * 4) / "digits", model=False)
    proc = _foal_pipe("summary", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert any(str(run) in line for line in proc.stdout.splitlines()), proc.stdout


# --------------------------------------------------------------------------------------------------
# --help


def _help_rows(command: str) -> dict[str, str]:
    """Each option's row of ``foal-pipe COMMAND --help`` (rendered wide enough that no row wraps)."""
    result = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "1000"})
    assert result.exit_code == 0, result.output
    rows = {}
    for line in result.output.splitlines():
        first = re.search(r"--[\w-]+", line)
        if line.startswith("│") and first:
            rows[first.group(0)] = line
    return rows


#: Options whose values are a fixed set: --help must list them (``<a|b>``), not say ``<str>``.
FIXED_SETS = {
    "extract": ("--dataset", "--token", "--dtype", "--blocks-dtype", "--device", "--precision", "--scheduler"),
    "learn": ("--engine", "--backend", "--dtype", "--projection-init", "--scheduler", "--activation", "--select"),
    "sweep": ("--backend", "--dtype", "--projection-init", "--scheduler", "--activation", "--select"),
    "predict": ("--split",),
}


@pytest.mark.parametrize("command", list(typer.main.get_command(app).commands))
def test_help_lists_choices_no_flag_placeholder_each_default_once(command):
    params = {max(p.opts, key=len): p for p in typer.main.get_command(app).commands[command].params}
    rows = _help_rows(command)
    problems = []
    for opt, row in rows.items():
        param = params.get(opt)
        if ((param is not None and getattr(param, "is_flag", False)) or opt == "--help") and "<bool>" in row:
            problems.append(f"{opt}: a flag with a value placeholder")
        if "Default:" in row and "[default:" in row:
            problems.append(f"{opt}: default stated twice")
    for opt in FIXED_SETS.get(command, ()):
        if opt in rows and not re.search(r"<[^<>|]+(\|[^<>|]+)+>", rows[opt]):
            problems.append(f"{opt}: its fixed set of values is not listed")
    assert not problems, f"foal-pipe {command} --help: " + "; ".join(problems)


def test_main_help_has_no_flag_placeholder():
    result = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"})
    (row,) = [line for line in result.output.splitlines() if "--help" in line]
    assert "<bool>" not in row


def test_version_prints_the_installed_version(tmp_path):
    from importlib.metadata import version

    proc = _foal_pipe("--version", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout == f"foal-pipe {version('foal-pipe')}\n"


def test_choice_refuses_values_outside_its_set():
    demo = typer.Typer()

    @demo.command()
    def pick(mode: Annotated[choice("gram", "rls"), typer.Option(help="Engine.")] = "gram") -> None:
        print(repr(mode))

    assert CliRunner().invoke(demo, ["--mode", "rls"]).output.strip() == "'rls'"  # a plain string
    bad = CliRunner().invoke(demo, ["--mode", "fast"])
    assert bad.exit_code == 2 and "'fast' is not one of 'gram', 'rls'" in bad.output



def test_the_train_and_test_bars_count_the_splits_rows_once(tmp_path, monkeypatch):
    """The walk's bar counted each row once per pass (read, learn, leave-one-out): "60000/60000 rows" for a
    30,000-row split, at twice the true rate. It shows the split's rows now, the passes scaled into them, and ends
    exactly at its total."""
    import foal_pipe.progress as progress

    bars = []

    def recorded(*columns, **kwargs):
        bars.append(progress.new_progress.__wrapped__(*columns, **kwargs))
        return bars[-1]

    recorded.__wrapped__ = progress.new_progress  # type: ignore[attr-defined]
    monkeypatch.setattr(progress, "new_progress", recorded)
    rng = np.random.default_rng(0)
    y = np.arange(300) % 3
    store = write_store(tmp_path / "s.zarr", (rng.normal(size=(300, 8)), y), (rng.normal(size=(60, 8)), y[:60]),
                        list("abc"), chunk_rows=64)
    assert invoke_learn(store, tmp_path / "o").exit_code == 0
    shown = {bar.tasks[0].description.split(" ")[0]: (bar.tasks[0].completed, bar.tasks[0].total) for bar in bars}
    assert shown == {"train": (300, 300), "test": (60, 60)}
    with progress_bar("x", 300, shown=100) as advance:  # uneven steps land on the shown count, never past it
        for n, expected in ((7, 2), (93, 33), (150, 83), (50, 100)):
            advance(n)
            assert recorded_completed(bars) == expected


def invoke_learn(store, out):
    return CliRunner().invoke(app, ["learn", "--features", str(store), "--out", str(out), "--tasks", "3",
                                    "--projection-dim", "16", "--gamma", "auto", "--loo-sample", "0"])


def recorded_completed(bars):
    return bars[-1].tasks[0].completed
