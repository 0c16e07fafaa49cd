"""``foal-pipe info``: what a feature store holds (shape, dtype, classes, encoder, completeness, checksums, size on
disk) as a table or JSON, every chunk read with ``--verify``, its split manifest exported. Its own module because it
only reads stores, which :mod:`foal_pipe.cli.extract` writes.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from foal_pipe.cli._app import app, err_console, flag, one_line, print_json, print_table, user_errors
from foal_pipe.errors import FoalPipeError

if TYPE_CHECKING:
    from foal_pipe.store import ChunkProblem


def _size_on_disk(path: Path) -> int:
    """The bytes of the regular files in the store: a symlink counts as itself, not as the file it points to."""
    sizes = (p.lstat() for p in path.rglob("*"))
    return sum(s.st_size for s in sizes if stat.S_ISREG(s.st_mode))


def _human(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} B"


def _last_run(log: dict[str, Any] | None) -> dict[str, Any]:
    """The finishing run of the sidecar log, with the first run's start and the total seconds."""
    runs = [r for r in (log or {}).get("runs", []) if isinstance(r, dict)]
    if not runs:
        return {}
    seconds = [r["seconds"] for r in runs if isinstance(r.get("seconds"), (int, float))]
    return {"created": runs[0].get("started"), "finished": runs[-1].get("finished"), "runs": len(runs),
            "seconds": round(sum(seconds), 3) if seconds else None,
            "runtime": {k: runs[-1][k] for k in ("host", "device", "batch_size", "workers", "resize_on",
                                                   "checkpoint", "torch_version", "foal_pipe_version", "scheduler")
                        if k in runs[-1]}}


def store_summary(path: Path, verify: bool = False, found: list[Any] | None = None) -> dict[str, Any]:
    """What ``foal-pipe info`` shows, as a dict (also its ``--json`` output); ``verify`` reads every chunk. The
    problems found are added to ``found`` too, as :class:`~foal_pipe.store.ChunkProblem` (a reader's refusal kept)."""
    from foal_pipe.store import SPLITS, has_checksums, log_path, open_array, read_log, read_meta, verify_store
    from foal_pipe.store.integrity import SEALED_FROM
    from foal_pipe.store.write import foreign_file

    group, meta = read_meta(path)
    splits, checksums = {}, []
    for split in SPLITS:
        features = open_array(group, path, f"{split}/features")
        checksums.append(has_checksums(features))
        splits[split] = {"rows": int(features.shape[0]), "dim": int(features.shape[1]) if features.ndim == 2 else None,
                         "dtype": str(features.dtype), "chunk_rows": int(features.chunks[0])}
    progress = meta.extra.get("progress")
    log = read_log(path)
    settings = meta.extra.get("extract")
    summary = {
        "path": str(path),
        "complete": meta.complete,
        "format_version": meta.format_version,
        "checksums": bool(checksums) and all(checksums),
        "integrity": meta.complete and meta.format_version >= SEALED_FROM,
        "generation": meta.generation,
        "dataset": meta.dataset,
        "classes": list(meta.classes),
        "encoder": meta.encoder,
        "splits": splits,
        "progress": {k: v for k, v in progress.items() if type(v) is int} if isinstance(progress, dict) else None,
        "source": meta.extra.get("source"),
        "test_split": settings.get("test_split") if isinstance(settings, dict) else None,
        "manifest": meta.extra.get("manifest"),
        "log": str(log_path(path)) if log is not None else None,
        **_last_run(log),
        "blocks": meta.extra.get("blocks"),
        "bytes_on_disk": _size_on_disk(Path(path)),
        "foreign_file": foreign_file(Path(path)),
    }
    result = verify_store(path, read=verify)
    summary["problems"] = [_worded(p) for p in result.problems]
    if found is not None:
        found += result.problems
    if verify:
        summary["chunks_read"] = result.chunks_read
    return summary


def _worded(problem: ChunkProblem) -> str:
    """A problem as the command line words it: a reader's refusal names its parameters as flags."""
    from foal_pipe.cli.flags import cli_form
    from foal_pipe.store.verify import REFUSED

    refusal = problem.refusal
    return str(problem) if refusal is None else f"{problem.array}: {REFUSED}{refusal.render(cli_form)}"


def _grid(size: Any) -> str:
    return "x".join(map(str, size)) if isinstance(size, list) else "?"


