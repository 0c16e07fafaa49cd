"""``foal-pipe extract`` (images -> feature store); ``foal-pipe info`` (what a store holds) is :mod:`foal_pipe.cli.info`.

Torch, timm and torchvision are imported by the library only when a command runs, never at import.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, cast

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from foal_pipe.cli._app import app, choice, console, err_console, flag, user_errors
from foal_pipe.cli.optiontext import fusion_text, model_kwargs_text, read_by
from foal_pipe.cluster import is_local
from foal_pipe.datasets.registry import DATASETS
from foal_pipe.durable import raise_swallowed_stop
from foal_pipe.encoders import PAPER_MODEL, parse_model_kwargs
from foal_pipe.errors import FoalPipeError
from foal_pipe.progress import new_progress

if TYPE_CHECKING:
    from foal_pipe.extract import ExtractProgress

_DATASETS = ", ".join(DATASETS)
if TYPE_CHECKING:  # mypy: the plain string extract receives; typer: a Literal of the names (built at run time)
    DatasetName = str
else:
    DatasetName = choice(*DATASETS)


class _RichProgress:
    """One bar per split: rows written of rows total, images/s, elapsed, ETA (on stderr; plain lines when it is
    not a terminal)."""

    def __init__(self) -> None:
        self.bar = new_progress(
            TextColumn("[bold]{task.description:>5}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=err_console,
            unit="images",
        )
        self.tasks: dict[str, Any] = {}

    def start(self, split: str, done: int, total: int) -> None:
        self.tasks[split] = self.bar.add_task(split, total=total, completed=done, rate="")

    def advance(self, split: str, n: int) -> None:
        raise_swallowed_stop()  # a stop a finaliser swallowed: the store stays incomplete, resumable
        task = self.tasks[split]
        self.bar.advance(task, n)
        speed = self.bar.tasks[task].speed
        self.bar.update(task, rate=f"{speed:,.0f} images/s" if speed else "")


#: extract's options that act only with another setting (cli/learn.py ``ONLY_WITH``): ``--workers`` counts DataLoader
#: workers (local) or the LocalCluster's (dask, ``--dask-address local`` or ""); a cluster elsewhere has its own.
EXTRACT_WORKERS: tuple[str, Callable[[dict[str, Any]], bool]] = ("--scheduler local or --dask-address local",
                   lambda p: p["scheduler"] != "dask" or is_local(p["dask_address"]))


@app.command()
def extract(
    ctx: typer.Context,
    dataset: Annotated[DatasetName, typer.Option("--dataset", "-d", show_default=False, help=f"Dataset: {_DATASETS}. Default: digits "
                                   "(scikit-learn's bundled 8x8 digits, offline).")] = "digits",
    data_dir: Annotated[Path | None, typer.Option(help="Where the dataset is: the torchvision root for cifar100, dtd(-trainval), "
                        "fgvc-aircraft(-trainval), country211 (default ~/datasets); the folder or its parent for core50, "
                        "tiny-imagenet, fashion-mnist and the benchmarks cub200, imagenet-r, imagenet-a, objectnet, "
                        "omnibenchmark, vtab (defaults ~/datasets/core50_128x128, ~/datasets/tiny-imagenet-200, "
                        "/usr/share/datasets/fashion-mnist, ~/datasets/CUB_200_2011, ~/datasets/imagenet-r, ...; "
                        "`foal-pipe datasets` lists them); the tree for "
                        "imagefolder and images and the .h5 file for hdf5 (required for these). Unused for digits.",
                        show_default=False)] = None,
    test_split: Annotated[float | None, typer.Option(help="For --dataset imagefolder without train/ and test/ "
                          "folders: --data-dir holds one folder per class, and this fraction of each class's images "
                          "(rounded, at least 1, at most all but 1) becomes the test split, drawn by --split-seed; "
                          "recorded in the store's settings. Refused for datasets that come split. Default: none.",
                          show_default=False)] = None,
    split_seed: Annotated[int, typer.Option(show_default=False, help="Seed of the --test-split draw: the same seed "
                          "gives the same split and the same store. Default: 0.")] = 0,
    split_manifest: Annotated[Path | None, typer.Option(help="Take the train and test splits from this split manifest: "
                              "another feature store (every store of image files records one) or the JSON file `foal-pipe "
                              "info STORE --export-manifest FILE` writes. Every image it lists must be in --data-dir (in "
                              "either split's folder) with the same bytes (SHA-256), or the extraction is refused; rows "
                              "follow the manifest. Not with --test-split. Default: none (the dataset's own split).",
                              show_default=False)] = None,
    download: Annotated[bool, flag("--download", help="Let torchvision download cifar100, dtd(-trainval), "
                        "fgvc-aircraft(-trainval) or country211 into --data-dir. Default: off (use files already there).")] = False,
    model: Annotated[str, typer.Option("--model", "-m", show_default=False, help="Full timm tag of a ViT-family model (weights via timm's "
                     "Hugging Face cache), or 'pixels' (flattened pixels, no network). Default: the paper's "
                     f"{PAPER_MODEL}.")] = PAPER_MODEL,
    checkpoint: Annotated[Path | None, typer.Option(help="Local .safetensors or .pth state dict for --model, loaded "
                          "strictly (every parameter, exact shapes; only the classifier head is dropped) with "
                          "weights_only=True (no unpickling); saved at another image size, its position embeddings are "
                          "resampled to --image-size as timm does (recorded in the store). Default: none (timm's "
                          "pretrained weights).",
                          show_default=False)] = None,
    model_kwargs: Annotated[str, typer.Option(help="Arguments for timm.create_model as NAME=VALUE,... (ints, floats, "
                            "true/false, strings), e.g. depth=2,patch_size=8,img_size=32,embed_dim=32,num_heads=2 for a "
                            "custom architecture; recorded in the store and compared on resume. Default: none.",
                            show_default=False, callback=read_by(model_kwargs_text))] = "",
    fusion: Annotated[str, typer.Option(show_default=False, help="Which blocks' tokens are averaged before the final norm: mean-cls "
                      "(every block: the paper), last, mean:A-B (blocks A to B, 1-based, inclusive) or block:K. "
                      "Default: mean-cls.", callback=read_by(fusion_text))] = "mean-cls",
    token: Annotated[Literal["cls", "mean"], typer.Option(show_default=False, help="cls: the CLS token; mean: the mean of the patch tokens. Default: cls.")]
    = "cls",
    image_size: Annotated[int | None, typer.Option(help="Input side in pixels (images are resized to a square). "
                          "Default: the model's own input size; for pixels the dataset's native size "
                          "(8 for digits), else 32.", show_default=False)] = None,
    normalize: Annotated[bool, flag("--normalize/--no-normalize", help="Normalise with the model's own "
                         "mean/std (pixels: 0.5/0.5). --no-normalize gives [0, 1] inputs as the published code. "
                         "Default: --normalize.")] = True,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Feature store to write (a .zarr directory). "
                   "Default: data/features/<dataset>.zarr.", show_default=False)] = None,
    dtype: Annotated[Literal["float32", "float16"], typer.Option(show_default=False, help="Stored feature dtype: float32 or float16 (half the disk). "
                     "Default: float32.")] = "float32",
    keep_blocks: Annotated[bool, flag("--keep-blocks", help="Also store every block's token (before any "
                           "norm) and the final norm, so learn/sweep can choose the fusion later without "
                           "re-extracting (L times the features on disk). Not for --model pixels. Default: off.")]
    = False,
    blocks_dtype: Annotated[Literal["float16", "float32"], typer.Option(show_default=False, help="Dtype of the stored block tokens with --keep-blocks: float16 "
                            "(half the disk; fused features within ~1e-3 of extract's) or float32 (fused features "
                            "equal extract's to 1e-6). Default: float16.")] = "float16",
    chunk_rows: Annotated[int, typer.Option(show_default=False, help="Rows per stored chunk, the unit of writing and of resuming. "
                          "Default: 1024.")] = 1024,
    batch_size: Annotated[int | None, typer.Option(help="Images per forward pass (batches never straddle chunks). "
                          "Default: 256 on CUDA, 32 on CPU.", show_default=False)] = None,
    workers: Annotated[int | None, typer.Option(help="DataLoader worker processes (0: load in the main process). "
                       "Default: half the CPU cores, at most 8. With --scheduler dask --dask-address local: Dask "
                       "worker processes (default: one per CUDA GPU, else one per CPU core).", show_default=False)]
    = None,
    device: Annotated[Literal["auto", "cpu", "cuda"], typer.Option(show_default=False, help="auto (CUDA when available), cpu or cuda. Default: auto.")] = "auto",
    precision: Annotated[Literal["auto", "fp32", "bf16", "fp16"], typer.Option(show_default=False, help="auto, fp32, bf16 or fp16 (autocast). Default: auto = bf16 on "
                         "CUDA, fp32 on CPU.")] = "auto",
    resize_on: Annotated[Literal["auto", "workers", "device"], typer.Option(show_default=False, help="Where images are resized to the model's size: workers (PIL, in the "
                         "DataLoader workers) or device (the workers ship native-size batches and the encoder's device "
                         "resizes them, exactly as PIL would; only for datasets whose images share one size). The "
                         "features are the same either way. Default: auto = device on CUDA when the dataset has one "
                         "native size, else workers.")] = "auto",
    overwrite: Annotated[bool, flag("--overwrite", help="Replace an existing store made with other settings "
                         "(or a complete one). Default: off: a store with the same settings is resumed, one with "
                         "other settings refused.")] = False,
    scheduler: Annotated[Literal["local", "dask"], typer.Option(show_default=False, help="local: this process. dask: chunk-aligned row ranges are tasks on a "
                         "Dask cluster (needs the foal-pipe\\[dist] extra); each worker loads the model once and writes "
                         "its ranges into the store; failed ranges are retried, a lost worker's rerun elsewhere. "
                         "Default: local.")] = "local",
    dask_address: Annotated[str, typer.Option(show_default=False, help="With --scheduler dask: 'local' starts a LocalCluster of --workers "
                            "processes, or a scheduler address tcp://host:port (--out and the dataset must then be on "
                            "a filesystem every worker sees). Default: local.")] = "local",
) -> None:
    """Encode a dataset with a frozen ViT (fused block features) into a chunked Zarr feature store.

    Re-running an interrupted command resumes after the last written chunk.
    """
    with user_errors():
        from foal_pipe.cli.learn import ONLY_WITH, _check_applies  # here: learn's commands register after extract's
        from foal_pipe.extract import ExtractSpec, run_extract

        if scheduler not in ("local", "dask"):
            raise FoalPipeError(f"unknown --scheduler {scheduler!r}; choose local or dask")
        _check_applies(ctx, {"dask_address": ONLY_WITH["dask_address"]})
        _check_applies(ctx, {"workers": EXTRACT_WORKERS}, can_add=False)
        _check_applies(ctx, {"blocks_dtype": ("--keep-blocks", lambda p: p["keep_blocks"])})
        spec = ExtractSpec(
            dataset=dataset, out=str(out) if out else None, data_dir=str(data_dir) if data_dir else None,
            download=download, model=model, checkpoint=str(checkpoint) if checkpoint else None,
            model_kwargs=parse_model_kwargs(model_kwargs), fusion=fusion,
            token=token, image_size=image_size, normalize=normalize, dtype=dtype, chunk_rows=chunk_rows,
            keep_blocks=keep_blocks, blocks_dtype=blocks_dtype,
            batch_size=batch_size, workers=workers if scheduler == "local" else 0, device=device, precision=precision,
            resize_on=resize_on, test_split=test_split, split_seed=split_seed,
            split_manifest=str(split_manifest) if split_manifest else None,
        )
        progress = _RichProgress()
        callbacks = cast("ExtractProgress", progress)  # ExtractProgress's two callbacks, duck-typed
        before = _metadata(spec.out_path)
        try:
            with progress.bar:
                if scheduler == "dask":
                    from foal_pipe.extract.distributed import dask_extract

                    report = dask_extract(spec, dask_address, workers, overwrite=overwrite, progress=callbacks)
                else:
                    report = run_extract(spec, overwrite=overwrite, progress=callbacks)
        except (KeyboardInterrupt, RuntimeError) as exc:
            if not _by_interrupt(exc):
                raise
            err_console.print(f"[yellow]Interrupted:[/] {escape(_stopped_store(spec.out_path, overwrite, before))}",
                              highlight=False, soft_wrap=True)
            raise typer.Exit(130) from None
        shape = ", ".join(f"{split} {n:,} x {report.dim} {dtype}" for split, n in report.rows.items())
        if keep_blocks:
            shape += f", with every block's token ({blocks_dtype})"
        if report.status == "complete":
            console.print(f"{report.path} is already complete with these settings ({shape}); nothing to do "
                          "(pass --overwrite to extract it again).", highlight=False, soft_wrap=True, markup=False)
            return
        if report.holes:
            holes = ", ".join(f"{s} from row {row:,}" for s, row in report.holes.items())
            err_console.print(f"[yellow]warning:[/] chunk files were missing or damaged below the recorded progress; "
                              f"extracted them again ({holes})", highlight=False, soft_wrap=True)
        resumed = ""
        if report.status == "resumed":
            resumed = " (resumed from " + ", ".join(f"{s} {n:,}" for s, n in report.resumed_from.items()) + ")"
        rate = sum(report.rows[s] - report.resumed_from.get(s, 0) for s in report.rows) / max(report.seconds, 1e-9)
        console.print(
            f"wrote {report.path}{resumed}: {shape}, encoder {report.encoder}, {report.seconds:.1f} s "
            f"({rate:,.0f} images/s on {report.device}, {report.precision})", highlight=False, soft_wrap=True, markup=False
        )


def _metadata(out: Path) -> bytes | None:
    """The group metadata (``zarr.json``) of the store at ``out``; None where there is none."""
    try:
        return (out / "zarr.json").read_bytes()
    except OSError:
        return None


def _stopped_store(out: Path, overwrite: bool, before: bytes | None) -> str:
    """What an interrupted ``extract`` left at ``out`` and what to do, from the store's metadata before the run
    (``before``) and now: none written (stopped while the dataset or the weights were read), a complete store
    re-checked and unchanged, one this run completed, or an incomplete store or replacement to resume."""
    from foal_pipe.extract.state import staging_path

    now = _metadata(out)
    try:
        complete = json.loads(now or b"{}")["attributes"]["complete"] is True
    except (ValueError, TypeError, KeyError):
        complete = False
    resume = "re-run the same command to resume after the last written chunk."
    if now is None and before is None:
        return f"no store was written to {out}; re-run the same command to start the extraction."
    if now == before and complete:
        if not overwrite:
            return f"{out} is complete and unchanged; nothing to resume."
        if _metadata(staging_path(out)) is None:
            return f"{out} is unchanged and no replacement was written; re-run the same command to start it."
        return f"{out} is unchanged and its replacement incomplete; {resume}"
    if complete:
        return f"{out} is complete: its extraction ended before the stop."
    return f"{out} is incomplete; {resume}"


def _by_interrupt(exc: BaseException) -> bool:
    """Whether ``exc`` is Ctrl-C or SIGTERM, or what unwinding from one raised: a SIGTERM sent to the whole process
    group stops the loader's workers too, and torch reports their deaths ("DataLoader worker ... is killed by
    signal") while the interrupt unwinds."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, KeyboardInterrupt):
            return True
        seen = seen.__context__
    return False
