#!/usr/bin/env bash
# One command for a CUDA GPU (issues 33 and 43): where a GPU is available, its figures take this one call, after the
# README's test install (pip install -e '.[test]' over torch's CUDA build), offline, in about 8 minutes on one
# H100 or H200.
#
#   bash benchmarks/gpu.sh [--dry-run] [OUT]    (OUT defaults to benchmarks/results/gpu-<UTC date and time>)
#
# 1. OUT/env.json: `kqv env --json`, the machine (kqv, torch, CUDA, GPUs, what `auto` chooses);
# 2. OUT/cuda_tests.xml: the tests that exercise the GPU (the CUDA tests of test_devices.py and test_kernels.py,
#    which skip without one, test_syncs.py, and test_batch_copies.py: pinned contiguous batches, a step under
#    torch.cuda.set_sync_debug_mode("error") and an inductor-compiled one), as JUnit XML, in this one process
#    (pyproject's addopts, which ask pytest-xdist for 2 workers, are set aside: xdist need not be installed), at
#    most $TESTS_S seconds; a failure is reported and the benchmarks still run;
# 3. OUT/gpu_train.json, the one JSON of the call: benchmarks/gpu_train.py's rows, kqv's compiled training step
#    against nanoGPT's model (tokens/s, MFU against the measured and the specification peak), the Trainer row
#    (`kqv train lm --config gpt2` for 10 updates on the repository's own text: no download), and the quick
#    model's updates/s at batch 128 in kqv's Trainer against a plain PyTorch loop (`ratio`), with env.json and a
#    summary of the tests (counts, failed tests) in it. Each row is written when it ends, a failed one with its
#    `error`; no row stops the others.
# Decoding against Hugging Face (benchmarks/generation_speed.py --device cuda) needs transformers and is not in
# this call; the peers of gpu_train.py's default (Hugging Face, x-transformers) neither: run them apart.
#
# --dry-run walks every step without a GPU: it says what each would run, imports what each needs (the tests are
# collected, the benchmark imported and its rows planned) and writes nothing; its exit status is 0 when every
# import works. The exit status is the tests' (0 when they passed), else 1 when a row failed, or 2 when torch sees
# no CUDA GPU (nothing is run then).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PIP_NO_INDEX=1  # offline: whatever would download fails at once
dry=0
if [[ "${1:-}" == "--dry-run" ]]; then
    dry=1
    shift
fi
out="${1:-benchmarks/results/gpu-$(date -u +%Y%m%d-%H%M%S)}"
cuda_tests=(tests/test_devices.py tests/test_kernels.py tests/test_syncs.py tests/test_batch_copies.py)
pytest_here=(python -m pytest -o addopts= -q -rs)  # one process, whether or not pytest-xdist is installed
TESTS_S="${TESTS_S:-240}"
train=(python benchmarks/gpu_train.py --models kqv,nanogpt --compile yes)

if ((dry)); then
    python -c 'import torch; print(f"gpu.sh --dry-run: torch {torch.__version__}, CUDA available:",
        torch.cuda.is_available(), "(the run stops at once without it)")'
    echo "step 1: python -m kqv.cli env --json > $out/env.json"
    python -m kqv.cli env --json > /dev/null
    echo "step 2: timeout $TESTS_S ${pytest_here[*]} ${cuda_tests[*]} --junitxml $out/cuda_tests.xml"
    "${pytest_here[@]}" --collect-only "${cuda_tests[@]}" > /dev/null
    echo "step 3: ${train[*]} --output $out/gpu_train.json --env-json $out/env.json --tests-xml $out/cuda_tests.xml"
    "${train[@]}" --output "$out/gpu_train.json" --dry-run
    echo "gpu.sh --dry-run: every step's imports work; nothing was run or written"
    exit 0
fi

if ! python -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu.sh: torch sees no CUDA GPU here (torch.cuda.is_available() is False); run it on a machine with an" \
        "NVIDIA GPU and a CUDA build of torch (kqv env says what this one has); --dry-run checks the steps" >&2
    exit 2
fi
mkdir -p "$out"
python -m kqv.cli env --json > "$out/env.json" || echo "gpu.sh: kqv env failed; the JSON says so" >&2
tests=0
timeout "$TESTS_S" "${pytest_here[@]}" "${cuda_tests[@]}" --junitxml "$out/cuda_tests.xml" || tests=$?
rows=0
"${train[@]}" --output "$out/gpu_train.json" --env-json "$out/env.json" --tests-xml "$out/cuda_tests.xml" || rows=$?
echo "gpu.sh: wrote $out/{env.json,cuda_tests.xml,gpu_train.json}; tests exit status $tests, rows exit status $rows"
if ((tests)); then exit "$tests"; fi
exit $((rows ? 1 : 0))
