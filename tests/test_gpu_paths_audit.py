"""The GPU code paths' faults, checked on the CPU with torch, fakes and monkeypatching: an out-of-memory error is not
"not positive definite", a failed factorisation's finite partial factor is refused, CuPy's factorisation runs under
``cupyx.errstate(linalg="raise")``, running out of memory is one line, ``predict --images`` encodes in the store's
precision, fp32 on CUDA turns TF32 off, and the GPU check's benchmarks keep their settings to themselves."""

from __future__ import annotations

import sys
import types
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from helpers import TINY_VIT, TINY_VIT_KWARGS, assert_one_line_error, make_image_tree
from typer.testing import CliRunner

from foal_pipe.cli import app
from foal_pipe.errors import FoalPipeError

torch = pytest.importorskip("torch")
xpt = pytest.importorskip("array_api_compat.torch")

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()


def _spd(d: int = 6) -> np.ndarray:
    B = np.random.default_rng(0).normal(size=(d, d))
    return B @ B.T + d * np.eye(d)


def _indefinite(d: int = 6) -> np.ndarray:
    A = _spd(d)
    A[3, 3] = -50.0  # the pivot of column 3 goes negative: potrf stops there
    return A


def _oom(*args, **kwargs):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has 0 bytes free.")


# --- 1. an out-of-memory error is no verdict on the matrix --------------------------------------------------------
def test_out_of_memory_in_the_factorisation_is_not_called_indefinite(monkeypatch):
    from foal_pipe.core.linalg import checked_solve, solve_spd
    from foal_pipe.heads.fecam import cholesky_factor

    A, Q = torch.from_numpy(_spd()), torch.ones(6, 2, dtype=torch.float64)
    monkeypatch.setattr(xpt.linalg, "cholesky", _oom)
    monkeypatch.setattr(xpt.linalg, "solve", _oom)
    with pytest.raises(torch.OutOfMemoryError):  # before: "G + gamma I is not positive definite ... larger gamma"
        solve_spd(A.clone(), Q)
    with pytest.raises(torch.OutOfMemoryError):  # before: None, fecam's dense path taken silently
        cholesky_factor(A)
    with pytest.raises(torch.OutOfMemoryError):
        checked_solve(A, Q, FoalPipeError("singular"))


def test_an_indefinite_matrix_is_still_refused_on_torch():
    """torch's own failed factorisation (``torch.linalg.LinAlgError``) is what is caught."""
    from foal_pipe.core.linalg import checked_solve, solve_spd
    from foal_pipe.heads.fecam import cholesky_factor

    A = torch.from_numpy(_indefinite())
    with pytest.raises(torch.linalg.LinAlgError):
        torch.linalg.cholesky(A)
    with pytest.raises(FoalPipeError, match="not positive definite at this gamma"):
        solve_spd(A.clone(), torch.ones(6, 2, dtype=torch.float64), "float64")
    assert cholesky_factor(A) is None
    singular = torch.zeros(3, 3, dtype=torch.float64)
    with pytest.raises(FoalPipeError, match="^singular$"):
        checked_solve(singular, torch.ones(3, 1, dtype=torch.float64), FoalPipeError("singular"))


# --- 2. a finite partial factor (what potrf leaves when it fails) is refused --------------------------------------
def _partial_factor(A: np.ndarray) -> np.ndarray:
    """LAPACK's potrf on an indefinite matrix: info > 0, every entry finite, a non-positive diagonal entry."""
    from scipy.linalg.lapack import dpotrf

    c, info = dpotrf(A, lower=1, clean=1)
    assert info == 4 and np.isfinite(c).all() and c[3, 3] <= 0
    return np.tril(c)


def test_a_finite_partial_factor_is_refused(monkeypatch):
    from foal_pipe.core.linalg import solve_spd
    from foal_pipe.heads.fecam import cholesky_factor

    A = _indefinite()
    partial = torch.from_numpy(_partial_factor(A))
    monkeypatch.setattr(xpt.linalg, "cholesky", lambda M: partial.clone())  # as CuPy without errstate returns it
    with pytest.raises(FoalPipeError, match="not positive definite at this gamma"):  # before: noise, returned
        solve_spd(torch.from_numpy(A.copy()), torch.ones(6, 2, dtype=torch.float64), "float64")
    assert cholesky_factor(torch.from_numpy(A)) is None  # before: the partial factor, used to score


def _fake_cupy(monkeypatch) -> tuple[types.ModuleType, list]:
    """A CuPy-like namespace (NumPy underneath) whose cholesky raises only under a fake ``cupyx.errstate(linalg=
    "raise")`` and otherwise returns potrf's partial factor, as CuPy does; the errstate calls are recorded."""
    calls: list = []
    state = {"raise": False}

    @contextmanager
    def errstate(**kwargs):
        calls.append(kwargs)
        before, state["raise"] = state["raise"], kwargs.get("linalg") == "raise"
        try:
            yield
        finally:
            state["raise"] = before

    def cholesky(A):
        try:
            return np.linalg.cholesky(A)
        except np.linalg.LinAlgError:
            if state["raise"]:
                raise
            return _partial_factor(A)

    monkeypatch.setitem(sys.modules, "cupyx", types.SimpleNamespace(errstate=errstate))
    xp = types.ModuleType("cupy")  # what array_api_compat's is_cupy_namespace recognises
    xp.all, xp.isfinite = np.all, np.isfinite
    xp.linalg = types.SimpleNamespace(cholesky=cholesky, diagonal=np.diagonal)
    return xp, calls


