"""``--head-option NAME=VALUE``: any head's own option, its text parsed by the type its head's ``Options`` dataclass
gives it (:mod:`foal_pipe.heads.base`), so a new head's option needs no edit of the command line.

``--shrinkage``, ``--shrinkage-offdiag``, ``--compensation`` and ``--gamma-comp`` (:data:`~foal_pipe.cli.flags.HEAD_OPTION_FLAGS`)
fill the same mapping, :attr:`~foal_pipe.protocol.config.ModelConfig.head_options`.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, fields
from typing import Any

from foal_pipe.cli._app import choice
from foal_pipe.cli.flags import HEAD_OPTION_FLAGS
from foal_pipe.cli.optiontext import ascii_number
from foal_pipe.errors import FoalPipeError
from foal_pipe.heads import HEADS
from foal_pipe.protocol.config import OWN_SETTINGS, check_head_option_names, head_option_names


def _kinds(annotation: Any) -> list[Any]:
    """The members of a type annotation: ``float | str`` -> [float, str]; NoneType left out (None: the default)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        return [k for member in typing.get_args(annotation) for k in _kinds(member)]
    return [] if annotation is type(None) else [annotation]


#: The words a head's ``str`` option takes: its type admits any text, its head's check refuses all but these (slda's
#: shrinkage is a number or oas, as ``--shrinkage`` reads it).
WORDS: dict[tuple[str, str], tuple[str, ...]] = {("slda", "shrinkage"): ("oas",)}


def _option_types(name: str, heads: Sequence[str]) -> tuple[list[Any], Any]:
    """The types option ``name`` takes in any of ``heads`` (their ``Options`` fields, a ``str`` of :data:`WORDS` as
    its words), and an example value: its first default that is a value (dual's ``gamma_comp`` defaults to None: its
    gamma), else one of its first type."""
    kinds: list[Any] = []
    example: Any = None
    for head in heads:
        options = HEADS[head].head.Options
        field = next(f for f in fields(options) if f.name == name)
        words = WORDS.get((head, name))
        typed = [choice(*words) if words and k is str else k for k in _kinds(typing.get_type_hints(options)[name])]
        kinds += [k for k in typed if k not in kinds]
        if example is None and field.default not in (MISSING, None):
            example = field.default
    if example is None and kinds:
        literal = typing.get_args(kinds[0]) if typing.get_origin(kinds[0]) is typing.Literal else ()
        example = literal[0] if literal else {bool: "true", int: 1, float: 1.0}.get(kinds[0], "VALUE")
    return kinds, example


def _as_bool(text: str) -> bool:
    words = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
    return words[text.lower()]


#: How text becomes a value of each plain type, in the order tried (a number before a string: ``oas`` stays text).
PARSERS: tuple[tuple[Any, str, Callable[[str], Any]], ...] = (
    (bool, "true or false", _as_bool),
    (int, "a whole number", int),
    (float, "a number", float),
    (str, "text", str),
)


def parse_value(text: str, kinds: Sequence[Any]) -> Any:
    """``text`` as the first of ``kinds`` that reads it (a ``Literal``: one of its values); None if none does."""
    for kind in kinds:
        if typing.get_origin(kind) is typing.Literal and text in map(str, typing.get_args(kind)):
            return next(v for v in typing.get_args(kind) if str(v) == text)
    for kind, _, parse in PARSERS:
        if kind in kinds:
            try:
                return parse(text) if kind in (bool, str) else ascii_number(text, parse)
            except (KeyError, ValueError):
                continue
    return None


def _described(kinds: Sequence[Any]) -> str:
    literals = [typing.get_args(k) for k in kinds if typing.get_origin(k) is typing.Literal]
    words = [f"one of {', '.join(map(str, v))}" if len(v) > 1 else str(v[0]) for v in literals]
    return " or ".join(words + [word for kind, word, _ in PARSERS if kind in kinds])


def parse_head_option(text: str) -> tuple[str, Any]:
    """``NAME=VALUE`` -> (NAME, VALUE parsed by the type of NAME in the ``Options`` of the heads that take it)."""
    known = head_option_names()
    name, sep, value = text.partition("=")
    name = name.strip()
    if not sep or not name:
        raise FoalPipeError(f"--head-option {text!r} is not NAME=VALUE; write e.g. --head-option shrinkage=oas")
    if name in OWN_SETTINGS:
        check_head_option_names({name: value})  # refuses it, naming its own flag
    if name not in known:
        listed = "; ".join(f"{option} ({', '.join(heads)})" for option, heads in known.items())
        raise FoalPipeError(f"--head-option {text!r}: no head takes an option {name!r}; the heads' options are: {listed}")
    kinds, example = _option_types(name, known[name])
    parsed = parse_value(value.strip(), kinds)
    if parsed is None:
        raise FoalPipeError(f"--head-option {text!r}: {name} of {', '.join(known[name])} takes {_described(kinds)}; "
                            f"write e.g. --head-option {name}={example}")
    return name, parsed


def head_options(params: Mapping[str, Any], parse: Mapping[str, Callable[[Any], Any]]) -> dict[str, Any]:
    """The head options a command line gives: its ``--head-option``s and the flags of :data:`HEAD_OPTION_FLAGS`
    (parsed by ``parse``, where it has the flag); an option given twice with different values refused."""
    given: dict[str, tuple[str, Any]] = {}
    pairs = [(f"--{name.replace('_', '-')} {params[name]}", name, parse.get(name, lambda v: v)(params[name]))
             for name in HEAD_OPTION_FLAGS if params.get(name) is not None]
    pairs += [(f"--head-option {text}", *parse_head_option(text)) for text in params.get("head_option") or ()]
    for where, name, value in pairs:
        if name in given and given[name][1] != value:
            raise FoalPipeError(f"{given[name][0]} and {where} give {name} two values; give it once")
        given.setdefault(name, (where, value))
    return {name: value for name, (_, value) in given.items()}
