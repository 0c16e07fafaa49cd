"""What the commands print on a terminal, a narrow one, a dumb one and a non-UTF-8 stdout: result tables that cut no
number, progress bars whose counts and times stay whole, plain progress lines where rich cannot redraw a bar, and
``--help`` paragraphs wrapped to the terminal rather than at the docstring's line breaks."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import A_AVG, A_LAST, F, build_store, invoke, make_metrics, make_run
from rich.console import Console
from rich.table import Table
from typer.testing import CliRunner

import foal_pipe.cli._app as cli_app
import foal_pipe.progress as progress_module
from foal_pipe.cli import app
from foal_pipe.cli.evaluate import summary_table
from foal_pipe.progress import new_progress, progress_bar

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()


def _printed(monkeypatch, table: Table, console: Console) -> str:
    """``print_table(table)`` on ``console`` (stdout's stand-in), what it wrote."""
    monkeypatch.setattr(cli_app, "console", console)
    cli_app.print_table(table)
    return console.file.getvalue()


def _terminal(width: int) -> Console:
    return Console(file=io.StringIO(), width=width, force_terminal=True, color_system=None)


def _pipe(width: int) -> Console:
    console = Console(file=io.StringIO(), width=width, force_terminal=False)
    console.soft_wrap = True  # as cli._app's console where stdout is not a terminal
    return console


def _two_runs(root: Path) -> None:
    make_run(root / "runs" / "a", model=False)
    make_run(root / "runs" / "b", metrics=make_metrics(dataset="blobs"), model=False)


NUMBERS = [f"{100 * A_AVG:.2f}", f"{100 * A_LAST:.2f}", f"{100 * F:.2f}"]


# --------------------------------------------------------------------------------------------------
# 1. A stdout that cannot encode "·" or "±"


def test_a_table_on_an_ascii_stdout_gets_ascii_replacements(monkeypatch):
    """The captured table was written as it was: UnicodeEncodeError: 'ascii' codec can't encode character '\\xb7'."""
    table = Table("run (dataset · encoder)", "A_avg")
    table.add_row("runs/a\ndigits · pixels", "98.21 ± 0.35")
    raw = io.BytesIO()
    stdout = io.TextIOWrapper(raw, encoding="ascii", newline="\n")
    console = Console(file=stdout, width=120, force_terminal=False)
    monkeypatch.setattr(cli_app, "console", console)
    cli_app.print_table(table)
    stdout.flush()
    text = raw.getvalue().decode("ascii")
    assert "run (dataset - encoder)" in text and "digits - pixels" in text and "98.21 +- 0.35" in text


def test_summary_with_pythonioencoding_ascii_prints_its_table(tmp_path):
    _two_runs(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "FOAL_PIPE_DEBUG")}
    env.update(PYTHONPATH=str(ROOT), PYTHONIOENCODING="ascii", HF_HUB_OFFLINE="1")
    code = "import sys; from foal_pipe.cli import main; sys.argv[0] = 'foal-pipe'; main()"
    result = subprocess.run([sys.executable, "-c", code, "summary", "runs"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert "run (dataset - encoder)" in result.stdout and "digits - pixels" in result.stdout
    assert all(number in result.stdout for number in NUMBERS)


# --------------------------------------------------------------------------------------------------
# 2. TERM=dumb: rich never redraws a bar there


def test_a_dumb_terminal_gets_plain_progress_lines(monkeypatch):
    monkeypatch.setenv("TERM", "dumb")
    dumb = Console(file=io.StringIO(), force_terminal=True)
    now = [0.0]
    progress = new_progress(console=dumb, unit="images")
    assert progress.disable
    progress.get_time = lambda: now[0]
    with progress:
        task = progress.add_task("predict", total=100)
        now[0] = 3.0
        progress.advance(task, 50)
    assert dumb.file.getvalue().startswith("predict: 50/100 images (50%)")


def test_a_real_terminal_still_draws_and_a_pipe_still_prints_lines(monkeypatch):
    monkeypatch.setenv("TERM", "xterm-256color")
    assert not new_progress(console=Console(file=io.StringIO(), force_terminal=True)).disable
    assert new_progress(console=Console(file=io.StringIO(), force_terminal=False)).disable


# --------------------------------------------------------------------------------------------------
# 3. Tables and bars that cut no number


def test_summary_on_an_80_column_terminal_keeps_every_column_and_number(monkeypatch, tmp_path):
    """rich shrank the no_wrap columns: ``F   A_`` in the header, the last columns dropped, the footnote cut."""
    _two_runs(tmp_path)
    monkeypatch.chdir(tmp_path)
    text = _printed(monkeypatch, summary_table([Path("runs")]), _terminal(80))
    assert "…" not in text
    header = " ".join(text.split())
    for name in ("tasks", "stream", "gamma", "A_avg", "A_last", "F", "A_auc"):
        assert re.search(rf"(^|\s){name}(\s|$)", header), name
    _rows_keep_their_numbers(text)


def _rows_keep_their_numbers(text: str) -> None:
    for run in ("runs/a", "runs/b"):
        row = next(line for line in text.splitlines() if line.strip().startswith(run))
        assert all(number in row for number in NUMBERS), row


def test_summary_piped_with_columns_40_keeps_the_path_and_the_numbers(monkeypatch, tmp_path):
    """COLUMNS=40 in a pipe: the run column was one character wide and every accuracy ``9…``."""
    _two_runs(tmp_path)
    monkeypatch.chdir(tmp_path)
    text = _printed(monkeypatch, summary_table([Path("runs")]), _pipe(40))
    assert "…" not in text
    _rows_keep_their_numbers(text)


def test_a_table_that_fits_is_laid_out_as_rich_lays_it_out(monkeypatch, tmp_path):
    """A log's table (512 columns) is printed as before: rich's own layout, the ends of its lines stripped."""
    _two_runs(tmp_path)
    monkeypatch.chdir(tmp_path)
    plain = _pipe(512)
    with plain.capture() as captured:
        plain.print(summary_table([Path("runs")]))
    expected = "".join(line.rstrip() + "\n" for line in captured.get().splitlines())
    assert _printed(monkeypatch, summary_table([Path("runs")]), _pipe(512)) == expected


def test_sweep_table_on_an_80_column_terminal_cuts_no_word(monkeypatch, tmp_path):
    """`sweep`'s table at 80 columns showed ``loo_acc…`` (its choices' column shrunk below its longest word)."""
    store = build_store(tmp_path / "s.zarr")
    console = _terminal(80)
    monkeypatch.setattr(cli_app, "console", console)
    result = runner.invoke(app, ["sweep", "--features", str(store), "--out", str(tmp_path / "sw"), "--tasks", "2",
                                 "--projection-dim", "300", "--gammas", "1e-8,1e-4,1,100"])
    assert result.exit_code == 0, result.output
    text = console.file.getvalue()
    assert "…" not in text and "LOO MSE" in " ".join(text.split())
    marks = re.findall(r"[a-z_]+", " ".join(line.split("│")[-2] for line in text.splitlines() if line.count("│") > 2))
    assert marks and set(marks) <= {"test", "gcv", "loo", "loo_accuracy"}, marks


def test_a_table_too_wide_for_the_terminal_is_printed_whole(monkeypatch):
    table = Table("gamma", "A_avg %")
    for column in table.columns:
        column.no_wrap = True
    table.add_row("0.0001", "98.7654321")
    text = _printed(monkeypatch, table, _terminal(12))
    assert "98.7654321" in text and "0.0001" in text


def test_a_progress_bar_at_80_columns_keeps_its_counts_and_times(monkeypatch):
    """A long description cut the counts and times (``38392…``, ``0:00:…``); now it gives way itself."""
    console = Console(file=io.StringIO(), width=80, force_terminal=True, force_interactive=True, color_system=None)
    monkeypatch.setattr(progress_module, "_console", console)
    with progress_bar("train (one read, gram + leave-one-out)", 38392) as advance:
        advance(1000)
    drawn = [line for line in console.file.getvalue().replace("\r", "\n").splitlines() if "/38392" in line]
    assert drawn and all(re.search(r" \d+/38392 +\d:\d\d:\d\d (-:--:--|\d:\d\d:\d\d)$", line) for line in drawn), drawn
    assert " 1000/38392 " in drawn[-1]
    assert all("…" in line for line in drawn)  # the description is what is cut


# --------------------------------------------------------------------------------------------------
# 4. --help


@pytest.mark.parametrize("command, sentence", [
    (["learn"], "OUT/model.safetensors and OUT/timings.json (seconds per phase)"),
    (["predict"], "accuracy goes to stderr. --images: columns path, predicted_class, predicted_name"),
    (["table"], "with the same options, except that ncm, slda, fecam and cosine stay"),
    (["sweep"], "name the best gamma. With --fusions, the same for every fusion"),
    ([], "weight norms, gamma curve, confusion matrix) and write summary.md"),
])
def test_help_wraps_docstring_paragraphs_to_the_terminal(command, sentence):
    result = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "250"})
    assert result.exit_code == 0
    assert sentence in result.output, result.output


