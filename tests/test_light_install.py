"""Without torch, torchvision or timm (``pip install -e .`` without the ``extract`` extra): a timm model is
one line naming the install command, and ``--model pixels`` extracts digits in NumPy alone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from foal_pipe.cli import app
from foal_pipe.store import open_store, read_log

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
runner = CliRunner()

HIDDEN = """
import sys

class Hidden:  # `import torch` (or a submodule) raises ModuleNotFoundError, as on a machine without it
    names = set(sys.argv[1].split(","))

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Hidden())
sys.argv = ["foal-pipe", *sys.argv[2:]]
from foal_pipe.cli import main
main()
"""


def _without(modules: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", HIDDEN, modules, *args], env=ENV, capture_output=True, text=True,
                          timeout=300)


def _message(missing: str) -> str:
    return (f"Error: --model vit_tiny_patch16_224 needs torch, torchvision and timm (not installed: {missing}); "
            "run pip install -e '.[extract]' in the foal-pipe clone, or use --model pixels (which needs none of them)")


@pytest.mark.parametrize("hidden", ["timm", "torchvision,timm"])
def test_a_timm_model_without_the_extract_extra_is_one_line(tmp_path, monkeypatch, hidden):
    for name in hidden.split(","):
        monkeypatch.setitem(sys.modules, name, None)  # `import timm` raises ImportError in this process
    out = tmp_path / "x.zarr"
    result = runner.invoke(app, ["extract", "--model", "vit_tiny_patch16_224", "--out", str(out), "--workers", "0"])
    assert result.exit_code == 1, result.output
    assert result.output.strip() == _message(hidden.replace(",", ", "))
    assert not out.exists()


def test_a_timm_model_without_torch_is_one_line(tmp_path):
    out = tmp_path / "x.zarr"
    proc = _without("torch,torchvision,timm", "extract", "--model", "vit_tiny_patch16_224", "--out", str(out))
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert " ".join(proc.stderr.split()) == _message("torch, torchvision, timm")
    assert not out.exists()


def test_pixels_on_digits_runs_without_torch(tmp_path):
    without = tmp_path / "light.zarr"
    proc = _without("torch,torchvision,timm", "extract", "--model", "pixels", "--out", str(without),
                    "--chunk-rows", "512")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "wrote" in proc.stdout and "train 1,442 x 192" in proc.stdout
    with_torch = tmp_path / "full.zarr"
    result = runner.invoke(app, ["extract", "--model", "pixels", "--out", str(with_torch), "--chunk-rows", "512",
                                 "--workers", "0"])
    assert result.exit_code == 0, result.output
    light, full = open_store(without), open_store(with_torch)
    for split in ("train", "test"):
        a, b = np.asarray(light.split(split).features[:]), np.asarray(full.split(split).features[:])
        assert a.dtype == b.dtype == np.float32 and a.tobytes() == b.tobytes()
    assert read_log(without)["runs"][-1]["torch_version"] is None


def test_cuda_without_torch_names_the_install(tmp_path):
    proc = _without("torch,torchvision,timm", "extract", "--model", "pixels", "--device", "cuda", "--out",
                    str(tmp_path / "c.zarr"))
    assert proc.returncode == 1
    assert "Error: --device cuda needs torch, which is not installed; run pip install -e '.[extract]' in the foal-pipe clone" \
        in " ".join(proc.stderr.split())
    assert "Traceback" not in proc.stderr


def test_resizing_without_torch_stays_in_the_workers(tmp_path):
    """`--resize-on auto` resizes with PIL in the workers on a light install; asking for the device names torch."""
    auto = _without("torch,torchvision,timm", "extract", "--model", "pixels", "--image-size", "12", "--chunk-rows",
                    "512", "--out", str(tmp_path / "auto.zarr"))
    assert auto.returncode == 0, auto.stderr[-3000:]
    assert "train 1,442 x 432" in auto.stdout and read_log(tmp_path / "auto.zarr")["runs"][-1]["resize_on"] == "workers"
    device = _without("torch,torchvision,timm", "extract", "--model", "pixels", "--image-size", "12", "--resize-on",
                      "device", "--out", str(tmp_path / "device.zarr"))
    assert device.returncode == 1 and "Traceback" not in device.stderr
    assert ("Error: --resize-on device needs torch, which is not installed: pip install -e '.[extract]' in the foal-pipe "
            "clone; use "
            "--resize-on workers (or auto)") in " ".join(device.stderr.split())


WATCHED = """
import atexit, sys
atexit.register(lambda: print("torch imported:", "torch" in sys.modules, file=sys.stderr))
sys.argv = ["foal-pipe", *sys.argv[1:]]
from foal_pipe.cli import main
main()
"""


def test_pixels_extraction_never_imports_torch(tmp_path):
    """With torch installed, `extract --model pixels` (device auto, worker processes or none) leaves it alone:
    the light path reads the same batches, so the store is the same bytes."""
    stores = {}
    for workers in ("2", "0"):
        stores[workers] = tmp_path / f"w{workers}.zarr"
        proc = subprocess.run([sys.executable, "-c", WATCHED, "extract", "--model", "pixels", "--out",
                               str(stores[workers]), "--workers", workers, "--chunk-rows", "256", "--batch-size", "16"],
                              env=ENV, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stderr.strip().splitlines()[-1] == "torch imported: False"
        assert read_log(stores[workers])["runs"][-1]["torch_version"] is None
    pooled, inline = open_store(stores["2"]), open_store(stores["0"])
    assert pooled.meta.generation == inline.meta.generation
    for split in ("train", "test"):
        a, b = np.asarray(pooled.split(split).features[:]), np.asarray(inline.split(split).features[:])
        assert a.tobytes() == b.tobytes()
