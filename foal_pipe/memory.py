"""Memory up front: what a run will need, against what the machine can give, before any work.

A D x D float64 matrix is 8 D^2 bytes (800 MB at D = 10,000); allocating past the machine's memory ends in
the kernel's OOM killer, with no message. :func:`check_memory` refuses such a run with the figure instead.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from foal_pipe.errors import FoalPipeError, param

#: Resident memory of the interpreter with NumPy, SciPy, zarr and foal-pipe imported (measured: ~150 MiB).
BASELINE_BYTES = 200 * 2**20
#: Default ``--max-memory``: the most an optional speed-up may hold (the per-class statistics of
#: ``--order-seeds``, the activations kept for leave-one-out); beyond it the slower bounded path runs.
DEFAULT_MAX_MEMORY = 8 * 2**30
_UNITS = {"": 1, "b": 1, "k": 2**10, "kib": 2**10, "m": 2**20, "mib": 2**20, "g": 2**30, "gib": 2**30,
          "t": 2**40, "tib": 2**40}


#: Where the machine's and the process's memory limits are read (tests point them at a tree of their own).
MEMINFO = Path("/proc/meminfo")
PROC_CGROUP = Path("/proc/self/cgroup")
PROC_STATUS = Path("/proc/self/status")
CGROUP_ROOT = Path("/sys/fs/cgroup")
#: cgroup v1 writes "no limit" as a huge number (2**63 rounded down to a page).
_NO_LIMIT = 2**62
#: Per version: the mount of the memory controller under CGROUP_ROOT, its limit, usage, and the reclaimable page cache
#: in ``memory.stat`` (left out of the usage, as ``docker stats`` does: the kernel drops it before it kills).
_CGROUP_FILES = {"v2": ("", "memory.max", "memory.current", "inactive_file"),
                 "v1": ("memory", "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")}


def available_memory() -> int | None:
    """Bytes the process can still allocate: ``MemAvailable``, capped by what every memory cgroup holding the process
    (cgroup v2 or v1, a container's or a batch job's) and its address-space limits (``ulimit -v``, a scheduler's
    ``h_vmem``) leave; None if unknown."""
    sizes = cgroup_room() + rlimit_room()
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                sizes.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    if not sizes:
        try:
            sizes.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (OSError, ValueError, AttributeError):
            return None
    return max(0, min(sizes))


def cgroup_room() -> list[int]:
    """What each limited memory cgroup from the process's own (``/proc/self/cgroup``) up to the mount's root leaves:
    a job's limit sits in a folder below the root (Slurm), a container's at the root of its own view."""
    try:
        lines = PROC_CGROUP.read_text().splitlines()
    except OSError:
        lines = []
    rooms = []
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        version = "v2" if controllers == "" else "v1" if "memory" in controllers.split(",") else None
        if version is None:
            continue
        mount, limit_file, usage_file, cache_key = _CGROUP_FILES[version]
        root = CGROUP_ROOT / mount
        folder = root / path.strip("/")
        folder = folder if folder.is_dir() else root  # a container's view: its own cgroup is the root
        while True:
            room = _room(folder, limit_file, usage_file, cache_key)
            if room is not None:
                rooms.append(room)
            if folder == root or root not in folder.parents:
                break
            folder = folder.parent
    return rooms


def rlimit_room() -> list[int]:
    """What the process's soft limits on its address space and its data leave beyond what it maps already (an
    allocation past them fails with MemoryError, however much the machine has)."""
    try:
        status = dict(line.split(":", 1) for line in PROC_STATUS.read_text().splitlines() if ":" in line)
    except OSError:  # no /proc: not Linux
        return []
    import resource  # Unix only: here, on Linux

    rooms = []
    for limit, field in ((resource.RLIMIT_AS, "VmSize"), (resource.RLIMIT_DATA, "VmData")):
        soft = resource.getrlimit(limit)[0]
        if soft != resource.RLIM_INFINITY and field in status:
            rooms.append(soft - int(status[field].split()[0]) * 1024)
    return rooms


def _room(folder: Path, limit_file: str, usage_file: str, cache_key: str) -> int | None:
    """One cgroup's limit less its usage (less its reclaimable page cache); None where it sets no limit."""
    try:
        limit = (folder / limit_file).read_text().strip()
        if limit == "max" or int(limit) >= _NO_LIMIT:
            return None
        used = int((folder / usage_file).read_text().strip())
    except (OSError, ValueError):
        return None
    try:
        stat = dict(line.split() for line in (folder / "memory.stat").read_text().splitlines() if line.count(" ") == 1)
        used -= min(used, int(stat.get(cache_key, 0)))
    except (OSError, ValueError):
        pass
    return int(limit) - used


