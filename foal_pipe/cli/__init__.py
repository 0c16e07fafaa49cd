"""``foal-pipe`` command line: one module per command, all registered on one typer app."""

import atexit
import logging
import os
import signal
import sys
import threading
import warnings
from types import FrameType
from typing import NoReturn

from foal_pipe.durable import swallowed_stop

_INTERRUPTED = 128 + signal.SIGINT
#: The stops, each named as the one line says: Ctrl-C, a scheduler's or container's SIGTERM, a closed terminal's SIGHUP.
_STOPS: dict[int, str] = {signal.SIGINT: "Ctrl-C (SIGINT)", signal.SIGTERM: "SIGTERM", signal.SIGHUP: "SIGHUP"}
_stopped_by: int | None = None
_announced = False


def _quiet_exit() -> None:
    """Drop asyncio's "Task was destroyed but it is pending!" at exit: Zarr's I/O loop, stopped by its ``atexit``
    handler, still holds the reads or writes of an interrupted or failed command, and their repr would add lines
    after the command's one."""
    logging.getLogger("asyncio").addFilter(lambda record: not record.getMessage().startswith("Task was destroyed"))


def _quiet_failure() -> None:
    """After a command's one-line failure nothing else is printed: not :func:`_quiet_exit`'s asyncio log, nor a
    "coroutine ... was never awaited" warning (a Zarr call whose I/O thread could not start), nor what an ``atexit``
    handler or a finaliser raises at the exit (Zarr's, joining that thread: "cannot join thread before it is started")."""
    _quiet_exit()
    warnings.filterwarnings("ignore", message=r"coroutine .* was never awaited", category=RuntimeWarning)
    sys.unraisablehook = _dropped


def _dropped(unraisable: "sys.UnraisableHookArgs") -> None:
    """``sys.unraisablehook`` once a command failed: its one line said why; nothing is added after it."""


_unraisable = sys.unraisablehook  # the one before a stop's


def _after_stop(unraisable: "sys.UnraisableHookArgs") -> None:
    """``sys.unraisablehook`` once a stop is received: what finalisers raise then (the stop's KeyboardInterrupt in a
    ``__del__`` or a weakref callback, Zarr's event loop collected half-built, a closed loop's callbacks) is not
    printed; a swallowed KeyboardInterrupt is recorded, to be raised again before the outputs are completed. With no
    stop recorded (a caller in this process reset it) the previous hook reports as before."""
    if _stopped_by is None:
        _unraisable(unraisable)
    elif unraisable.exc_type is not None and issubclass(unraisable.exc_type, KeyboardInterrupt):
        swallowed_stop()


def _silence() -> None:
    """After a stop nothing but its one line is printed: not what finalisers raise, not asyncio's log nor its
    "coroutine ... was never awaited" warnings (Zarr's I/O loop, cut short)."""
    global _unraisable
    if sys.unraisablehook is not _after_stop:
        _unraisable, sys.unraisablehook = sys.unraisablehook, _after_stop
    warnings.simplefilter("ignore")
    logging.getLogger("asyncio").addFilter(lambda record: False)


def _announce() -> int:
    """Say once that Ctrl-C, SIGTERM or SIGHUP stopped the command, wherever it stood (loading, parsing, exiting):
    one line; the exit status, 130, 143 or 129. Later stops are ignored, not a traceback."""
    global _stopped_by, _announced
    for signum in _STOPS:
        signal.signal(signum, signal.SIG_IGN)
    _stopped_by = _stopped_by or signal.SIGINT  # a KeyboardInterrupt raised, not signalled: as Ctrl-C
    if not _announced:
        _announced = True
        _quiet_exit()
        _silence()
        sys.stderr.write(f"Interrupted: stopped by {_STOPS[_stopped_by]}; re-run the same command\n")
    return 128 + _stopped_by


def _interrupted() -> NoReturn:
    """End a stopped command: :func:`_announce`, then exit with its status."""
    raise SystemExit(_announce())


def _terminate(signum: int, frame: FrameType | None) -> None:
    """Every stop unwinds as Ctrl-C does, so that a run's temporary outputs are removed and the previous ones kept,
    and is recorded: one that a finaliser swallows (Python prints it and goes on) still ends the run with its
    status."""
    global _stopped_by
    if _stopped_by is None:
        _silence()
    _stopped_by = signum
    raise KeyboardInterrupt


def _catch_stops() -> None:
    """Install :func:`_terminate` for each of :data:`_STOPS` that is not ignored (``nohup`` ignores SIGHUP, a
    background job of a script SIGINT: kept)."""
    for signum in _STOPS:
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, _terminate)


if os.path.basename(sys.argv[0] if sys.argv else "") == "foal-pipe" and threading.current_thread() is threading.main_thread():
    _catch_stops()  # the console script: from before the commands load, not only in main()

try:  # Ctrl-C while the commands load (a third of a second) ends as at any other moment
    from foal_pipe.cli import extract as _extract  # noqa: F401, I001
    from foal_pipe.cli import info as _info  # noqa: F401, I001  (after extract: --help lists commands in import order)
    from foal_pipe.cli import datasets as _datasets  # noqa: F401, I001
    from foal_pipe.cli import learn as _learn  # noqa: F401  (registers commands)
    from foal_pipe.cli import evaluate as _evaluate  # noqa: F401, I001  (after learn: --help lists commands in import order)
    from foal_pipe.cli import table as _table  # noqa: F401, I001  (after evaluate)
    from foal_pipe.cli._app import app
