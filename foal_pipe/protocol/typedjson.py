"""Typed JSON objects: what a key holds (:class:`_Kind`), a frozen record of typed keys (:class:`_Record`) and a
record that is a whole file, with its format and version (:class:`_Document`). Standard library only; the files'
records are in :mod:`foal_pipe.protocol.schema`."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar, TypeGuard, TypeVar

from foal_pipe.errors import FoalPipeError, clipped

LEARN_FIX = "re-run `foal-pipe learn --out DIR` (or `dvc repro`) to write it"

class _Invalid(Exception):
    """A malformed value: the message says where and what; ``from_dict`` adds the fix."""


def shown(value: Any) -> str:
    """A value as JSON, cut to 40 characters."""
    return clipped(json.dumps(value, default=str), 40)


def is_number(value: Any) -> TypeGuard[int | float]:
    """A JSON number (not a boolean)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class _Kind:
    """What a key holds: ``noun`` names it in messages; ``convert(value, where, key)``, when given, checks inside
    the value (``where`` names the record) and returns it converted."""

    noun: str
    accepts: Callable[[Any], bool]
    convert: Callable[[Any, str, str], Any] | None = None

    def parse(self, value: Any, where: str, key: str) -> Any:
        if not self.accepts(value):
            raise _Invalid(f"{where} has no {self.noun} under {key!r} (found {shown(value)})")
        return self.convert(value, where, key) if self.convert else value


def _list_of(kind: _Kind, noun: str | None = None) -> _Kind:
    return _Kind(noun or f"list of {kind.noun}s", lambda v: isinstance(v, list) and all(map(kind.accepts, v)))


def _record(cls: type[_Record], noun: str) -> _Kind:
    return _Kind(noun, lambda v: isinstance(v, dict), lambda v, where, key: cls.parse_dict(v, f"{where}: {key}"))


def _records(cls: type[_Record], noun: str) -> _Kind:
    def convert(values: list, where: str, key: str) -> list:
        return [cls.parse_dict(v, f"{where}: {key}[{i}]") for i, v in enumerate(values)]

    return _Kind(noun, lambda v: isinstance(v, list) and all(isinstance(x, dict) for x in v), convert)


def _triangle(matrix: list, where: str, key: str) -> list[list[float]]:
    """Row i holds i+1 accuracies (a[i][j] for tasks j <= i), each a fraction in [0, 1]."""
    rows = []
    for i, row in enumerate(matrix):
        if not isinstance(row, list) or len(row) != i + 1:
            raise _Invalid(f"{where}: row {i} of {key!r} should have {i + 1} entries "
                           f"(a[i][j] for tasks j <= i), got {row!r:.60}")
        if not all(map(is_number, row)):
            raise _Invalid(f"{where}: row {i} of {key!r} is not all numbers")
        if not all(0.0 <= v <= 1.0 for v in row):
            raise _Invalid(f"{where}: row {i} of {key!r} has values outside [0, 1]; accuracies must be fractions")
        rows.append([float(v) for v in row])
    return rows


NUMBER = _Kind("number", is_number)
POSITIVE = _Kind("number > 0", lambda v: is_number(v) and v > 0)
INTEGER = _Kind("integer", lambda v: isinstance(v, int) and not isinstance(v, bool))
BOOLEAN = _Kind("boolean", lambda v: isinstance(v, bool))
TEXT = _Kind("string", lambda v: isinstance(v, str))
MAPPING = _Kind("mapping", lambda v: isinstance(v, dict))
NUMBERS = _list_of(NUMBER, "list of numbers")
INTEGERS = _list_of(INTEGER)
PER_BOUNDARY = _Kind("list of numbers or nulls (one per task boundary)",
                     lambda v: isinstance(v, list) and all(x is None or is_number(x) for x in v))
MATRIX = _Kind("non-empty list of rows", lambda v: isinstance(v, list) and bool(v), _triangle)
LABEL = _Kind("label id", lambda v: INTEGER.accepts(v) and v >= 0)
COUNT = _Kind("integer >= 0", lambda v: INTEGER.accepts(v) and v >= 0)
FRACTION = _Kind("number in [0, 1]", lambda v: is_number(v) and 0 <= v <= 1)
FRACTIONS = _list_of(FRACTION, "list of numbers in [0, 1]")
POSITIVE_INTEGER = _Kind("integer >= 1", lambda v: INTEGER.accepts(v) and v >= 1)
TASKS = _list_of(_list_of(LABEL), "list of lists of label ids")
TASK_NAMES = _list_of(_list_of(TEXT), "list of lists of class names")
CURVES = _Kind("list of lists of numbers or nulls (one list per task boundary)",
               lambda v: isinstance(v, list) and all(map(PER_BOUNDARY.accepts, v)))
