"""The twenty-fifth stop's last fixes: JSON on stdout in any locale and under FORCE_COLOR, a store's run log and
`predict --images`' CSV naming paths by their bytes in any locale, one encoder load for threads sharing a model.

Each test fails before its fix: `info --json` died with a UnicodeEncodeError under LC_ALL=C (PYTHONUTF8=0) on a store
of non-ASCII class names, and wrote ANSI colour codes into a pipe under FORCE_COLOR (jq refuses them); the log's
"store" and the CSV's path column were the locale's decoding of the bytes ("sÃ¼.zarr" under ISO-8859-1); threads
asking a DeployedModel for its encoder at once each built and loaded one; a local Dask run left its workers' settings
(OPENBLAS_NUM_THREADS=1, PYTHONHASHSEED, ...) in the process's environment, so that every subprocess started after it
ran its BLAS on one thread (in the suite, a later test's subprocess scored other last bits than the same command run
in-process).
"""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import invoke, make_image_tree
from test_audit_environ_s25 import ASCII, _latin1
from test_audit_images_s25 import _model

CLI = [sys.executable, "-c", "from foal_pipe.cli import main; main()"]
PIXELS = ("--model", "pixels", "--image-size", "8", "--workers", "0", "--device", "cpu")


def _run(args: list, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, timeout=300, env=os.environ | env)


def _cafe_store(tmp_path: Path) -> Path:
    images = make_image_tree(tmp_path / "images", {"café": 3, "dog": 3})
    out = tmp_path / "s.zarr"
    assert invoke("extract", "--dataset", "imagefolder", "--data-dir", str(images), *PIXELS, "--out", str(out)).exit_code == 0
    return out


def test_info_json_of_non_ascii_class_names_under_the_c_locale(tmp_path):
    """`info --json` of a store whose classes are ["café", "dog"], stdout in ASCII (LC_ALL=C, PYTHONUTF8=0): valid
    JSON holding the names (escaped), exit 0; before, rich wrote "é" raw and the command died with a traceback."""
    store = _cafe_store(tmp_path)
    done = _run(["info", store, "--json"], ASCII)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert b"Traceback" not in done.stderr
    assert json.loads(done.stdout.decode("ascii"))["classes"] == ["café", "dog"]


def test_json_on_a_pipe_is_plain_under_force_color(tmp_path):
    """FORCE_COLOR=1 (CI runners set it) with stdout a pipe: `info --json` and `datasets --json` write plain JSON, the
    bytes they write without it; before, rich coloured the keys and values with ANSI escapes, which no JSON reader
    takes."""
    store = _cafe_store(tmp_path)
    for args in (["info", store, "--json"], ["datasets", "--json"]):
        coloured, plain = _run(args, {"FORCE_COLOR": "1"}), _run(args, {"NO_COLOR": "1"})
        assert coloured.returncode == plain.returncode == 0, coloured.stderr.decode()
        assert b"\x1b[" not in coloured.stdout
        assert coloured.stdout == plain.stdout
        json.loads(coloured.stdout)


def test_the_store_log_names_the_store_by_its_bytes_under_latin1(tmp_path):
    """`extract --out sü.zarr` under an ISO-8859-1 locale: the run log beside the store names it "sü.zarr", as in a
    UTF-8 locale; before, "sÃ¼.zarr" (the locale's decoding of the UTF-8 bytes)."""
    env = _latin1(tmp_path)
    images = make_image_tree(tmp_path / "images", {"a": 3, "b": 3})
    out = tmp_path / "sü.zarr"  # passed as its UTF-8 bytes, which the child decodes as ISO-8859-1
    done = _run(["extract", "--dataset", "imagefolder", "--data-dir", images, *PIXELS, "--out", out], env)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    log = json.loads(Path(f"{out}.log.json").read_text(encoding="utf-8"))
    assert log["store"] == "sü.zarr"


def test_predict_images_csv_paths_are_their_bytes_under_latin1(tmp_path):
    """`predict --images DIR --out p.csv` of a folder named "café" under ISO-8859-1: the path column holds the path's
    UTF-8 bytes ("café/..."), as in a UTF-8 locale; before, "cafÃ©" written as UTF-8."""
    env = _latin1(tmp_path)
    model = _model(tmp_path)
    folder = tmp_path / "café"
    make_image_tree(tmp_path / "tree", {"x": 2})
    folder.mkdir()
    for png in sorted((tmp_path / "tree" / "train" / "x").iterdir()):
        (folder / png.name).write_bytes(png.read_bytes())
    out = tmp_path / "p.csv"
    done = _run(["predict", "--model", model, "--images", folder, "--out", out], env)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    rows = list(csv.DictReader(io.StringIO(out.read_text(encoding="utf-8"))))
    assert rows and all(row["path"].startswith(str(folder) + "/") for row in rows), [row["path"] for row in rows]


def test_threads_asking_for_the_encoder_load_it_once(tmp_path, monkeypatch):
    """Four threads calling `DeployedModel.encoder()` at once get one encoder, built and loaded once; before, each
    thread that found none yet built its own (four loads of the weights, three thrown away)."""
    import foal_pipe
    import foal_pipe.model.deploy as deploy

    model = foal_pipe.load_model(_model(tmp_path))
    built: list[object] = []

    def slow_build(*args, **kwargs):
        time.sleep(0.2)  # a load's time: the other threads arrive meanwhile
        built.append(object())
        return built[-1]

    monkeypatch.setattr(deploy, "build_recorded_encoder", slow_build)
    got: list[object] = []
    threads = [threading.Thread(target=lambda: got.append(model.encoder())) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(built) == 1 and len(got) == 4 and all(encoder is built[0] for encoder in got)
    assert np.array_equal(model.predict(np.zeros((1, 192))), model.predict(np.zeros((1, 192))))


@pytest.mark.slow
def test_a_local_dask_cluster_leaves_the_environment_as_it_found_it(monkeypatch):
    """`dask_client("local")` (what `--dask-address local` runs) starts its workers with their own settings and gives
    the process its environment back on leaving: nothing added, nothing changed."""
    pytest.importorskip("distributed")
    from foal_pipe.cluster import dask_client

    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "PYTHONHASHSEED"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")  # one the nannies set, set otherwise here
    before = dict(os.environ)
    with dask_client("local", 1) as client:
        assert client.submit(lambda: os.environ.get("OMP_NUM_THREADS")).result() == "1"  # the workers' own setting
    assert dict(os.environ) == before
