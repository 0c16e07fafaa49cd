"""The typer application and the one place user errors become ``Error: ...`` and exit status 1 (usage errors: 2).

Also what every command module shares for a readable ``--help`` and readable logs: :func:`choice` (an option
with a fixed set of values, listed in ``--help``), :func:`flag` (an on/off option, no value placeholder),
and consoles that do not fold long paths when the output is a file or a pipe.
"""

from __future__ import annotations

import errno
import inspect
import json
import os
import re
import signal
import sys
import unicodedata
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Annotated, Any, Literal, get_args

import typer
from rich.console import Console
from rich.markup import escape
from rich.segment import Segments
from rich.table import Table
from typer.core import TyperCommand, TyperGroup

try:  # typer 0.29 carries its own copy of click
    from typer._click.exceptions import NoArgsIsHelpError, UsageError
    from typer._click.globals import get_current_context
except ImportError:  # older typer: click itself
    from click.exceptions import NoArgsIsHelpError, UsageError  # type: ignore[assignment, no-redef]  # mypy types both; one runs
    from click.globals import get_current_context  # type: ignore[assignment, no-redef]

from foal_pipe.cli.flags import cli_form
from foal_pipe.errors import NO_VALUE, THREAD_FAILURE, FoalPipeError, limit_fix, thread_failure

# A store node without its zarr.json: zarr warns on stderr in several lines, and the readers refuse the store in one
warnings.filterwarnings("ignore", message=r"Object at .* is not recognized as a component of a Zarr hierarchy")

#: Modules of the optional extras -> the extra that installs them; the light install (`pip install -e .` in a clone)
#: has none of them, so a command that needs one says what to install.
EXTRAS = {
    "torch": "extract", "torchvision": "extract", "timm": "extract", "h5py": "extract",
    "dask": "dist", "distributed": "dist", "cupy": "gpu",
}

#: Console width when the output is not a terminal (a log file, a pipe) and ``COLUMNS`` is not set: wide
#: enough that paths and table rows stay on one line instead of being folded at rich's default of 80.
LOG_WIDTH = 512


def _broken_pipe(self: Console) -> None:
    """Rich's hook for a closed stdout (``foal-pipe info --json S | head -0``), set on every console, typer's help
    console among them: exit 141 as a command killed by SIGPIPE does and as ``user_errors`` ends the others, not rich's
    silent exit 1, which ``set -o pipefail`` reads as a failure with no reason. Stdout is pointed at ``/dev/null`` so
    that the interpreter's final flush writes nothing more (Python's documented pattern)."""
    self.quiet = True
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    raise SystemExit(128 + signal.SIGPIPE)


Console.on_broken_pipe = _broken_pipe  # type: ignore[method-assign]


def _console(stderr: bool = False) -> Console:
    console = Console(stderr=stderr, emoji=False)  # a value written ":x:" is shown as typed, not as an emoji
    if not console.is_terminal:
        console.soft_wrap = True
        if "COLUMNS" not in os.environ:
            console.width = LOG_WIDTH
    return console


def print_json(value: Any) -> None:
    """``value`` as indented JSON on stdout: coloured only on a terminal itself (a pipe reads plain JSON where
    ``FORCE_COLOR`` colours the rest), its non-ASCII text escaped where stdout's encoding cannot hold it (``LC_ALL=C``
    with ``PYTHONUTF8=0``: rich wrote it raw and died with a UnicodeEncodeError)."""
    text = json.dumps(value, indent=2, ensure_ascii=False)
    try:
        text.encode(getattr(console.file, "encoding", None) or "utf-8")
        escaped = False
    except UnicodeEncodeError:
        text, escaped = json.dumps(value, indent=2), True
    isatty = getattr(console.file, "isatty", None)
    if isatty is not None and isatty():
        console.print_json(text, ensure_ascii=escaped)
    else:
        console.print(text, markup=False, highlight=False, soft_wrap=True)


class _HelpFlag:
    """``--help`` is a flag: no ``<bool>`` placeholder beside it; a required argument is its plain name in the usage
    line (``foal-pipe info [OPTIONS] STORE``, click's style), not typer's ``{STORE}``, which reads as a set to pick from.
    A docstring's paragraphs are rewrapped to the terminal (its line breaks are the source's, not the reader's), a
    long list of values (``<digits|fashion-mnist|...>``) breaks between values, not inside one, a repeatable option's
    value is ``<path>``, not typer's ``<list[Path]>``, and a required option's help that ends "Required." (as every
    option's help states its default) loses it beside typer's own "[required]"."""

    help: str | None  # click's Command's

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.help = _paragraphs(self.help)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        for param in self.get_params(ctx):  # type: ignore[attr-defined]
            if param.required and isinstance(param.help, str):  # typer adds "[required]" itself
                param.help = re.sub(r"\s*\bRequired\.$", "", param.help)
            shown = param.metavar is None and getattr(param, "display_type_rich", None) and param.display_type_rich(ctx)
            if shown and re.fullmatch(r"<[^<>|]+(\|[^<>|]+)+>", shown) and len(shown) > LONG_VALUES:
                param.metavar = shown.replace("|", "| ")
            elif shown and (listed := re.fullmatch(r"<list\[(\w+)\]>", shown)):  # typer's Python type, not a value
                param.metavar = f"<{listed[1].lower()}>"
        super().format_help(ctx, formatter)  # type: ignore[misc]

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)  # type: ignore[misc]
        if option is not None:
            option.metavar = ""
        return option

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = super().collect_usage_pieces(ctx)  # type: ignore[misc]
        return [re.sub(r"^\{(.*)\}(\.\.\.)?$", r"\1\2", piece) for piece in pieces]


#: A list of an option's values longer than this (characters) has a space after each ``|`` in ``--help``: the help's
#: table wraps its lines there (at 80 columns ``<digits|fashion-mnist|...>`` broke inside ``fashion-mnist``).
LONG_VALUES = 24


def _paragraphs(text: str | None) -> str | None:
    """``text`` (a docstring) with each paragraph on one line: the help renderer keeps single line breaks."""
    if not text:
        return text
    return "\n\n".join(" ".join(p.split()) for p in inspect.cleandoc(text).split("\n\n"))


