"""The store format's constants and group attributes: :class:`StoreMeta`, read and written in one place."""

from __future__ import annotations

import json
import os
import unicodedata
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import zarr

from foal_pipe.errors import FoalPipeError, clipped, limit_failure, limit_fix, param
from foal_pipe.io import UNLABELLED as UNLABELLED
from foal_pipe.io.outpaths import STORE_FORMAT
from foal_pipe.store.blockfusion import NORMS, FinalNorm
from foal_pipe.store.chunks import REEXTRACT, StrictLocalStore, sharding_problem

if TYPE_CHECKING:
    from zarr.core.array_spec import ArrayConfigParams

FORMAT = STORE_FORMAT
FORMAT_VERSION = 5
READABLE_VERSIONS = (1, 2, 3, 4, 5)
#: The first format version with a split manifest (array and attribute ``manifest``).
MANIFEST_FROM = 5
SPLITS = ("train", "test")
FEATURE_DTYPES = ("float16", "float32", "float64")
BLOCK_DTYPES = ("float16", "float32")
ROW_ARRAYS = ("features", "blocks")
"""The arrays of a split that ``extract`` fills chunk by chunk (``progress`` counts their rows)."""
LOG_SUFFIX = ".log.json"
LABEL_CHUNK_ROWS = 1 << 20
#: Whole-array reads (labels) and single chunks may use at most this share of the available memory.
MEMORY_SHARE = 0.5
_KNOWN_KEYS = ("format", "format_version", "classes", "dataset", "encoder", "complete", "generation")
#: What zarr raises for metadata it cannot parse (invalid JSON, a field of the wrong type or shape, JSON nested too
#: deep); anything else (a thread that cannot start, no memory) is not the store's fault and is not called corrupt.
METADATA_ERRORS = (ValueError, TypeError, KeyError, AttributeError, IndexError, RecursionError)
#: A chunk equal to the fill value is written too: none is ever absent.
WRITE_CONFIG: ArrayConfigParams = {"write_empty_chunks": True}


def writable_name(name: str) -> bool:
    """Whether UTF-8 holds ``name``: a path's undecodable bytes (surrogates U+DC80-U+DCFF) are written back as bytes,
    any other surrogate (JSON's ``"\\ud800"``) cannot be written."""
    try:
        name.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return False
    return True


def _json_type(value: Any) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
             dict: "a mapping", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def classes_problem(classes: Any) -> str | None:
    """Why ``classes`` is no store's class names (None when it is): not a non-empty list of strings, a name no text
    file can hold, or a name twice. One check for the reader and ``write_store``, so no writer makes what no reader
    opens."""
    if not isinstance(classes, list) or not classes or not all(isinstance(c, str) for c in classes):
        if not isinstance(classes, list):
            found = f"is {_json_type(classes)} ({shown(classes)})"
        elif not classes:
            found = "is empty"
        else:
            bad = next(c for c in classes if not isinstance(c, str))
            found = f"holds {_json_type(bad)} ({shown(bad)})"
        return f"must be a non-empty list of class names (strings), but it {found}"
    if unwritable := next((c for c in classes if not writable_name(c)), None):
        return (f"holds {unwritable!r}, a name with a lone surrogate that no text file can hold (the reports and "
                "predictions write every name)")
    if len(set(classes)) != len(classes):
        twice = next(c for i, c in enumerate(classes) if c in classes[:i])
        return f"names {twice!r} twice: two label ids for one name, which a model could not tell apart"
    return None


def _versions() -> str:
    """``1, 2, 3, 4 or 5``."""
    *head, last = map(str, READABLE_VERSIONS)
    return f"{', '.join(head)} or {last}" if head else last


def shown(value: Any) -> str:
    return clipped(json.dumps(value, default=str), 40)


