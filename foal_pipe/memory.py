"""Memory up front: what a run will need, against what the machine can give, before any work.

A D x D float64 matrix is 8 D^2 bytes (800 MB at D = 10,000); allocating past the machine's memory ends in
the kernel's OOM killer, with no message. :func:`check_memory` refuses such a run with the figure instead.
"""

from __future__ import annotations

import os
from pathlib import Path

from foal_pipe.errors import FoalPipeError

#: Resident memory of the interpreter with NumPy, SciPy, zarr and foal-pipe imported (measured: ~150 MiB).
BASELINE_BYTES = 200 * 2**20


def available_memory() -> int | None:
    """Bytes the process can still allocate: ``MemAvailable``, capped by a cgroup (container) limit; None if unknown."""
    sizes = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                sizes.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
        if limit != "max":
            sizes.append(int(limit) - used)
    except (OSError, ValueError):
        pass
    if not sizes:
        try:
            sizes.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (OSError, ValueError, AttributeError):
            return None
    return max(0, min(sizes))


def human(n_bytes: float) -> str:
    """``1.5 GiB``-style sizes."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n_bytes) < 1024 or unit == "TiB":
            return f"{n_bytes:.1f} {unit}" if unit != "B" else f"{int(n_bytes)} B"
        n_bytes /= 1024
    raise AssertionError("unreachable")


def check_memory(command: str, parts: dict[str, int], fix: str) -> int:
    """Refuse a run whose estimated peak (the sum of ``parts``, plus the interpreter) exceeds the available memory.

    Returns the estimate in bytes. ``parts`` names what takes the memory, largest first in the message.
    """
    total = BASELINE_BYTES + sum(parts.values())
    available = available_memory()
    if available is not None and total > available:
        detail = ", ".join(f"{name} {human(size)}" for name, size in sorted(parts.items(), key=lambda kv: -kv[1]))
        raise FoalPipeError(
            f"{command} needs about {human(total)} ({detail}) but only {human(available)} is available; {fix}"
        )
    return total
