"""The one exception foal-pipe raises for problems a user can fix."""


class FoalPipeError(ValueError):
    """A user-facing error: the message names the problem and the fix, in one line.

    A ``ValueError``, so ordinary ``except ValueError`` code (scikit-learn's included) catches it.

    The CLI prints it as ``Error: <message>`` and exits with status 1, without a traceback.
    """


class InputTypeError(FoalPipeError, TypeError):
    """A :class:`FoalPipeError` that is also a ``TypeError``: an input of the wrong type, where scikit-learn's
    conventions (and its estimator checks) expect a ``TypeError``."""


def as_user_error(exc: ValueError | TypeError) -> FoalPipeError:
    """``exc`` (a library's error about an input, e.g. scikit-learn's validation) as a one-line
    :class:`FoalPipeError` -- an :class:`InputTypeError` for a ``TypeError`` -- with the same words."""
    if isinstance(exc, FoalPipeError):
        return exc
    message = " ".join(str(exc).split()) or type(exc).__name__
    return InputTypeError(message) if isinstance(exc, TypeError) else FoalPipeError(message)