def test_evaluate_help_says_required_once():
    result = runner.invoke(app, ["evaluate", "--help"], env={"COLUMNS": "250"})
    run_help = next(line for line in result.output.splitlines() if "--run" in line)
    assert "[required]" in result.output and "Required." not in result.output, run_help


@pytest.mark.parametrize("columns", ["80", "100", "120"])
def test_a_long_value_list_breaks_between_values(columns):
    result = runner.invoke(app, ["extract", "--help"], env={"COLUMNS": columns})
    assert result.exit_code == 0
    assert result.output.count("fashion-") == result.output.count("fashion-mnist") >= 2, result.output


# --------------------------------------------------------------------------------------------------
# 5. predict's image paths without --images


def test_cli_reference_documents_predicts_bare_image_paths():
    section = (ROOT / "docs" / "cli.md").read_text().split("## `foal-pipe predict`")[1].split("\n## ")[0]
    assert "| `IMAGES...` |" in section and "`foal-pipe predict --model M dir/*.png`" in section


def test_a_value_written_like_an_emoji_code_is_shown_as_typed(tmp_path):
    """rich turns ``:x:`` into an emoji by default: an error line must quote the user's text as typed."""
    result = invoke("table", "--features", tmp_path / "s.zarr", "--out", tmp_path / "o", "--tasks", ":x:")
    assert result.exit_code == 2 and "--tasks ':x:' is not" in result.output, result.output
    assert "\u274c" not in result.output
