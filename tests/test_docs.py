"""The docstring examples and the README's Python API example run as written."""

from __future__ import annotations

import doctest
import re
from pathlib import Path

import numpy as np
import pytest

import foal_pipe.core.projection
import foal_pipe.core.statistics
import foal_pipe.model.classifier
from foal_pipe.store import write_store

README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.mark.parametrize("module", [foal_pipe.model.classifier, foal_pipe.core.projection, foal_pipe.core.statistics])
def test_docstring_examples(module):
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0


def test_readme_python_api_example(tmp_path, monkeypatch):
    section = README.read_text().split("## Python API", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    rng = np.random.default_rng(0)
    x, y = rng.random((120, 64)).astype(np.float32), np.repeat(np.arange(10), 12)
    store = write_store(tmp_path / "digits.zarr", (x, y), (x[:30], y[:30]), [str(i) for i in range(10)], chunk_rows=50)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(code.replace("data/features/digits.zarr", str(store)), namespace)
    assert namespace["pred"].shape == (30,) and namespace["clf"].n_samples_seen_ == 120
