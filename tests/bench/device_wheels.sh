#!/usr/bin/env bash
# Fetch, here, the wheels that the GPU machine lacks (Python 3.12, x86-64) into .whl/ for device_check.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx "/.whl/" "$exclude" 2>/dev/null || echo "/.whl/" >>"$exclude"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d .whl textual==8.2.8 mdit-py-plugins platformdirs py-spy==0.4.3 \
    rich==15.0.0 markdown-it-py linkify-it-py uc-micro-py pygments  # textual asks for rich >= 14.2
# transformers serve's web stack (the image has transformers 5.17 without it), with its needs: the versions
# the serving tests run here.
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d .whl fastapi==0.165.0 starlette==1.10.0 uvicorn==0.55.0 openai==3.60.0 \
    pydantic==2.14.4
# The image's click stays: its typer (transformers' command line) may not take a newer one.
rm -f .whl/click-*.whl
