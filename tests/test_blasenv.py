"""OpenBLAS's idle threads sleep soon after a product (foal_pipe.blasenv): the setting is made before NumPy loads
OpenBLAS, what the environment sets is kept, and a process that imported NumPy first is left as it is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import foal_pipe.blasenv as blasenv

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def fresh(monkeypatch):
    """A process as it starts: neither NumPy nor SciPy imported, neither variable set."""
    for name in ("numpy", "scipy"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    for name in blasenv.TIMEOUT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_the_timeout_is_set_where_the_environment_leaves_it_unset(fresh):
    blasenv.blas_environment()
    assert os.environ["OPENBLAS_THREAD_TIMEOUT"] == blasenv.OPENBLAS_THREAD_TIMEOUT == "4"


@pytest.mark.parametrize("name", blasenv.TIMEOUT_VARIABLES)
def test_a_timeout_the_user_set_is_kept(fresh, name):
    fresh.setenv(name, "20")
    blasenv.blas_environment()
    assert os.environ[name] == "20"
    assert name == "OPENBLAS_THREAD_TIMEOUT" or "OPENBLAS_THREAD_TIMEOUT" not in os.environ


@pytest.mark.parametrize("loaded", ["numpy", "scipy"])
def test_a_process_that_loaded_openblas_first_is_left_as_it_is(fresh, loaded):
    fresh.setitem(sys.modules, loaded, object())  # imported before foal_pipe was: OpenBLAS has read its setting
    blasenv.blas_environment()
    assert "OPENBLAS_THREAD_TIMEOUT" not in os.environ


SEEN_AT_NUMPY = """
import importlib.abc, json, os, sys
seen = {}
class Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name in ("numpy", "scipy") and name not in seen:
            seen[name] = os.environ.get("OPENBLAS_THREAD_TIMEOUT")
        return None
sys.meta_path.insert(0, Watch())
import foal_pipe.cli, numpy, scipy.linalg
print(json.dumps(seen))
"""


@pytest.mark.parametrize(("given", "seen"), [(None, "4"), ("20", "20")])
def test_numpy_and_scipy_load_openblas_with_the_setting(given, seen):
    """Both load their own OpenBLAS, which reads the variable then: it must be in the environment by the time either
    is first imported, as the command line imports them."""
    env = {k: v for k, v in os.environ.items() if k not in blasenv.TIMEOUT_VARIABLES}
    if given is not None:
        env["OPENBLAS_THREAD_TIMEOUT"] = given
    proc = subprocess.run([sys.executable, "-c", SEEN_AT_NUMPY], capture_output=True, text=True, timeout=120, cwd=REPO,
                          env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == {"numpy": seen, "scipy": seen}
