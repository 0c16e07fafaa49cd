"""Start-up of ridge's `learn` (or `predict`, `evaluate`, any command): an import and whole `foal-pipe` commands, for
two or more checkouts of foal_pipe side by side (interleaved, so load from other processes hits each alike), one BLAS
thread.

Each ``--code NAME=DIR`` is a directory holding a ``foal_pipe`` package (a `git worktree` of another commit), put
first on ``PYTHONPATH``. Reported: the median seconds of ``from foal_pipe.protocol.commands import run_learn``, the
part of it scikit-learn takes (``python -X importtime``; ``--import`` names another statement), and the median wall and
CPU seconds of each command (``--learn``: learn's options; ``--command``: any command line; ``--out`` is appended).

Usage: python benchmarks/learn_startup_bench.py --code before=/work/wt/base --code after=.
       --learn "--features A.zarr --tasks 5" [--learn "--features A.zarr --engine rls" ...] [--repeats 5] [--json F]
       --command "predict --model M.safetensors --features A.zarr" --import "from foal_pipe.model.deploy import load_model"
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _runner import blas_env, run_cli

IMPORT = "from foal_pipe.protocol.commands import run_learn"


def import_seconds(env: dict[str, str], statement: str = IMPORT) -> float:
    code = f"import time; t = time.perf_counter(); {statement}; print(time.perf_counter() - t)"
    return float(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                check=True).stdout)


def sklearn_seconds(env: dict[str, str], statement: str = IMPORT) -> float:
    """The import time of scikit-learn under the learner's import: the cumulative time of every ``sklearn`` module
    whose importer is not one (``-X importtime`` lists a module after those it imports, one level deeper)."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", statement], env=env, capture_output=True, text=True,
                          check=True)
    rows = []
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and line.count("|") == 2 and "cumulative" not in line:
            _, cumulative, name = line.split("|")
            rows.append((len(name) - len(name.lstrip()), name.strip().split(".")[0] == "sklearn", int(cumulative)))
    total = 0
    for i, (depth, sklearn, cumulative) in enumerate(rows):
        importer = next((row for row in rows[i + 1:] if row[0] < depth), None)
        if sklearn and not (importer and importer[1]):
            total += cumulative
    return total / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--code", action="append", required=True, help="NAME=DIR holding a foal_pipe package")
    parser.add_argument("--learn", action="append", default=[], help="learn's options but --out (repeatable)")
    parser.add_argument("--command", action="append", default=[], help="a command line but --out (repeatable)")
    parser.add_argument("--import", dest="statement", default=IMPORT, help=f"the import timed (default: {IMPORT})")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path)
    opts = parser.parse_args()
    codes = dict(item.split("=", 1) for item in opts.code)
    envs = {name: {**blas_env(1), "PYTHONPATH": str(Path(path).resolve())} for name, path in codes.items()}
    commands = {f"learn {args}": ["learn", *args.split()] for args in opts.learn} | {line: line.split() for line in
                                                                                    opts.command}
    if not commands:
        parser.error("pass --learn or --command")
    imports = {name: [] for name in codes}
    runs = {(name, label): [] for name in codes for label in commands}
    with tempfile.TemporaryDirectory() as tmp:
        for env in envs.values():  # warm the file cache
            import_seconds(env, opts.statement)
            for i, cmd in enumerate(commands.values()):  # a file (predict) or a folder each
                run_cli([*cmd, "--out", f"{tmp}/warm{i}"], env)
        for _ in range(opts.repeats):
            for name, env in envs.items():
                imports[name].append(import_seconds(env, opts.statement))
                for i, (label, cmd) in enumerate(commands.items()):
                    out = Path(tmp) / f"out-{len(runs[name, label])}-{name}-{i}"
                    runs[name, label].append(run_cli([*cmd, "--out", str(out)], env))
    result = {"repeats": opts.repeats, "import_statement": opts.statement, "import": {}, "commands": {}}
    for name, env in envs.items():
        seconds = statistics.median(imports[name])
        result["import"][name] = {"seconds": seconds, "sklearn_seconds": sklearn_seconds(env, opts.statement)}
        print(f"{name:<8} {opts.statement}: {seconds:.3f} s (scikit-learn {result['import'][name]['sklearn_seconds']:.3f} s "
              "in one -X importtime run)")
    for label in commands:
        for name in codes:
            wall = statistics.median(r.seconds for r in runs[name, label])
            cpu = statistics.median(r.cpu_seconds for r in runs[name, label])
            result["commands"].setdefault(label, {})[name] = {"wall": wall, "cpu": cpu}
            print(f"{name:<8} {label:<50} {wall:.3f} s wall, {cpu:.3f} s CPU")
    if opts.json:
        opts.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
