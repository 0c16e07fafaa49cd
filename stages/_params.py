"""Shared by the stage scripts: resolve one run's settings, read a stage's settings file, run one foal-pipe command.

The stage scripts hold no logic of their own: each turns one run's settings into the command line that a user
would type (``command(name, settings)``), prints it, and runs it in this process (the same code path as the
``foal-pipe`` CLI). A run's settings are the shared ``extract``, ``learn`` and ``sweep`` sections of
params.yaml with its ``datasets`` entry's overrides on top.

What each stage reads of them (:func:`stage_settings`) is written by the ``settings@NAME`` stage to
runs/NAME-settings/STAGE.settings.json (not named like a run's metrics.json or sweep.json), the file that
stage depends on instead of params.yaml, and the only one it reads (:func:`main`): a change reruns only the stages
whose settings it changes (a learn gamma: learn and evaluate, never the extraction), whether the key is set in the
shared section or in the entry, or left out of it, and a stage never runs settings that DVC did not record.
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

import json  # noqa: E402
import re  # noqa: E402
import shlex  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from datetime import date, datetime  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

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


#: How an error names a run name YAML read as no string (``1:``, ``yes:``, ``null:``, ``2024-01-01:``).
YAML_KINDS: dict[type, str] = {int: "an integer", float: "a number", bool: "a boolean", type(None): "null",
                              date: "a date", datetime: "a date and time"}


#: What a run name may hold: a folder name, a DVC stage's (``learn@NAME``) and one word of a command typed by hand.
NAME_CHARS = re.compile(r"[A-Za-z0-9._-]+")


class Quoted(str):
    """A string params.yaml quotes (``gamma: "1.0"``): never read as the number it spells."""


def check_name(name: str) -> None:
    """Refuse a run name that is not one plain folder name: it names data/features/NAME.zarr and runs/NAME, so
    ``../esc`` would write outside runs/ and ``..`` into the repository root; and one plain word, as it names DVC's
    stages (``learn@NAME``) and is typed after ``python stages/learn.py`` by hand (``my run`` would be two words)."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or name.startswith("-"):
        raise ParamsError(f"the run name {name!r} under `datasets` in {PARAMS} is not a plain folder name (it names "
                          f"data/features/NAME.zarr and runs/NAME/); rename it: no '/' or '\\', not '.' or '..', "
                          f"not empty, no leading '-'")
    if not NAME_CHARS.fullmatch(name):
        raise ParamsError(f"the run name {name!r} under `datasets` in {PARAMS} is not one plain word (it names folders, "
                          "DVC's stages, learn@NAME, and a stage script's argument); rename it with letters, digits, '.', "
                          "'_' and '-' alone")



@dataclass(frozen=True)
class Kind:
    """What one key of params.yaml takes: ``accepts(value)``, and how the error names it (``expected``)."""

    expected: str
    accepts: Callable[[Any], bool]


def _passes(check: Callable[[Any], object]) -> Callable[[Any], bool]:
    """``check`` (one of foal_pipe's validators, raising FoalPipeError) as a predicate."""
    from foal_pipe.errors import FoalPipeError

    def accepts(value: Any) -> bool:
        try:
            check(value)
        except (FoalPipeError, TypeError, ValueError, OverflowError):  # OverflowError: an integer past float's range
            return False
        return True

    return accepts


