"""Two small refusals: `--max-memory 1.5` read as one byte (a unit left out), and `info`'s advice naming `--features`,
an option `info` does not have."""

from __future__ import annotations

import pytest
from helpers import assert_one_line_error, invoke

from foal_pipe.errors import FoalPipeError
from foal_pipe.memory import parse_memory


@pytest.mark.parametrize("text", ["1.5", "750.5", "2.5b"])
def test_a_byte_count_with_a_fraction_is_refused(text):
    with pytest.raises(FoalPipeError, match="a byte count with a fraction; add the unit meant"):
        parse_memory(text)


@pytest.mark.parametrize(("text", "size"), [("1.5GiB", 3 * 2**29), ("1e3", 1000), ("1.5 KiB", 1536), ("7", 7)])
def test_whole_byte_counts_and_fractions_of_a_unit_pass(text, size):
    assert parse_memory(text) == size


def test_info_names_its_argument_not_an_option_it_lacks(tmp_path):
    result = invoke("info", tmp_path)
    assert_one_line_error(result, "is not a Zarr feature store; point STORE at a directory made by `foal-pipe extract`")
    assert "--features" not in result.output
    learn = invoke("learn", "--features", tmp_path, "--out", tmp_path / "r")
    assert_one_line_error(learn, "point --features at a directory")


def test_other_scripts_digits_are_no_size_from_python_either():
    """The command line refused `--max-memory ٣GiB`; parse_memory itself (the Python API's path) read it as 3 GiB."""
    with pytest.raises(FoalPipeError, match="is not a size"):
        parse_memory("٣GiB")
