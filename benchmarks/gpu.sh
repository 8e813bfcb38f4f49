#!/usr/bin/env bash
# One command for a CUDA GPU (issue 33): where a GPU is available, its figures take this one command.
#
#   bash benchmarks/gpu.sh [OUT]        (OUT defaults to benchmarks/results/gpu-<UTC date and time>)
#
# 1. OUT/env.json: `kqv env --json`, the machine (kqv, torch, CUDA, GPUs, what `auto` chooses);
# 2. OUT/cuda_tests.xml: the tests that exercise the GPU (the CUDA tests of test_devices.py and test_kernels.py,
#    which skip without one, and test_syncs.py), as JUnit XML; a failure is reported and the benchmarks still run;
# 3. OUT/gpu_train.json: benchmarks/gpu_train.py, kqv's training step against Hugging Face's and x-transformers'
#    with and without torch.compile, MFU included;
# 4. OUT/generation_speed_cuda.json: benchmarks/generation_speed.py --device cuda, decoding against Hugging Face.
#
# The exit status is the tests' (0 when they passed), or 2 when torch sees no CUDA GPU (nothing is run then).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
out="${1:-benchmarks/results/gpu-$(date -u +%Y%m%d-%H%M%S)}"

if ! python -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu.sh: torch sees no CUDA GPU here (torch.cuda.is_available() is False); run it on a machine with an" \
        "NVIDIA GPU and a CUDA build of torch (kqv env says what this one has)" >&2
    exit 2
fi
mkdir -p "$out"
python -m kqv.cli env --json > "$out/env.json"
tests=0
python -m pytest -q -rs tests/test_devices.py tests/test_kernels.py tests/test_syncs.py \
    --junitxml "$out/cuda_tests.xml" || tests=$?
python benchmarks/gpu_train.py --output "$out/gpu_train.json"
python benchmarks/generation_speed.py --device cuda --output "$out/generation_speed_cuda.json"
echo "gpu.sh: wrote $out/{env.json,cuda_tests.xml,gpu_train.json,generation_speed_cuda.json}; tests exit status $tests"
exit "$tests"
