#!/usr/bin/env bash
# The GPU check (benchmarks/gpu_check.py) on a device machine lent through the device tool, in two steps.
#
# 1. Here, in the repository root (pip and a package registry at hand, any Python):
#        bash benchmarks/gpu_check.sh download
#    saves into .whl/ (git-ignored) the Python 3.12 x86-64 wheels that the device image ('cuda': Python 3.12 with
#    torch, timm, cupy, h5py, safetensors, typer, rich, scikit-learn, numpy, pyyaml, packaging, typing-extensions)
#    lacks: zarr 3.1.6 and its dependencies numcodecs, donfig, google-crc32c; array-api-compat (the array-API
#    learner); setuptools >= 77 (builds the editable install with no network). About 11 MB. Keep one version of
#    each in .whl/: two stop the install.
# 2. One call of the device tool's `run`, then `give_back`:
#        command:   FOAL_PIPE_COMMIT=<git rev-parse HEAD here> bash benchmarks/gpu_check.sh device
#        carry:     [".whl"]
#        timeout_s: 540
#    It installs the wheels into /tmp/site, foal-pipe with `pip install --no-deps -e .`, and runs
#    `python3 benchmarks/gpu_check.py --out $OUT` (at most 8 minutes: each of its 3 parts is cut at 150 s), which
#    writes $OUT/gpu_check.json after every part; the printed table and log come back in $OUT/gpu_check.log.
#    FOAL_PIPE_COMMIT is what the JSON records as the commit: the device's git metadata can be the session's
#    first commit rather than the tree it was sent. Arguments after `device` go to gpu_check.py, e.g.
#    `bash benchmarks/gpu_check.sh device --parts learn,copies` for those two parts alone.
#    The same as one `run` command line, without this file:
#        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site
#        .whl/*.whl && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 || exit; python3 -m pip
#        install -q --no-index --no-deps --no-build-isolation -e . || exit; set -o pipefail; python3
#        benchmarks/gpu_check.py --out $OUT 2>&1 | tee $OUT/gpu_check.log
# Then copy the figures into benchmarks/RESULTS.md ("GPU check") with the card's name from the JSON.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
WHEELS=(zarr==3.1.6 numcodecs==0.16.6 donfig==0.8.1.post1 google-crc32c==1.9.0 array-api-compat==1.16.0
        setuptools==80.9.0)

case "${1:-}" in
download)
    "$PYTHON" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${WHEELS[@]}"
    ;;
device)
    : "${OUT:?OUT must name the folder for the results (the device tool sets it)}"
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
    "$PYTHON" -m pip install -q --no-index --no-deps --no-build-isolation -e .
    "$PYTHON" benchmarks/gpu_check.py --out "$OUT" "${@:2}" 2>&1 | tee "$OUT/gpu_check.log"
    ;;
*)
    echo "usage: bash benchmarks/gpu_check.sh download|device (see the comments at the top)" >&2
    exit 2
    ;;
esac
