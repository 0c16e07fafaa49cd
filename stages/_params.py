"""Shared by the stage scripts: read params.yaml, resolve one run's settings, run one foal-pipe command.

The stage scripts hold no logic of their own: each turns one run's settings into the command line that a user
would type (``command(name, settings)``), prints it, and runs it in this process (the same code path as the
``foal-pipe`` CLI). A run's settings are the shared ``extract``, ``learn`` and ``sweep`` sections of
params.yaml with its ``datasets`` entry's overrides on top.

What each stage reads of them (:func:`stage_settings`) is written by the ``settings@NAME`` stage to
runs/NAME-settings/STAGE.settings.json (not named like a run's metrics.json or sweep.json), the file that
stage depends on instead of params.yaml: a change reruns only the stages whose settings it changes (a learn
gamma: learn and evaluate, never the extraction), whether the key is set in the shared section or in the
entry, or left out of it.
"""

from __future__ import annotations

import os

# One BLAS/OpenMP thread in every stage, whatever the machine or the caller's environment (Dask, for one, sets
# these): sums computed with other thread counts differ in the last bits, and the pipeline's outputs must hash
# the same everywhere so that dvc.lock matches. Set, as the kernels below, before NumPy and PyTorch are imported.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

#: The same kernels on every x86-64 CPU with AVX2 and FMA (Intel from 2013, AMD from 2015, AVX-512 ones included):
#: OpenBLAS, NumPy's loops, MKL, oneDNN and PyTorch pick kernels by CPU, and kernels sum in different orders, so one
#: thread alone still differs in the last bits between machines (measured: OpenBLAS's SkylakeX or Sandybridge
#: kernels, or NumPy's without AVX-512, change learn's and sweep's outputs; PyTorch's AVX-512 ones a ViT's
#: features). Other CPUs keep their own kernels.
PINNED_KERNELS = {"OPENBLAS_CORETYPE": "Haswell", "MKL_CBWR": "AVX2", "ATEN_CPU_CAPABILITY": "avx2",
                  "ONEDNN_MAX_CPU_ISA": "AVX2"}
#: NumPy's dispatched loops above AVX2, by the names of its release (2.4 groups them as x86-64-v4).
NUMPY_AVX512 = {(2, 4): "X86_V4 AVX512_ICL AVX512_SPR",
                (1, 0): "AVX512F AVX512CD AVX512_KNL AVX512_KNM AVX512_SKX AVX512_CLX AVX512_CNL AVX512_ICL AVX512_SPR"}


def kernel_pins() -> dict[str, str]:
    """The variables that pin this CPU's kernels (set before NumPy and PyTorch load): none unless AVX2 and FMA."""
    try:
        with open("/proc/cpuinfo") as fh:
            flags = next((line.split(":", 1)[1].split() for line in fh if line.startswith("flags")), [])
    except OSError:
        return {}
    if not {"avx2", "fma"} <= set(flags):
        return {}
    from importlib.metadata import version

    numpy = tuple(int(part) for part in version("numpy").split(".")[:2])
    return {**PINNED_KERNELS, "NPY_DISABLE_CPU_FEATURES": next(v for k, v in NUMPY_AVX512.items() if numpy >= k)}


os.environ.update(kernel_pins())

import shlex  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import yaml  # noqa: E402

#: Relative to the working directory, as DVC runs stages from the directory of dvc.yaml.
PARAMS = Path("params.yaml")
SECTIONS = ("extract", "learn", "sweep", "table")


#: The keys of each shared section, as the stage scripts read them: any other is refused, since a typo
#: (`gamme: 0.001`, or `dvc exp run -S +learn.gamme=0.001`) would otherwise run with the default silently.
KEYS = {
    "extract": ("model", "checkpoint", "model_kwargs", "fusion", "token", "image_size", "normalize", "dtype",
                "keep_blocks", "chunk_rows", "data_dir", "test_split", "split_seed", "download", "device", "precision",
                "batch_size", "workers"),
    "learn": ("tasks", "batch_size", "projection_dim", "activation", "gamma", "select", "seed", "order_seeds",
              "engine", "dtype", "backend", "projection_init", "drop_last", "drop_remainder", "mask_unseen"),
    "sweep": ("gammas", "select", "fusions"),
    "table": ("heads", "order_seeds", "tasks"),
}


class ParamsError(ValueError):
    """params.yaml does not describe the run asked for; the message names the fix."""


