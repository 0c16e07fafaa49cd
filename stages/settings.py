"""DVC stage `settings@NAME`: each stage's settings for run NAME -> runs/NAME-settings/{extract,learn,sweep,table}.settings.json.

The other stages depend on these files, not on params.yaml: DVC reruns a stage when the bytes of its settings
change, so a change reruns only the stages it concerns. Written in one canonical form (sorted keys), so that
settings equal in value give the same bytes however params.yaml writes them. Before writing, it refuses what a
later stage would (:func:`check_stages`): DVC deletes a stage's outputs before running it.

DVC cannot name the files extract reads (``data_dir`` may be set in an entry, in the shared section, or left to the
dataset's default place), so this stage runs on every `dvc repro` (``always_changed``) and records a fingerprint of
them in extract.settings.json (:func:`extract_inputs`): a changed image or checkpoint changes its bytes and reruns
extract@NAME; an unchanged tree gives the same bytes, and nothing follows.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from _params import (
    KEYS,
    PARAMS,
    TABLE_FROM_LEARN,
    ParamsError,
    Quoted,
    _number,
    extract_spec,
    number_text,
    resolve,
    run_name,
    stage_settings,
    table_check,
    table_command,
    where,
)


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key set twice in one mapping (DVC refuses them too; PyYAML keeps the last)
    and marking quoted strings (:class:`Quoted`)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor`: its keys may be overridden
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if isinstance(key, (list, dict)):  # unhashable: PyYAML's own error follows
                continue
            if key in seen:
                raise ParamsError(f"{PARAMS} sets the key `{key}` twice in one mapping (lines {seen[key]} and {line}); "
                                  "keep one (DVC refuses it too)")
            seen[key] = line
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_str(self, node: yaml.ScalarNode) -> str:
        value = super().construct_scalar(node)
        return Quoted(value) if node.style in ("'", '"') else value


_Loader.add_constructor("tag:yaml.org,2002:str", _Loader.construct_yaml_str)


def load_params() -> Any:
    """params.yaml as settings@NAME reads it: a missing file, a YAML syntax error, a key set twice and a value DVC
    reads otherwise (:func:`check_as_dvc_reads`) are refused in one line (the stage scripts run outside DVC too)."""
    try:
        text = PARAMS.read_text()
    except FileNotFoundError:
        raise ParamsError(f"no {PARAMS} in {Path.cwd()}; run the stage from the repository root, where dvc.yaml "
                          "is") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ParamsError(f"cannot read {PARAMS} ({exc}); make it a readable UTF-8 file") from None
    try:
        params = yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ParamsError(f"{PARAMS} is not valid YAML: {exc.problem or exc.context}{at}; fix its syntax") from None
    except yaml.YAMLError as exc:
        raise ParamsError(f"{PARAMS} is not valid YAML ({' '.join(str(exc).split())}); fix its syntax") from None
    check_as_dvc_reads(text, params)
    return params


def _alike(ours: Any, theirs: Any) -> bool:
    """Whether a scalar reads alike in YAML 1.1 (``ours``) and DVC's YAML 1.2 (``theirs``): an unquoted ``1e-3``,
    a string to PyYAML, is the number the stages take it for (:func:`_params._number`) and DVC reads."""
    if isinstance(ours, str) and not isinstance(ours, Quoted) and isinstance(theirs, float):
        ours = _number(ours)
    if isinstance(ours, str) and isinstance(theirs, str):  # a Quoted string is a string
        return str(ours) == theirs
    return type(ours) is type(theirs) and (ours == theirs or (ours != ours and theirs != theirs))  # NaN: itself


def _key(key: Any) -> tuple[str, str]:
    """A mapping key as both readings compare it: a string as itself (quoted or not), else by type and value."""
    return ("str", key) if isinstance(key, str) else (type(key).__name__, repr(key))


def _differs(ours: Any, theirs: Any, at: str) -> str | None:
    """Where YAML 1.1 and DVC's YAML 1.2 read params.yaml otherwise, as the end of an error message (None: nowhere)."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        mine, other = ({_key(k): k for k in keys} for keys in (ours, theirs))
        if set(mine) != set(other):  # `on:` is True to YAML 1.1, the string 'on' to YAML 1.2
            first, second = (next((k for i, k in a.items() if i not in b), None) for a, b in ((mine, other), (other, mine)))
            under = f"`{at}`" if at else "the top level"
            return (f"the key {second!r} under {under} is {first!r} to YAML 1.1 and {second!r} to DVC (YAML 1.2); quote "
                    f"it (`\"{second if isinstance(second, str) else first}\":`)")
        inner = [(ours[key], theirs[key], f"{at}.{key}" if at else str(key)) for key in ours]
    elif isinstance(ours, list) and isinstance(theirs, list) and len(ours) == len(theirs):
        inner = [(a, b, f"{at}[{i}]") for i, (a, b) in enumerate(zip(ours, theirs))]
    elif isinstance(ours, (dict, list)) or isinstance(theirs, (dict, list)) or not _alike(ours, theirs):
        return (f"{at} is {ours!r} to YAML 1.1 and {theirs!r} to DVC (YAML 1.2, as dvc.lock records it); write it so both "
                "read it alike (a number without a leading 0, true or false, a string in quotes)")
    else:
        return None
    return next((found for found in (_differs(*pair) for pair in inner) if found is not None), None)