class _OneLineUsage:
    """A usage error (a value outside an option's type or fixed set, a missing option, an unknown option or command)
    is one unfolded line, ``Error: <click's reason>; see `foal-pipe learn --help```, not click's boxed usage text
    folded at 80 columns; exit status 2, click's for usage errors (the command line itself is wrong)."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        with _usage_line(ctx):
            _refuse_empty_paths(self, ctx, args)
            rest: list[str] = super().parse_args(ctx, args)  # type: ignore[misc]
        _expand_home(self, ctx)
        return rest


def _takes_paths(param: Any) -> bool:
    """Whether ``param`` takes paths: typer's annotation (from 0.29), else click's ``Path`` type."""
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    kinds = (annotation, *get_args(annotation)) if annotation is not None else (type(getattr(param, "type", None)),)
    return any(getattr(kind, "__name__", None) == "Path" for kind in kinds)


def _refuse_empty_paths(command: Any, ctx: Any, args: list[str]) -> None:
    """A path given as empty text (``--out ""``, an unset shell variable) is a usage error: typer reads it as ``.``, so
    the command went on with the current folder (``summary ""`` summarised it, ``extract --data-dir ""`` read it)
    and refusals named a ``.`` that was never typed."""
    params = [p for p in command.get_params(ctx) if _takes_paths(p)]
    if not params or ctx.resilient_parsing or set(args) & set(ctx.help_option_names):  # --help shows the help, as before
        return
    given, _, _ = command.make_parser(ctx).parse_args(args=list(args))  # the texts as typed, before typer reads them
    for param in params:
        texts = given.get(param.name)
        if "" in (texts if isinstance(texts, list | tuple) else [texts]):
            name = max(param.opts, key=len) if param.param_type_name == "option" else param.metavar or param.name.upper()
            raise UsageError(f"{name} is empty, which would read as the current folder; pass a path", ctx)


def _expand_home(command: Any, ctx: Any) -> None:
    """A path that starts with ``~`` is under the home folder, as a shell would read it where it expands nothing
    (``--out=~/run``, a quoted path): taken literally it made a folder named ``~`` in the working directory."""
    for param in command.get_params(ctx):
        value = ctx.params.get(param.name)
        if value is not None and _takes_paths(param):
            ctx.params[param.name] = type(value)(map(_home, value)) if isinstance(value, list | tuple) else _home(value)


def _home(value: Any) -> Any:
    kind: Any = type(value)  # str or a Path
    return kind(os.path.expanduser(value)) if isinstance(value, str | os.PathLike) else value


@contextmanager
def _usage_line(ctx: Any) -> Iterator[None]:
    try:
        yield
    except NoArgsIsHelpError:  # the command alone: its --help
        raise
    except UsageError as exc:
        message = _not_a_number(exc) or exc.format_message().replace("Value error, ", "").rstrip(".")  # pydantic's prefix
        see = f"{' S' if message.endswith('?') else '; s'}ee `{ctx.command_path} --help`"  # after "Did you mean 'x'?"
        err_console.print(f"[bold red]Error:[/] {escape(one_line(message + see))}", highlight=False, soft_wrap=True)
        raise typer.Exit(exc.exit_code) from None


#: pydantic's errors for a value that does not read as a number (typer from 0.29 converts values with pydantic) -> what
#: the option takes.
_NUMBER_ERRORS = {"int_parsing": "an integer", "int_from_float": "an integer", "int_type": "an integer",
                  "float_parsing": "a number", "float_type": "a number"}


def _not_a_number(exc: UsageError) -> str | None:
    """``--tasks 'abc' is not an integer; write e.g. --tasks 10`` (the example: the option's default where it is a
    number), for any command's number option, in place of pydantic's "Input should be a valid integer, unable to parse
    string as an integer", which does not say what was given. None for any other error, and under an older typer, whose
    click already says ``'abc' is not a valid integer``."""
    param: Any = getattr(exc, "param", None)
    errors: Any = getattr(exc.__cause__, "errors", None)
    first = errors()[0] if param is not None and callable(errors) and errors() else {}
    expected = _NUMBER_ERRORS.get(first.get("type", ""))
    if expected is None:
        return None
    name = max(param.opts, key=len) if param.opts else param.human_readable_name
    default = param.default
    number = isinstance(default, int | float) and not isinstance(default, bool)
    example = default if number else (10 if expected == "an integer" else 0.5)
    return f"{name} {first.get('input')!r} is not {expected}; write e.g. {name} {example}"


class _Command(_HelpFlag, _OneLineUsage, TyperCommand):
    pass


class _Group(_HelpFlag, _OneLineUsage, TyperGroup):
    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        with _usage_line(ctx):
            return super().resolve_command(ctx, args)


class _App(typer.Typer):
    """Commands registered with ``@app.command()`` get :class:`_Command` unless they name another class; a
    missing optional dependency ends any command with one line naming the extra to install."""

    def command(self, *args: Any, cls: Any = None, **kwargs: Any) -> Any:
        return super().command(*args, cls=cls or _Command, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except ModuleNotFoundError as exc:
            module = (exc.name or "").split(".")[0]
            if module not in EXTRAS or os.environ.get("FOAL_PIPE_DEBUG"):
                raise
            err_console.print(f"[bold red]Error:[/] this command needs {module}, which the light install leaves out; "
                              f"install it in the foal-pipe clone with: pip install -e '.\\[{EXTRAS[module]}]'", highlight=False)
            raise SystemExit(1) from None


app = _App(
    name="foal-pipe",
    help="F-OAL: frozen-ViT features to a Zarr cache, then exact online analytic learning.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    cls=_Group,
)
console = _console()
err_console = _console(stderr=True)


def package_version() -> str:
    """The installed distribution's version (importlib.metadata); the source tree's when it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("foal-pipe")
    except PackageNotFoundError:
        from foal_pipe.version import __version__

        return __version__


def _print_version(value: bool) -> None:
    if value:
        console.print(f"foal-pipe {package_version()}", highlight=False, markup=False)
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.", callback=_print_version,
                                          is_eager=True, metavar="", show_default=False)] = False,
) -> None:
    """The options of ``foal-pipe`` itself (before a command): ``--version``."""


def print_table(table: Table) -> None:
    """Print a rich table on stdout; where that is not a terminal, without the padding that ends its lines.

    No number or word is cut to fit the width (see :func:`_fit`), and a stdout that cannot encode "·" or "±"
    (``PYTHONIOENCODING=ascii``) gets "-" and "+-", any other such character "?", rather than a traceback."""
    if not all(_encodes(char) for char in ASCII):
        _to_ascii(table)
    width = _fit(table, console.width)
    with console.capture() as captured:
        if width > console.width:  # the narrowest layout is wider than the terminal: it wraps the lines, not rich
            console.print(Segments(console.render(table, console.options.update_width(width))), crop=False)
        else:
            console.print(table)
    text = captured.get()
    if not console.is_terminal:
        text = "".join(line.rstrip() + "\n" for line in text.splitlines())
    console.file.write(text.encode(console.encoding, errors="replace").decode(console.encoding))


