"""CLI audit 3: a number option's bad value named with its option and what it takes, readable argument names in
the usage lines, and ``--eval-every``'s points checked once per class order."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import assert_clean_error, invoke

from foal_pipe.store import write_store


def usage_error(result) -> str:
    """The one line of a usage error: exit 2, no traceback."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    return lines[0]


# --- 1: a value that is not a number names the option, the value and what it takes -------------------------------

@pytest.mark.parametrize(("args", "expected"), [
    (["learn", "--features", "x", "--out", "y", "--tasks", "abc"],
     "Error: --tasks 'abc' is not an integer; write e.g. --tasks 10; see `foal-pipe learn --help`"),
    (["learn", "--features", "x", "--out", "y", "--tasks", "1.5"],
     "Error: --tasks '1.5' is not an integer; write e.g. --tasks 10; see `foal-pipe learn --help`"),
    (["learn", "--features", "x", "--out", "y", "--eval-every", "ten"],
     "Error: --eval-every 'ten' is not an integer; write e.g. --eval-every 10; see `foal-pipe learn --help`"),
    (["sweep", "--features", "x", "--out", "y", "--batch-size", ""],
     "Error: --batch-size '' is not an integer; write e.g. --batch-size 10; see `foal-pipe sweep --help`"),
    (["sweep", "--features", "x", "--out", "y", "--shrinkage-offdiag", "abc"],
     "Error: --shrinkage-offdiag 'abc' is not a number; write e.g. --shrinkage-offdiag 0.5; see `foal-pipe sweep --help`"),
    (["learn", "--features", "x", "--out", "y", "--gamma-comp", "nope"],
     "Error: --gamma-comp 'nope' is not a number; write e.g. --gamma-comp 0.5; see `foal-pipe learn --help`"),
    (["table", "--features", "x", "--out", "y", "--seed", "z"],
     "Error: --seed 'z' is not an integer; write e.g. --seed 0; see `foal-pipe table --help`"),
    (["extract", "--dataset", "digits", "--out", "y", "--chunk-rows", "5x"],
     "Error: --chunk-rows '5x' is not an integer; write e.g. --chunk-rows 1024; see `foal-pipe extract --help`"),
    (["extract", "--dataset", "digits", "--out", "y", "--test-split", "x"],
     "Error: --test-split 'x' is not a number; write e.g. --test-split 0.5; see `foal-pipe extract --help`"),
    (["predict", "--model", "m", "--top-k", "q"],
     "Error: --top-k 'q' is not an integer; write e.g. --top-k 1; see `foal-pipe predict --help`"),
])
def test_a_bad_number_names_option_value_and_expectation(args, expected):
    assert usage_error(invoke(*args)) == expected


def test_other_usage_errors_keep_their_text():
    line = usage_error(invoke("learn", "--features", "x", "--out", "y", "--engine", "nope"))
    assert line.startswith("Error: Invalid value for '--engine': ") and "nope" in line


# --- 2: a required argument is its plain name in the usage line ---------------------------------------------------

@pytest.mark.parametrize(("command", "usage"), [
    ("info", "Usage: foal-pipe info [OPTIONS] STORE"),
    ("predict", "Usage: foal-pipe predict [OPTIONS] [IMAGES]..."),
    ("summary", "Usage: foal-pipe summary [OPTIONS] [PATHS]..."),
    ("learn", "Usage: foal-pipe learn [OPTIONS]"),
])
def test_usage_lines_name_arguments_plainly(command, usage):
    result = invoke(command, "--help")
    assert result.exit_code == 0, result.output
    first = next(line.strip() for line in result.output.splitlines() if "Usage:" in line)
    assert first == usage
    assert "{" not in first


def test_every_usage_line_is_free_of_braces():
    for command in ("extract", "info", "datasets", "learn", "sweep", "predict", "evaluate", "summary", "table"):
        result = invoke(command, "--help")
        assert result.exit_code == 0, result.output
        usage = next(line for line in result.output.splitlines() if "Usage:" in line)
        assert "{" not in usage, usage


def test_a_missing_argument_is_named_plainly():
    assert usage_error(invoke("info", "--json")) == "Error: Missing argument 'STORE'; see `foal-pipe info --help`"


# --- 3: --eval-every's points checked once per class order -----------------------------------------------------------

def make_store(path: Path, train: list[int], test: list[int], d: int = 16, seed: int = 0) -> Path:
    """A store of ``train[c]`` / ``test[c]`` rows of class c around its own mean."""
    rng = np.random.default_rng(seed)
    means = rng.normal(0, 1, size=(len(train), d))

    def split(counts: list[int]) -> tuple[np.ndarray, np.ndarray]:
        y = np.concatenate([np.full(n, c) for c, n in enumerate(counts)]).astype(np.int64)
        y = y[rng.permutation(len(y))]
        return (means[y] + rng.normal(0, 1.5, size=(len(y), d))).astype(np.float32), y

    write_store(path, split(train), split(test), [f"c{i}" for i in range(len(train))], chunk_rows=64)
    return path


@pytest.fixture(scope="module")
def uneven(tmp_path_factory) -> Path:
    """Nine classes of very different sizes: fecam's short points at --eval-every differ by order."""
    return make_store(tmp_path_factory.mktemp("uneven") / "s.zarr", [30, 5, 12, 40, 2, 25, 9, 17, 3],
                      [7, 3, 9, 5, 4, 11, 6, 2, 8], seed=3)


@pytest.fixture
def checked(monkeypatch) -> list[int]:
    """The class orders each call of check_points checks (wherever the run calls it from)."""
    from foal_pipe.protocol import capabilities, learnkinds, orders

    calls: list[int] = []
    original = capabilities.check_points

    def counting(head, labels, every, seeds=None, names=None):
        calls.append(len(labels))
        return original(head, labels, every, seeds, names)

    for module in (capabilities, learnkinds, orders):
        monkeypatch.setattr(module, "check_points", counting)
    return calls


def fecam(store: Path, out: Path, every: int, *orders: str):
    return invoke("learn", "--features", store, "--out", out, "--tasks", 3, "--head", "fecam", "--backend", "numpy",
                  "--eval-every", every, *orders)


def test_points_are_checked_once_per_order(tmp_path, uneven, checked):
    result = fecam(uneven, tmp_path / "o", 82, "--order-seeds", "1,2,3")
    assert result.exit_code == 0, result.output
    assert checked == [3]  # the three orders at once, before any work; no walk checks its own again


def test_one_order_is_checked_once(tmp_path, uneven, checked):
    result = fecam(uneven, tmp_path / "o", 82, "--order-seed", "1")
    assert result.exit_code == 0, result.output
    assert checked == [1]


def test_short_points_are_still_refused_for_one_and_many_orders(tmp_path, uneven, checked):
    many = fecam(uneven, tmp_path / "m", 7, "--order-seeds", "1,2,3")
    assert_clean_error(many, "--head fecam needs 2 training rows of every class seen, but in class order seed 1 at the "
                       "point after 7 rows class", tmp_path / "m")
    one = fecam(uneven, tmp_path / "a", 7, "--order-seed", "1")
    assert_clean_error(one, "--head fecam needs 2 training rows of every class seen, but at the point after 7 rows class",
                       tmp_path / "a")
    assert checked == [3, 1]
