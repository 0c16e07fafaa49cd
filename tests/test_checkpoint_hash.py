"""A checkpoint's SHA-256 is computed once and recorded (issue 33: not re-hashed on every extract), and a record can
never put a wrong hash in a store: the loaded bytes are hashed again and must match it."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest
from helpers import TINY_VIT, TINY_VIT_KWARGS

from foal_pipe.encoders import EncoderConfig, build_encoder, hashes, weights
from foal_pipe.errors import FoalPipeError

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv(hashes.CACHE_VARIABLE, str(folder))
    return folder


@pytest.fixture
def state(tiny_vit_checkpoint) -> dict:
    from safetensors.torch import load_file

    return load_file(str(tiny_vit_checkpoint))


@pytest.fixture
def counted(monkeypatch) -> list[Path]:
    """Every file hashed by reading it whole, in order."""
    calls: list[Path] = []
    real = weights.file_sha256

    def counting(path: Path) -> str:
        calls.append(path)
        return real(path)

    monkeypatch.setattr(weights, "file_sha256", counting)
    return calls


def _settled_copy(source: Path, path: Path) -> Path:
    """A copy of ``source`` last modified a minute ago (a checkpoint that is not being written)."""
    path.write_bytes(source.read_bytes())
    old = time.time() - 60
    os.utime(path, (old, old))
    return path


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _describe(path: Path) -> dict:
    return build_encoder(EncoderConfig(TINY_VIT, checkpoint=str(path), model_kwargs=TINY_VIT_KWARGS)).weights


def test_a_checkpoint_is_hashed_once_then_its_record_is_used(tmp_path, cache, counted, tiny_vit_checkpoint):
    path = _settled_copy(tiny_vit_checkpoint, tmp_path / "w.safetensors")
    first, second = _describe(path), _describe(path)
    assert first["sha256"] == second["sha256"] == _sha256(path)
    assert counted == [path]  # read whole once: the second description took the record
    records = json.loads((cache / hashes.RECORDS).read_text())
    assert records[str(path.resolve())]["sha256"] == _sha256(path)


def test_a_rewritten_checkpoint_is_hashed_again(tmp_path, cache, counted, tiny_vit_checkpoint, state):
    from safetensors.torch import save_file

    path = _settled_copy(tiny_vit_checkpoint, tmp_path / "w.safetensors")
    before = _describe(path)["sha256"]
    save_file({k: v + 1 for k, v in state.items()}, str(path))
    after = _describe(path)["sha256"]
    assert after == _sha256(path) != before and len(counted) == 2


def test_a_file_modified_moments_ago_is_not_recorded(tmp_path, cache, counted, tiny_vit_checkpoint):
    """As git's racy-clean rule: a rewrite within the same clock tick could keep the times, so a fresh file is
    hashed every time until it has settled."""
    path = tmp_path / "fresh.safetensors"
    path.write_bytes(tiny_vit_checkpoint.read_bytes())
    _describe(path), _describe(path)
    assert len(counted) == 2 and not (cache / hashes.RECORDS).exists()


def test_a_wrong_record_is_refused_at_load_and_dropped(tmp_path, cache, tiny_vit_checkpoint):
    """A record whose hash is not the file's (forged here) is caught by the hash of the bytes loaded; the record
    is dropped, so the same command run again hashes the file and works."""
    path = _settled_copy(tiny_vit_checkpoint, tmp_path / "w.safetensors")
    _describe(path)
    records = json.loads((cache / hashes.RECORDS).read_text())
    records[str(path.resolve())]["sha256"] = "0" * 64
    (cache / hashes.RECORDS).write_text(json.dumps(records))
    encoder = build_encoder(EncoderConfig(TINY_VIT, checkpoint=str(path), model_kwargs=TINY_VIT_KWARGS))
    assert encoder.weights["sha256"] == "0" * 64
    with pytest.raises(FoalPipeError, match="changed after it was hashed"):
        encoder.load("cpu")
    assert str(path.resolve()) not in json.loads((cache / hashes.RECORDS).read_text())
    again = build_encoder(EncoderConfig(TINY_VIT, checkpoint=str(path), model_kwargs=TINY_VIT_KWARGS))
    assert again.weights["sha256"] == _sha256(path)
    again.load("cpu")


def test_an_unwritable_cache_only_means_hashing_again(tmp_path, monkeypatch, counted, tiny_vit_checkpoint):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(hashes.CACHE_VARIABLE, str(blocker / "cache"))
    path = _settled_copy(tiny_vit_checkpoint, tmp_path / "w.safetensors")
    assert _describe(path)["sha256"] == _describe(path)["sha256"] == _sha256(path)
    assert len(counted) == 2
