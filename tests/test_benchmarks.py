"""The benchmark scripts still run against the current library: each parses its arguments and imports what it
needs (an import the library renamed fails here, not in the middle of an hour-long measurement)."""

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = sorted((Path(__file__).resolve().parent.parent / "benchmarks").glob("*.py"))


def test_there_are_benchmarks():
    assert {p.stem for p in BENCHMARKS} >= {"train_throughput", "attention_scaling", "mt_compare",
                                             "translation_speed", "long_context_quality"}


@pytest.mark.parametrize("script", BENCHMARKS, ids=lambda p: p.stem)
def test_benchmark_script_imports_and_parses_its_arguments(script):
    result = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout
