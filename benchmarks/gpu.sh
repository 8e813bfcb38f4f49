#!/usr/bin/env bash
# One command for a CUDA GPU (issues 33 and 43): where a GPU is available, its figures take this one command, after
# the README's test install (pip install -e '.[test]' over torch's CUDA build), offline.
#
#   bash benchmarks/gpu.sh [--dry-run] [OUT]    (OUT defaults to benchmarks/results/gpu-<UTC date and time>)
#
# 1. OUT/env.json: `kqv env --json`, the machine (kqv, torch, CUDA, GPUs, what `auto` chooses);
# 2. OUT/cuda_tests.xml: the tests that exercise the GPU (the CUDA tests of test_devices.py and test_kernels.py,
#    which skip without one, test_syncs.py, and test_batch_copies.py: pinned contiguous batches, a step under
#    torch.cuda.set_sync_debug_mode("error") and an inductor-compiled one), as JUnit XML, in this one process
#    (pyproject's addopts, which ask pytest-xdist for 2 workers, are set aside: xdist need not be installed); a
#    failure is reported and the benchmarks still run;
# 3. OUT/gpu_train.json: benchmarks/gpu_train.py, kqv's training step against the installed peers' (Hugging Face's,
#    x-transformers') with and without torch.compile, MFU against the measured and the specification peak, and a
#    Trainer-driven row: `kqv train lm --config gpt2` for a fixed number of updates, its MFU beside nanoGPT's model's;
# 4. OUT/generation_speed_cuda.json: benchmarks/generation_speed.py --device cuda, decoding against Hugging Face.
#
# --dry-run walks every step without a GPU: it says what each would run, imports what each needs (the tests are
# collected, the benchmarks imported) and writes nothing; its exit status is 0 when every import works.
# The exit status is the tests' (0 when they passed), or 2 when torch sees no CUDA GPU (nothing is run then).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
dry=0
if [[ "${1:-}" == "--dry-run" ]]; then
    dry=1
    shift
fi
out="${1:-benchmarks/results/gpu-$(date -u +%Y%m%d-%H%M%S)}"
cuda_tests=(tests/test_devices.py tests/test_kernels.py tests/test_syncs.py tests/test_batch_copies.py)
pytest_here=(python -m pytest -o addopts= -q -rs)  # one process, whether or not pytest-xdist is installed

if ((dry)); then
    python -c 'import torch; print(f"gpu.sh --dry-run: torch {torch.__version__}, CUDA available:",
        torch.cuda.is_available(), "(the run stops at once without it)")'
    echo "step 1: python -m kqv.cli env --json > $out/env.json"
    python -m kqv.cli env --json > /dev/null
    echo "step 2: ${pytest_here[*]} ${cuda_tests[*]} --junitxml $out/cuda_tests.xml"
    "${pytest_here[@]}" --collect-only "${cuda_tests[@]}" > /dev/null
    echo "step 3: python benchmarks/gpu_train.py --output $out/gpu_train.json"
    python benchmarks/gpu_train.py --output "$out/gpu_train.json" --dry-run
    echo "step 4: python benchmarks/generation_speed.py --device cuda --output $out/generation_speed_cuda.json"
    PYTHONPATH="benchmarks${PYTHONPATH:+:$PYTHONPATH}" python -c 'import generation_speed, transformers'
    echo "gpu.sh --dry-run: every step's imports work; nothing was run or written"
    exit 0
fi

if ! python -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu.sh: torch sees no CUDA GPU here (torch.cuda.is_available() is False); run it on a machine with an" \
        "NVIDIA GPU and a CUDA build of torch (kqv env says what this one has); --dry-run checks the steps" >&2
    exit 2
fi
mkdir -p "$out"
python -m kqv.cli env --json > "$out/env.json"
tests=0
"${pytest_here[@]}" "${cuda_tests[@]}" --junitxml "$out/cuda_tests.xml" || tests=$?
python benchmarks/gpu_train.py --output "$out/gpu_train.json"
python benchmarks/generation_speed.py --device cuda --output "$out/generation_speed_cuda.json"
echo "gpu.sh: wrote $out/{env.json,cuda_tests.xml,gpu_train.json,generation_speed_cuda.json}; tests exit status $tests"
exit "$tests"