def check_as_dvc_reads(text: str, params: Any) -> None:
    """Refuse a value that PyYAML (YAML 1.1, read here) and DVC (YAML 1.2: dvc.lock, `dvc params diff`, `dvc exp
    show`) read otherwise: ``seed: 010`` is 8 to one and 10 to the other, ``on`` true or a string; the stages would run
    one value and DVC record another."""
    from dvc.utils.serialize import YAMLError, parse_yaml

    try:
        theirs = parse_yaml(text, str(PARAMS))
    except YAMLError as exc:
        cause = " ".join(str(exc.__cause__ or exc).split())
        raise ParamsError(f"DVC cannot read {PARAMS} ({cause}); fix its syntax") from None
    found = None if params is None else _differs(params, theirs, "")  # an empty file: {} to DVC, refused by resolve
    if found is not None:
        raise ParamsError(f"in {PARAMS}, {found}")


def _yaml(value: Any) -> str:
    """A value as params.yaml writes it."""
    return json.dumps(value) if isinstance(value, bool) or value is None else str(value)


def check_stages(settings: dict[str, Any], name: str, entry: dict[str, Any]) -> None:
    """Refuse what a later stage's command would refuse (a value listed twice, a combination), by foal_pipe's own
    checks and in one line naming the keys: settings@NAME must fail before it writes anything, as DVC deletes a
    stage's outputs before running it. What needs the store (the classes of a task count, where the dataset has
    any number: :func:`check_dataset` checks a registered benchmark's) is left to the stage."""
    from foal_pipe.cli import options as o
    from foal_pipe.cli.flags import cli_form
    from foal_pipe.encoders import ENCODERS, build_encoder
    from foal_pipe.errors import NO_VALUE, FoalPipeError
    from foal_pipe.extract.spec import _check_keeps_blocks
    from foal_pipe.protocol.config import ExecutionConfig, ModelConfig, StreamConfig, SweepConfig
    from foal_pipe.protocol.entry import SWEEP_RULES, SweepSettings, check_rules
    from foal_pipe.protocol.headruns import check_ridge_model_file
    from foal_pipe.protocol.orderchecks import parse_order_seeds
    from foal_pipe.protocol.run import check_settings
    from foal_pipe.protocol.table import GAMMA_HEADS
    from foal_pipe.store.blockfusion import parse_fusions

    def key(section: str, k: str) -> str:
        return where(name, entry, section, k)

    def refuse(keys: tuple[str, ...], names: dict[str, str], check: Callable[[], object]) -> None:
        """``check``'s refusal with the parameters it names (``names``: foal_pipe's name -> the key) as keys."""
        try:
            check()
        except FoalPipeError as exc:
            def form(n: str, value: Any = NO_VALUE) -> str:
                if n not in names:
                    return cli_form(n, value)
                return names[n] if value is NO_VALUE else f"{names[n]}: {_yaml(value)}"

            message = exc.render(form)
            named = any(k in message for k in (*keys, *names.values()))
            raise ParamsError(f"in {PARAMS}, " + ("" if named else f"{', '.join(keys)}: ") + message) from None

    learn, sweep = settings["learn"], settings["sweep"]
    learn_names = {k: key("learn", k) for k in KEYS["learn"]} | {"seeds": key("learn", "order_seeds")}
    seeds = [int(s) for s in learn["order_seeds"]]
    if len(seeds) > 1:
        refuse((key("learn", "order_seeds"),), learn_names, lambda: parse_order_seeds(",".join(map(str, seeds))))

    def model() -> None:
        options = {**learn, "gamma": str(learn["gamma"])}
        config = o.settings(options, ModelConfig)
        o.settings(options, StreamConfig)  # checks its own fields
        check_settings(config, o.settings(options, ExecutionConfig))
        check_ridge_model_file(config)  # learn@NAME's head: ridge

    refuse((key("learn", "engine"), key("learn", "gamma")), learn_names, model)

    if sweep["gammas"] is not None:
        gammas = ",".join(number_text(g) for g in sweep["gammas"])
        refuse((key("sweep", "gammas"),), {}, lambda: o.floats(gammas, key("sweep", "gammas")))
    if sweep["fusions"]:
        fusions = [str(f) for f in sweep["fusions"]]
        refuse((key("sweep", "fusions"),), {}, lambda: parse_fusions(fusions, key("sweep", "fusions")))
        if not settings["extract"]["keep_blocks"]:
            raise ParamsError(f"in {PARAMS}, {key('sweep', 'fusions')} fuses the store's per-block tokens, which it keeps "
                              f"only with {key('extract', 'keep_blocks')}: true; set that, or {key('sweep', 'fusions')}: []")
        refuse((key("sweep", "fusions"), key("learn", "order_seeds")),
               {"fusions": key("sweep", "fusions"), "order_seeds": key("learn", "order_seeds")},
               lambda: check_rules(SWEEP_RULES, SweepSettings(SweepConfig(fusions=tuple(fusions)),
                                                              order_seeds=tuple(seeds) if len(seeds) > 1 else None)))

    def encoder() -> None:
        spec = extract_spec(settings, "data/features/NAME.zarr")
        config = spec.encoder_config()
        if spec.model in ENCODERS:  # its own checks (pixels: no fusion or token); a timm model is built by extract alone
            built = build_encoder(config)
            if spec.keep_blocks:
                _check_keeps_blocks(built)

    refuse((key("extract", "model"),), {k: key("extract", k) for k in KEYS["extract"]}, encoder)

    heads = [str(h) for h in settings["table"]["heads"]]
    gamma_heads = [h for h in heads if h in GAMMA_HEADS]
    if gamma_heads and "ridge" not in heads:  # the stage's gamma is auto, which no key changes
        raise ParamsError(f"in {PARAMS}, {key('table', 'heads')}: {', '.join(gamma_heads)} run{'s' * (len(gamma_heads) == 1)} "
                          f"at the gamma ridge chooses on the training rows (the table stage's gamma is auto); add ridge "
                          f"to {key('table', 'heads')}")

    def table() -> None:
        check = table_check(table_command(name, settings))
        check([])  # what it refuses whatever is typed first: why `table.heads` cannot run (balanced without ridge)
        check()

    names = {k: key("table", k) for k in KEYS["table"]} | {k: key("learn", k) for k in TABLE_FROM_LEARN}
    refuse(tuple(key("table", k) for k in KEYS["table"]), names, table)


