"""One ``--shrinkage`` given to slda and fecam, which one refuses and the other takes, is refused with the refusing
head's reason and the way out (separate commands): the reason is the head's refusal without its fix, kept apart as
data (``FoalPipeError.reason`` and ``fix``), not cut out of its text at "; try ", which a value's repr or another
wording of the fix defeated."""

from __future__ import annotations

import pytest

import foal_pipe.heads.fecam as fecam
from foal_pipe.errors import FoalPipeError, param
from foal_pipe.heads.checks import at_least_one, finite, positive
from foal_pipe.protocol.config import ModelConfig
from foal_pipe.protocol.headruns import check_head_options

HEADS = ["ridge", "slda", "fecam"]
WAY_OUT = ("and heads gives {other} the same shrinkage (one sets every head that takes it): run {refuser} and {other} in "
           "separate commands, each with its own shrinkage, or drop one of them from heads")


def _refusal(value: object) -> str:
    with pytest.raises(FoalPipeError) as caught:
        check_head_options(HEADS, ModelConfig(head_options={"shrinkage": value}))
    return str(caught.value)


@pytest.mark.parametrize(("value", "reason", "refuser", "other"), [
    ("oas", "fecam's shrinkage must be a number >= 0, got 'oas'", "fecam", "slda"),
    (2.0, "slda's shrinkage must lie in [0, 1], got 2", "slda", "fecam"),
])
def test_a_shared_shrinkage_is_refused_as_before(value, reason, refuser, other):
    assert _refusal(value) == f"{reason}, {WAY_OUT.format(refuser=refuser, other=other)}"


class Spelled(str):
    """``oas`` (slda takes it, fecam refuses it) with a repr that holds "; try "."""

    def __repr__(self) -> str:
        return "'oas; try me'"


def test_a_reason_holding_try_is_kept_whole():
    """Before: "fecam's shrinkage must be a number >= 0, got 'oas, and heads gives slda ..." (cut in the value)."""
    assert _refusal(Spelled("oas")) == ("fecam's shrinkage must be a number >= 0, got 'oas; try me', "
                                        f"{WAY_OUT.format(refuser='fecam', other='slda')}")


def test_a_fix_worded_otherwise_is_left_out(monkeypatch):
    """Before: the fix ("; use shrinkage=1.0") was kept, as it holds no "; try ", and would change slda's value too."""
    real = fecam.check_alpha

    def check_alpha(value, name, default):
        if value == "oas":
            raise FoalPipeError(f"fecam has no OAS estimate for its {param(name)}", f"use {param(name, default)}")
        return real(value, name, default)

    monkeypatch.setattr(fecam, "check_alpha", check_alpha)
    assert _refusal("oas") == f"fecam has no OAS estimate for its shrinkage, {WAY_OUT.format(refuser='fecam', other='slda')}"
    with pytest.raises(FoalPipeError, match=r"^fecam has no OAS estimate for its shrinkage; use shrinkage=1\.0$"):
        check_head_options(["fecam"], ModelConfig(head_options={"shrinkage": "oas"}))  # one head alone: its own fix


def test_a_refusal_keeps_its_reason_and_fix_apart_and_its_message():
    exc = FoalPipeError(f"{param('gamma')} must be a positive number, got 0", f"try {param('gamma', 1)}")
    assert (exc.reason, exc.fix) == (f"{param('gamma')} must be a positive number, got 0", f"try {param('gamma', 1)}")
    assert str(exc) == "gamma must be a positive number, got 0; try gamma=1"
    assert exc.render(lambda name, value=None: f"--{name}" + ("" if value is None else f" {value}")) == \
        "--gamma must be a positive number, got 0; try --gamma 1"
    plain = FoalPipeError("no fix here")
    assert (plain.reason, plain.fix, plain.template, str(plain)) == ("no fix here", "", "no fix here", "no fix here")


@pytest.mark.parametrize(("check", "args", "message"), [
    (positive, ("gamma", 0), "gamma must be a positive number, got 0; try gamma=1"),
    (positive, ("gamma", "x"), "gamma must be a number, got 'x'; try gamma=1"),
    (finite, ("gamma", float("inf")), "gamma must be a finite number, got inf; try gamma=1"),
    (at_least_one, ("k", 0.5, 3), "k must be a whole number of at least 1, got 0.5; try k=3"),
    (fecam.check_alpha, (-1, "shrinkage_offdiag", 0.0), "fecam's shrinkage_offdiag must be a number >= 0, got -1; "
     "try shrinkage_offdiag=0.0"),
])
def test_the_heads_option_refusals_read_as_before(check, args, message):
    with pytest.raises(FoalPipeError) as caught:
        check(*args)
    assert str(caught.value) == message