NUMBER_BY_NAME = _Kind("mapping of numbers", lambda v: isinstance(v, dict) and all(map(is_number, v.values())))
GAMMA = _Kind('number > 0 or "auto"', lambda v: v == "auto" or (is_number(v) and v > 0))


def key(kind: _Kind, required: bool = False) -> Any:
    """A dataclass field holding a JSON key of ``kind``; not ``required``: ``None`` when not recorded."""
    return field(metadata={"kind": kind}) if required else field(default=None, metadata={"kind": kind})


R = TypeVar("R", bound="_Record")


@dataclass(frozen=True, kw_only=True)
class _Record:
    """A JSON object with typed keys (the fields) and ``extra``, the keys of other versions, kept verbatim."""

    FIX: ClassVar[str] = LEARN_FIX
    #: How messages name a record read without a path.
    NAME: ClassVar[str] = "record"
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object: every recorded field (nested records as objects), then ``extra``."""
        out = {f.name: _json(getattr(self, f.name)) for f in fields(self)
               if f.name != "extra" and getattr(self, f.name) is not None}
        return {**out, **self.extra}

    @classmethod
    def from_dict(cls: type[R], data: Any, where: str | None = None) -> R:
        """The record of a JSON object (``where`` names it in messages); a malformed one raises
        :class:`~foal_pipe.errors.FoalPipeError`, one line naming the fix."""
        try:
            return cls.parse_dict(data, where or cls.NAME)
        except _Invalid as exc:
            raise FoalPipeError(f"{exc}; {cls.FIX}") from None

    @classmethod
    def parse_dict(cls: type[R], data: Any, where: str) -> R:
        """:meth:`from_dict` for a record nested in another: the outer record's ``from_dict`` names the fix."""
        if not isinstance(data, dict):
            raise _Invalid(f"{where} should be a JSON object, found {shown(data)}")
        values: dict[str, Any] = {}
        known = {f.name for f in fields(cls)}
        for f in fields(cls):
            if f.name == "extra":
                continue
            kind = f.metadata["kind"]
            if data.get(f.name) is not None:
                values[f.name] = kind.parse(data[f.name], where, f.name)
            elif f.default is MISSING:
                raise _Invalid(f"{where} has no {f.name!r} {kind.noun}" if f.name not in data
                               else f"{where} has no {kind.noun} under {f.name!r} (found null)")
        return cls(**values, extra={k: v for k, v in data.items() if k not in known})


@dataclass(frozen=True, kw_only=True)
class _Document(_Record):
    """A record that is a whole file: ``to_dict`` names its :attr:`FORMAT` and :attr:`VERSION`; ``from_dict``
    refuses another format, or a version this foal-pipe does not read, in one line."""

    FORMAT: ClassVar[str]
    #: The version written; every version from 1 to it is read (a file without ``format_version`` is version 1).
    VERSION: ClassVar[int] = 1

    def to_dict(self) -> dict[str, Any]:
        return {"format": self.FORMAT, "format_version": self.VERSION, **super().to_dict()}

    @classmethod
    def parse_dict(cls: type[R], data: Any, where: str) -> R:
        if isinstance(data, dict) and ("format" in data or "format_version" in data):
            check_format(cls, data, where)
            data = {k: v for k, v in data.items() if k not in ("format", "format_version")}
        return super().parse_dict(data, where)


def check_format(cls: Any, data: dict[str, Any], where: str) -> None:
    """Refuse a file of another format, or of a ``format_version`` outside 1..``cls.VERSION`` (a newer
    foal-pipe's), naming the fix: the right reader, or an upgrade."""
    found, version = data.get("format", cls.FORMAT), data.get("format_version", 1)
    if found != cls.FORMAT:
        raise FoalPipeError(f"{where} is a {shown(found)} file, not a {cls.FORMAT} file ({cls.NAME}); pass the "
                            f"{cls.NAME} of a foal-pipe run")
    if not (INTEGER.accepts(version) and 1 <= version <= cls.VERSION):
        raise FoalPipeError(f"{where} has format_version {shown(version)}, which this foal-pipe does not read (it "
                            f"reads {cls.FORMAT} versions 1 to {cls.VERSION}); upgrade foal-pipe to read it")


def _json(value: Any) -> Any:
    if isinstance(value, _Record):
        return value.to_dict()
    if isinstance(value, list):
        return [_json(v) for v in value]
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    return value
