"""``--help`` states every option's default, and the value it states is the one the command runs with; bad option
text is a usage error (exit 2, one line naming the option) as typer's own types make it.

Found by an audit of the options (session 21): the option text foal-pipe reads itself took other scripts' digits
(``--gamma ٣`` ran with gamma 3, ``--order-seeds ٣``, ``--max-memory ٣``) where typer's number options refuse them,
and an empty path (``--out ""``, an unset shell variable) was read as the current folder: ``summary ""`` summarised
it, ``extract --data-dir ""`` read it, and refusals named a ``.`` that was never typed.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import typer.main
from helpers import fault_store, invoke

from foal_pipe.cli import app
from foal_pipe.store import write_store

DIGITS = ["٣", "３", "1,٣"]  # Arabic-Indic and fullwidth three: Python's int() and float() read both


@pytest.mark.parametrize("text", DIGITS)
@pytest.mark.parametrize(("command", "option", "extra"), [
    ("learn", "--gamma", []),
    ("learn", "--gamma-grid", ["--gamma", "auto"]),
    ("learn", "--order-seeds", []),
    ("learn", "--max-memory", []),
    ("learn", "--shrinkage", ["--head", "fecam"]),
    ("sweep", "--gammas", []),
    ("table", "--tasks", []),
    ("table", "--order-seeds", []),
])
def test_digits_of_other_scripts_are_a_usage_error(tmp_path, command, option, extra, text):
    """As typer's own number options refuse them (``learn --tasks ٣``): exit 2 before the (missing) store is read."""
    out = tmp_path / "out"
    result = invoke(command, "--features", tmp_path / "missing.zarr", "--out", out, *extra, option, text)
    assert result.exit_code == 2, result.output
    assert result.output.startswith(f"Error: {option} ") and result.output.count("\n") == 1, result.output
    assert not out.exists()


def test_a_head_option_of_other_scripts_digits_is_a_usage_error(tmp_path):
    result = invoke("learn", "--features", tmp_path / "missing.zarr", "--out", tmp_path / "o", "--head", "fecam",
                    "--head-option", "shrinkage_offdiag=٣")
    assert (result.exit_code, result.output) == (2, "Error: --head-option 'shrinkage_offdiag=٣': shrinkage_offdiag of "
                                                    "fecam takes a number; write e.g. --head-option shrinkage_offdiag=0.0; "
                                                    "see `foal-pipe learn --help`\n")


def test_typer_number_options_refuse_them_too(tmp_path):
    """The behaviour the options read here now share."""
    result = invoke("learn", "--features", tmp_path / "missing.zarr", "--out", tmp_path / "o", "--tasks", "٣")
    assert result.exit_code == 2 and "--tasks '٣' is not an integer" in result.output, result.output


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return fault_store(tmp_path_factory.mktemp("help") / "s.zarr")


