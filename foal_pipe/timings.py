"""Wall times of a run's phases, kept out of its outputs (they differ run to run) in ``timings.json``."""

from __future__ import annotations

import time
from pathlib import Path

from foal_pipe.io import write_json

TIMINGS_FILE = "timings.json"


class Stopwatch:
    """Seconds per phase: ``lap(name)`` closes the phase that began at the previous lap (or at creation)."""

    def __init__(self) -> None:
        self._start = self._last = time.perf_counter()
        self.seconds: dict[str, float] = {}

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.seconds[phase] = round(now - self._last, 3)
        self._last = now

    def write(self, directory: str | Path) -> Path:
        """``DIRECTORY/timings.json``: each phase's seconds and the ``total`` so far."""
        total = round(time.perf_counter() - self._start, 3)
        return write_json(Path(directory) / TIMINGS_FILE, {"phases": self.seconds, "total": total})
