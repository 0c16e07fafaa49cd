"""The up-front memory estimate of `learn --head` against the peak it allocates, for two or more checkouts.

Each case runs `foal-pipe learn` in a child process with tracemalloc on (it sees every NumPy array) and the
estimate that `prepare` checks recorded; reported per case: the peak, the estimate and its parts. The cases make a
head's state dominate (12 classes): fecam on d = 1,200 features (disjoint, Si-Blurry, continued with
`--init-model` on a second store) and balanced on D = 2,000 activations. `tests/test_learn_heads.py` asserts the
bound; this script records the figures.

Usage: python benchmarks/head_memory_bench.py --code before=/work/wt/base --code after=. [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _runner import header
from synthetic import make_store

CHILD = """
import json, sys, tracemalloc
from typer.testing import CliRunner
from foal_pipe.cli import app
from foal_pipe.protocol import run as run_module
parts = []
check = run_module.check_memory
run_module.check_memory = lambda command, p, fix: parts.append(dict(p)) or check(command, p, fix)
tracemalloc.start()
base = tracemalloc.get_traced_memory()[0]
result = CliRunner().invoke(app, sys.argv[1:])
peak = tracemalloc.get_traced_memory()[1] - base
if result.exit_code != 0:
    sys.exit(result.output)
print(json.dumps({"peak": peak, "estimate": sum(parts[-1].values()), "parts": parts[-1]}))
"""

#: name -> (store, learn's options); "first" is learned (unmeasured) before a case that continues it.
CASES = {
    "fecam": ("wide", ["--head", "fecam"]),
    "fecam, si-blurry": ("wide", ["--head", "fecam", "--stream", "si-blurry"]),
    "fecam, --init-model": ("more", ["--init-model", "{first}"]),
    "balanced, D=2000": ("narrow", ["--head", "balanced", "--projection-dim", "2000"]),
}


def learn(code: Path, args: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(code.resolve()), "OPENBLAS_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", CHILD, "learn", *args], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"learn {' '.join(args)} failed: {proc.stderr or proc.stdout}")
    return json.loads(proc.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--code", action="append", required=True, help="NAME=DIR holding a foal_pipe package")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    codes = {name: Path(path) for name, path in (c.split("=", 1) for c in args.code)}
    results = header(threads=1, cases={})
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        stores = {"wide": make_store(tmp / "wide.zarr", 1200, 240, chunk=300, n_classes=12, dim=1200),
                  "more": make_store(tmp / "more.zarr", 600, 120, chunk=300, n_classes=12, dim=1200, seed=1),
                  "narrow": make_store(tmp / "narrow.zarr", 600, 120, chunk=300, n_classes=12, dim=300)}
        for i, (case, (store, options)) in enumerate(CASES.items()):
            for name, code in codes.items():
                first = tmp / f"{name}-first"
                if "{first}" in options and not first.exists():
                    learn(code, ["--features", str(stores["wide"]), "--out", str(first), "--head", "fecam",
                                 "--tasks", "3", "--backend", "numpy"])
                opts = [o.replace("{first}", str(first / "model.safetensors")) for o in options]
                got = learn(code, ["--features", str(stores[store]), "--out", str(tmp / f"{name}-{i}"),
                                   "--tasks", "3", "--backend", "numpy", *opts])
                results["cases"].setdefault(case, {})[name] = got
                print(f"{case:<22} {name:<8} peak {got['peak'] / 2**20:7.1f} MiB  estimate "
                      f"{got['estimate'] / 2**20:7.1f} MiB  {'ok' if got['peak'] <= got['estimate'] else 'UNDER'}",
                      flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