def test_cupy_factorises_under_errstate_raise(monkeypatch):
    from foal_pipe.core.linalg import cholesky_or_none

    xp, calls = _fake_cupy(monkeypatch)
    assert cholesky_or_none(xp, _indefinite()) is None
    assert calls == [{"linalg": "raise"}]
    L = cholesky_or_none(xp, _spd())
    np.testing.assert_array_equal(L, np.linalg.cholesky(_spd()))
    # without errstate (as if CuPy ignored it) the partial factor's diagonal still refuses it
    monkeypatch.setitem(sys.modules, "cupyx", types.SimpleNamespace(errstate=lambda **kw: contextmanager(lambda: (yield))()))
    assert cholesky_or_none(xp, _indefinite()) is None


# --- 3. running out of memory is one line ---------------------------------------------------------------------------
class OutOfMemoryError(MemoryError):
    """CuPy's allocation failure (``cupy.cuda.memory.OutOfMemoryError``), a MemoryError."""


OutOfMemoryError.__module__ = "cupy.cuda.memory"


@pytest.mark.parametrize(("error", "fragments"), [
    (MemoryError("Unable to allocate 7.45 GiB for an array with shape (1000000000,) and data type float64"),
     ["out of host memory (Unable to allocate 7.45 GiB", "a lower --max-memory", "a smaller --batch-size"]),
    (OutOfMemoryError("Out of memory allocating 8,000,000,000 bytes (allocated so far: 0 bytes)."),
     ["out of GPU memory (Out of memory allocating 8,000,000,000 bytes", "--backend numpy", "a lower --max-memory"]),
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79 GiB.\n"
                            "See documentation for Memory Management"),
     ["out of GPU memory (CUDA out of memory. Tried to allocate 2.00 GiB.)", "--backend numpy"]),
])
def test_running_out_of_memory_is_one_line(monkeypatch, tmp_path, error, fragments):
    import foal_pipe.protocol.entry as entry

    def learn(*args, **kwargs):
        raise error

    monkeypatch.setattr(entry, "learn", learn)
    (tmp_path / "s.zarr").mkdir()
    result = runner.invoke(app, ["learn", "--features", str(tmp_path / "s.zarr"), "--out", str(tmp_path / "run")])
    assert_one_line_error(result, *fragments)
    if isinstance(error, OutOfMemoryError | torch.OutOfMemoryError):
        assert "out of host memory" not in result.output