def _encoder_rows(table: Table, enc: dict[str, Any]) -> None:
    from foal_pipe.encoders import format_model_kwargs

    kwargs = enc.get("model_kwargs")  # timm.create_model's arguments: another network than the name says
    shaped = f" with --model-kwargs {format_model_kwargs(tuple(kwargs.items()))}" if isinstance(kwargs, dict) and kwargs else ""
    table.add_row("encoder", escape(f"{enc.get('name')}{shaped}"))
    details = [f"{key} {enc[key]}" for key in ("fusion", "token") if key in enc]
    if "image_size" in enc:
        details.append(f"{enc['image_size']} px")
    if "normalize" in enc:
        details.append("normalized" if enc["normalize"] else "not normalized")
    if enc.get("precision"):
        details.append(str(enc["precision"]))
    if details:
        table.add_row("", escape(", ".join(details)))
    weights = enc.get("weights")
    if isinstance(weights, dict) and weights:
        where = weights.get("id") or weights.get("path") or weights.get("url") or ""
        table.add_row("weights", escape(f"{weights.get('source')} {where}".strip()
                      + (f" (sha256 {str(weights['sha256'])[:12]}...)" if weights.get("sha256") else "")))
        plan = weights.get("pos_embed_resampled")
        if isinstance(plan, dict):
            table.add_row("", f"position embeddings resampled {_grid(plan.get('from'))} -> {_grid(plan.get('to'))} "
                          f"({plan.get('interpolation')}): saved at another image size")
    if enc.get("timm_version"):
        table.add_row("timm", str(enc["timm_version"]))


@app.command()
def info(
    store: Annotated[Path, typer.Argument(help="A feature store (.zarr directory).", show_default=False, metavar="STORE")],
    as_json: Annotated[bool, flag("--json", help="Print everything as JSON instead of a table. "
                       "Default: off.")] = False,
    verify: Annotated[bool, flag("--verify", help="Read every chunk: report damaged chunks (checksum "
                      "mismatch, undecodable, NaN/inf) by split and rows, recompute the generation id and run every "
                      "check the readers run (labels, shapes, dtypes, norm parameters). Default: off (metadata and a "
                      "listing of the chunk files only).")] = False,
    export_manifest: Annotated[Path | None, typer.Option(help="Write the store's split manifest (the images of each "
                               "split with their SHA-256) to this JSON file, for `extract --split-manifest`. Default: "
                               "none.", show_default=False)] = None,
) -> None:
    """Show a feature store: shape, dtype, classes, encoder, completeness, checksums and size on disk.

    Exits with status 0 when nothing is wrong, 1 when anything is, every problem listed: chunk files missing,
    metadata changed since completion, format_version edited down, an incomplete store's progress that extract cannot
    resume from; with --verify also damaged chunks, NaN/inf features and anything the readers refuse.
    """
    from foal_pipe.store.chunks import REEXTRACT

    with user_errors({"features": "STORE"}):
        if export_manifest is not None:
            _export_manifest(store, export_manifest)
            err_console.print(f"wrote {export_manifest}: the split manifest of {store}", highlight=False, markup=False,
                              soft_wrap=True)  # stderr: stdout is the table or the JSON
        found: list[Any] = []
        summary = store_summary(store, verify, found)
        problems = summary["problems"]
        if as_json:
            print_json(summary)
        else:
            _print_table(summary)
        refusal = found[0].refusal if len(found) == 1 else None
        if refusal is not None:  # open_store's own message, which names the fix (its flags, as learn's does)
            raise FoalPipeError(f"{store} fails --verify: {refusal.template}")
        if problems:  # each problem once, without the fix the line ends with
            texts = [p.removesuffix(f"; {REEXTRACT}") for p in problems]
            listed = "; ".join(texts[:5]) + (f"; and {len(texts) - 5} more" if len(texts) > 5 else "")
            raise FoalPipeError(f"{store} is damaged: {listed}; {REEXTRACT}")


def _export_manifest(store: Path, out: Path) -> None:
    """Write the store's split manifest to ``out`` (whole, via a temporary file: never half-written), refused inside
    a feature store, whose own files (``zarr.json``) it could replace."""
    from foal_pipe.extract.manifest import read_manifest
    from foal_pipe.io import atomic_path
    from foal_pipe.io.outpaths import enclosing_store

    where = enclosing_store(out, itself=True)
    if where is not None:
        raise FoalPipeError(f"--export-manifest {out} lies in the feature store {where}, whose files it would overwrite; "
                            "choose a path outside the store")
    if out.is_dir():
        raise FoalPipeError(f"--export-manifest {out} is a folder; pass a file name such as {out / 'manifest.json'}")
    raw = read_manifest(store).to_bytes()
    with atomic_path(out) as tmp:
        tmp.write_bytes(raw)


def _class_name(name: str) -> str:
    """A class name as ``info`` lists it: quoted with escapes (JSON) when it is empty, or holds a comma, a quote,
    a control character or outer spaces, so each name reads as one."""
    plain = name and name == name.strip() and name.isprintable() and not set(name) & {",", '"'}
    return name if plain else json.dumps(name, ensure_ascii=False)


