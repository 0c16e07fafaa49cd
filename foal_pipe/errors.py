"""The one exception foal-pipe raises for problems a user can fix, and how its messages name parameters.

A message names a setting with :func:`param`: the exception reads ``gamma=0`` (what a Python caller passes), and
the command line, which sets it with a flag, prints ``--gamma 0`` (:meth:`FoalPipeError.render`).
"""

from __future__ import annotations

import errno
import json
import re
from collections.abc import Callable, Mapping
from typing import Any

# Private-use characters mark a parameter inside a message: no path, name or value holds them.
_START, _VALUE, _END = "\ue000", "\ue001", "\ue002"
_MARK = re.compile(f"{_START}([^{_VALUE}{_END}]*)(?:{_VALUE}([^{_END}]*))?{_END}")
#: No value: the parameter itself is named.
NO_VALUE: Any = object()


def param(name: str, value: Any = NO_VALUE) -> str:
    """A parameter named in a :class:`FoalPipeError` message, alone (``gamma``) or with a value (``gamma=1``,
    ``dtype='float64'``): a string, number or boolean. The command line renders it as the flag that sets it."""
    if value is NO_VALUE:
        return f"{_START}{name}{_END}"
    return f"{_START}{name}{_VALUE}{json.dumps(value)}{_END}"


