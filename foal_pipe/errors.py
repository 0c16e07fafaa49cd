"""The one exception foal-pipe raises for problems a user can fix."""


class FoalPipeError(ValueError):
    """A user-facing error: the message names the problem and the fix, in one line.

    A ``ValueError``, so ordinary ``except ValueError`` code (scikit-learn's included) catches it.

    The CLI prints it as ``Error: <message>`` and exits with status 1, without a traceback.
    """
