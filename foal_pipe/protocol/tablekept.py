"""``foal-pipe table``'s kept runs: each finished run as one JSON file beside the output (``.OUT.table-runs/``),
under a fingerprint of its store, code and settings, so a killed table resumes them; a kept file that is not a whole
run record (:func:`is_run_record`), or no longer the record kept under its fingerprint (:func:`kept_checksum`), is
run again, not trusted."""

from __future__ import annotations

import contextlib
import functools
import glob
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import MISSING, fields, replace
from pathlib import Path
from typing import Any

from foal_pipe.core.metrics import SUMMARIES, summary_of
from foal_pipe.durable import changed_at, pid_alive
from foal_pipe.heads import HEADS
from foal_pipe.io import write_json
from foal_pipe.io.pathtext import path_text
from foal_pipe.protocol.capabilities import Settings
from foal_pipe.protocol.config import config_record
from foal_pipe.protocol.typedjson import COUNT, INTEGER, MAPPING, NUMBERS, TEXT, is_number

#: The key of a kept file that holds :func:`kept_checksum` beside the run record's fields.
CHECKSUM_KEY = "kept_checksum"
#: The key of a kept file that holds the lines its run said (its warnings), said again when the run is resumed.
SAID_KEY = "said"


def fingerprint(store: Any, head: str, tasks: int, seed: int, settings: Settings, content: str | None = None
                ) -> str | None:
    """What a kept run was computed from: the store (its path, generation -- for a store without one, its content,
    :func:`store_content` -- and row counts), the code (:func:`code_digest`), the head, the task count, the order
    and every setting; a resumed table reuses a run only under the same fingerprint. ``content``: the store's
    :func:`store_content`, read once per store. None: a store without a generation id whose content cannot be told,
    so no run of it is kept or resumed."""
    meta = store.meta
    if meta.generation is None and content is None:
        return None
    doc = {
        "store": path_text(Path(store.path).resolve()), "generation": meta.generation, "dataset": meta.dataset,
        "encoder": meta.encoder, "rows": [int(store.train.labels.size), int(store.test.labels.size)],
        "head": head, "tasks": tasks, "order_seed": seed, "code": code_digest(),
        "settings": {k: config_record(v) for k, v in asdict_shallow(settings).items()},
        **({"content": content} if meta.generation is None else {}),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:20]