#: The folders a run writes beside runs/NAME/, by suffix: a run named NAME-sweep would share runs/NAME-sweep/.
FOLDERS = ("sweep", "table", "settings")


def check_names(names: Any, name: str) -> None:
    """Refuse runs whose folders coincide (``digits`` and ``digits-sweep``: runs/digits-sweep/ would hold both
    sweep@digits's sweep.json and learn@digits-sweep's run, each writing the same timings.json there)."""
    for other in names:
        for a, b in ((name, other), (other, name)):
            suffix = next((s for s in FOLDERS if b == f"{a}-{s}"), None)
            if suffix is not None:
                raise ParamsError(f"the runs `{a}` and `{b}` under `datasets` in {PARAMS} share the folder runs/{b}/ "
                                  f"(the {suffix} folder of `{a}`); rename `{b}`")


def check_dataset(settings: dict[str, Any], name: str, entry: dict[str, Any]) -> None:
    """Refuse, before any stage runs, what extract, learn, sweep and table refuse of the dataset whatever its files: a
    test_split for a dataset with its own splits, no data_dir for one with no default place (your own files), a
    data_dir for one a library ships (digits), download for one torchvision does not fetch, `images`, whose
    unlabelled store has no train split to learn, and more tasks than a registered benchmark has classes (refused by
    learn or table only after DVC deleted their outputs)."""
    from foal_pipe.datasets import DATASETS

    dataset, p = settings["dataset"], settings["extract"]
    named = f"datasets.{name}.dataset: {dataset}" if "dataset" in entry else f"the run `{name}` (dataset {dataset})"
    if dataset == "images":
        raise ParamsError(f"in {PARAMS}, {named} extracts unlabelled images, a test split alone that learn, sweep and table "
                          "cannot learn from; use dataset imagefolder (a folder per class), or `foal-pipe extract --dataset "
                          "images` and `foal-pipe predict` outside the pipeline")
    if p["data_dir"] is None and DATASETS[dataset].locate is None:
        raise ParamsError(f"in {PARAMS}, {named} reads your own files, from {where(name, entry, 'extract', 'data_dir')}, "
                          "which is null; set it to their folder (hdf5: the .h5 file)")
    if p["data_dir"] is not None and DATASETS[dataset].bundled_with is not None:
        key = where(name, entry, "extract", "data_dir")
        raise ParamsError(f"in {PARAMS}, {named} ships with {DATASETS[dataset].bundled_with} and reads no folder, so {key} "
                          f"does not apply; set {key}: null" + ("" if key.startswith("datasets.") else
                                                                   " (an entry that reads a folder sets its own)"))
    if p["download"] and DATASETS[dataset].source != "torchvision":  # torchvision's loaders are the ones that download
        key = where(name, entry, "extract", "download")
        raise ParamsError(f"in {PARAMS}, {named} is read from files already on this machine (only torchvision's datasets are "
                          f"downloaded), so {key}: true would be ignored; set {key}: false")
    classes = DATASETS[dataset].classes
    for section, counts in (("learn", [settings["learn"]["tasks"]]), ("table", settings["table"]["tasks"])):
        over = [t for t in counts if classes is not None and t is not None and t > classes]
        if over:
            raise ParamsError(f"in {PARAMS}, {where(name, entry, section, 'tasks')} asks for {over[0]} tasks, more than "
                              f"{named} has classes ({classes}); ask for {classes} at most")
    if p["test_split"] is not None and not DATASETS[dataset].splittable:
        key = where(name, entry, "extract", "test_split")
        raise ParamsError(f"in {PARAMS}, {named} comes with its own train and test splits, so {key} does not apply; set "
                          f"{key}: null (it splits a folder of class folders: dataset imagefolder)")