#: The characters of the tables that a non-UTF-8 stdout may not encode -> what it shows instead.
ASCII = {"·": "-", "±": "+-"}

#: The narrowest a column that folds (``overflow="fold"``, e.g. a run's path) is made without a ``min_width`` of its own.
FOLD_WIDTH = 16


def _encodes(char: str) -> bool:
    try:
        char.encode(console.encoding)
    except (UnicodeEncodeError, LookupError):
        return False
    return True


def _to_ascii(table: Table) -> None:
    """:data:`ASCII`'s replacements in the title, caption, headers and text cells of ``table``, before it is laid out."""
    def plain(cell: Any) -> Any:
        if not isinstance(cell, str):
            return cell
        for char, replacement in ASCII.items():
            cell = cell.replace(char, replacement)
        return cell

    table.title, table.caption = plain(table.title), plain(table.caption)
    for column in table.columns:
        column.header = plain(column.header)
        column._cells[:] = [plain(cell) for cell in column._cells]


def _fit(table: Table, width: int) -> int:
    """Set the widths of ``table``'s columns for ``width`` characters where its rows are wider, so that nothing is cut:
    rich would shrink a column below its longest word, or crop a ``no_wrap`` one (``98.2…``, ``loo_acc…``), or drop
    the last columns. The widest column with room to spare gives a character at a time: a ``no_wrap`` column keeps its
    width, any other its longest word, a folding one :data:`FOLD_WIDTH` (or its ``min_width``). Returns the width to
    print at: ``width``, or more where even that layout is wider (the terminal then wraps its lines)."""
    if not all(hasattr(table, name) for name in ("_measure_column", "_extra_width", "_get_padding_width")):
        return width  # rich's private layout helpers (rich 13-15) gone: its own layout, as before
    options = console.options.update_width(1 << 16)
    ranges = [table._measure_column(console, options, column) for column in table.columns]
    widths = [span.maximum for span in ranges]
    room = width - table._extra_width
    if sum(widths) <= room:
        return width
    padding = [table._get_padding_width(column._index) for column in table.columns]
    floors = [span.maximum if column.no_wrap
              else min(span.maximum, pad + (column.min_width or FOLD_WIDTH)) if column.overflow == "fold"
              else span.minimum
              for column, span, pad in zip(table.columns, ranges, padding, strict=True)]
    while sum(widths) > room:
        spare = [i for i, (w, f) in enumerate(zip(widths, floors, strict=True)) if w > f]
        if not spare:
            break
        widths[max(spare, key=lambda i: widths[i])] -= 1
    for column, w, pad in zip(table.columns, widths, padding, strict=True):
        column.width = w - pad
    return max(width, sum(widths) + table._extra_width)


def choice(*values: str) -> Any:
    """The type of an option whose values are a registry's names: typer refuses others and ``--help`` shows ``<a|b|c>``.

    A Literal built at run time is no type to mypy, so name it ``X = choice(*REGISTRY)`` with ``X = str`` under
    ``TYPE_CHECKING`` and write ``Annotated[X, typer.Option(...)]`` (values written in the source: ``Literal["a", "b"]``
    itself); the command receives the plain string.
    """
    return Literal[values]


def flag(*names: str, help: str) -> Any:  # noqa: A002 (typer's own parameter name)
    """An on/off option (``--drop-last`` or ``--plots/--no-plots``): no value placeholder in ``--help``, and
    the default is stated once, by ``help`` (``... Default: off.``)."""
    return typer.Option(*names, help=help, metavar="", show_default=False)


