"""Start-up time of the CLI: `foal-pipe --help` (and any other arguments given), wall time and CPU time, median of
--repeats runs, with the heavy modules the command imports (`python -X importtime`).

`foal-pipe --help` imports typer, rich and NumPy only: scikit-learn, SciPy, zarr, matplotlib and torch are imported
by the commands that use them, when they run.

Usage: python benchmarks/cli_startup_bench.py [--repeats 5] [-- ARGS...]   (default ARGS: --help)
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

from _runner import run_cli

HEAVY = ("sklearn", "scipy", "zarr", "matplotlib", "torch", "timm", "dask", "pandas")


def heavy_imports(args: list[str]) -> list[str]:
    """The :data:`HEAVY` top-level packages that ``foal-pipe ARGS`` imports."""
    code = "import sys; from foal_pipe.cli import main; sys.argv = ['foal-pipe', *sys.argv[1:]]; main()"
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", code, *args], capture_output=True, text=True)
    names = {line.split("|")[-1].strip().split(".")[0] for line in proc.stderr.splitlines()
             if line.startswith("import time:")}
    return sorted(names & set(HEAVY))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("args", nargs="*", default=["--help"], help="foal-pipe arguments (after --)")
    opts = parser.parse_args()
    run_cli(opts.args)  # warm the file cache: the first start reads every module from disk
    runs = [run_cli(opts.args) for _ in range(opts.repeats)]
    wall = statistics.median(r.seconds for r in runs)
    cpu = statistics.median(r.cpu_seconds for r in runs)
    rss = statistics.median(r.peak_rss_mib for r in runs)
    heavy = heavy_imports(opts.args)
    print(f"foal-pipe {' '.join(opts.args)}: median of {opts.repeats} runs {wall:.3f} s wall, {cpu:.3f} s CPU, "
          f"peak RSS {rss:.0f} MiB ({Path(sys.executable).parent / 'foal-pipe'})")
    print(f"heavy modules imported: {', '.join(heavy) or 'none'}")


if __name__ == "__main__":
    main()
