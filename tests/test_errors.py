"""Errors speak the caller's language: the library names Python parameters (``gamma=1``), the command line the
flags that set them (``--gamma 1``), from one message."""

from __future__ import annotations

import ast
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from foal_pipe import AnalyticClassifier
from foal_pipe.cli import app
from foal_pipe.cli.flags import cli_form
from foal_pipe.errors import NO_VALUE, FoalPipeError, param

PACKAGE = Path(__file__).resolve().parents[1] / "foal_pipe"
FLAG = re.compile(r"(?<![\w`-])--[a-z][a-z-]*")


def test_a_python_caller_reads_parameters():
    with pytest.raises(FoalPipeError) as info:
        AnalyticClassifier(gamma=0).fit(np.ones((4, 3)), [0, 1, 0, 1])
    message = str(info.value)
    assert "gamma=1" in message and "--" not in message
    with pytest.raises(FoalPipeError, match=r"^backend='cupy' needs CuPy .* or use backend='numpy'$"):
        AnalyticClassifier(backend="cupy").fit(np.ones((4, 3)), [0, 1, 0, 1])


def test_the_command_line_reads_flags(tmp_path):
    result = CliRunner().invoke(app, ["learn", "--features", str(tmp_path / "none.zarr"), "--out", str(tmp_path / "r"),
                                      "--gamma", "0"])
    assert result.exit_code == 1
    assert result.output.strip() == "Error: gamma must be a positive number, got 0.0; try --gamma 1"


@pytest.mark.parametrize(
    ("name", "value", "python", "cli"),
    [
        ("gamma", NO_VALUE, "gamma", "--gamma"),
        ("gamma", 1, "gamma=1", "--gamma 1"),
        ("dtype", "float64", "dtype='float64'", "--dtype float64"),
        ("projection_dim", 0.5, "projection_dim=0.5", "--projection-dim 0.5"),
        ("drop_last", True, "drop_last=True", "--drop-last"),
        ("loo", False, "loo=False", "--no-loo"),
        ("mask_unseen", False, "mask_unseen=False", "--no-mask-unseen"),
        ("n_components", 10, "n_components=10", "--projection-dim 10"),
        ("seeds", NO_VALUE, "seeds", "--order-seeds"),
    ],
)
def test_one_message_two_forms(name, value, python, cli):
    error = FoalPipeError(f"use {param(name, value)} at {Path('/tmp/x y')}; or not")
    assert str(error) == f"use {python} at /tmp/x y; or not" and repr(error) == f"FoalPipeError({str(error)!r})"
    assert error.render(cli_form) == f"use {cli} at /tmp/x y; or not"
    assert pickle.loads(pickle.dumps(error)).render(cli_form) == error.render(cli_form)  # from a Dask worker


def _messages(path: Path) -> list[tuple[str, int, str]]:
    """``(function, line, text)`` of each FoalPipeError built in ``path``: its string parts joined."""
    found = []
    tree = ast.parse(path.read_text())
    for function in [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)] or [tree]:
        for node in ast.walk(function):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "FoalPipeError" and node.args:
                texts = [*node.args, *(k.value for k in node.keywords)]  # the problem and its separate fix
                parts = [n.value for t in texts for n in ast.walk(t) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
                found.append((getattr(function, "name", ""), node.lineno, "".join(parts)))
    return found


def test_library_messages_name_parameters_not_flags():
    """A flag in a library message would reach a Python caller: messages mark parameters with ``param`` instead
    (a command to run, in backquotes, may name its flags)."""
    flagged = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE).as_posix()
        if where.startswith("cli/"):
            continue
        for _function, line, text in _messages(path):
            if FLAG.search(re.sub(r"`[^`]*`", "", text)):
                flagged.append(f"{where}:{line}: {text[:80]}")
    assert not flagged, "library messages naming flags:\n" + "\n".join(flagged)