def clipped(text: str, limit: int = 60) -> str:
    """``text`` for a one-line message: at most ``limit`` characters, the last three an ellipsis where it was cut."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


#: errno -> the fix, for an OS error that is the process or the system at a limit rather than a fault of the files involved:
#: a store read then is not damaged, nor a disk full.
LIMIT_FIXES: dict[int, str] = {
    errno.EMFILE: "the process is at its open-file limit: raise it (`ulimit -n 4096`)",
    errno.ENFILE: "the system's open-file table is full: close other programs or raise it (sysctl fs.file-max)",
    errno.ENOMEM: "the kernel is out of memory for this process: close other programs or raise its memory limit (`ulimit -v`)",
    errno.EFBIG: "a file reached the file-size limit (`ulimit -f`) or the largest file its filesystem holds: raise the "
                 "limit or choose another output path",
}
#: The one line for a thread that cannot start, with the fix (Python says only "can't start new thread").
THREAD_FAILURE = ("a thread could not start (can't start new thread): the process is at its memory or process limit; raise "
                  "it (`ulimit -v`, `ulimit -u`, a container's memory or pids limit) or close other programs, then re-run")


def limit_fix(exc: OSError, otherwise: str, then: str = "") -> str:
    """The fix for a failed I/O call: the limit the process ran into (:data:`LIMIT_FIXES`) followed by ``then``, else
    ``otherwise`` (the place's own fix)."""
    limit = LIMIT_FIXES.get(exc.errno or 0)
    return otherwise if limit is None else limit + then


def limit_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is the process at one of its limits (:data:`LIMIT_FIXES`, a thread that cannot start), which no
    fix of a file or of the data can help: readers let it through instead of calling the store damaged."""
    return (isinstance(exc, OSError) and exc.errno in LIMIT_FIXES) or thread_failure(exc)


def thread_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is :class:`RuntimeError` "can't start new thread" (threading's, asyncio's executors')."""
    return isinstance(exc, RuntimeError) and "can't start new thread" in str(exc)


def python_form(name: str, value: Any = NO_VALUE) -> str:
    """How a Python caller passes ``name``: ``gamma``, ``gamma=1``, ``dtype='float64'``."""
    return name if value is NO_VALUE else f"{name}={value!r}"


class FoalPipeError(ValueError):
    """A user-facing error: the message names the problem and the fix, in one line.

    A ``ValueError``, so ordinary ``except ValueError`` code (scikit-learn's included) catches it. Its text names
    parameters as a Python caller passes them; :meth:`render` names them otherwise (the CLI prints its flags as
    ``Error: <message>`` and exits with status 1, without a traceback).

    ``fix``: the way out, kept apart from the problem (``reason``) and joined to it by "; " in the message, so that a
    caller can name the same problem with another fix (one head's option, shared by another head) without parsing
    the text.
    """

    def __init__(self, message: object = "", fix: str = "") -> None:
        self.reason, self.fix = str(message), fix
        self.template = f"{self.reason}; {fix}" if fix else self.reason
        super().__init__(self.render(python_form))

    def render(self, form: Callable[..., str]) -> str:
        """The message with each parameter named by ``form(name)`` or ``form(name, value)``."""
        def one(match: re.Match[str]) -> str:
            name, value = match.group(1), match.group(2)
            return form(name) if value is None else form(name, json.loads(value))

        return _MARK.sub(one, self.template)


class ClassRefused(FoalPipeError):
    """A head's refusal of one class, made where only its label id is known (a head's own ids, which need not be the
    caller's labels): ``say(name)`` words it; :meth:`named` words it again with the name the caller knows."""

    def __init__(self, label: Any, say: Callable[[str], str]) -> None:
        super().__init__(say(repr(label)))
        self.label, self.say = label, say

    def named(self, names: Mapping[Any, Any]) -> FoalPipeError:
        """The refusal naming the class as ``names`` (label id -> the caller's label or name) does, where it holds it."""
        return ClassRefused(names[self.label], self.say) if self.label in names else self

    def __reduce__(self) -> tuple[Any, ...]:
        return FoalPipeError, (self.template,)  # ``say`` may be a closure: the message travels, as any refusal's


class InputTypeError(FoalPipeError, TypeError):
    """A :class:`FoalPipeError` that is also a ``TypeError``: an input of the wrong type, where scikit-learn's
    conventions (and its estimator checks) expect a ``TypeError``."""


class MissingAttribute(FoalPipeError, AttributeError):
    """A :class:`FoalPipeError` that is also an ``AttributeError``: an attribute that an estimator in its form lacks
    (the RLS engine's ``statistics_``), so that ``hasattr`` answers False, as for an unfitted estimator's."""


class NoBlocks(FoalPipeError):
    """A store without per-block tokens asked for a read-time fusion: its ``fix`` (extract with ``--keep-blocks``, or
    read without the fusion) is the user's where the fusion was their choice; a model that fixes it gives its own."""


def as_user_error(exc: ValueError | TypeError) -> FoalPipeError:
    """``exc`` (a library's error about an input, e.g. scikit-learn's validation) as a one-line
    :class:`FoalPipeError` -- an :class:`InputTypeError` for a ``TypeError`` -- with the same meaning: a quoted input
    (the whole of a 1-D X) or scikit-learn's paragraph of advice shortened to the fix, the fix added to a message that
    names none (a non-finite value, another width, an empty batch), the line clipped to 300."""
    if isinstance(exc, FoalPipeError):
        return exc
    message = " ".join(str(exc).split()) or type(exc).__name__
    for pattern, replacement in (
        (r"array=.*?\. (Reshape your data)", r"\1"),  # a 1-D or scalar X, printed whole
        (r"^(Complex data not supported).*", r"\1 (X holds complex numbers); pass real-valued features"),
        (r"^(Input .*contains NaN)\. (\S+) does not accept missing values encoded as NaN natively\..*",
         r"\1, which \2 does not accept; drop the rows with missing values or impute them first"),
        (r"^(Input y contains (?:NaN|infinity or a value too large for dtype\('\w+'\)))\.$",
         r"\1, which is not a class label; give every row a label (integer id or name), or drop the unlabelled rows"),
        (r"^(Input (?:\w+ )?contains NaN)\.$", r"\1; drop the rows with missing values or impute them first"),
        (r"^(Input (?:\w+ )?contains infinity or a value too large for dtype\('\w+'\))\.$",
         r"\1; check the features (re-extract the store), or drop the rows with such values"),
        (r"^(X has \d+ features, but \S+ is expecting \d+ features as input)\.$",
         r"\1; pass rows of the features it was fitted on (from the same encoder and projection)"),
        (r"^(Found array with 0 sample\(s\) .* a minimum of 1 is required.*)\.$",
         r"\1; pass a non-empty batch (one row or more)"),
        (r"^(Found array with 0 feature\(s\) .* a minimum of 1 is required.*)\.$", r"\1; pass one feature (column) or more"),
        (r"^(Found input variables with inconsistent numbers of samples: .*)$", r"\1; pass one label per row of X"),
    ):
        message = re.sub(pattern, replacement, message)
    message = clipped(message, 300)
    return InputTypeError(message) if isinstance(exc, TypeError) else FoalPipeError(message)


def comma_items(text: str, option: str) -> list[str]:
    """The items of a comma-separated option value, stripped; none for a value of no item (``""``, ``" , "``). An
    empty item between commas (``1,,2``, a trailing comma) is refused: it is a typo as often as not, and skipping it
    would hide one."""
    items = [item.strip() for item in text.split(",")]
    if not any(items):
        return []  # nothing listed: the caller's own "is empty" refusal names what to list
    if "" in items:
        raise FoalPipeError(f"{option} {text!r} has an empty item between commas; remove the extra comma")
    return items
