"""Audit s25: does every ``--help`` tell the truth, and do the docs say what the CLI does.

Checked against independent facts: the registries in foal_pipe (heads, activations, ``summary --group``'s keys), the
typer app's own parameters (choices, defaults) and docs/cli.md's tables. Two docs pages listed a choice set that
the CLI and docs/cli.md had grown past (fixed: they now list it whole); the other tests cover angles the existing help/docs
tests (test_cli_help_s21: every default stated and run; test_pipeline: every option named in docs/cli.md) leave
open: docs/cli.md's default column and choice lists against the CLI, and options docs/cli.md names that the CLI no
longer has.
"""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest
import typer.main

from foal_pipe.cli import app
from foal_pipe.core.activations import ACTIVATIONS
from foal_pipe.report.grouping import GROUP_KEYS

DOCS = Path(__file__).resolve().parent.parent / "docs"
COMMANDS = typer.main.get_command(app).commands  # type: ignore[attr-defined]


def _section(page: str, heading: str) -> str:
    """The text of ``page``'s ``## heading...`` section (up to the next ``## ``)."""
    for part in (DOCS / page).read_text().split("\n## ")[1:]:
        if part.startswith(heading):
            return part
    raise AssertionError(f"docs/{page} has no section {heading!r}")


# --- faults: docs pages whose choice lists differ from the CLI's -----------------------------------------------------


def test_evaluate_page_lists_every_summary_group_key():
    """docs/evaluate.md's ``summary`` section lists ``--group``'s keys ("keys: head, tasks, ... loo_sample"); it left
    out ``init_model``, which ``summary --help``, docs/cli.md and the registry (GROUP_KEYS) all have."""
    text = _section("evaluate.md", "`foal-pipe summary`")
    listed = text[text.index("(keys:"):text.index("loo_sample") + len("loo_sample")]
    words = set(re.findall(r"[A-Za-z_]+", listed))
    missing = [key for key in GROUP_KEYS if key not in words]
    assert not missing, f"docs/evaluate.md's --group keys miss {missing}"


def test_learn_page_names_every_activation():
    """docs/learn.md's "The expansion" named `--activation sigmoid`, `relu` or `identity`: the CLI (learn and sweep
    --activation, ACTIVATIONS) also takes cos (random Fourier features), which the page did not mention."""
    text = _section("learn.md", "The expansion")
    missing = [name for name in ACTIVATIONS if f"`{name}`" not in text and f"--activation {name}" not in text]
    assert not missing, f"docs/learn.md's expansion section does not name {missing}"


# --- docs/cli.md against the typer app (angles no other test covers) -------------------------------------------------


def _cli_sections() -> dict[str, dict[str, str]]:
    """docs/cli.md's option tables: command -> option -> its row's first cell (the option as written)."""
    sections: dict[str, dict[str, str]] = {}
    for part in (DOCS / "cli.md").read_text().split("\n## ")[1:]:
        heading, _, body = part.partition("\n")
        rows = {}
        for line in body.splitlines():
            if line.startswith("| `"):
                first = line[1:].split(" | ")[0]
                for flag in re.findall(r"`(--[a-z][a-z-]*)", first) + re.findall(r", (--[a-z][a-z-]*)", first):
                    rows.setdefault(flag, line)
        for name in re.findall(r"`foal-pipe ([a-z]+)`", heading):
            sections[name] = rows
    return sections


def _flags(command: str) -> set[str]:
    return {o for p in COMMANDS[command].params for o in (*p.opts, *p.secondary_opts) if o.startswith("--")} - {"--help"}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_cli_reference_names_no_option_the_command_lacks(command):
    """An option docs/cli.md documents under the command that ``COMMAND --help`` no longer lists (learn and sweep
    share a table: each row there must be one of either's)."""
    documented = set(_cli_sections()[command])
    known = _flags("learn") | _flags("sweep") if command in ("learn", "sweep") else _flags(command)
    assert not documented - known, f"docs/cli.md documents {sorted(documented - known)} that {command} lacks"


def _choices(param) -> list[str] | None:
    annotation = param.type_descriptor.annotation
    return list(typing.get_args(annotation)) if typing.get_origin(annotation) is typing.Literal else None


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_cli_reference_choice_lists_equal_the_commands(command):
    """A row written ``--opt a|b|c`` in docs/cli.md lists exactly the command's choices (sweep's --select aside,
    which the shared table gives in parentheses)."""
    rows = _cli_sections()[command]
    for param in COMMANDS[command].params:
        choices, flag = _choices(param), param.opts[0]
        row = rows.get(flag)
        written = row and re.search(rf"`{flag} ([a-z0-9_-]+(?:\\\|[a-z0-9_-]+)+)`", row.split(" | ")[0])
        if not choices or not written or (command, flag) == ("sweep", "--select"):
            continue
        assert set(written[1].split("\\|")) == set(choices), f"docs/cli.md {command} {flag}: {written[1]} vs {choices}"


def _shown_default(param) -> str | None:
    """The default ``--help`` shows as ``[default: X]`` (typer's), else None."""
    if param.show_default is False or param.default is None or getattr(param, "is_flag", False):
        return None
    return str(param.default)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_cli_reference_default_column_equals_the_help(command):
    """docs/cli.md's default column states the default ``--help`` shows for every option typer shows one of."""
    rows = _cli_sections()[command]
    wrong = []
    for param in COMMANDS[command].params:
        shown, row = _shown_default(param), rows.get(param.opts[0])
        if shown is None or row is None:
            continue
        cells = [c.strip().strip("`") for c in re.split(r"(?<!\\)\|", row)[1:-1]]
        default = cells[1]
        if not (default == shown or default.startswith((f"{shown} ", f"{shown},", f"`{shown}`"))
                or (command == "table" and default in ("as `learn", "50, 10"))):
            wrong.append(f"{param.opts[0]}: help {shown!r}, docs {default!r}")
    assert not wrong, f"docs/cli.md {command}: " + "; ".join(wrong)


def test_help_choice_lists_come_from_the_registries():
    """The --head and --activation choices are the registries' (HEADS order aside), as docs/cli.md lists them."""
    from foal_pipe.heads import HEADS

    by_name = {p.name: p for p in COMMANDS["learn"].params}
    assert set(_choices(by_name["head"]) or []) == set(HEADS)
    assert set(_choices(by_name["activation"]) or []) == set(ACTIVATIONS)
    assert set(_choices({p.name: p for p in COMMANDS["table"].params}["activation"]) or []) == set(ACTIVATIONS)