def resolve(params: dict[str, Any], name: str) -> dict[str, Any]:
    """One run's settings: ``{"dataset": ..., "extract": {...}, "learn": {...}, "sweep": {...}}``.

    ``params["datasets"][name]`` may set ``dataset`` (default: ``name``) and override keys of the shared
    sections; an unknown key, there or in a shared section (:data:`KEYS`), is refused (a typo would otherwise be
    ignored silently).
    """
    entries = params.get("datasets")
    if not isinstance(entries, dict):
        raise ParamsError(f"`datasets` in {PARAMS} must map run names to overrides, e.g. `digits: {{}}`")
    if name not in entries:
        raise ParamsError(f"no run {name!r} under `datasets` in {PARAMS}; the runs are: {', '.join(entries)}")
    for section in SECTIONS:
        shared = params.get(section)
        if not isinstance(shared, dict):
            raise ParamsError(f"`{section}` in {PARAMS} must map its settings to values, e.g. the repository's")
        unknown = sorted(set(shared) - set(KEYS[section]))
        if unknown:
            raise ParamsError(f"`{section}` in {PARAMS} has unknown keys {unknown}; its keys are: "
                              f"{', '.join(KEYS[section])}")
    entry = entries[name] or {}
    unknown = sorted(set(entry) - {"dataset", *SECTIONS})
    if unknown:
        raise ParamsError(f"datasets.{name} in {PARAMS} has unknown keys {unknown}; it may set: dataset, "
                          + ", ".join(SECTIONS))
    settings: dict[str, Any] = {"dataset": entry.get("dataset", name)}
    for section in SECTIONS:
        overrides = entry.get(section) or {}
        unknown = sorted(set(overrides) - set(params[section]))
        if unknown:
            raise ParamsError(f"datasets.{name}.{section} in {PARAMS} has unknown keys {unknown}; the keys of "
                              f"`{section}` are: {', '.join(params[section])}")
        settings[section] = {**params[section], **overrides}
    return settings


#: The settings of ``learn`` that ``sweep`` does not read (it scores many gammas, always with the gram engine).
LEARN_ONLY = ("gamma", "select", "engine")


#: The settings of ``learn`` that the table's runs share (its gamma is ``auto``, chosen by ``select``).
TABLE_FROM_LEARN = ("batch_size", "projection_dim", "activation", "seed", "backend", "select")


def stage_settings(settings: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """What each stage's command is built from, by stage (a :func:`resolve` result in)."""
    learn = settings["learn"]
    return {
        "extract": {"dataset": settings["dataset"], "extract": settings["extract"]},
        "learn": {"learn": learn},
        "sweep": {"sweep": settings["sweep"], "learn": {k: v for k, v in learn.items() if k not in LEARN_ONLY}},
        "table": {"table": settings["table"], "learn": {k: learn[k] for k in TABLE_FROM_LEARN}},
    }


def stream_args(p: dict[str, Any]) -> list[Any]:
    """The options `learn` and `sweep` share: how the stream is built and the state is kept."""
    args = [] if p["tasks"] is None else ["--tasks", p["tasks"]]
    args += [
        "--batch-size", p["batch_size"], "--projection-dim", p["projection_dim"],
        "--activation", p["activation"], "--seed", p["seed"], "--dtype", p["dtype"], "--backend", p["backend"],
        "--projection-init", p["projection_init"],
    ]
    seeds = [int(s) for s in p.get("order_seeds") or []]
    if len(seeds) == 1:
        args += ["--order-seed", seeds[0]]
    elif seeds:
        args += ["--order-seeds", ",".join(map(str, seeds))]
    if p["drop_last"]:
        args.append("--drop-last")
    if p["drop_remainder"]:
        args.append("--drop-remainder")
    if not p["mask_unseen"]:
        args.append("--no-mask-unseen")
    return args


def run(args: list[Any]) -> None:
    """Print ``foal-pipe ARGS`` and run it here; exits with the command's status."""
    args = [str(a) for a in args]
    print("$ foal-pipe " + shlex.join(args), flush=True)
    from foal_pipe.cli import app

    app(args, prog_name="foal-pipe")


def main(command: Callable[[str, dict[str, Any]], list[Any]]) -> None:
    """Run ``command(NAME, settings)`` for the script's only argument (dvc.yaml's ``${key}``)."""
    if len(sys.argv) != 2:
        sys.exit(f"usage: python {sys.argv[0]} NAME  (a run under `datasets` in {PARAMS.name})")
    name = sys.argv[1]
    try:
        settings = resolve(yaml.safe_load(PARAMS.read_text()), name)
    except ParamsError as exc:
        sys.exit(f"Error: {exc}")
    run(command(name, settings))
