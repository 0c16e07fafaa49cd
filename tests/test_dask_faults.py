"""``--scheduler dask`` faults: the same bytes every run, a damaged chunk or a lost cluster named in one line (no
tracebacks, not even the workers'), options that would be ignored refused, nothing left behind by a refused extract,
and the Python API's execution settings checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

distributed = pytest.importorskip("distributed")

from helpers import cluster_store, write_nonfinite_store  # noqa: E402

from foal_pipe.cli import app  # noqa: E402
from foal_pipe.errors import FoalPipeError  # noqa: E402

pytestmark = pytest.mark.slow  # local Dask clusters

runner = CliRunner()
N_CLASSES, DIM, CHUNK = 10, 24, 50
COMMON = ("--tasks", "4", "--projection-dim", "120", "--seed", "3", "--backend", "numpy")
OUTPUTS = ("model.safetensors", "metrics.json")


def invoke(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def one_error_line(output: str) -> str:
    """The single ``Error:`` line of a refused command (and no traceback anywhere)."""
    assert "Traceback" not in output, output
    errors = [line for line in output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, output
    return errors[0]


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                                  silence_logs=50) as c:
        yield c


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """60 chunks of 50 train rows: with one chunk per block, 60 block tasks finish in a varying order."""
    return cluster_store(tmp_path_factory.mktemp("faults") / "s.zarr", N_CLASSES, DIM, 400, CHUNK, seed=7)


def flipped(store: Path, tmp_path: Path, chunk: int = 5) -> Path:
    """A copy of ``store`` with one byte of a train chunk flipped (same size: only its CRC-32C tells)."""
    import shutil

    bad = tmp_path / "bad.zarr"
    shutil.copytree(store, bad)
    with open(bad / "train" / "features" / "c" / str(chunk) / "0", "r+b") as f:
        f.seek(200)
        byte = f.read(1)
        f.seek(200)
        f.write(bytes([byte[0] ^ 255]))
    return bad


# ---------------------------------------------------------------------------------------------------------
# F1: the reduction order is a function of the chunk index, so the bytes are the same every run
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13, 16, 31])
def test_tree_sum_is_a_fixed_tree_over_the_index(n):
    """The tree of the parts (shown as a parenthesised string) depends on their index alone: summing aligned blocks of
    2^b parts, then the blocks' totals, gives the same tree; parts that are None (empty) add nothing."""
    from foal_pipe.protocol.distributed import tree_sum

    def add(a, b):
        return f"({a}+{b})"

    parts = [None if k % 7 == 3 else str(k) for k in range(n)]
    whole = tree_sum(parts, add)
    for b in range(4):
        size = 2**b
        blocks = [tree_sum(parts[i : i + size], add) for i in range(0, n, size)]
        assert tree_sum(blocks, add) == whole, b
    if n == 5:
        assert whole == "(((0+1)+2)+4)"  # part 3 is None


def test_dask_learn_gives_the_same_bytes_every_run_and_on_any_number_of_workers(store, cluster, tmp_path, monkeypatch):
    """60 one-chunk blocks, whose tasks finish in a varying order, twice on two workers and once on one: the model and
    metrics byte-identical (the partials were added in the order they finished, so the last bits moved run to run);
    and within 1e-9 of the single-process run."""
    from safetensors.numpy import load_file

    import foal_pipe.protocol.distributed as dist

    monkeypatch.setattr(dist, "BLOCK_BYTES", 1)  # one chunk per block
    assert dist.block_rows(3000, DIM, 8, CHUNK) == CHUNK
    address = ("--scheduler", "dask", "--dask-address", cluster.scheduler_address)
    for name in ("a", "b"):
        result = invoke("learn", "--features", store, "--out", tmp_path / name, *COMMON, *address)
        assert result.exit_code == 0, result.output
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0",
                                  silence_logs=50) as one:
        result = invoke("learn", "--features", store, "--out", tmp_path / "c", *COMMON, "--scheduler", "dask",
                        "--dask-address", one.scheduler_address)
    assert result.exit_code == 0, result.output
    for name in OUTPUTS:
        first = (tmp_path / "a" / name).read_bytes()
        assert (tmp_path / "b" / name).read_bytes() == first, name
        assert (tmp_path / "c" / name).read_bytes() == first, name
    local = invoke("learn", "--features", store, "--out", tmp_path / "local", *COMMON)
    assert local.exit_code == 0, local.output
    w_local, w_dask = load_file(tmp_path / "local/model.safetensors"), load_file(tmp_path / "a/model.safetensors")
    for key in ("W", "G", "Q"):
        assert np.abs(w_local[key]).max() > 1.0
        np.testing.assert_allclose(w_dask[key], w_local[key], rtol=0, atol=1e-9, err_msg=key)
    m_local, m_dask = (json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("local", "a"))
    assert m_dask["accuracy_matrix"] == m_local["accuracy_matrix"] and 0.5 < m_local["A_last"] < 1.0