def _print_table(summary: dict[str, Any]) -> None:
    from foal_pipe.store.meta import resume_advice

    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    if summary["complete"]:
        status = "yes"
    else:
        prog = summary["progress"] or {}
        done = ", ".join(f"{s} {prog.get(s, 0):,}/{v['rows']:,}" for s, v in summary["splits"].items())
        status = f"[yellow]no[/] ({escape(done)} rows written; {escape(resume_advice(summary['format_version']))})"
    classes = summary["classes"]
    preview = escape(", ".join(map(_class_name, classes[:6])) + (", ..." if len(classes) > 6 else ""))
    table.add_row("store", escape(str(summary["path"])))
    table.add_row("complete", status)
    if summary["format_version"] == 1:
        table.add_row("format", "1 (no chunk checksums: a damaged chunk may decode to other values unnoticed; "
                      "re-extract with this foal-pipe to get them)")
    else:
        checks = "crc32c checksum on every chunk" if summary["checksums"] else "no chunk checksums"
        if summary["integrity"]:
            checks += ", each bound to its position; metadata sealed by the generation id"
        elif not summary["complete"] and summary["format_version"] >= 4:
            checks += "; the chunk records and generation id are written when it is completed"
        elif summary["generation"]:
            checks += (" (no per-chunk records: an edited attribute or a chunk moved to another position is refused "
                       "as a changed store, the chunk not named; re-extract with this foal-pipe to get them)")
        else:
            checks += (" (no integrity data: a chunk moved to another position, or an edited attribute, is not "
                       "noticed by learn; re-extract with this foal-pipe to get it)")
        table.add_row("format", f"{summary['format_version']}, {checks}")
    if summary["generation"]:
        table.add_row("generation", summary["generation"])
    table.add_row("dataset", escape(one_line(f"{summary['dataset']}") + (f" ({summary['source']})" if summary["source"] else "")))
    table.add_row("classes", f"{len(classes)}: {preview}")
    for split, v in summary["splits"].items():
        table.add_row(split, f"{v['rows']:,} x {v['dim']} {v['dtype']} (chunks of {v['chunk_rows']:,} row{'s' * (v['chunk_rows'] != 1)})")
    drawn = summary["test_split"]
    if isinstance(drawn, dict):
        table.add_row("", f"test split drawn by extract --test-split {drawn.get('test_fraction')} --split-seed "
                      f"{drawn.get('seed')} (stratified per class)")
    manifest = summary.get("manifest")
    if isinstance(manifest, dict):
        table.add_row("manifest", f"the images of each split with their SHA-256 ({manifest.get('bytes'):,} bytes, sha256 "
                      f"{str(manifest.get('sha256'))[:12]}...): `info --export-manifest FILE`, `extract --split-manifest`")
    _encoder_rows(table, summary["encoder"])
    blocks = summary.get("blocks")
    if isinstance(blocks, dict):
        norm = blocks["norm"] if isinstance(blocks.get("norm"), dict) else {}
        table.add_row("blocks", f"{blocks.get('count')} block tokens per row, {blocks.get('dtype')}, final norm "
                      f"{norm.get('kind')} (eps {norm.get('eps')}): learn/sweep can choose the fusion")
    if summary.get("finished"):
        runs = f", {summary['runs']} runs" if summary.get("runs", 1) > 1 else ""
        seconds = f" in {summary['seconds']:.1f} s" if summary.get("seconds") is not None else ""
        table.add_row("extracted", escape(f"{summary['finished']}{seconds}{runs} (log: {summary['log']})"))
    runtime = summary.get("runtime") or {}
    if runtime:
        table.add_row("runtime", escape(", ".join(f"{k} {v}" for k, v in runtime.items() if v is not None)))
    table.add_row("size", f"{_human(summary['bytes_on_disk'])} on disk")
    if summary["foreign_file"] is not None:  # --overwrite, the fix every problem names, refuses such a store
        table.add_row("note", escape(f"it holds {summary['foreign_file']!r}, which a store's writer does not make: "
                                     "readers ignore it, but `extract --overwrite` refuses to replace the store until "
                                     "it is removed"))
    found = summary["problems"]
    problems = f"[red]{len(found)} problem{'s' * (len(found) != 1)}[/]"
    if "chunks_read" in summary:
        fine = "all intact" if summary["checksums"] else "all decoded (no checksums: damage may go unnoticed)"
        table.add_row("verified", f"{summary['chunks_read']:,} chunks read, "
                      + (problems if found else fine))
    elif found:
        table.add_row("damaged", f"{problems} (chunk files listed; --verify reads them all)")
    for problem in found:
        table.add_row("", f"[red]{escape(problem)}[/]")
    print_table(table)
