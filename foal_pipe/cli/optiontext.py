"""The option text the command line reads itself, read while the command line is parsed (:func:`read_by`), so that
text which is not of its option's type or fixed set is a usage error (exit 2), as with typer's own types. What each
reads as is checked when the command runs (a gamma <= 0, a seed listed twice: exit 1, as the library refuses it)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from foal_pipe.cli._app import UsageError
from foal_pipe.cli.flags import cli_form
from foal_pipe.encoders.config import _check_model_kwargs, parse_model_kwargs
from foal_pipe.errors import FoalPipeError, comma_items
from foal_pipe.heads import HEADS, head_entry
from foal_pipe.memory import parse_memory
from foal_pipe.protocol.stream import CLASS_ORDERS, named_class_order
from foal_pipe.store.blockfusion import parse_fusion, parse_fusions


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


Number = TypeVar("Number", int, float)


def ascii_number(text: str, kind: Callable[[str], Number]) -> Number:
    """``kind(text)`` of ASCII text only: Python reads other scripts' digits (``'٣'``, ``'３'``) as numbers, which
    typer's own number options (``--tasks``, ``--seed``) refuse; so do the options read here, alike."""
    if not text.isascii():
        raise ValueError(f"not an ASCII number: {text!r}")
    return kind(text)


def integers(text: str, option: str, example: str) -> tuple[int, ...]:
    """``"5,10"`` -> ``(5, 10)``: a comma-separated list of at least one integer."""
    items = comma_items(text, option)
    try:
        values = tuple(ascii_number(v, int) for v in items)
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
        return tuple(ascii_number(g, float) for g in items)
    except ValueError:
        raise FoalPipeError(f"{option} {text!r} is not a comma-separated list of numbers; write e.g. 1e-3,1e-1,1,10") from None


def gamma_text(text: str) -> float | str:
    """``--gamma``'s text: a number, or ``auto``."""
    if text == "auto":
        return "auto"
    try:
        return ascii_number(text, float)
    except ValueError:
        raise FoalPipeError(f"--gamma {text!r} is neither a number nor 'auto'; write e.g. --gamma 1 or --gamma auto") from None


def shrinkage_value(text: str) -> float | str:
    """``--shrinkage``: a number, or ``oas``."""
    if text == "oas":
        return text
    try:
        return ascii_number(text, float)
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
        ascii_number(number, float)
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