@dataclass(frozen=True)
class StoreMeta:
    """Group attributes of a feature store; ``extra`` keeps writer-specific keys verbatim."""

    classes: tuple[str, ...]
    dataset: str
    encoder: dict[str, Any]
    complete: bool = False
    format_version: int = FORMAT_VERSION
    generation: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out = {
            "format": FORMAT,
            "format_version": self.format_version,
            "classes": list(self.classes),
            "dataset": self.dataset,
            "encoder": dict(self.encoder),
            "complete": self.complete,
            **self.extra,
        }
        if self.generation is not None:
            out["generation"] = self.generation
        return out

    @classmethod
    def from_dict(cls, attrs: dict[str, Any], where: str = "store") -> StoreMeta:
        if not isinstance(attrs, dict) or attrs.get("format") != FORMAT:
            found = attrs.get("format") if isinstance(attrs, dict) else attrs
            raise FoalPipeError(
                f"{where} is not a foal-pipe feature store (attribute 'format' is {shown(found)}, expected "
                f"{FORMAT!r}); create one with `foal-pipe extract`"
            )
        version = attrs.get("format_version")
        if type(version) is not int:  # bool is an int subclass, and 1.0 == 1: both are refused here
            raise FoalPipeError(
                f"{where} has format_version {shown(version)} ({_json_type(version)}), expected an integer "
                f"({_versions()}); fix the attribute or re-extract the store"
            )
        if version not in READABLE_VERSIONS:
            raise FoalPipeError(
                f"{where} has format_version {version} but this foal-pipe reads versions "
                f"{_versions()}; re-extract it with this version or upgrade foal-pipe"
            )
        for key in ("classes", "dataset", "encoder"):
            if key not in attrs:
                raise FoalPipeError(f"{where} lacks the attribute {key!r}; re-extract it with `foal-pipe extract`")
        classes = attrs["classes"]
        if (problem := classes_problem(classes)) is not None:
            raise FoalPipeError(f"{where}: attribute 'classes' {problem}; fix it or re-extract the store")
        expected = {"dataset": (str,), "encoder": (dict,), "complete": (bool,), "generation": (str,)}
        for key, types in expected.items():
            if key in attrs and not isinstance(attrs[key], types):
                want = {str: "a string", dict: "a mapping", bool: "a boolean"}[types[0]]
                raise FoalPipeError(
                    f"{where}: attribute {key!r} must be {want}, but it is {_json_type(attrs[key])} "
                    f"({shown(attrs[key])}); fix it or re-extract the store"
                )
        problem = encoder_problem(attrs["encoder"])
        if problem is not None:
            raise FoalPipeError(f"{where}: attribute 'encoder' {problem}; fix it or re-extract the store")
        return cls(
            classes=tuple(classes),
            dataset=attrs["dataset"],
            encoder=dict(attrs["encoder"]),
            complete=attrs.get("complete") is True,
            format_version=version,
            generation=attrs.get("generation"),
            extra={k: v for k, v in attrs.items() if k not in _KNOWN_KEYS},
        )


#: What every writer records of its encoder (extract has, for every model and every format version), with its type.
ENCODER_FIELDS: dict[str, tuple[type, str]] = {"name": (str, "a string"), "fusion": (str, "a string"),
                                               "image_size": (int, "an integer"), "normalize": (bool, "a boolean")}


def encoder_problem(encoder: dict[str, Any]) -> str | None:
    """Why the ``encoder`` attribute lacks a field a reader shows and a model compares, or holds one of another type
    (None when it does not); ``bool`` is no ``image_size``, as JSON ``true`` is no number."""
    for key, (kind, want) in ENCODER_FIELDS.items():
        if key not in encoder:
            return (f"lacks {key!r} (it must hold at least {', '.join(ENCODER_FIELDS)}; it holds "
                    f"{shown(sorted(encoder))})")
        if type(encoder[key]) is not kind:
            return f"field {key!r} must be {want}, but it is {_json_type(encoder[key])} ({shown(encoder[key])})"
    return None


def _canonical(value: Any) -> Any:
    """``value`` with every mapping's keys sorted: the same attributes always give the same bytes."""
    return json.loads(json.dumps(value, sort_keys=True))


def write_attrs(group: zarr.Group, attrs: dict[str, Any]) -> None:
    group.attrs.put(_canonical(attrs))  # one atomic write of zarr.json


@dataclass(frozen=True)
class BlockLayout:
    """The per-block tokens a store keeps (``extract --keep-blocks``, format 3): ``SPLIT/blocks`` of shape
    ``(N, count, d)`` and ``dtype``, chunked along rows only, and the encoder's final ``norm`` (its kind and
    eps in the attribute ``blocks``, its parameters in the arrays ``norm/<name>``)."""

    count: int
    dtype: str
    norm: FinalNorm

    def to_dict(self) -> dict[str, Any]:
        """The store's ``blocks`` attribute."""
        return {"count": self.count, "dtype": self.dtype, "norm": {"kind": self.norm.kind, "eps": self.norm.eps}}