def test_blocks_are_sized_by_the_store_alone():
    """Whole chunks, at most BLOCK_BYTES, at least MIN_BLOCKS blocks where the chunks allow: no worker count."""
    import foal_pipe.protocol.distributed as dist

    assert dist.block_rows(3000, DIM, 8, CHUNK) == 8 * CHUNK  # 60 chunks: 8 a block makes 8 blocks
    assert dist.block_rows(200, DIM, 8, CHUNK) == CHUNK  # 4 chunks: one each
    big = dist.BLOCK_BYTES // (4096 * 768 * 4)
    assert dist.block_rows(10**7, 768, 4, 4096) == 4096 * big  # the byte bound


# ---------------------------------------------------------------------------------------------------------
# F2: a chunk that fails its checksum on a worker is named, as in a local run
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["learn", "sweep"])
def test_a_flipped_byte_is_named_under_dask_as_locally(store, cluster, tmp_path, command):
    bad = flipped(store, tmp_path)
    local = invoke(command, "--features", bad, "--out", tmp_path / "local", *COMMON)
    dask = invoke(command, "--features", bad, "--out", tmp_path / "dask", *COMMON, "--scheduler", "dask",
                  "--dask-address", cluster.scheduler_address)
    assert local.exit_code == dask.exit_code == 1, dask.output
    line = one_error_line(dask.output)
    assert line == one_error_line(local.output)
    assert "train/features chunk at rows 250-299 is damaged (checksum mismatch)" in line
    assert not (tmp_path / "dask").exists()


# ---------------------------------------------------------------------------------------------------------
# F3: a cluster lost under the run is one line, the outputs untouched
# ---------------------------------------------------------------------------------------------------------
def test_a_cluster_lost_mid_run_is_one_line(store, tmp_path, monkeypatch):
    """The scheduler and workers are really shut down once the first block has finished."""
    real = distributed.as_completed
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                                  silence_logs=50) as doomed:

        def as_completed(futures, *args, **kwargs):
            for k, future in enumerate(real(futures, *args, **kwargs)):
                if k == 1:
                    doomed.close()
                yield future

        import foal_pipe.protocol.distributed as dist

        monkeypatch.setattr(dist, "BLOCK_BYTES", 1)  # 60 blocks
        monkeypatch.setattr(distributed, "as_completed", as_completed)
        out = tmp_path / "out"
        out.mkdir()
        (out / "metrics.json").write_text("previous")
        result = invoke("learn", "--features", store, "--out", out, *COMMON, "--scheduler", "dask",
                        "--dask-address", doomed.scheduler_address)
    assert result.exit_code == 1, result.output
    line = one_error_line(result.output)
    assert "the Dask cluster failed during the run" in line and "previous outputs are unchanged" in line
    assert sorted(p.name for p in out.iterdir()) == ["metrics.json"] and (out / "metrics.json").read_text() == "previous"