def store_content(path: Path) -> str | None:
    """A store without a generation id (format 1) by its content: a SHA-256 over every file in it, its path in the
    store and its bytes, read whole (such a store records no checksums of its chunks, and one rewritten with each
    chunk's size and last bytes kept holds other rows); None where that cannot be read."""
    digest = hashlib.sha256()
    try:
        for file in sorted(f for f in path.rglob("*") if f.is_file()):
            digest.update(f"\n{file.relative_to(path).as_posix()}\n".encode())
            with file.open("rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
        return digest.hexdigest()[:32]
    except OSError:
        return None


@functools.cache
def code_digest() -> str:
    """A hash of foal-pipe's own source files: a kept run of other code (a fix since) is not resumed."""
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for file in sorted(root.rglob("*.py")):
        digest.update(file.relative_to(root).as_posix().encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()[:20]


def kept_checksum(key: str, record: dict[str, Any]) -> str:
    """A SHA-256 of ``record`` (its canonical JSON) under its fingerprint ``key``: a kept file edited by hand (another
    dataset, options, counts) no longer matches it, so its run is done again; a file moved under another key neither."""
    text = json.dumps(record, sort_keys=True, allow_nan=False, separators=(",", ":"))
    return hashlib.sha256(f"{key}\0{text}".encode()).hexdigest()


def asdict_shallow(settings: Settings) -> dict[str, Any]:
    """The four settings records by name, as ``table.json``'s ``settings`` holds them."""
    return {"stream": settings.stream, "model": settings.model, "evaluation": settings.evaluation,
            "execution": settings.execution}


def recorded_settings(settings: Settings, heads: Sequence[str]) -> Settings:
    """``settings`` with an option given at its default recorded as left out, so ``table.json``'s ``settings`` and
    the kept runs' :func:`fingerprint` are the same whether a default is typed or not (the runs are alike either way):
    an activation equal to the one None stands for (sigmoid, or identity without a projection) becomes None, and a
    head option equal to the default of every head of ``heads`` that takes it is dropped (each head's default)."""
    model = settings.model
    activation = None if model.activation == replace(model, activation=None).resolved_activation else model.activation
    options = {}
    for option, value in model.head_options.items():
        takers = [head for head in heads if option in HEADS[head].options]
        if not takers or not all(_is_default(value, _option_default(head, option)) for head in takers):
            options[option] = value
    return replace(settings, model=replace(model, activation=activation, head_options=options))


def _option_default(head: str, option: str) -> Any:
    """Head ``head``'s default of ``option`` (its ``Options`` dataclass's)."""
    return next(f.default for f in fields(HEADS[head].head.Options) if f.name == option)


def _is_default(value: Any, default: Any) -> bool:
    """``value`` equals ``default`` (a bool only a bool: ``True == 1`` is no default)."""
    return default is not MISSING and isinstance(value, bool) == isinstance(default, bool) and value == default


def run_record(store_path: Path, store: Any, head: str, tasks: int, seed: int, metrics: Any,
               options: dict[str, Any]) -> dict[str, Any]:
    """One run of ``table.json``: where it came from, its options and its accuracy fields (fractions)."""
    return {
        "store": path_text(store_path), "dataset": store.meta.dataset, "encoder": (store.meta.encoder or {}).get("name"),
        "head": head, "tasks": tasks, "n_tasks": metrics.n_tasks, "stream": metrics.stream or "disjoint",
        "n_classes": len({c for task in metrics.tasks or () for c in task}), "order_seed": seed, "options": options,
        "accuracy_matrix": metrics.accuracy_matrix, "A_avg": metrics.A_avg, "A_last": metrics.A_last, "F": metrics.F,
        "A_auc": metrics.A_auc, "n_train_seen": metrics.n_train_seen, "n_test": metrics.n_test,
        "feature_dim": metrics.feature_dim,
    }


#: What each field of :func:`run_record` holds; a kept record of other fields or kinds is not reused.
RUN_FIELDS: dict[str, Any] = {
    "store": TEXT.accepts, "dataset": TEXT.accepts, "encoder": lambda v: v is None or TEXT.accepts(v),
    "head": TEXT.accepts, "tasks": INTEGER.accepts, "n_tasks": COUNT.accepts, "stream": TEXT.accepts,
    "n_classes": COUNT.accepts, "order_seed": INTEGER.accepts, "options": MAPPING.accepts,
    "accuracy_matrix": lambda v: isinstance(v, list) and bool(v) and all(
        isinstance(row, list) and len(row) == i + 1 and all(is_number(x) and 0 <= x <= 1 for x in row)
        for i, row in enumerate(v)),
    "A_avg": is_number, "A_last": is_number, "F": is_number, "A_auc": lambda v: v is None or is_number(v),
    "n_train_seen": COUNT.accepts, "n_test": COUNT.accepts, "feature_dim": COUNT.accepts,
}


def is_run_record(record: Any, head: str, tasks: int, seed: int, auto: bool) -> bool:
    """Whether ``record`` is a whole :func:`run_record` of ``head`` at ``tasks`` and order ``seed`` (ridge's with
    ``auto``, ``--gamma auto``: the gamma of each boundary, which the other heads take): a kept file edited, cut or
    of another shape, or whose A_avg, A_last or F its accuracy matrix contradicts, is run again rather than read into
    the table."""
    if not isinstance(record, dict) or record.keys() != RUN_FIELDS.keys():
        return False
    if not all(accepts(record[field]) for field, accepts in RUN_FIELDS.items()):
        return False
    if (record["head"], record["tasks"], record["order_seed"]) != (head, tasks, seed):
        return False
    if not len(record["accuracy_matrix"]) == record["n_tasks"] == tasks or record["stream"] not in SUMMARIES:
        return False
    numbers = summary_of(record["accuracy_matrix"], record["stream"])  # as the run's metrics computed them
    if not all(abs(record[k] - numbers[k]) <= 1e-9 for k in ("A_avg", "A_last", "F")):
        return False
    gammas = record["options"].get("gammas_selected")
    return head != "ridge" or not auto or (NUMBERS.accepts(gammas) and len(gammas) == record["n_tasks"] > 0)


class KeptRuns:
    """The finished runs of a table under way, one JSON file each beside the output, found again by fingerprint."""

    def __init__(self, out: Path) -> None:
        self.path = out.parent / f".{out.name}.table-runs"
        #: a run walked apart writes its files under a directory of this prefix (the process id in it), removed
        #: after; those of a table killed outright (SIGKILL) are removed by the next table on ``out``
        self.scratch_prefix = f"{self.path.name}-{os.getpid()}-"
        #: the kept files found that were not whole run records (:meth:`get`): their runs are done again
        self.damaged = 0
        for left in out.parent.glob(f"{glob.escape(self.path.name)}-*-*"):  # tempfile adds 8 of [a-z0-9_]
            named = re.fullmatch(re.escape(self.path.name) + r"-(\d+)-[a-z0-9_]{8}", left.name)
            if named and not pid_alive(int(named.group(1)), changed_at(left)):
                shutil.rmtree(left, ignore_errors=True)

    def get(self, key: str, head: str, tasks: int, seed: int, auto: bool) -> tuple[dict[str, Any], list[str]] | None:
        """The kept run under ``key`` and the lines it said (None: none); a file that cannot be read, is not a whole
        record of this run (:func:`is_run_record`) or does not match its :func:`kept_checksum` is counted in
        :attr:`damaged` and its run done again."""
        file = self.path / f"{key}.json"
        try:
            record = json.loads(file.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            record = None
        checksum = record.pop(CHECKSUM_KEY, None) if isinstance(record, dict) else None
        if isinstance(record, dict) and checksum == _checksum_of(key, record):
            said = record.pop(SAID_KEY, [])
            if is_run_record(record, head, tasks, seed, auto) and isinstance(said, list) and all(
                    isinstance(line, str) for line in said):
                return record, said
        self.damaged += 1
        return None

    def scratch(self) -> tempfile.TemporaryDirectory[str]:
        """A directory for a run walked apart, beside the kept runs: ``--out``'s parent is made first, as :meth:`put`'s
        first file makes it (a missing parent refused only the runs walked apart)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return tempfile.TemporaryDirectory(dir=self.path.parent, prefix=self.scratch_prefix)

    def put(self, key: str | None, record: dict[str, Any], said: Sequence[str] = ()) -> None:
        """Keep ``record`` and the lines its run ``said`` (its warnings, said again when it is resumed)."""
        if key is not None:  # None: the store's content cannot be told, so the run is not kept
            kept = {**record, SAID_KEY: list(said)} if said else record
            try:
                write_json(self.path / f"{key}.json", {**kept, CHECKSUM_KEY: kept_checksum(key, kept)})
            except BaseException:  # the folder the write made is not left behind holding no run (rmdir: if empty)
                with contextlib.suppress(OSError):
                    self.path.rmdir()
                raise

    def clear(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def _checksum_of(key: str, record: dict[str, Any]) -> str | None:
    """:func:`kept_checksum`, None where ``record`` holds a number JSON cannot (NaN, infinity: edited)."""
    try:
        return kept_checksum(key, record)
    except ValueError:
        return None