def layout_attribute(path: Path, attr: Any) -> tuple[int, str, str, float]:
    """The ``blocks`` attribute, checked: block count, blocks dtype, the final norm's kind and eps."""
    norm = attr.get("norm") if isinstance(attr, dict) else None
    count, dtype = (attr.get("count"), attr.get("dtype")) if isinstance(attr, dict) else (None, None)
    if (type(count) is not int or count < 1 or dtype not in BLOCK_DTYPES or not isinstance(norm, dict)
            or not isinstance(norm.get("kind"), str) or type(norm.get("eps")) not in (int, float)
            or not norm["eps"] >= 0):
        raise FoalPipeError(f"{path}: attribute 'blocks' is {shown(attr)}, expected count (an integer >= 1), dtype "
                            f"({' or '.join(BLOCK_DTYPES)}) and norm (kind and eps >= 0); {REEXTRACT}")
    if norm["kind"] not in NORMS:
        raise FoalPipeError(f"{path}: final norm kind {norm['kind']!r} is not one foal-pipe recomputes "
                            f"({', '.join(NORMS)}); upgrade foal-pipe or re-extract the store")
    return count, dtype, norm["kind"], float(norm["eps"])


def store_group(path: str | Path, mode: str = "r") -> zarr.Group:
    """The Zarr group at ``path``, each array's metadata read from its own ``zarr.json``: a consolidated copy in the
    root's, which zarr would prefer, is covered by neither the generation id nor the checksums, and one that
    disagreed changed the rows read, unrefused. Every opening of a store goes through here (or :func:`_open_group`)."""
    return zarr.open_group(str(path), mode=mode, use_consolidated=False)  # type: ignore[arg-type]


def _open_group(path: Path) -> zarr.Group:
    """The store's group for reading, strict about its files, as :func:`store_group` reads metadata."""
    meta_file = path / "zarr.json"
    if not meta_file.is_file() and (path / ".zgroup").is_file():
        raise FoalPipeError(f"{path} is a Zarr format-2 group (.zgroup), but a feature store is a Zarr v3 group "
                            "(docs/feature-store.md); re-extract it (`foal-pipe extract ... --overwrite`), or write it "
                            "with zarr's default zarr_format=3 (as foal_pipe.store.write_store does)")
    if not meta_file.is_file():
        raise FoalPipeError(
            f"{path} is not a Zarr feature store; point {param('features')} at a directory made by `foal-pipe extract`"
        )
    try:
        return zarr.open_group(store=StrictLocalStore(str(path), read_only=True), mode="r", use_consolidated=False)
    except OSError as exc:
        if limit_failure(exc):
            raise
        if exc.errno is not None:
            raise FoalPipeError(f"cannot read feature store {path}: {exc.strerror}; check the path") from None
        detail = str(exc).splitlines()[0][:100] if str(exc) else type(exc).__name__
    except METADATA_ERRORS as exc:  # zarr raises several types for unparsable metadata
        detail = str(exc).splitlines()[0][:100] if str(exc) else type(exc).__name__
    raise FoalPipeError(f"the group metadata of {path} is corrupt ({detail}); re-extract the store or restore it "
                        "from a copy")


def read_meta(path: str | Path) -> tuple[zarr.Group, StoreMeta]:
    """Open the group at ``path`` and parse its attributes, without requiring ``complete``."""
    path = Path(path)
    try:
        path.stat()
    except FileNotFoundError:
        dangling = " (a symlink to nothing)" if path.is_symlink() else _other_form(path)
        raise FoalPipeError(f"feature store {path} does not exist{dangling}; create it with `foal-pipe extract` or "
                            "check the path") from None
    except OSError as exc:
        raise FoalPipeError(f"cannot open feature store {path}: {exc.strerror or exc}; point {param('features')} at "
                            "the store directory itself") from None
    if not path.is_dir():
        raise FoalPipeError(f"{path} is a file, not a feature store (a .zarr directory); point "
                            f"{param('features')} at a directory made by `foal-pipe extract`")
    group = _open_group(path)
    return group, StoreMeta.from_dict(dict(group.attrs), where=str(path))


