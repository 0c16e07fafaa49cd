"""Memory audit: the row cache's spill file (every byte written or a one-line refusal naming the whole cache, in the
TMPDIR asked for) and the memory limits of the cgroups holding the process (v1, and a job's folder below the root)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_clean_error, build_store, invoke

import foal_pipe.memory as memory
from foal_pipe.errors import FoalPipeError
from foal_pipe.protocol import rowcache
from foal_pipe.store import open_store


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return build_store(tmp_path_factory.mktemp("spill") / "blobs.zarr")


def _spilled(store: Path) -> tuple[rowcache.GroupedRows, np.ndarray]:
    """The train split cached by label with a 1-byte limit (so in a spill file), and its rows as stored."""
    split = open_store(store).split("train")
    labels = np.asarray(split.labels).astype(np.int64)
    rows = rowcache.GroupedRows(split, [None], labels, int(labels.max()) + 1, max_memory=1)
    assert not rows.in_memory
    return rows, np.asarray(split.features[:])[rows.rows]


def test_a_short_write_to_the_spill_file_is_finished_not_left_as_zeros(store, monkeypatch):
    """pwrite may write fewer bytes than asked (a disk filling up, a signal): the rest used to stay a hole of zeros."""
    write = os.pwrite
    monkeypatch.setattr(rowcache.os, "pwrite", lambda fd, data, offset: write(fd, data[: max(1, len(data) // 2)], offset))
    rows, stored = _spilled(store)
    with rows:
        assert np.array_equal(rows.block(None, 0, rows.n_rows), stored)


def test_a_disk_filling_up_is_refused_in_one_line_naming_the_whole_cache(store, tmp_path, monkeypatch):
    written = [0]
    write = os.pwrite

    def full(fd, data, offset):  # room for 10,000 bytes: a short write, then no space
        if written[0] >= 10_000:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = write(fd, data[: 10_000 - written[0]], offset)
        written[0] += n
        return n

    monkeypatch.setattr(rowcache.os, "pwrite", full)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    split = open_store(store).split("train")
    need = memory.human(split.n_rows * split.dim * split.features.dtype.itemsize)
    with pytest.raises(FoalPipeError) as info:
        _spilled(store)
    text = str(info.value)
    assert "\n" not in text and f"the {need} of decoded rows" in text and str(tmp_path) in text
    assert "No space left on device" in text and "raise max_memory to" in text

    written[0] = 0
    monkeypatch.setattr(rowcache, "RAM_BYTES", 1)  # a cache above what is ever held in memory: raising does not help
    with pytest.raises(FoalPipeError) as info:
        _spilled(store)
    assert "max_memory" not in str(info.value)

    written[0] = 0
    out = tmp_path / "out"
    result = invoke("learn", "--features", store, "--out", out, "--tasks", 2, "--projection-dim", 16,
                    "--max-memory", "1KiB", "--backend", "numpy")
    assert_clean_error(result, "of decoded rows to a temporary file", out)


def test_the_spill_file_goes_to_tmpdir_and_an_unusable_tmpdir_is_refused(store, tmp_path, monkeypatch):
    """tempfile reads TMPDIR once per process and swaps an unusable one for /tmp silently; the spill uses TMPDIR as
    it is now, and refuses one it cannot write in."""
    if not Path("/proc/self/fd").is_dir():
        pytest.skip("needs /proc to see where the unlinked file lies")
    spill = tmp_path / "spill"
    spill.mkdir()
    monkeypatch.setenv("TMPDIR", str(spill))
    rows, _ = _spilled(store)
    with rows:
        lane = rows._store[None]
        assert isinstance(lane, rowcache._Spill)
        assert os.readlink(f"/proc/self/fd/{lane.file.fileno()}").startswith(f"{spill}/")

    missing = tmp_path / "missing"
    monkeypatch.setenv("TMPDIR", str(missing))
    out = tmp_path / "out"
    result = invoke("learn", "--features", store, "--out", out, "--tasks", 2, "--projection-dim", 16,
                    "--max-memory", "1KiB", "--backend", "numpy")
    assert_clean_error(result, f"temporary file in {missing}", out)


def _cgroup(folder: Path, files: dict[str, str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_the_limit_of_a_cgroup_holding_the_process_caps_the_available_memory(tmp_path, monkeypatch, version):
    """A job's cgroup below the root (Slurm), or a cgroup v1 container: their limits were not read, so a run the
    machine's MemAvailable holds passed the check and met the OOM killer instead of a refusal."""
    gib = 2**30
    (tmp_path / "meminfo").write_text(f"MemTotal: {64 * gib // 1024} kB\nMemAvailable: {60 * gib // 1024} kB\n")
    root = tmp_path / "cgroup"
    if version == "v2":
        (tmp_path / "self").write_text("0::/job_1/step_0\n")
        _cgroup(root, {"cgroup.controllers": "memory\n"})  # the root has no memory.max
        _cgroup(root / "job_1", {"memory.max": f"{4 * gib}\n", "memory.current": f"{3 * gib}\n",
                                 "memory.stat": f"anon 1\ninactive_file {gib}\n"})
        _cgroup(root / "job_1" / "step_0", {"memory.max": "max\n", "memory.current": f"{2 * gib}\n"})
    else:
        (tmp_path / "self").write_text("5:cpu:/\n4:memory:/docker/abc\n")  # the container's view: its cgroup is the root
        _cgroup(root / "memory", {"memory.limit_in_bytes": f"{4 * gib}\n", "memory.usage_in_bytes": f"{3 * gib}\n",
                                  "memory.stat": f"cache 5\ntotal_inactive_file {gib}\n"})
    monkeypatch.setattr(memory, "MEMINFO", tmp_path / "meminfo")
    monkeypatch.setattr(memory, "PROC_CGROUP", tmp_path / "self")
    monkeypatch.setattr(memory, "CGROUP_ROOT", root)
    monkeypatch.setattr(memory, "PROC_STATUS", tmp_path / "no-status")  # no ulimit in the way
    assert memory.available_memory() == 4 * gib - (3 * gib - gib)  # limit less usage, the reclaimable cache aside
    with pytest.raises(FoalPipeError, match="only 2.0 GiB is available"):
        memory.check_memory("learn", {"state": 3 * gib}, "lower --projection-dim")

    unlimited = "max\n" if version == "v2" else f"{2**63 - 4096}\n"
    for limit_file in ("memory.max", "memory.limit_in_bytes"):
        for folder in (root / "job_1", root / "memory"):
            if (folder / limit_file).exists():
                (folder / limit_file).write_text(unlimited)
    assert memory.available_memory() == 60 * gib


def test_an_address_space_limit_caps_the_available_memory(tmp_path, monkeypatch):
    """``ulimit -v`` (SGE's h_vmem): an allocation past it is a MemoryError mid-run; it is refused up front instead,
    with what is already mapped counted against it."""
    import resource

    mib = 2**20
    (tmp_path / "status").write_text(f"Name:\tpython\nVmSize:\t{300 * 1024} kB\nVmData:\t{100 * 1024} kB\n")
    monkeypatch.setattr(memory, "PROC_STATUS", tmp_path / "status")
    monkeypatch.setattr(memory, "PROC_CGROUP", tmp_path / "no-cgroup")
    limits = {resource.RLIMIT_AS: 1000 * mib, resource.RLIMIT_DATA: resource.RLIM_INFINITY}
    monkeypatch.setattr(resource, "getrlimit", lambda which: (limits.get(which, resource.RLIM_INFINITY),) * 2)
    (tmp_path / "meminfo").write_text(f"MemAvailable: {60 * 2**20} kB\n")
    monkeypatch.setattr(memory, "MEMINFO", tmp_path / "meminfo")
    assert memory.available_memory() == 700 * mib
    limits[resource.RLIMIT_DATA] = 500 * mib
    assert memory.available_memory() == 400 * mib
