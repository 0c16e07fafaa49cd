"""What the console script's fast exit saves: one command run as ``app()`` (the interpreter's teardown after it)
and as ``main()`` (``os._exit`` after the joins, ``atexit`` handlers and flush), interleaved, medians.

Usage: python benchmarks/exit_bench.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from synthetic import make_store  # noqa: E402

RUNNERS = {"teardown": "import sys; sys.argv[0] = 'foal-pipe'; from foal_pipe.cli import app; app()",
           "fast exit": "import sys; sys.argv[0] = 'foal-pipe'; from foal_pipe.cli import main; main()"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="exit_bench_"))
    store = make_store(work / "s.zarr", 20_000, 2_000)
    commands = {
        "learn (numpy)": ["learn", "--features", str(store), "--tasks", "5", "--projection-dim", "500"],
        "learn (torch, CPU)": ["learn", "--features", str(store), "--tasks", "5", "--projection-dim", "500",
                               "--backend", "torch"],
    }
    seconds: dict[tuple[str, str], list[float]] = {}
    for i in range(args.repeats):
        for name, cmd in commands.items():
            for runner, code in sorted(RUNNERS.items(), reverse=i % 2 == 1):  # each first in every other round
                start = time.perf_counter()
                subprocess.run([sys.executable, "-c", code, *cmd, "--out", str(work / f"r{i}-{runner}-{name}")],
                               check=True, capture_output=True)
                seconds.setdefault((name, runner), []).append(time.perf_counter() - start)
    print("| command | teardown (s) | fast exit (s) | saved (s) |\n|---|---|---|---|")
    for name in commands:
        a, b = (statistics.median(seconds[(name, r)]) for r in RUNNERS)
        print(f"| {name} | {a:.2f} | {b:.2f} | {a - b:.2f} |")


if __name__ == "__main__":
    main()