def test_a_head_read_whose_cluster_is_lost_is_one_line(store, cluster, tmp_path, monkeypatch):
    """``learn --head`` reads through the cluster (ClusterSplit): a future that reports a lost worker stops it in one
    line."""
    from distributed.scheduler import KilledWorker

    def lost(self, *args, **kwargs):
        raise KilledWorker("read_chunks-0", "tcp://127.0.0.1:1", 3)

    monkeypatch.setattr(distributed.Future, "result", lost)
    result = invoke("learn", "--features", store, "--out", tmp_path / "o", "--tasks", "4", "--backend", "numpy",
                    "--head", "ncm", "--scheduler", "dask", "--dask-address", cluster.scheduler_address)
    assert result.exit_code == 1, result.output
    assert "the Dask cluster failed during the run (KilledWorker)" in one_error_line(result.output)
    assert not (tmp_path / "o").exists()


def test_lost_cluster_errors_of_every_kind_are_one_line(store, cluster, monkeypatch):
    """Each error distributed reports a lost cluster with, raised by the reduction, becomes the one-line error."""
    from distributed.client import FutureCancelledError, FuturesCancelledError
    from distributed.comm.core import CommClosedError

    import foal_pipe.protocol.distributed as dist
    from foal_pipe.model.projection import SmoothProjection
    from foal_pipe.store import open_store

    train = open_store(store).train
    projection = SmoothProjection(n_components=8, random_state=1).fit(np.zeros((1, DIM)))
    groups = np.zeros(train.n_rows, dtype=np.int64)
    with distributed.Client(cluster.scheduler_address) as client:
        for exc in (FuturesCancelledError([]), FutureCancelledError("k", "scheduler-connection-lost"),
                    CommClosedError("in <TCP>"), distributed.client.ClosedClientError()):
            def fail(*args, _exc=exc, **kwargs):
                raise _exc

            monkeypatch.setattr(dist, "reduce_tree", fail)
            with pytest.raises(FoalPipeError, match="the Dask cluster failed during the run") as caught:
                dist.dask_statistics(client, str(store), groups, 1, train.labels, projection, step=100)
            assert type(exc).__name__ in str(caught.value) and "\n" not in str(caught.value)


def test_a_cluster_lost_as_the_projection_is_sent_is_one_line(store, cluster, tmp_path, monkeypatch):
    """The projection's broadcast (before any block) was outside the handling: a traceback."""
    from distributed.comm.core import CommClosedError

    def lost(*args, **kwargs):
        raise CommClosedError("in <TCP>")

    monkeypatch.setattr(distributed.Client, "scatter", lost)
    result = invoke("learn", "--features", store, "--out", tmp_path / "r", *COMMON, "--scheduler", "dask",
                    "--dask-address", cluster.scheduler_address)
    assert result.exit_code == 1
    assert one_error_line(result.output).startswith("Error: the Dask cluster failed during the run (CommClosedError)")
    assert not (tmp_path / "r").exists()


