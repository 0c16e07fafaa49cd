"""The store an extraction fills (:class:`StoreState`): created aside and renamed into place, resumed when its
settings match, refused otherwise, and finished last.
"""

from __future__ import annotations

import os
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from foal_pipe.durable import raise_swallowed_stop
from foal_pipe.errors import FoalPipeError, param
from foal_pipe.extract.spec import ExtractSpec, Inputs, block_encoder, load_inputs, open_inputs, store_settings, stored_encoder
from foal_pipe.io.outpaths import is_feature_store
from foal_pipe.store import (
    FORMAT,
    FORMAT_VERSION,
    ROW_ARRAYS,
    SPLITS,
    BlockLayout,
    StoreMeta,
    complete_store,
    create_skeleton,
    reopen_at,
    replace_store,
    verify_store,
)
from foal_pipe.store.blockfusion import FinalNorm
from foal_pipe.store.chunks import read_rows
from foal_pipe.store.log import log_path
from foal_pipe.store.manifest import parse_stored_manifest, stored_manifest
from foal_pipe.store.meta import store_group
from foal_pipe.store.read import chunk_too_large
from foal_pipe.store.verify import changed_chunks, resumable
from foal_pipe.store.write import ReplacedStoreLeft, foreign_file, replace_manifest

#: The group attribute of each split's SHA-256 over its images, in a store of a dataset without a split manifest.
DATA_SHA256 = "data_sha256"


def _shown(value: Any) -> str:
    return f"{len(value)} entries" if isinstance(value, list) and len(value) > 4 else repr(value)