def checked(params: dict[str, Any], name: str) -> dict[str, Any]:
    """Run ``name``'s settings (:func:`_params.resolve`), refused where a later stage would refuse them."""
    settings = resolve(params, name)
    entry = params["datasets"][name] or {}
    check_names(params["datasets"], name)
    check_dataset(settings, name, entry)
    check_stages(settings, name, entry)
    return settings


def _entries(top: Path) -> list[str]:
    """Each file under ``top`` (``top`` itself when a file) as "relative path, size, mtime_ns, ctime_ns" from a stat
    walk that reads no contents, sorted; folders (through links, as extract's search, each once) by their relative
    path. The change time too: a file replaced with its old size and modification time (``cp -p``, ``rsync -t``, an
    archive unpacked) still shows, since no user can set it."""
    def line(rel: str, path: str) -> str | None:
        for look in (os.stat, os.lstat):  # the file a link points to; a broken link itself
            try:
                st = look(path)
            except OSError:
                continue
            return f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}"
        return None  # gone while walking

    if not top.is_dir():
        return [entry for entry in [line(".", str(top))] if entry is not None]
    found, seen = [], set()
    for folder, dirs, files in os.walk(top, followlinks=True):
        st = os.stat(folder)
        if (st.st_dev, st.st_ino) in seen:  # reached again through a link: a loop (extract refuses it), or walked once
            dirs.clear()
            continue
        seen.add((st.st_dev, st.st_ino))
        dirs.sort()  # a folder reached directly and through a link is recorded under the same path on every copy
        rel = Path(folder).relative_to(top).as_posix()
        found.append(f"{rel}/")
        found += [entry for f in files if (entry := line(f"{rel}/{f}", os.path.join(folder, f))) is not None]
    return sorted(found)


