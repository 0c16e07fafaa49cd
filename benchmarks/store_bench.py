"""Benchmark what store format 2 costs: the crc32c checksum on every chunk, the chunk listing in `open_store`,
and `info --verify` (reading everything).

* chunk writes and reads of ROWS x DIM float32 features in 1024-row chunks, zstd alone (format 1) against
  zstd + crc32c (format 2), the two interleaved in every repeat so that load from other processes hits both;
* `open_store` of a store of that size (a listing of every chunk file, the labels read, no features read);
* `verify_store`: every chunk read and checked, the generation id recomputed.

Usage: python benchmarks/store_bench.py [--rows 50000] [--dim 768] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import zarr
from zarr.codecs import BytesCodec, Crc32cCodec, ZstdCodec

from foal_pipe.store import open_store, verify_store, write_store

CHUNK = 1024


def write_read(x: np.ndarray, crc: bool) -> tuple[float, float]:
    """Seconds to write then read ``x`` chunk by chunk, with or without the crc32c codec."""
    tmp = Path(tempfile.mkdtemp(prefix="store_bench_"))
    try:
        group = zarr.open_group(str(tmp / "s.zarr"), mode="w")
        compressors = (ZstdCodec(level=0), Crc32cCodec()) if crc else (ZstdCodec(level=0),)
        array = group.create_array("f", shape=x.shape, chunks=(CHUNK, x.shape[1]), dtype="float32",
                                   serializer=BytesCodec(), compressors=compressors,
                                   config={"write_empty_chunks": True})
        start = time.perf_counter()
        for lo in range(0, x.shape[0], CHUNK):
            array[lo : lo + CHUNK] = x[lo : lo + CHUNK]
        wrote = time.perf_counter() - start
        start = time.perf_counter()
        for lo in range(0, x.shape[0], CHUNK):
            np.asarray(array[lo : lo + CHUNK])
        return wrote, time.perf_counter() - start
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    x = np.random.default_rng(0).standard_normal((args.rows, args.dim)).astype(np.float32)
    mb = x.nbytes / 1e6
    times: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    for r in range(args.repeats):
        for crc in ((False, True) if r % 2 == 0 else (True, False)):
            times[crc].append(write_read(x, crc))
    for crc, runs in times.items():
        w, rd = statistics.median(t[0] for t in runs), statistics.median(t[1] for t in runs)
        print(f"{'zstd + crc32c' if crc else 'zstd alone   '}: write {mb / w:6.0f} MB/s, read {mb / rd:6.0f} MB/s")
    ratio_w = statistics.median(b[0] / a[0] for a, b in zip(times[False], times[True]))
    ratio_r = statistics.median(b[1] / a[1] for a, b in zip(times[False], times[True]))
    print(f"crc32c / zstd alone, paired medians: write time x{ratio_w:.2f}, read time x{ratio_r:.2f}")
    tmp = Path(tempfile.mkdtemp(prefix="store_bench_"))
    try:
        labels = np.arange(args.rows) % 100
        path = write_store(tmp / "s.zarr", (x, labels), (x[: args.rows // 5], labels[: args.rows // 5]),
                           [str(k) for k in range(100)], chunk_rows=CHUNK)
        opens = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            open_store(path)
            opens.append(time.perf_counter() - start)
        start = time.perf_counter()
        checked = verify_store(path)
        verify = time.perf_counter() - start
        print(f"open_store: {statistics.median(opens) * 1e3:.1f} ms (median); verify_store: {checked.chunks_read} "
              f"chunks, {verify:.2f} s ({mb * 1.2 / verify:.0f} MB/s of features)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
