"""Extraction's start-up off the user's path (issue 33): one loader for every split, its workers started before
the weights load, so images are read while the checkpoint is read, hashed and moved; the store's bytes unchanged."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from helpers import TINY_VIT, TINY_VIT_KWARGS, assert_identical_stores

import foal_pipe.extract.run as ex
from foal_pipe.datasets.sources import PreparedImages
from foal_pipe.extract import ExtractSpec, create_store, extract_rows, finish_store, mark_progress, run_extract

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _spec(out: Path, checkpoint: Path, workers: int) -> ExtractSpec:
    return ExtractSpec(dataset="digits", model=TINY_VIT, checkpoint=str(checkpoint), model_kwargs=TINY_VIT_KWARGS,
                       out=str(out), chunk_rows=128, batch_size=48, workers=workers, device="cpu")


def test_workers_read_images_while_the_weights_load(tmp_path, monkeypatch, tiny_vit_checkpoint):
    """Each image a worker reads is logged to a file (workers are forked: the patch reaches them); while the
    weights load (made slow here), the workers have read images already."""
    log = tmp_path / "reads.log"
    log.touch()
    real_item, real_load = PreparedImages.__getitem__, ex.load_inputs
    seen: dict[str, int] = {}

    def logged_item(self, i):
        with open(log, "a") as f:
            f.write(f"{i}\n")
        return real_item(self, i)

    def slow_load(inputs):
        if not inputs.loaded:  # the first call loads; later ones (extract_rows checks) return at once
            time.sleep(1.5)  # a checkpoint that takes a while to read and move to the device
            seen["after_a_while"] = len(log.read_text().split())
        return real_load(inputs)

    monkeypatch.setattr(PreparedImages, "__getitem__", logged_item)
    monkeypatch.setattr(ex, "load_inputs", slow_load)
    run_extract(_spec(tmp_path / "a.zarr", tiny_vit_checkpoint, workers=2))
    assert seen["after_a_while"] > 0, seen  # before: nothing was read until the weights had loaded
    assert len(log.read_text().split()) == 1442 + 355  # every row read once, no more


def test_one_loader_reads_every_split_and_the_store_is_the_same(tmp_path, monkeypatch, tiny_vit_checkpoint):
    """run_extract starts one loader (before: one per split, its workers started and stopped each time); its store
    is byte-identical to one filled split by split, each range with a loader of its own."""
    started: list[int] = []
    real = ex._load_batches

    def counting(images, batches, inputs):
        started.append(len(batches))
        return real(images, batches, inputs)

    monkeypatch.setattr(ex, "_load_batches", counting)
    run_extract(_spec(tmp_path / "one.zarr", tiny_vit_checkpoint, workers=2))
    # digits in chunks of 128 and batches of 48 (a batch never crosses a chunk): 1,442 train rows are 11 full chunks
    # (3 batches each) and 34 rows (1); 355 test rows are 2 full chunks and 99 rows (48 + 48 + 3)
    assert started == [11 * 3 + 1 + 2 * 3 + 3]
    monkeypatch.setattr(ex, "_load_batches", real)

    spec = _spec(tmp_path / "ranges.zarr", tiny_vit_checkpoint, workers=0)
    state = create_store(spec)
    for split in ("train", "test"):
        extract_rows(spec, split, 0, state.rows[split])
        mark_progress(spec.out_path, split, state.rows[split])
    finish_store(state)
    assert_identical_stores(tmp_path / "ranges.zarr", tmp_path / "one.zarr")


def test_a_failed_weights_load_stops_the_started_workers(tmp_path, monkeypatch, tiny_vit_checkpoint):
    """The loader started before the weights is shut down when they cannot be had, and nothing is left at out."""
    from foal_pipe.errors import FoalPipeError

    closed: list[bool] = []
    real_close = ex.Loading.close

    def recording_close(self):
        closed.append(True)
        real_close(self)

    def no_weights(inputs):
        raise FoalPipeError("no weights for the test")

    monkeypatch.setattr(ex.Loading, "close", recording_close)
    monkeypatch.setattr(ex, "load_inputs", no_weights)
    with pytest.raises(FoalPipeError, match="no weights for the test"):
        run_extract(_spec(tmp_path / "x.zarr", tiny_vit_checkpoint, workers=2))
    assert closed == [True] and not (tmp_path / "x.zarr").exists()


def test_cuda_starts_on_a_thread_after_the_workers_were_forked(monkeypatch):
    """On CUDA the context is created on a thread (torch.cuda.init, replaced here: no GPU needed) while the weights
    are read; on the CPU nothing is started."""
    import threading

    import torch

    called: list[str] = []
    monkeypatch.setattr(torch.cuda, "init", lambda: called.append(threading.current_thread().name))
    assert ex.start_device("cpu") is None and called == []
    thread = ex.start_device("cuda")
    thread.join(10)
    assert called == ["foal-pipe-cuda-init"] and thread is not threading.main_thread()


def test_a_failing_cuda_start_on_the_thread_prints_nothing(monkeypatch, capfd):
    """The thread's error is left to the main thread's first use of the device (one line there), not printed as a
    thread's traceback."""
    import torch

    def broken() -> None:
        raise RuntimeError("no CUDA driver")

    monkeypatch.setattr(torch.cuda, "init", broken)
    ex.start_device("cuda").join(10)
    assert "Traceback" not in capfd.readouterr().err
