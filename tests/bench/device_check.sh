#!/usr/bin/env bash
# The GPU checks (issue 35) in one device call: the GPU tests, real recordings on the GPU, MFU, a serving
# engine on the GPU loaded by meshtop, the sampler's cost and the hooks' overhead (docs/benchmarks.md,
# "The GPU suite"). Parts run most important first, each with its own time limit, all inside one deadline
# (DEADLINE_S, 560 s by default, inside a device call's 600), and each result is on disk as soon as it is
# measured (the logs line by line, the suite's JSON after each figure), so a limit reached keeps what was
# taken. nccl runs build no C++ probe (the launcher sets MESHTOP_NATIVE_PROBE=off for them, and so does this
# script for the tests' session start), so nothing is compiled there.
#
# The GPU machine has torch, transformers, pandas, pyarrow, psutil, nvidia-ml-py and pytest, not textual,
# py-spy or transformers serve's web stack: their wheels travel in .whl/ (git-ignored; fetched here with
# tests/bench/device_wheels.sh) and go to /tmp/site there. Writes under $OUT: machine.txt, checks.log (every
# part's output), dmon.log (nvidia-smi dmon), gpu-mfu.json, gpu-suite.json and recordings.tgz (every recording
# but the served model). The serving part prints each GPU's PCIe and NVLink rates over the load (summary's links,
# from NVML) beside dmon's PCIe columns and nvidia-smi's NVLink counters before and after it. On one H200
# (2026-12-04) every part took 326 s together.
#
# PARTS=example,tests,record,mfu,serving,suite,nvml (all by default) runs only those; TESTS=EXPR narrows the GPU
# tests (pytest -k). CHECK_DEVICE=cpu rehearses the call on a CPU machine: the same parts on small shapes (the
# GPU tests skip, the mfu part is refused, the suite part runs the CPU rows of those names, nvml finds none).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/meshtop-device}
DEVICE=${CHECK_DEVICE:-cuda}
DEADLINE=$((SECONDS + ${DEADLINE_S:-560}))
WORK=$(mktemp -d /tmp/meshtop-check.XXXX)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_HUB_DISABLE_UPDATE_CHECK=1
export MESHTOP_NATIVE_PROBE=off # nccl only: the tests' session start builds no C++ probe either
if [ "$DEVICE" = cuda ] && [ -d .whl ]; then  # a CPU rehearsal runs in its own environment
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "cannot install the carried wheels (.whl/)"; exit 2; }
fi
# meshtop is not installed there (the GPU machine starts bare, and pip reaches no index): its import package
# is laid out as links over the folders, as .ci/typecheck does, and the ranks inherit the path.
mkdir -p /tmp/ns/meshtop
for folder in runner probes recordings tui; do ln -sfn "$PWD/$folder" "/tmp/ns/meshtop/$folder"; done
export PYTHONPATH="/tmp/site:/tmp/ns:$PWD"
MESHTOP=(python3 -m meshtop.tui.cli)
if [ "$DEVICE" = cuda ]; then SHAPE=1b; STEPS=20; BATCH=8; DIM=2048; else SHAPE=tiny; STEPS=6; BATCH=4; DIM=64; fi

# part KEY NAME LIMIT_S COMMAND...: (where PARTS names KEY) run COMMAND with LIMIT_S or what is left before the deadline, whichever is less,
# its output into checks.log, its exit code and time said after it.
PARTS=",${PARTS:-example,tests,record,mfu,serving,suite,nvml},"
part() {
    local key=$1 name=$2 limit=$3 left=$((DEADLINE - SECONDS))
    shift 3
    [[ $PARTS == *",$key,"* ]] || return 0
    [ "$left" -lt "$limit" ] && limit=$left
    if [ "$limit" -lt 20 ]; then
        echo "=== $name: skipped, $left s left before the deadline" | tee -a "$OUT/checks.log"
        return
    fi
    echo "=== $name (at most $limit s): $*" | tee -a "$OUT/checks.log"
    local began=$SECONDS
    timeout -k 10 "$limit" "$@" >>"$OUT/checks.log" 2>&1
    echo "=== $name: exit $? after $((SECONDS - began)) s" | tee -a "$OUT/checks.log"
}

{
    nvidia-smi
    nvidia-smi -q | grep -iE "product name|driver version|cuda version|power limit|max clocks" -A0
    nvidia-smi nvlink -s # the NVLink links and their speed (none active: meshtop's NVLink rates are None)
    python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl",
        torch.cuda.nccl.version() if torch.cuda.is_available() else None, "transformers", transformers.__version__,
        torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU")'
} >"$OUT/machine.txt" 2>&1
DMON=
if command -v nvidia-smi >/dev/null; then
    nvidia-smi dmon -s pucmt -o T >"$OUT/dmon.log" 2>&1 &  # t: PCIe rx/tx MB/s, beside meshtop's links
    DMON=$!
fi

# The served model is built on the CPU (16 cores there) while the first parts use the GPU.
[[ $PARTS == *",serving,"* ]] && python3 -m tests.bench.gpu_serving "$WORK/serving" --shape "$SHAPE" --device "$DEVICE" --build-only \
    >"$WORK/build.log" 2>&1 &
BUILD=$!

part example "example script: meshtop record -- torchrun examples/ddp.py, one rank" 60 \
    "${MESHTOP[@]}" record "$WORK/rec/ddp-example" -- torchrun --standalone --nproc-per-node 1 \
    examples/ddp.py --steps 40 --dim "$DIM"
part tests "GPU tests" 200 python3 -m pytest -q -p no:cacheprovider -rs --durations=0 -k "${TESTS:-}" \
    tests/probes/test_gpu.py
part record "built-in job: meshtop record --model $SHAPE on $DEVICE" 90 \
    "${MESHTOP[@]}" record "$WORK/rec/$SHAPE" --model "$SHAPE" --device "$DEVICE" --steps "$STEPS" \
    --batch-size "$BATCH"
part mfu "MFU: 1b and 8b, one rank" 170 \
    python3 -m tests.bench.suite --device "$DEVICE" --only mfu,mfu8b --json "$OUT/gpu-mfu.json"
wait "$BUILD" 2>/dev/null
cat "$WORK/build.log" >>"$OUT/checks.log" 2>/dev/null
command -v nvidia-smi >/dev/null && nvidia-smi nvlink -gt d >>"$OUT/checks.log" 2>&1 # NVLink KiB before the load
part serving "serving: transformers serve on the GPU, loaded at concurrency 1, 8, 32" 210 \
    python3 -m tests.bench.gpu_serving "$WORK/serving" --model "$WORK/serving/model" --device "$DEVICE"
command -v nvidia-smi >/dev/null && nvidia-smi nvlink -gt d >>"$OUT/checks.log" 2>&1 # and after
pkill -f "transformers.cli.transformers" # a server left by a part cut at its limit would hold the GPU's memory
part suite "suite: samplers, overhead" 200 \
    python3 -m tests.bench.suite --device "$DEVICE" --only samplers,overhead --json "$OUT/gpu-suite.json"
part nvml "NVML: each call the GPU sampler makes, timed" 40 python3 -m tests.bench.nvml_calls

(cd "$WORK" && tar -czf "$OUT/recordings.tgz" --exclude=serving/model --exclude=serving/hf-cache \
    $(ls -d rec serving 2>/dev/null)) 2>>"$OUT/checks.log"
[ -n "$DMON" ] && kill "$DMON" 2>/dev/null
echo "=== done in $SECONDS s" | tee -a "$OUT/checks.log"