@contextmanager
def user_errors(arguments: Mapping[str, str] | None = None) -> Iterator[None]:
    """Turn a :class:`FoalPipeError` (the parameters it names rendered as flags, or as the command's ``arguments``:
    ``info``'s ``STORE`` for ``features``), any I/O error the library did not
    name itself, running out of host or GPU memory (:func:`out_of_memory_message`) and a thread that cannot start into
    one line on stderr and exit status 1; other RuntimeErrors (a CUDA fault, a bug) keep their traceback.

    Set ``FOAL_PIPE_DEBUG=1`` to see the traceback instead.
    """
    try:
        yield
    except BrokenPipeError:  # the reader closed the pipe (`foal-pipe predict ... | head`): stop quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more reaches the closed pipe at exit
        raise typer.Exit(128 + signal.SIGPIPE) from None
    except (FoalPipeError, OSError, MemoryError, RuntimeError) as exc:
        if os.environ.get("FOAL_PIPE_DEBUG") or (isinstance(exc, RuntimeError) and not thread_failure(exc)
                                                 and not isinstance(exc, torch_out_of_memory())):
            raise
        def form(name: str, value: Any = NO_VALUE) -> str:
            return arguments[name] if arguments and name in arguments and value is NO_VALUE else cli_form(name, value)

        message = (exc.render(form) if isinstance(exc, FoalPipeError) else os_error_message(exc)
                   if isinstance(exc, OSError) else THREAD_FAILURE if thread_failure(exc) else out_of_memory_message(exc))
        err_console.print(f"[bold red]Error:[/] {escape(one_line(message))}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None


def one_line(message: str) -> str:
    """``message`` with its control characters escaped (``\\n``): a path holding a line break kept an error on two
    lines."""
    return "".join(repr(c)[1:-1] if unicodedata.category(c) == "Cc" else c for c in message)


def torch_out_of_memory() -> tuple[type[Exception], ...]:
    """torch's out-of-memory error (a RuntimeError) once torch is imported: no torch computation runs before."""
    torch = sys.modules.get("torch")
    error = getattr(torch, "OutOfMemoryError", None) or getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None)
    return (error,) if isinstance(error, type) else ()


def out_of_memory_message(exc: BaseException) -> str:
    """One line for an allocation that failed: whose memory ran out (the host's: NumPy's MemoryError; the GPU's:
    CuPy's OutOfMemoryError, a MemoryError, or torch's) and the running command's options that need less of it."""
    gpu = not isinstance(exc, MemoryError) or type(exc).__module__.split(".")[0] == "cupy"
    sentences = re.split(r"(?<=\.)\s+", " ".join((str(exc).splitlines() or [""])[0].split()))
    detail = " ".join(sentences[:2]) or type(exc).__name__
    context = get_current_context(silent=True)
    options = {p.name for p in context.command.params} if context is not None else set()
    fixes = [flag for name, flag in (("max_memory", "a lower --max-memory"), ("batch_size", "a smaller --batch-size"),
                                      ("chunk_rows", "a smaller --chunk-rows")) if name in options]
    if gpu:
        fixes += [flag for name, flag in (("backend", "--backend numpy"), ("device", "--device cpu")) if name in options]
    fixes.append("freeing the GPU memory other processes hold" if gpu else "closing other programs")
    tried = f"{', '.join(fixes[:-1])} or {fixes[-1]}" if len(fixes) > 1 else fixes[0]
    return f"out of {'GPU' if gpu else 'host'} memory ({detail}); try {tried}"


def os_error_message(exc: OSError) -> str:
    """One line for an I/O error: the path(s), the system's reason and its errno name, and the fix: the limit the
    process ran into (:data:`~foal_pipe.errors.LIMIT_FIXES`: open files, file size), else the path's."""
    paths = " -> ".join(str(p) for p in (exc.filename, exc.filename2) if p is not None) or _stdout_of(exc)
    reason = " ".join((exc.strerror or str(exc) or type(exc).__name__).split())
    code = errno.errorcode.get(exc.errno or 0)
    fix = limit_fix(exc, "check the path, its permissions and the free space", ", then re-run")
    return f"{paths + ': ' if paths else ''}{reason}{f' ({code})' if code else ''}; {fix}"


def _stdout_of(exc: OSError) -> str:
    """``standard output`` where ``exc``, an error without a path, was raised writing it (a frame it passed through
    held the stream: ``predict`` writing its rows there); else empty."""
    streams = [s for s in (sys.stdout, getattr(sys.stdout, "buffer", None), sys.__stdout__) if s is not None]
    tb = exc.__traceback__
    while tb is not None:
        if any(value is stream or (isinstance(value, Console) and value.file is stream)
               for value in tb.tb_frame.f_locals.values() for stream in streams):
            return "standard output"
        tb = tb.tb_next
    return ""