def _differences(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: {_shown(a)} -> {_shown(b)}")
    return out


@dataclass
class StoreState:
    """Where a store stands: ``status`` is ``created``, ``resumed`` or ``complete``.

    ``path`` is where rows are written: ``out`` itself, or -- when ``--overwrite`` replaces an existing store --
    a staging sibling ``.<name>.replacing`` that is swapped in when complete, so readers of the old store are
    never served a half-written one. ``holes``: the first row of each split where a missing chunk file was
    found below the recorded progress, or -- in a complete store -- one that is not the file it was completed with
    (those rows are extracted again).
    """

    path: Path
    status: str
    progress: dict[str, int]
    rows: dict[str, int]
    out: Path
    holes: dict[str, int] = field(default_factory=dict)


def is_zarr_dir(path: Path) -> bool:
    return (path / "zarr.json").is_file() or (path / ".zgroup").is_file()


def staging_path(out: Path) -> Path:
    """Where ``--overwrite`` builds the replacement of the store at ``out``."""
    return out.parent / f".{out.name}.replacing"


def settle_staging(state: StoreState) -> Path | None:
    """Settle the staging folder a killed ``--overwrite`` of ``state.out`` left; its owner is gone: every writer of it
    holds the store's writer lock, which the caller holds. One this run resumes is kept, and swapped in when it was
    killed complete, before its swap. One this run does not build in is removed with its run log (returns its path;
    None otherwise), unless it holds anything a store's writer does not make (not ours to delete)."""
    staged = staging_path(state.out)
    if state.path == staged and state.status == "complete":
        swap_in(state)
        return None
    if state.path == staged or staged.is_symlink() or not is_feature_store(staged) or foreign_file(staged) is not None:
        return None
    shutil.rmtree(staged)
    log_path(staged).unlink(missing_ok=True)
    return staged


def _build_skeleton(where: Path, spec: ExtractSpec, inputs: Inputs, settings: dict[str, Any]) -> None:
    extra = {"extract": settings, "source": inputs.data.location}
    if inputs.data_sha256 is not None:
        extra[DATA_SHA256] = inputs.data_sha256
    meta = StoreMeta(classes=tuple(inputs.data.classes), dataset=spec.dataset, encoder=stored_encoder(inputs), extra=extra)
    labels = {split: inputs.data.split(split).labels for split in SPLITS}
    index = {split: inputs.data.split(split).index for split in SPLITS}
    manifest = inputs.manifest.to_bytes() if inputs.manifest is not None else None
    create_skeleton(where, meta, inputs.encoder.dim, spec.dtype, spec.chunk_rows, labels, index,
                    block_layout(spec, inputs), manifest)


def block_layout(spec: ExtractSpec, inputs: Inputs) -> BlockLayout | None:
    """What the store keeps of the blocks with ``--keep-blocks`` (the final norm read from the loaded weights)."""
    if not spec.keep_blocks:
        return None
    norm = block_encoder(load_inputs(inputs).encoder).norm_parameters()
    return BlockLayout(block_encoder(inputs.encoder).n_blocks, spec.blocks_dtype,
                       FinalNorm(norm.pop("kind"), norm.pop("eps"), **norm))


def create_store(spec: ExtractSpec, inputs: Inputs | None = None, overwrite: bool = False) -> StoreState:
    """Create the store for ``spec`` (or find it resumable / complete); never mixes settings.

    A store replaced with ``overwrite`` is rebuilt in :func:`staging_path` (resumed there if an earlier
    ``--overwrite`` run with the same settings was interrupted); :func:`finish_store` swaps it in. The caller
    holds the store's writer lock (:func:`foal_pipe.store.writer_lock`) when other writers may run.
    """
    inputs = inputs or open_inputs(spec)
    state = check_store(spec, inputs, overwrite)
    if state is not None:
        if state.holes:
            reopen_at(state.path, state.progress)
        if state.status != "complete" and inputs.manifest is not None:
            replace_manifest(state.path, inputs.manifest.to_bytes())  # rows not written yet may have new files
        return state
    out = spec.out_path
    settings = store_settings(spec, inputs)
    _check_chunk_memory(spec, inputs, max(settings["rows"].values(), default=1))
    target = staging_path(out) if out.is_dir() and any(out.iterdir()) else out
    _build_skeleton(target, spec, inputs, settings)
    return StoreState(target, "created", {split: 0 for split in SPLITS}, dict(settings["rows"]), out)


def _check_chunk_memory(spec: ExtractSpec, inputs: Inputs, rows: int) -> None:
    """Refuse, before a store is created, features too wide for one chunk and one batch in memory (a pixels
    encoder at a huge --image-size): extraction would otherwise end in a MemoryError traceback. A batch never
    straddles a chunk, so it holds at most a chunk's rows whatever --batch-size says."""
    from foal_pipe.memory import check_memory

    dim, chunk = inputs.encoder.dim, max(1, min(spec.chunk_rows, rows))
    batch = min(inputs.batch_size, chunk)
    smaller = [f"{param('image_size')} (features of {dim:,} values a row)", param("chunk_rows")]
    smaller += [param("batch_size")] if batch == chunk else []  # the batch is as large as the chunk
    check_memory("extract", {"one chunk of features": chunk * dim * np.dtype(spec.dtype).itemsize,
                             "one batch of features": batch * dim * 4},
                 f"choose a smaller {', '.join(smaller[:-1])} or {smaller[-1]}")


def check_store(spec: ExtractSpec, inputs: Inputs, overwrite: bool = False) -> StoreState | None:
    """The state of the store at ``spec.out_path`` without writing anything: ``None`` when it is to be
    created (missing, an empty folder, or replaced because of ``overwrite``); a :class:`FoalPipeError` when
    it may not be touched (not a store written by ``extract``, or other settings without ``overwrite``)."""
    out = spec.out_path
    if not out.exists():
        return None
    if not out.is_dir() or (any(out.iterdir()) and not is_zarr_dir(out)):
        raise FoalPipeError(f"{out} exists and is not a feature store; refusing to replace it: choose another "
                            f"{param('out')} or remove it")
    if not any(out.iterdir()):
        return None
    settings = store_settings(spec, inputs)
    staged = staging_path(out)
    if not overwrite:
        state = _check_data(_check_rows(_check_manifest(_existing_state(out, out, settings), inputs), inputs), inputs)
        if state.status != "complete":
            _check_writable(out, f"{out} cannot be resumed")
        if staged.is_dir() and not staged.is_symlink() and is_feature_store(staged) and foreign_file(staged) is None:
            _check_writable(staged, f"{staged}, left by an interrupted overwrite of {out}, cannot be removed")
        return state
    foreign = foreign_file(out) if is_feature_store(out) else None
    if foreign is not None:  # --overwrite deletes the old store whole: refuse before a user's file goes with it
        raise FoalPipeError(f"{out} also holds {foreign!r}, which a store does not write; {param('overwrite', True)} "
                            f"would delete it with the store: move it out first, or choose another {param('out')}")
    _check_staging(staged, out)
    for folder in (out, staged) if staged.is_dir() else (out,):  # both are deleted, the staging one resumed or rebuilt
        _check_writable(folder, f"{param('overwrite', True)} cannot replace {out}", parent=True)
    if staged.is_dir():  # an interrupted --overwrite: resume it when it has these settings
        try:
            return _check_data(_check_rows(_check_manifest(_existing_state(staged, out, settings), inputs), inputs), inputs)
        except FoalPipeError:
            return None
    return None


def _check_writable(store: Path, why: str, parent: bool = False) -> None:
    """Refuse, before any work, a store with a folder this process cannot write (``chmod -R a-w``, a read-only mount),
    saying ``why`` it is needed: rows written into it, or it deleted (``parent``: its parent must be writable too).
    Found only once the run writes, it would stop the run half-way, or, deleting a replaced store, after the new one
    took its place."""
    folders = ([store.parent] if parent else []) + sorted(Path(root) for root, _, _ in os.walk(store))
    locked = next((folder for folder in folders if not os.access(folder, os.W_OK)), None)
    if locked is not None:
        fix = f"chmod u+w {shlex.quote(str(locked))}" if locked == store.parent else f"chmod -R u+w {shlex.quote(str(store))}"
        raise FoalPipeError(f"{why}: {locked} is read-only (Permission denied); make it writable ({fix}), then re-run")


def _check_staging(staged: Path, out: Path) -> None:
    """Refuse, before anything changes, a staging path that is not a store an ``--overwrite`` of ``out`` left: a
    symlink (resumed and swapped in, it would put the link at ``out`` and write into its target), a file, a folder
    that is not a store or a store holding a user's file. Not ours to use or delete."""
    if staged.is_symlink() or (staged.exists() and not staged.is_dir()):
        what = "a symlink" if staged.is_symlink() else "a file"
    elif not staged.is_dir():
        return
    elif any(staged.iterdir()) and not is_feature_store(staged):
        what = "a folder that is not a feature store"
    elif (foreign := foreign_file(staged)) is not None:
        what = f"a feature store that also holds {foreign!r}, which a store does not write"
    else:
        return
    raise FoalPipeError(f"{staged} is {what}, not a replacement of {out} that {param('overwrite', True)} builds under "
                        "that name; remove it (or move it away), then re-run")


def _check_manifest(state: StoreState, inputs: Inputs) -> StoreState:
    """Refuse to resume (or to call complete) a store whose written rows came from images that are no longer the
    dataset's: each split's manifest entries below its progress must equal the current ones (name, SHA-256,
    label). Rows not written yet may come from other files; :func:`create_store` records them."""
    recorded, current = stored_manifest(state.path), inputs.manifest
    if recorded is None and current is None:
        return state
    out = f"{state.out} was extracted"
    if recorded is None or current is None:
        has = "without a split manifest" if recorded is None else "with a split manifest"
        raise FoalPipeError(f"{out} {has}, unlike this dataset; pass {param('overwrite', True)} to extract it again")
    _, old = parse_stored_manifest(recorded, state.out)
    for split in SPLITS:
        for row, (was, now) in enumerate(zip(old[split][: state.progress[split]], current.splits[split])):
            if was != now:
                raise FoalPipeError(f"{out} from other images: {split} row {row} holds the features of {was[0]!r} "
                                    f"(SHA-256 {was[1][:12]}...), now {now[0]!r} (SHA-256 {now[1][:12]}...); restore "
                                    f"the original images, or pass {param('overwrite', True)} to extract it again")
    return state


def _check_rows(state: StoreState, inputs: Inputs) -> StoreState:
    """Refuse to resume (or to call complete) a store whose labels or row indices, written once with its skeleton,
    are no longer the dataset's for every row (an image not written yet moved to another class folder): the rows
    still to come would carry the old labels."""
    group = store_group(state.path)
    for split in SPLITS:
        source = inputs.data.split(split)
        for leaf, now in (("labels", source.labels), ("index", source.index)):
            if f"{split}/{leaf}" not in group:
                continue
            array = group[f"{split}/{leaf}"]
            assert isinstance(array, zarr.Array)  # a group there is refused first, as not listed by the store's metadata
            damage = (f"shape {tuple(array.shape)}, unlike the {state.rows[split]:,} rows of {split}/features"
                      if tuple(array.shape) != (state.rows[split],) else chunk_too_large(array))
            if damage is not None:  # edited metadata: reading it would end in a MemoryError
                raise FoalPipeError(f"{state.out} is damaged ({split}/{leaf}: {damage}); pass {param('overwrite', True)} "
                                    "to extract it again")
            was, now = read_rows(state.path, f"{split}/{leaf}", array, 0, int(array.shape[0])), np.asarray(now)
            differ = np.flatnonzero(was != now)  # as long: the row counts are among the settings compared
            if len(differ):
                row = int(differ[0])
                raise FoalPipeError(f"{state.out} was extracted with other {leaf}: {split} row {row} has {leaf.rstrip('s')} "
                                    f"{int(was[row])} in the store but {int(now[row])} in the dataset now (its rows not "
                                    f"written yet come from other images); pass {param('overwrite', True)} to extract it again")
    return state


def _check_data(state: StoreState, inputs: Inputs) -> StoreState:
    """Refuse to resume (or to call complete) a store of a dataset without a split manifest whose images changed with
    the same rows and classes (a corrected HDF5 file): its ``data_sha256`` must be the dataset's now. A store written
    before the attribute came has none, and is taken as it was."""
    recorded = store_group(state.path).attrs.get(DATA_SHA256)
    current = inputs.data_sha256
    if recorded is None or recorded == current:
        return state
    was, now = recorded if isinstance(recorded, dict) else {}, current or {}
    split = next((split for split in SPLITS if was.get(split) != now.get(split)), SPLITS[0])
    old, new = (f"{d[:12]}..." if isinstance(d, str) else "unknown" for d in (was.get(split), now.get(split)))
    raise FoalPipeError(f"{state.out} was extracted from other data: the {split} images of {inputs.data.location} are not "
                        f"those it holds the features of (SHA-256 {old}, now {new}); restore the original data, or pass "
                        f"{param('overwrite', True)} to extract it again")


def _existing_state(path: Path, out: Path, settings: dict[str, Any]) -> StoreState:
    """The state of the store at ``path`` (``out`` or its staging copy), which must have been made by
    ``extract`` in this format with the same settings; holes below its progress move the progress back."""
    try:
        group = store_group(path)
        attrs = dict(group.attrs)
    except Exception:  # unreadable metadata: not ours to resume
        attrs, group = {}, None
    extract = attrs.get("extract")
    if attrs.get("format") != FORMAT or not isinstance(extract, dict):
        raise FoalPipeError(f"{out} is a Zarr store but not one written by `foal-pipe extract`; pass {param('overwrite', True)} "
                            f"to replace it or choose another {param('out')}")
    if attrs.get("format_version") != FORMAT_VERSION or type(attrs.get("format_version")) is not int:
        raise FoalPipeError(f"{out} was written in store format {attrs.get('format_version')!r}, this foal-pipe "
                            f"writes format {FORMAT_VERSION}; pass {param('overwrite', True)} to extract it again")
    diffs = _differences(extract, settings)
    if diffs:
        raise FoalPipeError(f"{out} was extracted with different settings ({'; '.join(diffs[:4])}); re-run with "
                            f"the original options to resume it, or pass {param('overwrite', True)} to replace it")
    rows = dict(settings["rows"])
    recorded = attrs.get("progress")
    progress = {}
    assert group is not None  # attrs were read from it
    damaged = f"{out} is damaged (%s); pass {param('overwrite', True)} to extract it again"
    for split in SPLITS:
        try:
            features = group[f"{split}/features"]
        except KeyError:
            raise FoalPipeError(damaged % f"no {split}/features array") from None
        except Exception as exc:  # zarr raises several types for unparsable metadata (as store.meta reads them)
            raise FoalPipeError(damaged % f"the metadata of {split}/features is unreadable ({type(exc).__name__})") from None
        if not isinstance(features, zarr.Array):
            raise FoalPipeError(damaged % f"{split}/features is a group, not an array")
        done = recorded.get(split) if isinstance(recorded, dict) else None
        step = int(features.chunks[0])
        if features.shape[0] != rows[split] or not resumable(done, rows[split], step):
            raise FoalPipeError(damaged % f"{split}/features {features.shape} with progress {done!r}")
        progress[split] = done
    lost = verify_store(path, read=False).problems  # chunk files missing (features, blocks: below the progress)
    if attrs.get("complete") is True:  # and, cheaply, chunk files that are not those it was completed with
        lost += changed_chunks(path)
    skeleton = [problem for problem in lost if problem.array.partition("/")[2] not in ROW_ARRAYS]
    if skeleton:  # labels or row indices: only a new skeleton can bring them back
        raise FoalPipeError(damaged % f"{skeleton[0]}")
    holes: dict[str, int] = {}
    for problem in lost:  # the first hole of each split (features or blocks) is where its extraction resumes
        split = problem.array.split("/")[0]
        holes[split] = min(holes.get(split, problem.lo), problem.lo)
        progress[split] = holes[split]
    status = "complete" if attrs.get("complete") is True and not holes else "resumed"
    return StoreState(path, status, progress, rows, out, holes)


def finish_store(state: StoreState) -> str:
    """Mark the store complete (last, once every split's progress reaches its row count and every chunk file
    is there) and, for a replacement built aside, swap it in; returns the store's generation id. A stop that a
    finaliser swallowed is raised first: the store stays incomplete (resumable), a replacement is not swapped in."""
    raise_swallowed_stop()
    generation = complete_store(state.path)
    if state.path != state.out:
        swap_in(state)
    return generation


def swap_in(state: StoreState) -> None:
    """Swap the complete replacement at ``state.path`` in for ``state.out``; from the swap on, the store (and its log)
    is ``state.out``, even when deleting the old store then fails."""
    try:
        replace_store(state.path, state.out)
    except ReplacedStoreLeft:
        state.path = state.out
        raise
    state.path = state.out