def _other_form(path: Path) -> str:
    """Where the folder holds ``path``'s name in the other Unicode normalisation (NFC / NFD print alike: a name made
    on one system and typed on another), a note naming that form; else empty."""
    forms = {unicodedata.normalize(form, path.name) for form in ("NFC", "NFD")} - {path.name}
    try:
        near = [entry for entry in os.listdir(path.parent) if entry in forms] if forms else []
    except OSError:
        return ""
    if not near:
        return ""
    form = "NFD" if unicodedata.is_normalized("NFD", near[0]) else "NFC"
    return f" (the folder holds a name that prints alike in the other Unicode form, {form}: use the folder's spelling)"


def open_array(group: zarr.Group, path: Path, name: str) -> zarr.Array:
    """Array ``name`` of the group; a missing array or unreadable metadata is one clear error."""
    try:
        node = group[name]
    except KeyError:
        if (path / name / "zarr.json").is_file():  # zarr reports metadata it cannot parse as a missing node
            raise FoalPipeError(f"{path / name}/zarr.json is corrupt (not valid array metadata); {REEXTRACT}") from None
        raise FoalPipeError(f"feature store {path} has no {name} array; {REEXTRACT}") from None
    except OSError as exc:
        if limit_failure(exc):
            raise
        raise FoalPipeError(f"cannot read {path / name}: {exc.strerror or exc}; {REEXTRACT}") from None
    except METADATA_ERRORS as exc:
        detail = str(exc).splitlines()[0][:100] if str(exc) else type(exc).__name__
        raise FoalPipeError(f"{path / name}/zarr.json is corrupt ({detail}); {REEXTRACT}") from None
    if not isinstance(node, zarr.Array):
        raise FoalPipeError(f"{path / name} is a group, not an array; {REEXTRACT}")
    sharded = sharding_problem(node)
    if sharded is not None:
        raise FoalPipeError(f"{path / name}: {sharded}")
    return node


def check_rows_layout(path: Path, name: str, array: zarr.Array, want: tuple[int, ...], dtype: str) -> None:
    """Refuse array ``name`` unless it is ``dtype`` of shape ``want``, chunked along rows only: a chunk holds whole
    rows, as the chunk listing, the row spans of every error and the per-chunk reads assume."""
    if array.shape != want or array.dtype.name != dtype or tuple(array.chunks[1:]) != want[1:]:
        rest = ", ".join(map(str, want[1:]))
        raise FoalPipeError(f"{name} in {path} is {array.dtype} {array.shape} in chunks of {array.chunks}, expected "
                            f"{dtype} {want} chunked along rows only (rows, {rest}); {REEXTRACT}")


@contextmanager
def writing(path: Path, what: str) -> Iterator[None]:
    """Turn an OS error while writing (no space, read-only, no permission, a limit of the process) into one line."""
    try:
        yield
    except OSError as exc:
        fix = limit_fix(exc, "free some space or make it writable")
        raise FoalPipeError(f"cannot write {what} of {path}: {exc.strerror or exc}; {fix}, then re-run the same command "
                            "(a store resumes after its last chunk)") from None


def edited_version(meta: StoreMeta, arrays: dict[str, zarr.Array], records: int) -> tuple[int, str] | None:
    """``(version, what)`` when a complete store declares a ``format_version`` older than its content proves (its
    split manifest: format 5; chunk records, ``records`` = :func:`~foal_pipe.store.integrity.proven_version`: 4), so
    the advice names the version that content needs; None when the declared version fits it."""
    if not meta.complete:
        return None
    if meta.format_version < MANIFEST_FROM and "manifest" in arrays and isinstance(meta.extra.get("manifest"), dict):
        return MANIFEST_FROM, "split manifest"
    return (records, "chunk records") if meta.format_version < records else None


def resume_advice(format_version: int) -> str:
    """How to finish an incomplete store: resume it, or -- written in an older format, which extract does not resume
    -- extract it again."""
    if format_version == FORMAT_VERSION:
        return "re-run the same `foal-pipe extract` command to resume it"
    return (f"it was written in store format {format_version}, which this foal-pipe does not resume: re-run the same "
            "`foal-pipe extract` command with --overwrite")