# ---------------------------------------------------------------------------------------------------------
# F4: no worker tracebacks on stderr when the command ends with a clean error
# ---------------------------------------------------------------------------------------------------------
def test_a_worker_failure_prints_one_line_and_no_worker_traceback(tmp_path):
    """A real process (the workers write to its stderr): NaN features found on a worker."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(400, 8)), np.arange(400) % 4
    x[257, 3] = np.nan
    path = write_nonfinite_store(tmp_path / "nan.zarr", (x, y), (x[:40], y[:40]), list("abcd"), chunk_rows=50)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    command = ["learn", "--features", str(path), "--out", str(tmp_path / "o"), "--tasks", "2", "--backend", "numpy",
               "--scheduler", "dask", "--workers", "2"]
    done = subprocess.run([sys.executable, "-c", "from foal_pipe.cli import main; main()", *command],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 1, done.stderr
    text = done.stdout + done.stderr
    assert "row: 257" in one_error_line(text)
    noise = [line for line in done.stderr.splitlines() if line.strip() and "rows/s" not in line and "rows (" not in line
             and not line.startswith("Error:")]
    assert noise == [], noise  # no "Compute Failed", no worker traceback
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------------------------------------------------
# F5, F6: extract refuses what it would ignore, and a refusal leaves nothing behind
# ---------------------------------------------------------------------------------------------------------
EXTRACT = ("extract", "--dataset", "digits", "--model", "pixels", "--chunk-rows", "128", "--device", "cpu")


def test_extract_refuses_options_it_would_ignore(tmp_path):
    result = invoke(*EXTRACT, "--out", tmp_path / "a.zarr", "--dask-address", "tcp://127.0.0.1:1")
    assert result.exit_code == 1
    assert "--dask-address acts only with --scheduler dask" in one_error_line(result.output)
    result = invoke(*EXTRACT, "--out", tmp_path / "a.zarr", "--scheduler", "dask", "--dask-address",
                    "tcp://127.0.0.1:1", "--workers", "7")
    assert result.exit_code == 1
    assert "--workers acts only with --scheduler local or --dask-address local" in one_error_line(result.output)
    assert list(tmp_path.iterdir()) == []


def test_extract_dask_api_refuses_workers_with_a_remote_cluster(tmp_path):
    from foal_pipe.extract import ExtractSpec
    from foal_pipe.extract.distributed import dask_extract

    spec = ExtractSpec(dataset="digits", model="pixels", out=str(tmp_path / "a.zarr"), chunk_rows=128, workers=0,
                       device="cpu")
    with pytest.raises(FoalPipeError, match="has its own workers"):
        dask_extract(spec, address="tcp://127.0.0.1:1", workers=3)
    assert list(tmp_path.iterdir()) == []


def test_a_refused_dask_extract_leaves_nothing_behind(tmp_path):
    """--workers 0 and an address that is no scheduler: refused before the store is created or replaced."""
    for bad in (("--workers", "0"), ("--dask-address", "nonsense")):
        result = invoke(*EXTRACT, "--out", tmp_path / "new.zarr", "--scheduler", "dask", *bad)
        assert result.exit_code == 1
        one_error_line(result.output)
        assert list(tmp_path.iterdir()) == [], bad
    made = invoke(*EXTRACT, "--out", tmp_path / "d.zarr", "--workers", "0")
    assert made.exit_code == 0, made.output
    before = {p.relative_to(tmp_path): p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()}
    for bad in (("--workers", "0"), ("--dask-address", "nonsense")):
        result = invoke(*EXTRACT, "--out", tmp_path / "d.zarr", "--overwrite", "--scheduler", "dask", *bad)
        assert result.exit_code == 1
        one_error_line(result.output)
        after = {p.relative_to(tmp_path): p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()}
        assert after == before, bad
        assert sorted(p.name for p in tmp_path.iterdir()) == ["d.zarr", "d.zarr.log.json"]


# ---------------------------------------------------------------------------------------------------------
# F9: ExecutionConfig checks its fields
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("kwargs", "message"), [
    ({"scheduler": "dask", "workers": "2"}, "workers must be at least 1 (an integer), got '2'"),
    ({"scheduler": "dask", "workers": 1.5}, "workers must be at least 1 (an integer), got 1.5"),
    ({"scheduler": "dask", "workers": None}, "workers must be at least 1 (an integer), got None"),
    ({"scheduler": "dask", "workers": True}, "workers must be at least 1 (an integer), got True"),
    ({"scheduler": "dask", "workers": 0}, "workers must be at least 1 (an integer), got 0"),
    ({"scheduler": "dask", "dask_address": 5}, "dask_address must be 'local' or a scheduler address"),
    ({"scheduler": "ray"}, "scheduler must be local or dask, got 'ray'"),
    ({"scheduler": None}, "scheduler must be local or dask, got None"),
    ({"backend": 1}, "backend must be a backend name, got 1"),
    ({"max_memory": -1}, "max_memory must be at least 0 (an integer), got -1"),
    ({"max_memory": "8GiB"}, "max_memory must be at least 0 (an integer), got '8GiB'"),
])
def test_execution_config_refuses_bad_fields_in_one_line(kwargs, message):
    from foal_pipe.protocol.config import ExecutionConfig

    with pytest.raises(FoalPipeError) as caught:
        ExecutionConfig(**kwargs)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    ok = ExecutionConfig(scheduler="dask", workers=np.int64(3), dask_address=None)
    assert ok.workers == 3
