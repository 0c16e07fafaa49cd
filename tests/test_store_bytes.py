"""Byte-stable stores (issue 9): the same `extract` command twice gives byte-identical store directories, so
DVC sees an unchanged output; what varies from run to run lives in the sidecar `<store>.log.json`.

Before: `created`, `finished`, `seconds` and `runtime` (device, workers, versions) were group attributes, so
every run changed the store's `zarr.json`, and the checkpoint's absolute path was recorded in the encoder.
"""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import pytest
from helpers import TINY_VIT, TINY_VIT_KWARGS
from typer.testing import CliRunner

from foal_pipe.cli import app
from foal_pipe.extract import ExtractSpec, run_extract
from foal_pipe.store import log_path, read_log, read_meta

pytestmark = pytest.mark.usefixtures("one_torch_thread")
runner = CliRunner()
TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d")


def _files(store: Path) -> dict[str, bytes]:
    return {p.relative_to(store).as_posix(): p.read_bytes() for p in sorted(store.rglob("*")) if p.is_file()}


def assert_byte_identical(a: Path, b: Path) -> None:
    fa, fb = _files(a), _files(b)
    assert sorted(fa) == sorted(fb) and len(fa) > 20
    assert [name for name in fa if fa[name] != fb[name]] == []


def assert_nothing_run_varying(store: Path) -> None:
    for meta in store.rglob("zarr.json"):
        text = meta.read_text()
        assert not TIMESTAMP.search(text), meta
        for word in ("created", "finished", "seconds", "runtime", "torch_version", socket.gethostname()):
            assert f'"{word}"' not in text, (meta, word)


def test_the_same_cli_command_twice_gives_identical_bytes(tmp_path):
    args = ["extract", "--dataset", "digits", "--model", "pixels", "--chunk-rows", "256", "--workers", "0"]
    stores = []
    for name, extra in (("one", []), ("two", ["--batch-size", "7"])):  # batch size is not part of the data
        out = tmp_path / name / "digits.zarr"
        result = runner.invoke(app, [*args, *extra, "--out", str(out)])
        assert result.exit_code == 0, result.output
        stores.append(out)
    assert_byte_identical(*stores)
    assert_nothing_run_varying(stores[0])
    log = read_log(stores[1])
    run = log["runs"][0]
    assert log_path(stores[1]) == tmp_path / "two" / "digits.zarr.log.json"
    assert run["batch_size"] == 7 and run["host"] == socket.gethostname() and run["status"] == "created"
    assert TIMESTAMP.match(run["started"]) and TIMESTAMP.match(run["finished"]) and run["seconds"] >= 0
    assert run["generation"] == read_meta(stores[1])[1].generation
    shown = runner.invoke(app, ["info", str(stores[1])])
    assert shown.exit_code == 0 and "extracted" in shown.output and "batch_size 7" in shown.output
    summary = json.loads(runner.invoke(app, ["info", str(stores[1]), "--json"]).stdout)
    assert summary["runtime"]["batch_size"] == 7 and summary["finished"] == run["finished"]
    assert summary["log"] == str(log_path(stores[1]))


def test_the_tiny_vit_twice_gives_identical_bytes(tmp_path, tiny_vit_checkpoint):
    """Also from a copy of the checkpoint elsewhere: the store records the weights' hash, not their path."""
    copy = tmp_path / "elsewhere" / "weights.safetensors"
    copy.parent.mkdir()
    copy.write_bytes(tiny_vit_checkpoint.read_bytes())
    stores = []
    for name, checkpoint in (("one", tiny_vit_checkpoint), ("two", copy)):
        out = tmp_path / name / "digits.zarr"
        run_extract(ExtractSpec(dataset="digits", model=TINY_VIT, checkpoint=str(checkpoint),
                                model_kwargs=TINY_VIT_KWARGS, out=str(out), chunk_rows=256, batch_size=64, workers=0,
                                device="cpu"))
        stores.append(out)
    assert_byte_identical(*stores)
    assert_nothing_run_varying(stores[0])
    weights = read_meta(stores[0])[1].encoder["weights"]
    assert weights["source"] == "checkpoint" and len(weights["sha256"]) == 64 and "path" not in weights
    assert read_log(stores[1])["runs"][0]["checkpoint"] == str(copy)
