"""The option text the command line reads itself, read while the command line is parsed (:func:`read_by`), so that
text which is not of its option's type or fixed set is a usage error (exit 2), as with typer's own types.

``--head-option NAME=VALUE``: any head's own option, its text parsed by the type its head's ``Options`` dataclass
gives it (:mod:`foal_pipe.heads.base`), so a new head's option needs no edit of the command line.
``--shrinkage``, ``--shrinkage-offdiag``, ``--compensation`` and ``--gamma-comp`` (:data:`~foal_pipe.cli.flags.HEAD_OPTION_FLAGS`)
fill the same mapping, :attr:`~foal_pipe.protocol.config.ModelConfig.head_options`.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

from foal_pipe.cli._app import UsageError, choice
from foal_pipe.cli.flags import HEAD_OPTION_FLAGS, cli_form
from foal_pipe.encoders.config import _check_model_kwargs, parse_model_kwargs
from foal_pipe.errors import FoalPipeError, comma_items
from foal_pipe.heads import HEADS, head_entry
from foal_pipe.memory import parse_memory
from foal_pipe.protocol.config import OWN_SETTINGS, check_head_option_names, head_option_names
from foal_pipe.protocol.stream import CLASS_ORDERS, named_class_order
from foal_pipe.store.blockfusion import parse_fusion, parse_fusions


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
                return parse(text)
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

# ----------------------------------------------------------------------------------------------------------------
# The other options' text: what each reads as is checked when the command runs (a gamma <= 0, a seed listed twice:
# exit 1, as the library refuses it)


def read_by(read: Callable[[Any], object]) -> Callable[[Any], Any]:
    """A typer callback: the option's text (None: not given) read by ``read``, whose FoalPipeError becomes the usage
    error (``Error: <its message>; see `foal-pipe CMD --help```); the text itself is passed on unchanged."""
    def check(value: Any) -> Any:
        try:
            if value is not None:
                read(value)
        except FoalPipeError as exc:
            raise UsageError(exc.render(cli_form)) from None
        return value

    return check


def integers(text: str, option: str, example: str) -> tuple[int, ...]:
    """``"5,10"`` -> ``(5, 10)``: a comma-separated list of at least one integer."""
    items = comma_items(text, option)
    try:
        values = tuple(int(v) for v in items)
    except ValueError:
        raise FoalPipeError(f"{option} {text!r} is not a comma-separated list of integers; write e.g. {example}") from None
    if not values:
        raise FoalPipeError(f"{option} is empty; write e.g. {example}")
    return values


def numbers(text: str, option: str) -> tuple[float, ...]:
    """``"1e-3,1,10"`` -> ``(0.001, 1.0, 10.0)``: a comma-separated list of at least one number."""
    items = comma_items(text, option)
    if not items:
        raise FoalPipeError(f"{option} is empty; write e.g. 1e-3,1e-1,1,10")
    try:
        return tuple(float(g) for g in items)
    except ValueError:
        raise FoalPipeError(f"{option} {text!r} is not a comma-separated list of numbers; write e.g. 1e-3,1e-1,1,10") from None


def gamma_text(text: str) -> float | str:
    """``--gamma``'s text: a number, or ``auto``."""
    if text == "auto":
        return "auto"
    try:
        return float(text)
    except ValueError:
        raise FoalPipeError(f"--gamma {text!r} is neither a number nor 'auto'; write e.g. --gamma 1 or --gamma auto") from None


def shrinkage_value(text: str) -> float | str:
    """``--shrinkage``: a number, or ``oas``."""
    if text == "oas":
        return text
    try:
        return float(text)
    except ValueError:
        raise FoalPipeError(f"--shrinkage {text!r} is neither a number nor 'oas'; write e.g. --shrinkage 1e-4") from None


def heads_value(text: str) -> tuple[str, ...]:
    """``--heads``: the head names; given, it must name one (an empty list is not "no heads")."""
    heads = tuple(comma_items(text, "--heads"))
    if not heads:
        raise FoalPipeError(f"--heads {text!r} names no head; write a comma-separated list of {', '.join(HEADS)}")
    return heads


def head_names(text: str) -> None:
    """``--heads``' text: heads of the registry (read now: a head registered at run time is one)."""
    for head in heads_value(text):
        head_entry(head, "heads")


def size_text(text: str) -> None:
    """``--max-memory``'s text: a number and one of parse_memory's units (its refusal of other text is the message);
    the size itself (above 0, within range) is checked when the command runs."""
    s = text.strip().lower()
    number = s.rstrip("abcdefghijklmnopqrstuvwxyz")
    try:
        float(number)
        parse_memory("1" + s[len(number):])
    except (ValueError, FoalPipeError):
        parse_memory(text)  # refuses it: not a size


def class_order_text(value: Path) -> None:
    """``--class-order``: a named order's seed must be digits (named_class_order's refusal of others is the message);
    its range, and a FILE, are read when the command runs."""
    name, colon, seed = str(value).partition(":")
    if name in CLASS_ORDERS and colon and not (seed.isdigit() and seed.isascii()):
        named_class_order(str(value))


def fusions_text(text: str) -> None:
    """``--fusions``: a comma-separated list of at least one fusion spec; a spec listed twice is refused when it runs."""
    items = comma_items(text, "--fusions")
    if not items:
        parse_fusions(items, "--fusions")  # refuses it: names no fusion
    for item in items:
        parse_fusion(item, "--fusions")


def fusion_text(text: str) -> None:
    """``extract --fusion``: a fusion spec; one extract cannot apply (concat, a block the model lacks) is refused when it
    runs."""
    parse_fusion(text, "--fusion")


def model_kwargs_text(text: str) -> None:
    """``extract --model-kwargs``: NAME=VALUE items, each NAME an argument name (the library's refusal of an item that
    is not is the message); a name given twice, or one foal-pipe sets itself, is refused when it runs."""
    for item in text.split(",") if text.strip() else ():
        name, sep, value = (part.strip() for part in item.partition("="))
        if not (sep and name and value):
            parse_model_kwargs(f"{item},")  # refuses it: its first item is not NAME=VALUE (a blank one too)
        elif not name.isidentifier():
            _check_model_kwargs(((name, value),))  # refuses it: not an argument name


def group_text(text: str) -> None:
    """``summary --group``: at least one key, each of its set (parse_group's refusal is the message); a key named
    twice is refused when it runs."""
    from foal_pipe.report.grouping import parse_group  # here: foal_pipe.report loads zarr, which --help does without

    parse_group(",".join(dict.fromkeys(key.strip() for key in text.split(","))))
