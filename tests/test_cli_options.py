"""``learn`` and ``sweep`` build their signatures from one table of options (issue 30 item 4): an option both take is
defined once, with one help text and one default."""

from __future__ import annotations

import inspect

import pytest
import typer.main

from foal_pipe.cli import app
from foal_pipe.cli import options as o


def _params(name: str) -> dict[str, object]:
    command = typer.main.get_command(app).commands[name]  # type: ignore[attr-defined]
    return {p.name: p for p in command.params}


def test_every_option_of_learn_and_sweep_comes_from_the_one_table():
    from foal_pipe.cli.learn import learn, sweep

    for command in (learn, sweep):
        for name, parameter in inspect.signature(command).parameters.items():
            if name in ("ctx", "features", "out", "select"):
                continue
            assert (parameter.annotation, parameter.default) == o.OPTIONS[name], name
    shared = set(inspect.signature(learn).parameters) & set(inspect.signature(sweep).parameters)
    assert {"tasks", "seed", "fusion", "shrinkage", "order_seeds", "per_decade"} <= shared
    learn_params, sweep_params = _params("learn"), _params("sweep")
    for name in shared - {"ctx", "select"}:
        a, b = learn_params[name], sweep_params[name]
        assert (a.opts, a.help, a.default) == (b.opts, b.help, b.default), name
    assert learn_params["select"].help != sweep_params["select"].help  # the one option each defines its own way


def test_a_command_naming_an_option_the_table_lacks_is_refused():
    with pytest.raises(TypeError, match="no definition of \\['colour'\\]"):
        o.options("tasks", "colour")
    with pytest.raises(TypeError, match="unlisted own options \\['select'\\]"):
        o.options("tasks", select=(o.Select, None))
