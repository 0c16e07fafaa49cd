"""Option text that foal-pipe reads itself, when it is not of the option's type or fixed set, is a usage error as with
typer's own types (docs/cli.md, "Errors and output"): one line naming the option and the command's --help, exit
status 2, before anything is read or written. It used to be a FoalPipeError of the command (exit 1, no --help hint):
``table --tasks x`` exited 1 where ``learn --tasks x`` exited 2, ``--heads ridge,foo`` 1 where ``--head bogus`` 2.

A value that does read but is refused (a gamma <= 0, a seed listed twice, a size of 0, a head that needs ridge
beside it) stays the command's error, exit 1; the library keeps raising FoalPipeError for the same bad values.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import fault_store, invoke

from foal_pipe import AnalyticClassifier, FoalPipeError, head_classifier
from foal_pipe.encoders import parse_model_kwargs
from foal_pipe.heads import HEADS, head_entry
from foal_pipe.memory import parse_memory
from foal_pipe.protocol.orderchecks import parse_order_seeds
from foal_pipe.protocol.stream import named_class_order
from foal_pipe.report.grouping import GROUP_KEYS, parse_group
from foal_pipe.store.blockfusion import FUSION_FORMS, parse_fusion, parse_fusions

NOT_NUMBERS = "is not a comma-separated list of numbers; write e.g. 1e-3,1e-1,1,10"
NOT_INTEGERS = "is not a comma-separated list of integers; write e.g."

#: (command, its arguments after --features and --out, the whole message before "; see `foal-pipe CMD --help`").
CASES = [
    # typer's own types, for reference: the style the others now share
    ("learn", ["--tasks", "x"], "--tasks 'x' is not an integer; write e.g. --tasks 10"),
    ("learn", ["--head", "fecam", "--shrinkage-offdiag", "abc"],
     "--shrinkage-offdiag 'abc' is not a number; write e.g. --shrinkage-offdiag 0.5"),
    ("learn", ["--head", "bogus"], "Invalid value for '--head': 'bogus' is not one of "
     + ", ".join(f"'{h}'" for h in HEADS)),
    # learn
    ("learn", ["--gamma", "abc"], "--gamma 'abc' is neither a number nor 'auto'; write e.g. --gamma 1 or --gamma auto"),
    ("learn", ["--gamma", ""], "--gamma '' is neither a number nor 'auto'; write e.g. --gamma 1 or --gamma auto"),
    ("learn", ["--gamma", "auto", "--gamma-grid", "1,x"], f"--gamma-grid '1,x' {NOT_NUMBERS}"),
    ("learn", ["--gamma", "auto", "--gamma-grid", " , "], "--gamma-grid is empty; write e.g. 1e-3,1e-1,1,10"),
    ("learn", ["--head", "fecam", "--shrinkage", "abc"],
     "--shrinkage 'abc' is neither a number nor 'oas'; write e.g. --shrinkage 1e-4"),
    ("learn", ["--order-seeds", "a,b"], f"--order-seeds 'a,b' {NOT_INTEGERS} 0,1,2,3,4"),
    ("learn", ["--order-seeds", ""], "--order-seeds is empty; write e.g. 0,1,2,3,4"),
    ("learn", ["--order-seeds", "0,,1"], "--order-seeds '0,,1' has an empty item between commas; remove the extra comma"),
    ("learn", ["--max-memory", "lots"], "--max-memory 'lots' is not a size; write e.g. 8GiB, 512MiB or a byte count"),
    ("learn", ["--max-memory", "8XB"], "--max-memory '8XB' is not a size; write e.g. 8GiB, 512MiB or a byte count"),
    ("learn", ["--fusion", "bogus"], f"unknown --fusion 'bogus'; write {FUSION_FORMS}"),
    ("learn", ["--fusion", "mean:x-3"], f"--fusion mean:x-3: 'x' is not a block number; write {FUSION_FORMS}"),
    ("learn", ["--class-order", "pilot:x"], "--class-order pilot:x is not pilot with a seed (the seed after the colon "
     "must be a non-negative integer); pass e.g. --class-order pilot:1993"),
    ("learn", ["--head-option", "foo=1"], "--head-option 'foo=1': no head takes an option 'foo'; the heads' options are: "
     "shrinkage (slda, fecam); shrinkage_offdiag (fecam); gamma_comp (dual); compensation (dual)"),
    ("learn", ["--head-option", "shrinkage"], "--head-option 'shrinkage' is not NAME=VALUE; write e.g. --head-option "
     "shrinkage=oas"),
    ("learn", ["--head", "fecam", "--head-option", "shrinkage_offdiag=x"], "--head-option 'shrinkage_offdiag=x': "
     "shrinkage_offdiag of fecam takes a number; write e.g. --head-option shrinkage_offdiag=0.0"),
    # slda's shrinkage is typed float | str, but reads as --shrinkage does: a number or oas (was exit 1, slda's check)
    ("learn", ["--head", "slda", "--head-option", "shrinkage=abc"], "--head-option 'shrinkage=abc': shrinkage of slda, "
     "fecam takes oas or a number; write e.g. --head-option shrinkage=0.0001"),
    ("learn", ["--head-option", "gamma=2"], "gamma is a setting of its own, not a head option: pass --gamma and drop it "
     "from --head-option"),
    # sweep
    ("sweep", ["--gammas", "1,x"], f"--gammas '1,x' {NOT_NUMBERS}"),
    ("sweep", ["--gammas", ""], "--gammas is empty; write e.g. 1e-3,1e-1,1,10"),
    ("sweep", ["--gammas", "1,,2"], "--gammas '1,,2' has an empty item between commas; remove the extra comma"),
    ("sweep", ["--heads", "ridge,foo"], f"unknown --heads 'foo'; choose one of {', '.join(HEADS)}"),
    ("sweep", ["--heads", ","], f"--heads ',' names no head; write a comma-separated list of {', '.join(HEADS)}"),
    ("sweep", ["--order-seeds", "a,b"], f"--order-seeds 'a,b' {NOT_INTEGERS} 0,1,2,3,4"),
    ("sweep", ["--fusions", "bogus"], f"unknown --fusions 'bogus'; write {FUSION_FORMS}"),
    ("sweep", ["--fusions", "last,mean:3-2"], "--fusions mean:3-2 starts at block 3, after its last block 2; write "
     f"mean:A-B with A <= B (e.g. mean:2-3), or one of {FUSION_FORMS}"),
    ("sweep", ["--fusions", ","], f"--fusions names no fusion; write a comma-separated list of {FUSION_FORMS}"),
    ("sweep", ["--max-memory", "lots"], "--max-memory 'lots' is not a size; write e.g. 8GiB, 512MiB or a byte count"),
    ("sweep", ["--heads", "ridge,slda", "--shrinkage", "abc"],
     "--shrinkage 'abc' is neither a number nor 'oas'; write e.g. --shrinkage 1e-4"),
    ("sweep", ["--class-order", "pilot:-1"], "--class-order pilot:-1 is not pilot with a seed (the seed after the colon "
     "must be a non-negative integer); pass e.g. --class-order pilot:1993"),
    # table
    ("table", ["--tasks", "x"], f"--tasks 'x' {NOT_INTEGERS} 5,10"),
    ("table", ["--tasks", "2.5"], f"--tasks '2.5' {NOT_INTEGERS} 5,10"),
    ("table", ["--tasks", ""], "--tasks is empty; write e.g. 5,10"),
    ("table", ["--heads", "foo"], f"unknown --heads 'foo'; choose one of {', '.join(HEADS)}"),
    ("table", ["--order-seeds", "a"], f"--order-seeds 'a' {NOT_INTEGERS} 0,1,2"),
    ("table", ["--gamma", "abc"], "--gamma 'abc' is neither a number nor 'auto'; write e.g. --gamma 1 or --gamma auto"),
    ("table", ["--gamma-grid", "1,x"], f"--gamma-grid '1,x' {NOT_NUMBERS}"),
    ("table", ["--max-memory", "lots"], "--max-memory 'lots' is not a size; write e.g. 8GiB, 512MiB or a byte count"),
    ("table", ["--heads", "fecam", "--shrinkage", "abc"],
     "--shrinkage 'abc' is neither a number nor 'oas'; write e.g. --shrinkage 1e-4"),
    ("table", ["--head-option", "foo"], "--head-option 'foo' is not NAME=VALUE; write e.g. --head-option shrinkage=oas"),
]


def _case_id(case: tuple[str, list[str], str]) -> str:
    return " ".join([case[0], *case[1]])


@pytest.mark.parametrize(("command", "args", "message"), CASES, ids=[_case_id(c) for c in CASES])
def test_option_text_not_of_its_type_is_a_usage_error(tmp_path, command, args, message):
    """Exit 2 and one line before anything is read: the store does not exist (reading it would be exit 1)."""
    out = tmp_path / "out"
    result = invoke(command, "--features", tmp_path / "missing.zarr", "--out", out, *args)
    assert (result.exit_code, result.output) == (2, f"Error: {message}; see `foal-pipe {command} --help`\n")
    assert not out.exists()


def test_predict_device_outside_its_set_is_a_usage_error(tmp_path):
    result = invoke("predict", "--model", tmp_path / "m.safetensors", "--images", tmp_path / "a.png", "--device", "gpu")
    assert (result.exit_code, result.output) == (2, "Error: Invalid value for '--device': 'gpu' is not one of 'auto', "
                                                    "'cpu', 'cuda'; see `foal-pipe predict --help`\n")


#: Commands without --features: (command and its arguments, the whole message before "; see ..."); each exited 1.
OWN_CASES = [
    (["summary", "--group", "BOGUS"], f"unknown --group key 'BOGUS'; choose from {', '.join(GROUP_KEYS)}"),
    (["summary", "--group", "head,colour"], f"unknown --group key 'colour'; choose from {', '.join(GROUP_KEYS)}"),
    (["summary", "--group", " , "], f"--group names no key; write e.g. head,tasks (keys: {', '.join(GROUP_KEYS)})"),
    (["extract", "--model-kwargs", "depth"], "--model-kwargs item 'depth' is not NAME=VALUE; write e.g. --model-kwargs "
     "depth=2,patch_size=4,img_size=32"),
    (["extract", "--model-kwargs", "depth=2,,img_size=32"], "--model-kwargs item '' is not NAME=VALUE; write e.g. "
     "--model-kwargs depth=2,patch_size=4,img_size=32"),
    (["extract", "--model-kwargs", "depth=2,"], "--model-kwargs item '' is not NAME=VALUE; write e.g. --model-kwargs "
     "depth=2,patch_size=4,img_size=32"),
    (["extract", "--model-kwargs", "depth="], "--model-kwargs item 'depth=' is not NAME=VALUE; write e.g. "
     "--model-kwargs depth=2,patch_size=4,img_size=32"),
    (["extract", "--model-kwargs", "depth=2,depth=3,=4"], "--model-kwargs item '=4' is not NAME=VALUE; write e.g. "
     "--model-kwargs depth=2,patch_size=4,img_size=32"),
    (["extract", "--model-kwargs", "2depth=2"], "--model-kwargs name '2depth' is not an argument name; write "
     "NAME=VALUE, e.g. depth=2"),
    (["extract", "--fusion", "max"], f"unknown --fusion 'max'; write {FUSION_FORMS}"),
    (["extract", "--fusion", "mean:5-2"], "--fusion mean:5-2 starts at block 5, after its last block 2; write mean:A-B "
     f"with A <= B (e.g. mean:2-5), or one of {FUSION_FORMS}"),
    (["extract", "--fusion", "mean:1-x"], f"--fusion mean:1-x: 'x' is not a block number; write {FUSION_FORMS}"),
]


@pytest.mark.parametrize(("args", "message"), OWN_CASES, ids=[" ".join(c[0]) for c in OWN_CASES])
def test_summary_and_extract_option_text_is_a_usage_error(tmp_path, args, message):
    """summary reads no run and extract no image, nor writes a store, before the usage error."""
    out = tmp_path / "x.zarr"
    where = ["--model", "pixels", "--out", out] if args[0] == "extract" else [tmp_path / "missing"]
    result = invoke(*args, *where)
    assert (result.exit_code, result.output) == (2, f"Error: {message}; see `foal-pipe {args[0]} --help`\n")
    assert not out.exists()


#: Values of summary and extract that read but are refused: the command's error, exit 1, as before.
OWN_REFUSED = [
    (["summary", "--group", "head,head"], "--group names a key twice; name each once"),
    (["extract", "--model-kwargs", "depth=2,depth=3"], "--model-kwargs gives depth twice; give each argument once"),
    (["extract", "--model-kwargs", "num_classes=3"], "--model-kwargs num_classes is set by foal-pipe itself"),
    (["extract", "--fusion", "concat:1-2"], "--fusion concat:1-2 sets blocks side by side, which is fused when reading a "
     "blocks store, not when extracting"),
]


@pytest.mark.parametrize(("args", "message"), OWN_REFUSED, ids=[" ".join(c[0]) for c in OWN_REFUSED])
def test_summary_and_extract_values_that_read_but_are_refused_exit_1(tmp_path, args, message):
    out = tmp_path / "x.zarr"
    where = ["--model", "pixels", "--out", out] if args[0] == "extract" else [tmp_path / "missing"]
    result = invoke(*args, *where)
    assert result.exit_code == 1, result.output
    assert result.output.startswith("Error: ") and result.output.count("\n") == 1, result.output
    assert message in result.output and "--help" not in result.output, result.output
    assert not out.exists()


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    return fault_store(tmp_path_factory.mktemp("usage") / "s.zarr")


@pytest.mark.parametrize(("command", "args", "message"), [
    ("learn", ["--gamma", "-1"], "gamma must be a positive number, got -1.0; try --gamma 1"),
    ("learn", ["--order-seeds", "0,0"], "--order-seeds '0,0' repeats a seed; list each class order once"),
    ("learn", ["--order-seeds", "-1"], "--order-seeds must be a non-negative integer, got -1; pass e.g. --order-seeds 0"),
    ("learn", ["--max-memory", "0"], "--max-memory '0' leaves nothing to hold; write a size above 0, e.g. 8GiB"),
    ("learn", ["--class-order", "pilot:4294967296"], "--class-order pilot:4294967296: the seed after the colon must be "
     "below 2**32"),
    ("learn", ["--head", "slda", "--shrinkage", "2"], "slda's --shrinkage must lie in [0, 1], got 2"),
    ("learn", ["--head", "slda", "--head-option", "shrinkage=2"], "slda's --shrinkage must lie in [0, 1], got 2"),
    ("learn", ["--head", "fecam", "--head-option", "shrinkage=oas"], "fecam's --shrinkage must be a number >= 0, got 'oas'"),
    ("sweep", ["--gammas", "1,1"], "--gammas lists 1 twice; list each gamma once"),
    ("sweep", ["--gammas", "1,-1"], "--gammas lists -1; a gamma is a positive number"),
    ("sweep", ["--heads", "ncm"], "--heads compares heads beside ridge's gamma sweep; add ridge"),
    ("table", ["--tasks", "0"], "--tasks takes task counts of at least 1, got 0"),
    ("table", ["--order-seeds", "1,1"], "--order-seeds lists a value twice; list each once"),
])
def test_a_value_that_reads_but_is_refused_stays_the_commands_error(store, tmp_path, command, args, message):
    """Only the text-to-value reading is a usage error: what the value then fails is exit 1, without the --help hint."""
    out = tmp_path / "out"
    result = invoke(command, "--features", store, "--out", out, "--tasks", 2, "--backend", "numpy", *args)
    assert result.exit_code == 1, result.output
    assert result.output.startswith("Error: ") and result.output.count("\n") == 1, result.output
    assert message in result.output and "--help" not in result.output, result.output
    assert not out.exists()


@pytest.mark.parametrize(("call", "message"), [
    (lambda: parse_order_seeds("a,b"), "seeds 'a,b' is not a comma-separated list of integers"),
    (lambda: parse_order_seeds(""), "seeds is empty"),
    (lambda: parse_memory("lots"), "max_memory 'lots' is not a size"),
    (lambda: parse_fusion("bogus"), "unknown fusion 'bogus'"),
    (lambda: parse_fusions("last,mean:3-2"), "fusions mean:3-2 starts at block 3"),
    (lambda: named_class_order("pilot:x"), "class_order='pilot:x' is not pilot with a seed"),
    (lambda: head_entry("foo", "heads"), "unknown heads 'foo'"),
    (lambda: head_classifier("foo"), "unknown head 'foo'"),
    (lambda: head_classifier("fecam", shrinkage="abc").fit(*_rows()), "fecam's shrinkage must be a number"),
    (lambda: head_classifier("slda", shrinkage="abc").fit(*_rows()), "slda's shrinkage must be a number in [0, 1] or 'oas'"),
    (lambda: parse_group("BOGUS"), "unknown group key 'BOGUS'"),
    (lambda: parse_model_kwargs("depth"), "model_kwargs item 'depth' is not NAME=VALUE"),
    (lambda: AnalyticClassifier(gamma="abc").fit(*_rows()), "gamma must be a positive number or 'auto', got 'abc'"),
    (lambda: AnalyticClassifier(gamma="auto", gamma_grid=[1, "x"]).fit(*_rows()), "gamma_grid must hold positive numbers"),
])
def test_the_library_still_raises_foalpipeerror(call, message):
    with pytest.raises(FoalPipeError) as info:
        call()
    assert message in str(info.value)


def _rows() -> tuple[np.ndarray, np.ndarray]:
    return np.random.default_rng(0).normal(size=(40, 6)), np.arange(40) % 4