def test_other_runtime_errors_are_not_taken_for_memory(monkeypatch, tmp_path):
    import foal_pipe.protocol.entry as entry

    def learn(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(entry, "learn", learn)
    (tmp_path / "s.zarr").mkdir()
    result = runner.invoke(app, ["learn", "--features", str(tmp_path / "s.zarr"), "--out", str(tmp_path / "run")])
    assert isinstance(result.exception, RuntimeError) and "illegal memory access" in str(result.exception)


def test_extract_names_its_own_options(monkeypatch, tmp_path):
    import foal_pipe.extract as extract

    def run_extract(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 GiB.")

    monkeypatch.setattr(extract, "run_extract", run_extract)
    tree = make_image_tree(tmp_path / "images", {"cat": 1, "dog": 1}, test_per_class=1)
    result = runner.invoke(app, ["extract", "--dataset", "imagefolder", "--data-dir", str(tree), "--model", "pixels",
                                 "--out", str(tmp_path / "s.zarr")])
    assert_one_line_error(result, "out of GPU memory (CUDA out of memory. Tried to allocate 4.00 GiB.)",
                          "a smaller --batch-size", "a smaller --chunk-rows", "--device cpu")
    assert "--max-memory" not in result.output  # extract has no such option


# --- 4. predict --images encodes in the store's precision -----------------------------------------------------------
def test_images_of_a_bf16_store_give_its_features_bit_for_bit(tmp_path, tiny_vit_checkpoint, one_torch_thread):
    import csv
    import io

    import foal_pipe
    from foal_pipe.extract import ExtractSpec, run_extract
    from foal_pipe.store import open_store

    tree = make_image_tree(tmp_path / "images", {"cat": 4, "dog": 4}, test_per_class=3)
    store = tmp_path / "vit.zarr"
    run_extract(ExtractSpec(dataset="imagefolder", data_dir=str(tree), model=TINY_VIT, model_kwargs=TINY_VIT_KWARGS,
                            checkpoint=str(tiny_vit_checkpoint), out=str(store), device="cpu", precision="bf16",
                            workers=0, batch_size=6, chunk_rows=8))
    s = open_store(store)
    assert s.meta.encoder["precision"] == "bf16"
    learned = runner.invoke(app, ["learn", "--features", str(store), "--out", str(tmp_path / "run"), "--tasks", "1",
                                  "--projection-dim", "30"])
    assert learned.exit_code == 0, learned.output
    model = str(tmp_path / "run" / "model.safetensors")
    X = np.concatenate([x for _, x in s.test.iter_chunks()])
    paths = sorted((tree / "test").rglob("*.png"))
    features = foal_pipe.load_model(model).encode_images(paths, tiny_vit_checkpoint, batch_size=6)
    assert features.dtype == X.dtype
    np.testing.assert_array_equal(features, X)  # before: fp32 features, 7.5e-3 away
    by_store = runner.invoke(app, ["predict", "--model", model, "--features", str(store)])
    by_images = runner.invoke(app, ["predict", "--model", model, "--images", str(tree / "test"), "--checkpoint",
                                    str(tiny_vit_checkpoint), "--batch-size", "6"])
    assert by_store.exit_code == 0 and by_images.exit_code == 0, by_images.output
    a, b = (list(csv.DictReader(io.StringIO(r.stdout))) for r in (by_store, by_images))
    assert [r["score"] for r in a] == [r["score"] for r in b]


def test_a_store_without_a_recorded_precision_is_encoded_in_fp32(monkeypatch):
    from foal_pipe.extract.encoding import recorded_precision

    assert recorded_precision({"name": "x"}, "cpu") == "fp32"
    assert recorded_precision({"precision": "fp16"}, "cpu") == "fp16"
    with pytest.raises(FoalPipeError, match="records precision 'fp64'"):
        recorded_precision({"precision": "fp64"}, "cpu")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    with pytest.raises(FoalPipeError, match="extracted in bf16, which this GPU cannot compute"):
        recorded_precision({"precision": "bf16"}, "cuda")


# --- 5. fp32 on CUDA is fp32, not TF32 --------------------------------------------------------------------------------
@pytest.fixture
def tf32_on():
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.mark.parametrize(("device", "tf32"), [("cuda", False), ("cpu", True)])
def test_fp32_on_cuda_runs_without_tf32_and_gives_the_callers_back(tf32_on, device, tf32):
    """Inside the encoder's fp32 context (every forward pass runs in it) CUDA has TF32 off; after it, the caller's
    settings are back (a library caller's torch is left as it was)."""
    from foal_pipe.encoders.runtime import autocast

    with autocast(device, "fp32"):
        assert (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) == (tf32, tf32)
    assert (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) == (True, True)


def test_gpu_check_extract_part_restores_tf32(monkeypatch, tmp_path):
    sys.path.insert(0, str(REPO / "benchmarks"))
    import gpu_check

    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False

    def stop(*args):
        assert torch.backends.cuda.matmul.allow_tf32 is True  # on while the part runs on CUDA
        raise RuntimeError("stop here")

    monkeypatch.setattr(gpu_check, "_cuda", lambda: True)
    monkeypatch.setattr(gpu_check, "_random_h5", stop)
    try:
        with pytest.raises(RuntimeError, match="stop here"):
            gpu_check.part_extract(gpu_check.DRY, tmp_path, {})
        assert torch.backends.cuda.matmul.allow_tf32 is False  # before: left on for the parts after it
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


# --- 6. each CuPy first run of `scale` compiles into a kernel cache of its own ---------------------------------------
def test_scale_first_runs_each_start_from_an_empty_kernel_cache(monkeypatch, tmp_path):
    sys.path.insert(0, str(REPO / "benchmarks"))
    import gpu_scale

    seen: dict[str, tuple[str | None, bool]] = {}

    def run(args, out, limit, env=None):
        cache = (env or {}).get("CUPY_CACHE_DIR")
        seen[out.name] = (cache, cache is not None and Path(cache).exists())
        if cache is not None:  # what CuPy does: the kernels it compiles land in the cache
            Path(cache).mkdir(parents=True, exist_ok=True)
            (Path(cache) / "kernel.cubin").write_text("compiled")
        return {"wall_s": 1.0}

    monkeypatch.setitem(sys.modules, "synthetic", types.SimpleNamespace(make_store=lambda path, *a, **k: path))
    monkeypatch.setattr(gpu_scale, "_run", run)
    gpu_scale.part_scale(gpu_scale.SCALE_DRY, tmp_path, {}, lambda backend: None)
    firsts = {k: v for k, v in seen.items() if k.endswith("cupy-first")}
    assert len(firsts) == 4 and len({cache for cache, _ in firsts.values()}) == 4  # before: no cache of their own
    assert not any(existed for _, existed in firsts.values())
    for key, (cache, _) in firsts.items():
        assert seen[key.replace("first", "warm")] == (cache, True)  # the warm run reuses what its first compiled
    assert all(cache is None for k, (cache, _) in seen.items() if "cupy" not in k)