@pytest.mark.parametrize(("args", "name"), [
    (["learn", "--features", "{store}", "--out", ""], "--out"),
    (["learn", "--features", "", "--out", "{out}"], "--features"),
    (["learn", "--features", "{store}", "--out", "{out}", "--class-order", ""], "--class-order"),
    (["learn", "--features", "{store}", "--out", "{out}", "--eval-features", ""], "--eval-features"),
    (["sweep", "--features", "{store}", "--out", "{out}", "--class-order", ""], "--class-order"),
    (["table", "--features", "{store}", "--features", "", "--out", "{out}"], "--features"),
    (["extract", "--dataset", "imagefolder", "--data-dir", "", "--model", "pixels", "--out", "{out}"], "--data-dir"),
    (["predict", "--model", "", "--features", "{store}"], "--model"),
    (["evaluate", "--run", "", "--out", "{out}"], "--run"),
    (["info", ""], "STORE"),
    (["info", "{store}", "--export-manifest", ""], "--export-manifest"),
    (["summary", "{store}", ""], "PATHS"),
    (["datasets", "--data-dir", ""], "--data-dir"),
])
def test_an_empty_path_is_a_usage_error(store, tmp_path, monkeypatch, args, name):
    """Not the current folder (each of these ran on it, or refused a ``.`` never typed, exit 1): exit 2, one line, the
    option named, nothing written there."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    out = tmp_path / "out"
    result = invoke(*[a.format(store=store, out=out) for a in args])
    assert (result.exit_code, result.output) == (
        2, f"Error: {name} is empty, which would read as the current folder; pass a path; see `foal-pipe {args[0]} --help`\n")
    assert not out.exists() and not any(work.iterdir())


def test_the_current_folder_by_name_is_still_a_path(store, monkeypatch):
    monkeypatch.chdir(store)
    result = invoke("info", ".")
    assert result.exit_code == 0, result.output


def test_help_beside_an_empty_path_shows_the_help():
    result = invoke("learn", "--out", "", "--help")
    assert result.exit_code == 0 and "Usage: foal-pipe learn" in result.output, result.output


# --- every default stated, and the one the command runs with -----------------------------------------------------


def _params(command: str) -> dict:
    return {p.name: p for p in typer.main.get_command(app).commands[command].params}  # type: ignore[attr-defined]


@pytest.mark.parametrize("command", ["extract", "info", "datasets", "learn", "sweep", "predict", "evaluate", "summary",
                                     "table"])
def test_every_option_states_its_default(command):
    """Typer's ``[default: X]`` (shown where the option has a value and does not hide it) or the help's own words."""
    for name, p in _params(command).items():
        if p.required or name == "help":
            continue
        shown = p.show_default is not False and p.default is not None and not getattr(p, "is_flag", False)
        assert shown or re.search(r"\bdefault", p.help or "", re.IGNORECASE), f"{command} {name}: no default stated"
    options = [line for line in invoke(command, "--help").output.splitlines() if re.match(r"\W+(\*\s+)?--[a-z]", line)]
    assert options and not [line for line in options if "list[" in line]  # a repeatable option's value, not typer's type


def _stated(command: str, name: str) -> str:
    """The default ``--help`` states for option ``name``: typer's shown value, else the help's "Default: X"."""
    p = _params(command)[name]
    if p.show_default is not False and p.default is not None:
        return str(p.default)
    grid = re.search(r"grid, (\S+)\.$", p.help)  # sweep --gammas: "Default: --gamma auto's grid, 1e-4,...,1e8."
    stated = grid or re.search(r"Default: ([^ ;()]+?)\.?(?:$|\s)", p.help)
    assert stated, f"{command} {name}: {p.help}"
    return stated[1].rstrip(",")


def _twelve_classes(path):
    """120 train and 48 test rows of 12 classes: more than learn's default 10 tasks, so --tasks 10 is the default."""
    rng = np.random.default_rng(5)
    y, yt = np.arange(120) % 12, np.arange(48) % 12
    x, xt = rng.normal(size=(120, 6)) + y[:, None], rng.normal(size=(48, 6)) + yt[:, None]
    return write_store(path, (x, y), (xt, yt), [f"k{i}" for i in range(12)], chunk_rows=32)


#: (command, the options checked, the options they act with).
DEFAULTS = [
    ("learn", ["tasks", "batch_size", "projection_dim", "gamma", "seed", "max_memory", "engine", "backend", "dtype",
               "projection_init", "activation", "stream", "scheduler", "head"], []),
    ("learn", ["select", "gamma_grid", "per_decade", "loo_sample"], ["--gamma", "auto"]),
    ("learn", ["disjoint_ratio", "blurry_ratio"], ["--stream", "si-blurry"]),
    ("sweep", ["gammas", "select", "per_decade", "loo_sample", "tasks", "batch_size", "seed", "dtype", "projection_init",
               "activation", "max_memory"], []),
    ("table", ["heads", "order_seeds", "tasks", "gamma", "select", "gamma_grid", "loo_sample", "seed", "batch_size",
               "activation", "max_memory"], []),
]
OUTPUT = {"learn": ("metrics.json", "model.safetensors"), "sweep": ("sweep.json",), "table": ("table.json", "table.csv")}


@pytest.mark.parametrize(("command", "names", "context"), DEFAULTS, ids=[f"{d[0]}-{d[1][0]}" for d in DEFAULTS])
def test_the_stated_default_is_the_one_run(tmp_path, command, names, context):
    """Each option given its stated default writes the same bytes as the command without it."""
    features = _twelve_classes(tmp_path / "k.zarr")
    base = ["--features", str(features), *context]
    small = {"projection_dim": ["--projection-dim", "16"], "backend": ["--backend", "numpy"]}

    def run(out, name=None, *args):
        """The command, with ``args`` in place of ``small``'s option ``name``."""
        extra = [a for key, flag in small.items() if key != name for a in flag]
        result = invoke(command, *base, "--out", out, *extra, *args)
        assert result.exit_code == 0, (args, result.output)
        return [(out / f).read_bytes() for f in OUTPUT[command]]

    without = {name: run(tmp_path / f"without-{name}", name) for name in names if name in small}
    plain = run(tmp_path / "plain")
    for name in names:
        stated = _stated(command, name)
        given = run(tmp_path / name, name, _flag(name), stated)
        assert given == without.get(name, plain), f"{command} {_flag(name)} {stated}: not the default run"


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")
