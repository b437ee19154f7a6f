#!/usr/bin/env bash
# The GPU checks of issues 3 and 8 in one device call (docs/benchmarks.md, "The GPU suite"):
# the GPU tests, then the suite's GPU figures. About 6 minutes on one H200 (an estimate: no GPU has run it
# yet). Each part has its own time limit (4 + 5 minutes, inside a device call's 10), and each result is on
# disk as soon as it is measured (the logs line by line, gpu-suite.json after each figure, with
# "complete": false until the last), so a limit reached keeps what was taken. nccl runs build no C++
# probe (the launcher sets MESHTOP_NATIVE_PROBE=off for them, and so does this script for the tests'
# session start), so nothing is compiled here.
#
# Its length outside the GPU parts, measured on the 2-core CPU machine on 2026-12-01 with those parts
# stubbed out by the machine itself (pytest skips every GPU test, the suite refuses --device cuda):
# 11.4 s (installing the carried wheels about 7 s, imports, the skips). With the GPU parts at their limits
# the call ends within 11 s + 240 s + 300 s = 9.2 minutes: inside the 10 of a device call.
#
# The GPU machine has torch, pandas, pyarrow, psutil, nvidia-ml-py and pytest, not textual or py-spy:
# their wheels travel in .whl/ (git-ignored; fetched here with tests/bench/device_wheels.sh) and go to
# /tmp/site there. Writes machine.txt, test_gpu.log, gpu-suite.log and gpu-suite.json under $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/meshtop-device}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export MESHTOP_NATIVE_PROBE=off  # nccl only: the tests' session start builds no C++ probe either
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "cannot install the carried wheels (.whl/)"; exit 2; }
# meshtop is not installed there (the GPU machine starts bare, and pip reaches no index): its import package
# is laid out as links over the folders, as .ci/typecheck does, and the ranks inherit the path.
mkdir -p /tmp/ns/meshtop
for folder in runner probes recordings tui; do ln -sfn "$PWD/$folder" "/tmp/ns/meshtop/$folder"; done
export PYTHONPATH="/tmp/site:/tmp/ns:$PWD"
{
    nvidia-smi
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))'
} >"$OUT/machine.txt" 2>&1
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/probes/test_gpu.py 2>&1 | tee "$OUT/test_gpu.log"
timeout 300 python3 -m tests.bench.suite --device cuda --json "$OUT/gpu-suite.json" 2>&1 | tee "$OUT/gpu-suite.log"