def _number(value: Any) -> Any:
    """``value``, or the float an unquoted string spells: YAML 1.1 (PyYAML) reads ``1e-3`` without a dot as a string,
    which the stages pass on as the number it spells (``--gamma 1e-3``); a quoted ``"1.0"`` stays a string."""
    if isinstance(value, str) and not isinstance(value, Quoted):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _int(value: Any, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _optional(kind: Kind) -> Kind:
    return Kind(f"{kind.expected}, or null", lambda v: v is None or kind.accepts(v))


def _list_of(kind: Kind, items: str, empty: bool) -> Kind:
    what = f"a YAML list of {items}" + (" ([] for none)" if empty else ", not empty")
    return Kind(what, lambda v: isinstance(v, list) and (empty or bool(v)) and all(kind.accepts(x) for x in v))


BOOL = Kind("a YAML boolean, true or false (unquoted)", lambda v: isinstance(v, bool))
TEXT = Kind("a string", lambda v: isinstance(v, str) and bool(v.strip()))
POSITIVE = Kind("a positive integer", lambda v: _int(v, 1))
NON_NEGATIVE = Kind("a non-negative integer", lambda v: _int(v, 0))


def _choice(values: Any) -> Kind:
    values = tuple(values)
    return Kind(f"one of {', '.join(values)}", lambda v: isinstance(v, str) and v in values)


def _extract_choice(name: str) -> Kind:
    """The values `foal-pipe extract --NAME` takes (its ``choice(...)`` annotation)."""
    from typing import get_args, get_type_hints

    from foal_pipe.cli.extract import extract

    return _choice(get_args(get_args(get_type_hints(extract, include_extras=True)[name])[0]))


def kinds() -> dict[str, dict[str, Kind]]:
    """Each key of each shared section (:data:`KEYS`) -> what it takes, from foal_pipe's own registries and checks
    (imported here, not at import time: the stage scripts pin the kernels first)."""
    from foal_pipe.core.activations import ACTIVATIONS, INITS
    from foal_pipe.core.backend import BACKENDS, DTYPES
    from foal_pipe.core.engines import ENGINES, check_gamma
    from foal_pipe.heads import HEADS
    from foal_pipe.protocol.config import check_seed, parse_gamma
    from foal_pipe.protocol.criteria import CRITERIA, TRAINING_CRITERIA
    from foal_pipe.store.blockfusion import FUSION_FORMS, parse_fusion

    fusion = Kind(f"a fusion spec string: {FUSION_FORMS}", lambda v: isinstance(v, str) and _passes(parse_fusion)(v))
    gamma = Kind("a positive number (e.g. 1.0 or 1e-3)",
                 lambda v: not isinstance(_number(v), str) and _passes(check_gamma)(_number(v)))
    seed = Kind("a non-negative integer", _passes(check_seed))
    scalars = (str, int, float, bool, type(None))
    return {
        "extract": {
            "model": TEXT, "checkpoint": _optional(TEXT),
            "model_kwargs": Kind("a YAML mapping of names to numbers, strings or booleans, e.g. {img_size: 32}",
                                 lambda v: isinstance(v, dict) and all(isinstance(x, scalars) for x in v.values())),
            "fusion": fusion, "token": _extract_choice("token"), "image_size": _optional(POSITIVE), "normalize": BOOL,
            "dtype": _extract_choice("dtype"), "keep_blocks": BOOL, "chunk_rows": POSITIVE, "data_dir": _optional(TEXT),
            "test_split": _optional(Kind("a fraction between 0 and 1", lambda v: isinstance(v, (int, float))
                                         and not isinstance(v, bool) and 0 < v < 1)),
            "split_seed": seed, "download": BOOL, "device": _extract_choice("device"),
            "precision": _extract_choice("precision"), "batch_size": _optional(POSITIVE), "workers": _optional(NON_NEGATIVE),
        },
        "learn": {
            "tasks": _optional(POSITIVE), "batch_size": POSITIVE, "projection_dim": NON_NEGATIVE,
            "activation": _optional(_choice(ACTIVATIONS)),  # null: sigmoid, or identity with projection_dim 0
            "gamma": Kind("a positive number or auto (a number unquoted)",
                          lambda v: v == "auto" or (not isinstance(_number(v), str) and _passes(parse_gamma)(_number(v)))),
            "select": _choice(TRAINING_CRITERIA), "seed": seed,
            "order_seeds": _list_of(seed, "non-negative integers", empty=True),
            "engine": _choice(ENGINES), "dtype": _choice(DTYPES), "backend": _choice(BACKENDS),
            "projection_init": _choice(INITS), "drop_last": BOOL, "drop_remainder": BOOL, "mask_unseen": BOOL,
        },
        "sweep": {"gammas": _optional(_list_of(gamma, "positive numbers", empty=False)), "select": _choice(CRITERIA),
                  "fusions": _list_of(fusion, f"fusion specs ({FUSION_FORMS})", empty=True)},
        "table": {"heads": _list_of(_choice(HEADS), f"heads ({', '.join(HEADS)})", empty=False),
                  "order_seeds": _list_of(seed, "non-negative integers", empty=False),
                  "tasks": _list_of(POSITIVE, "positive integers", empty=False)},
    }


def check(settings: dict[str, Any], name: str, entry: dict[str, Any]) -> None:
    """Refuse, in one line naming the key and what it takes, a value of the wrong type or outside its choices: a
    quoted ``"false"`` would otherwise be true, and a bad value fail only in a later stage, after the settings files
    and dvc.lock were updated."""
    from foal_pipe.datasets import DATASETS

    if not isinstance(settings["dataset"], str) or settings["dataset"] not in DATASETS:
        named = f"datasets.{name}.dataset" if "dataset" in entry else f"the run name `{name}` (no `dataset` key)"
        raise ParamsError(f"{named} in {PARAMS} names no registered dataset ({settings['dataset']!r}); set "
                          f"datasets.{name}.dataset to one of: {', '.join(DATASETS)}")
    for section, section_kinds in kinds().items():
        for key, kind in section_kinds.items():
            value = settings[section][key]
            if not kind.accepts(value):
                raise ParamsError(f"{where(name, entry, section, key)} in {PARAMS} must be {kind.expected}, got {value!r}")


def where(name: str, entry: dict[str, Any], section: str, key: str) -> str:
    """How an error names ``section.key`` of run ``name``: as its entry's own key where the entry sets it."""
    return f"datasets.{name}.{section}.{key}" if key in (entry.get(section) or {}) else f"{section}.{key}"


def _known(found: Any, allowed: Any, where: str, kind: str, lead: str) -> None:
    """Refuse keys of ``found`` outside ``allowed``: a typo would otherwise be ignored silently."""
    unknown = sorted(set(found) - set(allowed), key=str)  # by text: keys YAML read as numbers sort too
    if unknown:
        raise ParamsError(f"{where} has unknown {kind} {unknown}; {lead}: {', '.join(allowed)}")


def resolve(params: dict[str, Any], name: str) -> dict[str, Any]:
    """One run's settings: ``{"dataset": ..., "extract": {...}, "learn": {...}, "sweep": {...}}``.

    ``params["datasets"][name]`` may set ``dataset`` (default: ``name``) and override keys of the shared
    sections; an unknown key, there or in a shared section (:data:`KEYS`), is refused (a typo would otherwise be
    ignored silently).
    """
    if not isinstance(params, dict):
        raise ParamsError(f"{PARAMS} must map `datasets` and the sections {', '.join(SECTIONS)} to their settings")
    _known(params, ("datasets", *SECTIONS), f"{PARAMS}", "top-level sections", "its sections are")
    entries = params.get("datasets")
    if not isinstance(entries, dict) or not entries:
        raise ParamsError(f"`datasets` in {PARAMS} must map run names to overrides, e.g. `digits: {{}}`")
    for key in entries:  # DVC makes no stage of one, and `settings.py 1` asks for the string '1'
        if not isinstance(key, str):
            text = json.dumps(key) if key is None or isinstance(key, bool) else str(key)  # as YAML wrote it
            raise ParamsError(f"the run name `{text}` under `datasets` in {PARAMS} is {YAML_KINDS.get(type(key), 'no string')} "
                              f"to YAML, not a name; quote it (`\"{text}\": {{...}}`)")
    if name not in entries:
        raise ParamsError(f"no run {name!r} under `datasets` in {PARAMS}; the runs are: {', '.join(entries)}")
    for section in SECTIONS:
        shared = params.get(section)
        if not isinstance(shared, dict):
            raise ParamsError(f"`{section}` in {PARAMS} must map its settings to values, e.g. the repository's")
        _known(shared, KEYS[section], f"`{section}` in {PARAMS}", "keys", "its keys are")
        missing = sorted(set(KEYS[section]) - set(shared))
        if missing:  # an entry overrides the shared section's keys, never adds one: every entry reads them all
            raise ParamsError(f"`{section}` in {PARAMS} lacks the keys {missing}; set each there (an entry may override a "
                              f"key of `{section}`, not add one; the repository's params.yaml has every key)")
    check_name(name)
    entry = {} if entries[name] is None else entries[name]
    if not isinstance(entry, dict):
        raise ParamsError(f"datasets.{name} in {PARAMS} must be a mapping of overrides (or {{}}), got {entry!r}")
    _known(entry, ("dataset", *SECTIONS), f"datasets.{name} in {PARAMS}", "keys", "it may set")
    settings: dict[str, Any] = {"dataset": entry.get("dataset", name)}
    for section in SECTIONS:
        overrides = {} if entry.get(section) is None else entry[section]
        if not isinstance(overrides, dict):
            raise ParamsError(f"datasets.{name}.{section} in {PARAMS} must map keys of `{section}` to values, got {overrides!r}")
        _known(overrides, params[section], f"datasets.{name}.{section} in {PARAMS}", "keys",
               f"the keys of `{section}` are")
        settings[section] = {**params[section], **overrides}
    check(settings, name, entry)
    return settings


#: The settings of ``learn`` that ``sweep`` does not read (it scores many gammas, always with the gram engine).
LEARN_ONLY = ("gamma", "select", "engine")


#: The settings of ``learn`` that the table's runs share (its gamma is ``auto``, chosen by ``select``): every one
#: `foal-pipe table` takes. It has no option for the others (tasks, gamma and order_seeds are table's own): its runs
#: use engine gram, dtype float64, projection_init uniform, drop_last false and mask_unseen true, whatever learn's.
TABLE_FROM_LEARN = ("batch_size", "projection_dim", "activation", "seed", "backend", "select", "drop_remainder")


def stage_settings(settings: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """What each stage's command is built from, by stage (a :func:`resolve` result in)."""
    learn = settings["learn"]
    return {
        "extract": {"dataset": settings["dataset"], "extract": settings["extract"]},
        "learn": {"learn": learn},
        "sweep": {"sweep": settings["sweep"], "learn": {k: v for k, v in learn.items() if k not in LEARN_ONLY}},
        "table": {"table": settings["table"], "learn": {k: learn[k] for k in TABLE_FROM_LEARN}},
    }


def kwargs_text(values: dict[str, Any]) -> str:
    """``{img_size: 32, pretrained_strict: false}`` -> ``img_size=32,pretrained_strict=false`` (JSON scalars)."""
    return ",".join(f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in values.items())


def number_text(value: Any) -> str:
    """A number as a command line spells it exactly: ``:g`` where that is the same float (``0.1``, ``1e+08``), else
    ``repr`` (``0.12345678``, which ``:g`` would round to ``0.123457``)."""
    short = f"{float(value):g}"
    return short if float(short) == float(value) else repr(float(value))


def extract_spec(settings: dict[str, Any], out: str) -> Any:
    """The :class:`~foal_pipe.extract.ExtractSpec` of the extract stage's command (its checks run on making it)."""
    from foal_pipe.encoders import parse_model_kwargs
    from foal_pipe.extract import ExtractSpec

    p = settings["extract"]
    return ExtractSpec(
        dataset=settings["dataset"], out=out, data_dir=p["data_dir"], download=p["download"], model=p["model"],
        checkpoint=p["checkpoint"], model_kwargs=parse_model_kwargs(kwargs_text(p["model_kwargs"])), fusion=p["fusion"],
        token=p["token"], image_size=p["image_size"], normalize=p["normalize"], dtype=p["dtype"], chunk_rows=p["chunk_rows"],
        keep_blocks=p["keep_blocks"], batch_size=p["batch_size"], workers=p["workers"], device=p["device"],
        precision=p["precision"], test_split=p["test_split"], split_seed=p["split_seed"],
    )


#: The options of `foal-pipe table` that learn's settings give (and ridge's gamma, auto), in the command's order.
TABLE_OPTIONS = ("gamma", "select", "batch_size", "projection_dim", "activation", "seed", "backend", "drop_remainder")


def _table_args(name: str, settings: dict[str, Any], options: Sequence[str]) -> list[Any]:
    """The table stage's command with those of :data:`TABLE_OPTIONS` in ``options``."""
    t, values = settings["table"], {**settings["learn"], "gamma": "auto"}
    args = [
        "table", "--features", f"data/features/{name}.zarr", "--out", f"runs/{name}-table",
        "--heads", ",".join(t["heads"]), "--order-seeds", ",".join(map(str, t["order_seeds"])),
        "--tasks", ",".join(map(str, t["tasks"])),
    ]
    for option in (o for o in TABLE_OPTIONS if o in options and o != "drop_remainder" and values[o] is not None):
        args += ["--" + option.replace("_", "-"), values[option]]
    return [*args, *(["--drop-remainder"] if "drop_remainder" in options and values["drop_remainder"] else [])]


def table_check(args: list[Any]) -> Callable[..., None]:
    """What `foal-pipe ARGS` (a table) checks before it reads a store, as its command does (its heads, orders and task
    counts, and a typed option no head would use), as ``check(explicit=None)``: ``explicit`` the options taken as typed
    (None: those ARGS types)."""
    import typer

    from foal_pipe.cli import app
    from foal_pipe.cli import options as o
    from foal_pipe.cli.learn import _typed
    from foal_pipe.cli.optiontext import integers
    from foal_pipe.cli.table import TYPED_OPTIONS
    from foal_pipe.protocol.capabilities import Settings
    from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig
    from foal_pipe.protocol.table import TableConfig, check_table

    ctx = typer.main.get_command(app).commands["table"].make_context("table", [str(a) for a in args[1:]])
    params = {k: v for k, v in ctx.params.items() if k not in ("heads", "tasks", "order_seeds")}
    typed = [name for name in TYPED_OPTIONS if _typed(ctx, name)]

    def check(explicit: Sequence[str] | None = None) -> None:
        kinds = (StreamConfig, ModelConfig, EvaluationConfig, ExecutionConfig)
        config = TableConfig(o.heads_value(ctx.params["heads"]), integers(ctx.params["order_seeds"], "--order-seeds", "0,1,2"),
                             integers(ctx.params["tasks"], "--tasks", "5,10"))
        check_table(config, ctx.params["features"], Settings(*(o.settings(params, kind) for kind in kinds)),
                    typed if explicit is None else explicit)

    return check


def table_command(name: str, settings: dict[str, Any]) -> list[Any]:
    """The table stage's command: learn's :data:`TABLE_FROM_LEARN` and ridge's gamma auto, each of those `foal-pipe
    table` judges by being typed (``--projection-dim``, ``--select``, ...) only where `table.heads` uses it: where its
    own check refuses the option typed and takes it untyped, at the same values (``--projection-dim`` for heads on the
    store's features alone). A table refused either way keeps every option, for `foal-pipe table` to say why."""
    from foal_pipe.cli.table import TYPED_OPTIONS
    from foal_pipe.errors import FoalPipeError

    every = _table_args(name, settings, TABLE_OPTIONS)
    check = table_check(every)

    def takes(explicit: list[str]) -> bool:
        try:
            check(explicit)
        except FoalPipeError:
            return False
        return True

    if not takes([]):
        return every
    return _table_args(name, settings, [o for o in TABLE_OPTIONS if o not in TYPED_OPTIONS or takes([o])])


def stream_args(p: dict[str, Any]) -> list[Any]:
    """The options `learn` and `sweep` share: how the stream is built and the state is kept."""
    args = [] if p["tasks"] is None else ["--tasks", p["tasks"]]
    args += ["--batch-size", p["batch_size"], "--projection-dim", p["projection_dim"]]
    args += [] if p["activation"] is None else ["--activation", p["activation"]]  # null: the command's own default
    args += ["--seed", p["seed"], "--dtype", p["dtype"], "--backend", p["backend"]]
    args += ["--projection-init", p["projection_init"]] if p["projection_dim"] != 0 else []  # no projection: none to draw
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


def read_settings(name: str, stage: str) -> dict[str, Any]:
    """``stage``'s settings of run ``name``, from the file settings@NAME wrote (never params.yaml, which DVC may have
    changed since), refused in one line when missing or not what settings@NAME writes (its sections and keys, each
    value of a type the key takes; extract's may add the fingerprint of its inputs)."""
    path = Path("runs") / f"{name}-settings" / f"{stage}.settings.json"
    rerun = f"run `dvc repro settings@{name}` (or `python stages/settings.py {name}`) to write it"
    try:
        found = json.loads(path.read_text())
    except FileNotFoundError:
        raise ParamsError(f"{path} is missing: {stage}@{name} reads its settings from it, not from {PARAMS}; {rerun}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ParamsError(f"{path} is not what settings@{name} writes ({exc}); {rerun} again") from None
    layout = stage_settings({"dataset": "", **{section: dict.fromkeys(KEYS[section]) for section in SECTIONS}})[stage]
    ok = isinstance(found, dict) and set(layout) <= set(found) <= {*layout, *(["inputs"] if stage == "extract" else [])}
    problem = None if ok else f"it holds {sorted(found) if isinstance(found, dict) else repr(found)}, not {sorted(layout)}"
    for section, keys in layout.items() if ok else ():
        value = found[section]
        if section == "dataset" or not isinstance(value, dict) or set(value) != set(keys):
            problem = None if section == "dataset" and isinstance(value, str) else f"its `{section}` is {value!r}"
        else:
            problem = next((f"its {section}.{k} is {value[k]!r}" for k, kind in kinds()[section].items()
                            if k in keys and not kind.accepts(value[k])), None)
        if problem:
            break
    if problem:
        raise ParamsError(f"{path} is not what settings@{name} writes: {problem}; {rerun} again")
    return found


def run(args: list[Any]) -> None:
    """Print ``foal-pipe ARGS`` and run it here; exits with the command's status."""
    args = [str(a) for a in args]
    print("$ foal-pipe " + shlex.join(args), flush=True)
    from foal_pipe.cli import app

    app(args, prog_name="foal-pipe")


def run_name(stage: str) -> str:
    """The run this script runs: its one argument (``python stages/learn.py NAME``, by hand) or, under ``dvc repro``
    (no argument), DVC's ``DVC_STAGE`` (``learn@NAME``). dvc.yaml's commands hold no ``${key}``: DVC pastes it into
    the shell's command line unescaped, so a run name could have run a command before any check of it."""
    usage = f"usage: python {sys.argv[0]} NAME  (a run under `datasets` in {PARAMS.name})"
    if len(sys.argv) == 2:
        return sys.argv[1]
    address = os.environ.get("DVC_STAGE", "").rsplit(":", 1)[-1]  # `dvc.yaml:learn@NAME` where another file is named
    if len(sys.argv) != 1 or not address.startswith(f"{stage}@"):
        sys.exit(usage)
    return address.removeprefix(f"{stage}@")


def main(command: Callable[[str, dict[str, Any]], list[Any]], stage: str | None, script: str | None = None) -> None:
    """Run ``command(NAME, settings)`` for the run :func:`run_name` gives (``script``: the stage's name in dvc.yaml,
    default ``stage``), ``settings`` read from ``stage``'s settings file alone (:func:`read_settings`; ``None``: a
    stage that reads no settings gets ``{}``)."""
    name = run_name(script or stage or "")
    try:
        check_name(name)
        settings = {} if stage is None else read_settings(name, stage)
    except ParamsError as exc:
        sys.exit(f"Error: {exc}")
    run(command(name, settings))
