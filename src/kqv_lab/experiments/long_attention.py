"""`long-attention`: cheaper attention for long inputs, and what it costs in quality.

The lecture: self-attention's cost is quadratic in the sequence length ("what if n >= 50,000?"), which motivates
approximations that avoid scoring every pair: Linformer (Wang et al. 2020) projects the keys and values of n
positions down to k; BigBird (Zaheer et al. 2020) lets each block of queries see a window, a few global blocks and a
few random ones.

How it is tested: the needle task of `benchmarks/long_context_quality.py` (`kqv.data.needle`: a value hidden in the
first quarter of a random sequence must be recalled in the last quarter, chance 1/8), learned by a tiny kqv
`DecoderLM` with each attention core (`ModelConfig.attention`), through the same curriculum of lengths with kqv's
`Trainer`; accuracy on 512 held-out sequences at the end of each stage. Separately, for each core and length, the
wall time and peak memory (resident set size above the inputs, each measurement in a fresh process) of one forward
and backward pass of a freshly built model on one sequence. Memory-compressed attention joins when kqv's config
offers it (`attention="memory_compressed"`).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
import typing
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from kqv.data import needle
from kqv.nn import DecoderLM, ModelConfig, count_parameters
from kqv.train import TrainConfig, Trainer

from .base import FAILS, HOLDS, INCONCLUSIVE, TRAINING_DEVICE, Check, ExperimentConfig, Progress, control
from .plotting import figure, log_log, save
from .statistics import decide, ratio_interval

NAME = "long-attention"
CLAIM = "Linformer and BigBird cut the time and memory of long inputs, at a cost in long-range recall"
LECTURE = (
    "Self-attention's computation grows quadratically with the sequence length. Much recent work asks: can we "
    "build models like Transformers without paying the all-pairs self-attention cost? Linformer maps the "
    "sequence length dimension to a lower-dimensional space for values and keys; BigBird replaces all-pairs "
    "interactions with a family of other interactions: local windows, looking at everything, random."
)
FIELDS = ("methods", "stages", "accuracy", "measure_lengths", "seconds", "peak_mb", "parameters")


def methods() -> tuple[str, ...]:
    kinds = typing.get_args(typing.get_type_hints(ModelConfig)["attention"])
    return ("full", "linformer", "bigbird") + (("memory_compressed",) if "memory_compressed" in kinds else ())


@dataclass
class Config(ExperimentConfig):
    """The sizes of the `long-attention` experiment (`FULL` and `QUICK` below), validated when made."""

    PAIRED = (("lengths", "steps"),)

    lengths: tuple[int, ...] = (128, 256, 512)  # the curriculum: one model per core trained at each in turn
    steps: tuple[int, ...] = (250, 100, 60)
    measure_lengths: tuple[int, ...] = (512, 1024, 2048, 4096)
    batch_size: int = 16
    lr: float = 1e-2
    d_model: int = 64
    n_layers: int = 2
    linformer_k: int = 32
    block: int = 32  # BigBird's block
    eval_sequences: int = 512
    timing_repeats: int = 5  # timed passes per core and length: the time check is decided by their interval
    seeds: int = 1

    def model_config(self, method: str, max_len: int) -> ModelConfig:
        return ModelConfig(
            vocab_size=needle.VOCAB,
            d_model=self.d_model,
            n_heads=2,
            n_layers=self.n_layers,
            d_ff=2 * self.d_model,
            max_len=max_len,
            dropout=0.0,
            position="rope",
            attention=method,
            linformer={"k": min(self.linformer_k, max_len)},
            bigbird={"block": self.block, "window": 1, "global_blocks": 1, "random_blocks": 1},
        )


FULL = Config()
QUICK = Config(
    lengths=(64, 128),
    steps=(20, 8),
    measure_lengths=(128,),
    batch_size=8,
    d_model=32,
    n_layers=1,
    linformer_k=16,
    block=16,
    eval_sequences=64,
)


def method(config: Config) -> str:
    stages = ", then ".join(f"{s} steps at {n}" for n, s in zip(config.lengths, config.steps))
    return (
        f"A {config.n_layers}-layer DecoderLM (d_model {config.d_model}, 2 heads, RoPE) per core "
        f"({', '.join(methods())}; Linformer k = {config.linformer_k}, BigBird blocks of {config.block} with 1 "
        f"window, 1 global and 1 random block) trained by kqv's Trainer on the needle task: {stages} tokens "
        f"(batch {config.batch_size}, AdamW, peak lr {config.lr:g} per stage with 10% warm-up and cosine decay, "
        f"fp32); accuracy on the last query of {config.eval_sequences} held-out sequences after each stage. "
        f"Time and peak memory: one forward + backward pass on one sequence of "
        f"{', '.join(map(str, config.measure_lengths))} tokens, median of {config.timing_repeats} passes after a "
        "warm-up, in a fresh process."
    )


def needle_loss(model: DecoderLM, batch: tuple) -> torch.Tensor:
    ids, queries, answers = batch
    logits = model(ids)[torch.arange(len(ids))[:, None], queries]  # (batch, QUERIES, vocab)
    return F.cross_entropy(logits.flatten(0, 1), answers.repeat_interleave(needle.QUERIES))


def accuracy(model: DecoderLM, length: int, sequences: int, seed: int) -> float:
    generator = torch.Generator().manual_seed(10_000 + seed)
    model.eval()
    with torch.no_grad():
        ids, queries, answers = needle.needle_batch(sequences, length, generator)
        predicted = model(ids)[torch.arange(sequences), queries[:, -1]].argmax(-1)
    model.train()
    return float((predicted == answers).float().mean())


def train_curriculum(config: Config, kind: str, seed: int, progress: Progress) -> tuple[list[float], int]:
    """Accuracy after each stage of one model of this core; and its parameter count."""
    torch.manual_seed(seed)
    model = DecoderLM(config.model_config(kind, max(config.lengths)))
    found = []
    for stage, (length, steps) in enumerate(zip(config.lengths, config.steps)):
        progress.start(f"{kind} n={length}, {steps} steps")
        train = TrainConfig(
            steps=steps,
            batch_size=config.batch_size,
            lr=config.lr,
            warmup_steps=max(1, steps // 10),
            precision="fp32",
            eval_every=steps,
            checkpoint_every=steps,
            log_every=steps,
            seed=seed,
            device=TRAINING_DEVICE.get(),
        )
        batches = lambda i, n=length, s=stage: needle.needle_batch(
            config.batch_size, n, torch.Generator().manual_seed(seed * 1_000_003 + s * 100_003 + i)
        )
        with tempfile.TemporaryDirectory(prefix="kqv-long-attention-") as run_dir:
            Trainer(model, train, run_dir, train_batches=batches, loss_fn=needle_loss, quiet=True).train()
        model.cpu()  # trained where TRAINING_DEVICE says, measured on the CPU
        found.append(accuracy(model, length, config.eval_sequences, seed))
        progress.step(f"{kind} n={length}: accuracy {found[-1]:.1%}")
    return found, count_parameters(model)


def _status_kb(field: str) -> int:
    """A memory figure of this process from /proc/self/status (VmRSS: resident now; VmHWM: peak resident)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def measure(kind: str, length: int, config: Config) -> dict[str, float]:
    """Seconds and peak MB (resident memory above what the process held before the pass) of forward + backward on
    one sequence; run in its own process. The peak is the kernel's high-water mark, reset before the passes
    (writing 5 to /proc/self/clear_refs), so what importing torch and building the model took does not hide it."""
    model = DecoderLM(config.model_config(kind, length))
    ids = torch.randint(0, needle.VOCAB, (1, length))
    model(ids[:, : min(length, 4 * config.block)]).sum().backward()  # warm-up on a short input
    model.zero_grad(set_to_none=True)
    baseline = _status_kb("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current resident size
    times = []
    for _ in range(config.timing_repeats):
        model.zero_grad(set_to_none=True)
        started = time.perf_counter()
        model(ids).float().logsumexp(-1).mean().backward()
        times.append(time.perf_counter() - started)
    peak = (_status_kb("VmHWM") - baseline) / 1024
    return {"seconds": statistics.median(times), "times": times, "peak_mb": peak}


def measure_in_subprocess(kind: str, length: int, config: Config, threads: int) -> dict[str, float]:
    code = (
        "import json, sys, torch; from kqv_lab.experiments.long_attention import Config, measure; "
        f"torch.set_num_threads({threads}); torch.manual_seed(0); "
        f"values = {{k: tuple(v) if isinstance(v, list) else v for k, v in json.loads(sys.argv[1]).items()}}; "
        f"print(json.dumps(measure({kind!r}, {length}, Config(**values))))"
    )
    arguments = json.dumps({k: list(v) if isinstance(v, tuple) else v for k, v in vars(config).items()})
    done = subprocess.run([sys.executable, "-c", code, arguments], capture_output=True, text=True, timeout=1800)
    if done.returncode:
        raise RuntimeError(f"measuring {kind} at {length} tokens failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(config: Config, seeds: list[int], progress: Progress) -> dict:
    kinds = methods()
    progress.plan(len(kinds) * (len(config.lengths) * len(seeds) + len(config.measure_lengths)))
    accuracy_found = {kind: [] for kind in kinds}
    parameters = {}
    for seed in seeds:
        for kind in kinds:
            accuracies, parameters[kind] = train_curriculum(config, kind, seed, progress)
            accuracy_found[kind].append(accuracies)
    seconds, peak, times = ({kind: [] for kind in kinds} for _ in range(3))
    for kind in kinds:
        for length in config.measure_lengths:
            progress.start(f"timing {kind} n={length}")
            result = measure_in_subprocess(kind, length, config, torch.get_num_threads())
            seconds[kind].append(result["seconds"])
            times[kind].append(result["times"])
            peak[kind].append(result["peak_mb"])
            progress.step(f"{kind} n={length}: {result['seconds']:.2f} s, {result['peak_mb']:.0f} MB")
    return {
        "methods": list(kinds),
        "stages": [list(x) for x in zip(config.lengths, config.steps)],
        "accuracy": accuracy_found,
        "measure_lengths": list(config.measure_lengths),
        "seconds": seconds,
        "times": times,  # every timed pass: kind -> per measured length, timing_repeats seconds
        "peak_mb": peak,
        "parameters": parameters,
    }


def mean_accuracy(results: dict, kind: str, stage: int) -> float:
    return statistics.fmean(run[stage] for run in results["accuracy"][kind])


def table(results: dict) -> tuple[list[str], list[list]]:
    columns = ["attention", "parameters"] + [f"accuracy @ {n} (after {s} steps)" for n, s in results["stages"]]
    columns += [f"s / MB @ {n}" for n in results["measure_lengths"]]
    rows = []
    for kind in results["methods"]:
        row = [kind, results["parameters"][kind]]
        row += [f"{mean_accuracy(results, kind, j):.1%}" for j in range(len(results["stages"]))]
        row += [f"{s:.3f} s / {m:.0f} MB" for s, m in zip(results["seconds"][kind], results["peak_mb"][kind])]
        rows.append(row)
    return columns, rows


CHANCE = 1 / 8  # the needle's answer is one of 8 values
RERUN = "needs rerun (`kqv experiment run long-attention --out docs/experiments`): no repeated timings stored"


def learned(results: dict, kind: str) -> bool:
    """Whether `kind` learned the lookup at all: accuracy at the last stage above twice chance. A core below it
    outputs (nearly) one constant class, its recall the frequency of one answer: a failed arm, not a measurement."""
    return mean_accuracy(results, kind, len(results["stages"]) - 1) > 2 * CHANCE


def timing_check(results: dict, cheaper: list[str], longest: int) -> Check:
    """The cheaper cores' time over full attention's at the longest length, decided by the repeats' intervals."""
    what, threshold = (
        f"the cheaper cores are faster than full attention at {longest} tokens",
        "time / full attention's < 1 for every cheaper core (95% interval over the timed repeats)",
    )
    if "times" not in results:
        point = {k: results["seconds"][k][-1] / results["seconds"]["full"][-1] for k in cheaper}
        figure = ", ".join(f"{k} {r:.2f}x" for k, r in point.items()) + f" (one median each); {RERUN}"
        return Check(what, threshold, figure, False, INCONCLUSIVE)
    ratios = {k: ratio_interval(results["times"][k][-1], results["times"]["full"][-1]) for k in cheaper}
    outcomes = {decide(r, 1.0, above=False) for r in ratios.values()}
    outcome = FAILS if FAILS in outcomes else INCONCLUSIVE if INCONCLUSIVE in outcomes else HOLDS
    return Check(what, threshold, ", ".join(f"{k} {r.text(3)}" for k, r in ratios.items()), False, outcome)


def checks(results: dict) -> list[Check]:
    last, longest = len(results["stages"]) - 1, results["measure_lengths"][-1]
    cheaper = [k for k in results["methods"] if k != "full"]
    full_accuracy = [mean_accuracy(results, "full", j) for j in range(last + 1)]
    full_peak = results["peak_mb"]["full"][-1]  # below 1 MB the measurement cannot rank the cores
    memory_ratio = {k: results["peak_mb"][k][-1] / full_peak if full_peak >= 1 else float("inf") for k in cheaper}
    recall = {k: mean_accuracy(results, k, last) for k in cheaper}
    trained = results["stages"][last][0]
    constant = [k for k in cheaper if not learned(results, k)]
    recall_figure = f"full {full_accuracy[-1]:.1%}; " + ", ".join(f"{k} {a:.1%}" for k, a in recall.items())
    if constant:
        recall_figure += f"; did not learn (accuracy <= {2 * CHANCE:.0%}, one constant class): {', '.join(constant)}"
    return [
        control(
            Check(
                "full attention learns the long-range lookup",
                "accuracy >= 50% (chance 12.5%) after every stage",
                ", ".join(f"{a:.1%}" for a in full_accuracy),
                all(a >= 0.5 for a in full_accuracy),
            )
        ),
        timing_check(results, cheaper, longest),
        Check(
            f"the cheaper cores use less memory than full attention at {longest} tokens",
            "peak memory < full attention's for every cheaper core",
            ", ".join(f"{k} {r:.2f}x" for k, r in memory_ratio.items()),
            all(r < 1 for r in memory_ratio.values()),
        ),
        Check(
            f"the cheaper cores recall the needle less well at {trained} tokens",
            "accuracy at least 10 points below full attention's for every cheaper core; inconclusive when a core "
            "did not learn the task at all",
            recall_figure,
            False,
            INCONCLUSIVE
            if constant
            else HOLDS
            if all(a <= full_accuracy[-1] - 0.1 for a in recall.values())
            else FAILS,
        ),
    ]


def notes(results: dict) -> str:
    return (
        "**Beside the papers.** kqv's Linformer is causal (keys and values are projected over the past only, so it "
        "can be a decoder), unlike the published Linformer (Wang et al. 2020), which projects the whole sequence "
        "and is an encoder: its figures here are not the paper's model's. A core whose recall equals the frequency "
        "of one answer outputs one constant class: it failed to learn, which says nothing about how well it recalls."
    )


def plots(results: dict, directory: Path) -> list[Path]:
    fig, (quality, seconds, memory) = figure(3, width=4.6)
    lengths = [n for n, _ in results["stages"]]
    for kind in results["methods"]:
        quality.plot(lengths, [mean_accuracy(results, kind, j) for j in range(len(lengths))], "o-", label=kind)
        seconds.plot(results["measure_lengths"], results["seconds"][kind], "o-", label=kind)
        memory.plot(results["measure_lengths"], [max(m, 0.1) for m in results["peak_mb"][kind]], "o-", label=kind)
    quality.axhline(1 / 8, color="k", linestyle=":", label="chance")
    quality.set(
        xscale="log",
        ylim=(0, 1.05),
        xlabel="sequence length (curriculum)",
        ylabel="needle accuracy",
        title="long-range recall",
    )
    log_log(seconds, "sequence length", "forward + backward (s)", "time, one sequence")
    log_log(memory, "sequence length", "peak memory above inputs (MB)", "memory, one sequence")
    for ax in (quality, seconds, memory):
        ax.legend(fontsize=8)
    return [save(fig, directory / "long-attention.png")]
