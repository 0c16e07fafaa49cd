"""``learn --order-seeds`` with ``--eval-every`` longer than one order's stream: the refusal names that order's seed
and its rows (orders of a Si-Blurry stream with ``--drop-last`` stream different row counts)."""

from __future__ import annotations

import json

import pytest
from helpers import assert_clean_error, build_store, invoke

ARGS = ("--stream", "si-blurry", "--tasks", "4", "--batch-size", "7", "--drop-last", "--projection-dim", "20",
        "--seed", "3", "--backend", "numpy")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return build_store(tmp_path_factory.mktemp("every") / "a.zarr", n_train=600)


def _rows(store, seed, out):
    """The rows order ``seed`` streams (None: ``--drop-last`` empties one of its tasks, a refusal of its own)."""
    result = invoke("learn", "--features", store, "--out", out, "--order-seed", seed, *ARGS)
    return json.loads((out / "metrics.json").read_text())["n_train_seen"] if result.exit_code == 0 else None


def test_the_refusal_names_the_order_whose_stream_is_shorter(store, tmp_path):
    rows = {seed: n for seed in range(8) if (n := _rows(store, seed, tmp_path / f"o{seed}")) is not None}
    short, long = min(rows, key=rows.get), max(rows, key=rows.get)
    assert rows[short] < rows[long]  # the orders stream different row counts, or the check below proves nothing
    every = rows[short] + 1
    result = invoke("learn", "--features", store, "--out", tmp_path / "both", "--order-seeds", f"{long},{short}",
                    "--eval-every", every, *ARGS)
    assert_clean_error(result, f"--eval-every {every} is more than class order seed {short}'s {rows[short]} training "
                       f"rows, so nothing would be evaluated; pass at most --eval-every {rows[short]}", tmp_path / "both")
    fine = invoke("learn", "--features", store, "--out", tmp_path / "ok", "--order-seeds", f"{long},{short}",
                  "--eval-every", rows[short], *ARGS)
    assert fine.exit_code == 0, fine.output
