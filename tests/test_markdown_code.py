"""summary.md writes paths and names that hold backticks as inline code that still reads as one span (CommonMark:
a fence longer than the longest run of backticks inside), and a path holding ``|`` in a table cell escaped."""

from __future__ import annotations

import re

import pytest

from foal_pipe.report.markdown import _code_cell, code


def _span(markdown: str) -> str:
    """The text of the one code span ``markdown`` is, as CommonMark reads it."""
    match = re.fullmatch(r"(`+)(.*?)\1", markdown, flags=re.S)
    assert match is not None and "`" * len(match.group(1)) not in match.group(2), markdown
    inner = match.group(2)
    return inner[1:-1] if inner[:1] == inner[-1:] == " " and inner.strip() else inner


@pytest.mark.parametrize("text", ["runs/digits", "r`x|y*", "``a`", "`", "a``b```c", "a\nb"])
def test_code_spans_hold_the_text_whatever_its_backticks(text):
    assert _span(code(text)) == " ".join(text.splitlines())


def test_a_plain_path_is_one_backtick_each_side():
    assert code("runs/digits") == "`runs/digits`"
    assert _code_cell("a|b") == "`a\\|b`"
