"""The stream and metrics audit (session 21): an accuracy matrix holding text, booleans or complex numbers is refused
by the summaries, not cast by NumPy into an accuracy ("0.5" -> 0.5, True -> 1.0, 0.5+1j -> 0.5)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from foal_pipe.core.metrics import summarize, summarize_seen
from foal_pipe.errors import FoalPipeError


@pytest.mark.parametrize("function", [summarize, summarize_seen])
@pytest.mark.parametrize("entry", ["0.5", True, np.True_, 0.5 + 1j, np.complex128(0.5), None, b"0.5"])
def test_summaries_refuse_entries_that_are_not_real_numbers(function, entry):
    with pytest.raises(FoalPipeError) as info:
        function([[0.9], [0.8, entry]])
    message = str(info.value)
    assert "row 1 of the accuracy matrix is not all numbers" in message and "\n" not in message


@pytest.mark.parametrize("function", [summarize, summarize_seen])
def test_summaries_name_an_integer_beyond_float_range_instead_of_overflowing(function):
    with pytest.raises(FoalPipeError) as info:
        function([[10**400]])
    assert "holds 1000" in str(info.value) and "not a fraction in [0, 1]" in str(info.value)


def test_summaries_take_every_kind_of_real_number_at_its_value():
    entries = [[1], [np.float32(0.75), Fraction(1, 4)]]  # int, NumPy scalar, Fraction
    got = summarize(entries)
    a = np.array([[1.0, np.nan], [0.75, 0.25]])
    assert got["A_steps"] == [1.0, 0.5] and got["A_avg"] == pytest.approx((1.0 + 0.5) / 2)
    assert got["A_last"] == 0.5 and got["F"] == pytest.approx(a[0, 0] - a[1, 0])
    assert summarize_seen(entries)["A_steps"] == [1.0, 0.25]


@pytest.mark.parametrize("order", ["pilot", "pilot:7", None])
def test_an_uneven_split_is_noted_for_a_named_order_as_for_a_seeded_one(tmp_path, order):
    """``--class-order pilot`` draws every class and splits them as a seeded order does: 5 classes in 2 tasks are
    3 and 2, which the seeded split notes and pilot's said nothing of (taken for a file, which may leave classes out)."""
    from helpers import invoke

    from foal_pipe.store import write_store

    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(5), 8)
    store = write_store(tmp_path / "s.zarr", (rng.normal(size=(40, 4)) + y[:, None], y), (rng.normal(size=(10, 4)),
                        np.arange(10) % 5), [f"k{i}" for i in range(5)])
    extra = () if order is None else ("--class-order", order)
    result = invoke("learn", "--features", store, "--out", tmp_path / "r", "--tasks", 2, "--projection-dim", 8, *extra)
    assert result.exit_code == 0, result.output
    assert "note: 5 classes do not split evenly into 2 tasks" in " ".join(result.output.split())