except KeyboardInterrupt:
    _interrupted()


def _observed() -> bool:
    """A profiler, tracer or debugger is attached (through ``sys.monitoring`` from Python 3.12, as cProfile is)."""
    if sys.getprofile() is not None or sys.gettrace() is not None:
        return True
    monitoring = getattr(sys, "monitoring", None)
    return monitoring is not None and any(monitoring.get_tool(tool) is not None for tool in range(6))


def _unannounced(exc: SystemExit) -> bool:
    """Typer turned a Ctrl-C the command did not handle into this exit, and printed nothing (``extract`` says
    how to resume and exits itself)."""
    return exc.code == _INTERRUPTED and isinstance(getattr(exc.__context__, "__cause__", None), KeyboardInterrupt)


def _status(exc: SystemExit) -> int:
    """The exit status Python gives ``exc``, printing a message code as it does."""
    if exc.code is None or isinstance(exc.code, int):
        return exc.code or 0
    sys.stderr.write(f"{exc.code}\n")
    return 1


def _end(status: int) -> NoReturn:
    """End the process as a normal exit does, without the interpreter's teardown: the other threads are joined,
    the ``atexit`` handlers run (Zarr's I/O loop stopped, temporary folders removed) and the output is flushed,
    then ``os._exit``. The teardown could abort a stopped command: Zarr's reads run on daemon threads (the
    default executor of its daemon I/O loop), which a stop leaves mid-read, and Python 3.11 aborted once with
    "Fatal Python error: PyThreadState_Get" while freeing the modules under them. A stop while ending is the
    command's status, said in one line."""
    while True:
        try:
            for thread in threading.enumerate():
                if thread is not threading.current_thread() and not thread.daemon:
                    thread.join()
            atexit._run_exitfuncs()
            for signum in _STOPS:
                signal.signal(signum, signal.SIG_IGN)
            break
        except KeyboardInterrupt:
            status = _announce()
    if _stopped_by is not None and not status:  # a stop that a finaliser swallowed: the command went on
        status = _announce()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(status)


def _refuse_optimized() -> None:
    """Under Python's optimisation mode (``-O``, ``PYTHONOPTIMIZE``), where zarr cannot read a store
    (:func:`~foal_pipe.store.integrity.optimized_problem`), every command is refused in one line before it starts,
    with a usage error's exit status (2): the interpreter's command line is wrong, not a store."""
    if not sys.flags.optimize:
        return
    from rich.markup import escape

    from foal_pipe.cli._app import err_console
    from foal_pipe.store.integrity import optimized_problem

    problem = optimized_problem()
    if problem is not None:
        err_console.print(f"[bold red]Error:[/] {escape(problem)}", highlight=False, soft_wrap=True)
        raise SystemExit(2)


def _command() -> None:
    """Run the command; a stop ends in :func:`_interrupted`, a failure in its ``SystemExit``."""
    try:
        app()
    except SystemExit as exc:
        if exc.code not in (None, 0):
            _quiet_failure()
            if _unannounced(exc):
                _interrupted()
            if _stopped_by:
                raise SystemExit(128 + _stopped_by) from None
            raise
    _quiet_exit()


def main() -> None:
    """The ``foal-pipe`` console script. A command ends its process without the interpreter's teardown
    (:func:`_end`): its files were complete and closed, or removed, when it returned or failed; the teardown
    (freeing every module, torch's and CUDA's state) cost 0.35 s after ``learn`` on CuPy and 1.5 s after
    ``extract`` on an H200, and could abort a stopped one. A command that raised an unexpected exception exits
    the normal way, with its traceback, and so does one run under a profiler or a tracer (cProfile, a debugger,
    coverage), which writes its results after the program returns. Ctrl-C and SIGTERM (or SIGHUP) from here on,
    typer's start-up included (the interpreter's and ``foal_pipe``'s imports come before: a stop there ends the
    process as Python does, nothing written yet), end with one line and exit 130 or 143 (129), a stop that a
    finaliser swallowed too: the command then went on, and ends with its status all the same. Under ``python -O``
    no command starts (:func:`_refuse_optimized`)."""
    try:
        _catch_stops()
        _refuse_optimized()
        try:
            _command()
        except OSError as exc:  # outside a command's own handling: --version or --help to a full stdout, say
            from rich.markup import escape

            from foal_pipe.cli._app import err_console, one_line, os_error_message

            err_console.print(f"[bold red]Error:[/] {escape(one_line(os_error_message(exc)))}", highlight=False,
                              soft_wrap=True)
            raise SystemExit(1) from None
        status = 0
    except KeyboardInterrupt:
        status = _announce()
    except SystemExit as exc:
        status = _status(exc)
    except Exception:
        if _stopped_by is None:
            raise
        status = _announce()  # the stop's KeyboardInterrupt wrapped (Python 3.11's ``__set_name__`` in an import)
    if _observed():
        if _stopped_by is not None:
            status = _announce()
        if status:
            raise SystemExit(status)
        return
    _end(status)