def human(n_bytes: float) -> str:
    """``1.5 GiB``-style sizes."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n_bytes) < 1024 or unit == "TiB":
            return f"{n_bytes:.1f} {unit}" if unit != "B" else f"{int(n_bytes)} B"
        n_bytes /= 1024
    raise AssertionError("unreachable")


def human_up(n_bytes: float) -> str:
    """:func:`human`, rounded up to its last digit: a figure to raise a limit to that still holds ``n_bytes``
    once :func:`parse_memory` reads it back (``human`` rounds to nearest, which may fall short)."""
    for power, unit in enumerate(("B", "KiB", "MiB", "GiB", "TiB")):
        scale = 1024**power
        if n_bytes < 1024 * scale or unit == "TiB":
            if unit == "B":
                return f"{math.ceil(n_bytes)} B"
            tenths = math.ceil(n_bytes * 10 / scale)
            while parse_memory(f"{tenths / 10:.1f}{unit}") < n_bytes:  # float rounding of the tenths
                tenths += 1
            return f"{tenths / 10:.1f} {unit}"
    raise AssertionError("unreachable")


def parse_memory(text: str) -> int:
    """``"8GiB"``, ``"512M"`` or a byte count -> bytes; refused in one line when it is not a size, rounds to no
    byte at all, or is too large to be one (``1e400``: an overflow, not a traceback)."""
    s = text.strip().lower()
    number = s.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = s[len(number):]
    try:
        value = float(number) if number.isascii() else float("nan")  # float() reads other scripts' digits ('٣')
    except ValueError:
        value = float("nan")
    if unit not in _UNITS or value != value:
        raise FoalPipeError(f"{param('max_memory')} {text!r} is not a size; write e.g. 8GiB, 512MiB or a byte count")
    if value <= 0:
        raise FoalPipeError(f"{param('max_memory')} {text!r} leaves nothing to hold; write a size above 0, e.g. 8GiB")
    size = value * _UNITS[unit]
    if not math.isfinite(size):  # 1e400, 1e300TiB: int() of it would raise OverflowError
        raise FoalPipeError(f"{param('max_memory')} {text!r} is too large to be a size; write e.g. 8GiB or 512MiB")
    if size < 1:  # 0.5 would be read as 0 bytes, which 0 itself is refused as
        raise FoalPipeError(f"{param('max_memory')} {text!r} is less than one byte, so it leaves nothing to hold; "
                            "write e.g. 8GiB or 512MiB")
    if unit in ("", "b") and size != int(size):  # 1.5 read as 1 byte: a unit left out, more likely than a part of a byte
        raise FoalPipeError(f"{param('max_memory')} {text!r} is a byte count with a fraction; add the unit meant, e.g. "
                            f"{number}GiB, or write whole bytes")
    return int(size)


def memory_text(n_bytes: int) -> str:
    """A size as :func:`parse_memory` reads it: ``8GiB``, in the largest binary unit that divides it."""
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        if n_bytes and n_bytes % _UNITS[unit.lower()] == 0:
            return f"{n_bytes // _UNITS[unit.lower()]}{unit}"
    return str(n_bytes)


def fits(parts: dict[str, int]) -> bool:
    """Whether the estimated peak (the sum of ``parts``, plus the interpreter) fits the available memory (True
    when unknown): an optional cache is only kept where :func:`check_memory` would still pass with it."""
    available = available_memory()
    return available is None or BASELINE_BYTES + sum(parts.values()) <= available


#: Bytes the pick of each row's best class adds per row and class: the ties' top two scores
#: (:func:`~foal_pipe.core.scoring.top_two`: a copy and a ``where`` of the scores).
TIES_BYTES = 16


class MemoryRefusal(FoalPipeError):
    """:func:`check_memory`'s refusal: the run does not fit the machine (not a fault of its input, which a caller
    that reports a bad store and goes on must let through)."""


def check_memory(command: str, parts: dict[str, int], fix: str) -> int:
    """Refuse a run whose estimated peak (the sum of ``parts``, plus the interpreter) exceeds the available memory.

    Returns the estimate in bytes. ``parts`` names what takes the memory, largest first in the message.
    """
    total = BASELINE_BYTES + sum(parts.values())
    available = available_memory()
    if available is not None and total > available:
        detail = ", ".join(f"{name} {human(size)}" for name, size in sorted(parts.items(), key=lambda kv: -kv[1]))
        raise MemoryRefusal(
            f"{command} needs about {human(total)} ({detail}) but only {human(available)} is available; {fix}"
        )
    return total