def _fingerprint(path: Path) -> dict[str, Any]:
    entries = _entries(path)
    digest = hashlib.sha256("\n".join(entries).encode("utf-8", "surrogateescape")).hexdigest()
    return {"path": str(path), "files": sum(not e.endswith("/") for e in entries), "sha256": digest}


def extract_inputs(settings: dict[str, Any]) -> dict[str, Any]:
    """A fingerprint of what extract@NAME reads from disk: the dataset's folder or file (``data_dir``, else the
    registry's default place) and the checkpoint file, each where it exists (a missing one, extract refuses; digits,
    bundled with scikit-learn, has none). Sizes, modification and change times, not contents: cheap on every `dvc
    repro`, and a file rewritten with the same bytes reruns extract, which then finds the store current and leaves it."""
    from foal_pipe.datasets import DATASETS

    p = settings["extract"]
    given = Path(p["data_dir"]).expanduser() if p["data_dir"] is not None else None
    locate = DATASETS[settings["dataset"]].locate
    where = locate(given) if locate is not None else given
    found = {"data_dir": Path(where) if where is not None else None,
             "checkpoint": Path(p["checkpoint"]).expanduser() if p["checkpoint"] is not None else None}
    return {key: _fingerprint(path) for key, path in found.items() if path is not None and path.exists()}


def canonical(settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` with each gamma a float: ``gamma: 1``, ``1.0`` and ``1e0`` (a string to PyYAML) are one setting,
    so they must give the same bytes (else `dvc exp run -S learn.gamma=1` reruns learn for a gamma it already ran)."""
    learn, sweep = settings["learn"], settings["sweep"]
    gamma = learn["gamma"] if learn["gamma"] == "auto" else float(_number(learn["gamma"]))
    gammas = None if sweep["gammas"] is None else [float(_number(g)) for g in sweep["gammas"]]
    return {**settings, "learn": {**learn, "gamma": gamma}, "sweep": {**sweep, "gammas": gammas}}


def write(name: str, settings: dict[str, Any]) -> None:
    """The four settings files together or not at all: each written beside its place (``.NAME.tmp``), then, once all
    are, each renamed onto it; a place that cannot take one (a folder there, no permission) is refused in one line,
    the files there left as they were."""
    out = Path("runs") / f"{name}-settings"
    files = stage_settings(canonical(settings))
    inputs = extract_inputs(settings)
    if inputs:  # none (digits): the file holds the settings alone
        files["extract"] = {**files["extract"], "inputs": inputs}
    texts = {out / f"{stage}.settings.json": json.dumps(values, indent=1, sort_keys=True) + "\n"
             for stage, values in files.items()}
    temps: dict[Path, Path] = {}
    try:
        out.mkdir(parents=True, exist_ok=True)
        for path, text in texts.items():
            if path.is_dir():  # the rename would fail after others were made
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
            temps[path] = path.with_name(f".{path.name}.tmp")
            temps[path].write_text(text)
        for path, temp in temps.items():
            os.replace(temp, path)
    except OSError as exc:
        for temp in temps.values():
            temp.unlink(missing_ok=True)
        raise ParamsError(f"cannot write {exc.filename or out} ({exc.strerror or exc}); remove what is there or make it "
                          f"writable, then run settings@{name} again") from None


def main() -> None:
    name = run_name("settings")
    try:
        write(name, checked(load_params(), name))
    except ParamsError as exc:
        sys.exit(f"Error: {exc}")


if __name__ == "__main__":
    main()
