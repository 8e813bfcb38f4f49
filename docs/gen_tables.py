"""Writes every table of measurements on the site from the JSON the benchmarks and jobs wrote.

A table lives in a page between two markers, `<!-- table: NAME -->` and `<!-- /table -->`; this script replaces
what is between them with the table `TABLES[NAME]` builds from its JSON files, each row with the machine it ran on,
the date (from the JSON's own timestamp, or the day of the commit that added a JSON without one) and the number of
its run in the list of commands under the table (or, for a table of one run, that run under it). Prose
explains the tables; it does not restate them. `tests/test_doc_tables.py` fails when a page's table differs from
what this script writes.

    python docs/gen_tables.py            # rewrite the tables in docs/*.md
    python docs/gen_tables.py --check    # exit 1, naming the tables, when a page is out of date

Most JSON files record neither the machine's kind nor the command line, so each file's `Source` below says them; a
few record their own command, which the table then quotes (`with_command`). A page's figures with no JSON behind
them are not tabled here: the page names the command that would write them instead.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DOCS = ROOT / "docs"
MARKER = re.compile(r"(<!-- table: ([\w-]+) -->\n)(.*?)(<!-- /table -->)", re.S)


@dataclass(frozen=True)
class Source:
    """One JSON file of measurements: where it ran and the command that wrote it."""

    file: str
    machine: str  # short, for the table's rows
    detail: str  # the machine in full and what ran, for the list of commands under the table
    command: str
    date: str = ""  # for a JSON that records no timestamp: the day of the commit that added it

    def load(self) -> dict:
        return json.loads((ROOT / self.file).read_text(encoding="utf-8"))


TRAIN_THROUGHPUT = [
    Source(
        "benchmarks/results/train_throughput_epyc.json",
        "Zen 4",
        "AMD EPYC Zen 4, native bf16, 2 cores",
        "python benchmarks/train_throughput.py --rounds 7 --output benchmarks/results/train_throughput_epyc.json",
    ),
    Source(
        "benchmarks/results/train_throughput.json",
        "Xeon",
        "Intel Xeon, AVX512F without bf16, 2 cores, before the block-wise loss",
        "python benchmarks/train_throughput.py --rounds 7",
    ),
    Source(
        "benchmarks/results/train_throughput_zen5.json",
        "Zen 5",
        "AMD EPYC Zen 5, native bf16, 2 cores",
        "python benchmarks/train_throughput.py --rounds 7 --output benchmarks/results/train_throughput_zen5.json",
    ),
    Source(
        "benchmarks/results/train_throughput_zen5_before_devices.json",
        "Zen 5, before devices",
        "AMD EPYC Zen 5, native bf16, 2 cores: the code before CUDA devices, an earlier checkout of kqv in `its/`",
        "PYTHONPATH=its/src python benchmarks/train_throughput.py --rounds 7 "
        "--output benchmarks/results/train_throughput_zen5_before_devices.json",
    ),
]

GENERATION_SPEED = [
    Source(
        "benchmarks/results/generation_speed_epyc.json",
        "Zen 4",
        "AMD EPYC Zen 4, native bf16, 2 cores",
        "python benchmarks/generation_speed.py --threads 1,2 --rounds 7 "
        "--output benchmarks/results/generation_speed_epyc.json",
    ),
    Source(
        "benchmarks/results/generation_speed_zen5.json",
        "Zen 5",
        "AMD EPYC Zen 5, native bf16, 2 cores",
        "python benchmarks/generation_speed.py --threads 1,2 --rounds 7 "
        "--output benchmarks/results/generation_speed_zen5.json",
    ),
    Source(
        "benchmarks/results/generation_speed_zen5_batch1_after.json",
        "Zen 5, rerun",
        "AMD EPYC Zen 5, native bf16, 2 cores: the same code, rerun right after the before-devices code",
        "python benchmarks/generation_speed.py --threads 1,2 --rounds 7 --batches 1 --precision fp32 "
        "--output benchmarks/results/generation_speed_zen5_batch1_after.json",
    ),
    Source(
        "benchmarks/results/generation_speed_threads_epyc.json",
        "Zen 4, before one-row products",
        "AMD EPYC Zen 4, native bf16, 2 cores: the code before the one-row products",
        "python benchmarks/generation_speed.py --threads 1,2 --rounds 7 "
        "--output benchmarks/results/generation_speed_threads_epyc.json",
    ),
    Source(
        "benchmarks/results/generation_speed_threads.json",
        "Xeon, before one-row products",
        "Intel Xeon without native bf16, 2 cores: the code before the one-row products",
        "python benchmarks/generation_speed.py --threads 1,2 --rounds 10 "
        "--output benchmarks/results/generation_speed_threads.json",
    ),
]

# attention_scaling*.json record no date: the day of the commit that added them
ATTENTION_SCALING = {
    "one thread": Source(
        "benchmarks/results/attention_scaling.json",
        "2 cores, shared",
        "a 2-core x86_64 machine shared with other jobs, one thread",
        "python benchmarks/attention_scaling.py --threads 1",
        "2026-11-22",
    ),
    "two threads": Source(
        "benchmarks/results/attention_scaling-2threads.json",
        "2 cores, idle",
        "the same 2-core machine, idle, two threads",
        "python benchmarks/attention_scaling.py --methods sdpa blockwise_relative blockwise_alibi "
        "--output benchmarks/results/attention_scaling-2threads.json --plot docs/attention_scaling-2threads.png",
        "2026-11-22",
    ),
}
LONG_CONTEXT_QUALITY = Source(
    "benchmarks/results/long_context_quality.json",
    "2 cores, shared",
    "this project's 2-core x86_64 machine, shared with other jobs, one thread",
    "python benchmarks/long_context_quality.py --threads 1",
    "2026-11-22",
)
# the attention cores as benchmarks/long_context_quality.py configures them
NEEDLE_METHODS = {
    "full": "full",
    "linformer": "linformer (causal, k = 32)",
    "bigbird": "bigbird (32-token blocks, window 1, global 1, random 1)",
}
# the methods of the O(n)-memory target at n = 65,536
TARGET_METHODS = {
    "sdpa": "SDPA, causal, no bias (the bar)",
    "blockwise_relative": "blockwise, Shaw relative (k = 16, keys and values)",
    "blockwise_alibi": "blockwise, ALiBi",
}

# the mt_compare JSON files record no date: the day of the commit that added them
MT_COMPARE = Source(
    "benchmarks/results/mt_compare-60min.json",
    "2 cores",
    "this project's 2-core x86_64 machine, nothing else running, one thread per model",
    "python benchmarks/mt_compare.py --minutes 60 --eval-every 200 --name mt_compare-60min",
    "2026-11-22",
)
MT_COMPARE_LOADED = (
    "this project's 2-core x86_64 machine, shared with other benchmarks (load average 6-8), one thread per model"
)
MT_COMPARE_EARLIER = [
    Source(
        "benchmarks/results/mt_compare.json",
        "2 cores, loaded",
        MT_COMPARE_LOADED,
        "python benchmarks/mt_compare.py --minutes 25 --set data.max_tokens=1000 --set train.warmup_steps=50",
        "2026-11-22",
    ),
    Source(
        "benchmarks/results/mt_compare-20min-default.json",
        "2 cores, loaded",
        MT_COMPARE_LOADED,
        "python benchmarks/mt_compare.py --minutes 20 --name mt_compare-20min-default",
        "2026-11-22",
    ),
]

TRANSLATION_SPEED = Source(
    "benchmarks/results/translation_speed.json",
    "2 cores, shared",
    "this project's 2-core x86_64 machine, shared with other benchmarks, one thread",
    "python benchmarks/translation_speed.py",
    "2026-11-22",  # the JSON records no date: the day of the commit that added it
)

PEERS = {"hf": "Hugging Face", "xtrans": "x-transformers"}


AB_MACHINE = "AMD EPYC, AVX2 only (no AVX-512), 2 cores, nothing else running"
AB_COMPARE = [
    Source(
        f"benchmarks/results/ab_{name}.json",
        "EPYC AVX2",
        AB_MACHINE,
        f"python benchmarks/ab_compare.py --base REV --name {name} {command}",
    )
    for name, command in (
        (
            "trainer",
            "--rounds 3 -- benchmarks/trainer_throughput.py --rounds 1 --updates 60 --warmup 10 --output {out}",
        ),
        (
            "train_step",
            "--rounds 3 --metric '/rows\\[\\d+\\]/tokens_per_s$' -- benchmarks/train_throughput.py --models kqv,hf "
            "--precision fp32 --rounds 3 --warmup 2 --output {out}",
        ),
        (
            "generation",
            "--rounds 3 --metric '/rows\\[\\d+\\]/(kqv|hf)_tokens_per_s$' -- benchmarks/generation_speed.py "
            "--batches 1 --precision fp32 --rounds 2 --new-tokens 32 --threads 1 --output {out}",
        ),
    )
]


def day(record: dict) -> str:
    """The day a record was measured: its `timestamp` (records before `kqv_lab.measuring`), else its `date`."""
    return (record.get("timestamp") or record["date"])[:10]


def when(source: Source) -> str:
    """The day `source` ran: its own date where the JSON records none, else the JSON's timestamp."""
    return source.date or day(source.load())


def run_line(source: Source, label: str = "Run") -> str:
    """The line under a table of one run: its machine, date, command and JSON file."""
    return f"{label}: {source.detail}, {when(source)}: `{source.command}` (`{source.file}`)\n"


def runs_list(sources: list[Source]) -> str:
    """The numbered list of the runs under a table of several: each one's machine, date, command and JSON."""
    listed = "".join(
        f"{number}. {source.detail}, {when(source)}: `{source.command}` (`{source.file}`)\n"
        for number, source in enumerate(sources, 1)
    )
    return f"Runs:\n\n{listed}"


def plain(header: list[str], rows: list[list[str]], right: int) -> str:
    """A Markdown table whose columns from `right` on are numbers (aligned right)."""
    align = ["---"] * right + ["---:"] * (len(header) - right)
    return "".join("| " + " | ".join(cells) + " |\n" for cells in [header, align, *rows])


def markdown(header: list[str], rows: list[list[str]], right: int, sources: list[Source]) -> str:
    """A Markdown table whose first three columns are the machine, the date and the number of the source, the
    columns from `right` on numbers (aligned right), followed by the numbered list of the sources' commands."""
    align = ["---"] * right + ["---:"] * (len(header) - right)
    lines = [["machine", "date", "run", *header], ["---", "---", "---", *align], *rows]
    table = "".join("| " + " | ".join(cells) + " |\n" for cells in lines)
    return f"{table}\n{runs_list(sources)}"


def first_columns(source: Source, sources: list[Source]) -> list[str]:
    return [source.machine, when(source), str(sources.index(source) + 1)]


def train_throughput_table() -> str:
    """Training tokens/s of kqv and its peers on a GPT-2-shaped model, per machine and precision."""
    rows = []
    for source in TRAIN_THROUGHPUT:
        record = source.load()
        for precision in ("fp32", "bf16"):
            by_model = {row["model"]: row for row in record["rows"] if row["precision"] == precision}
            kqv, summary = by_model["kqv"], record["summary"][precision]
            peak = record["matmul_peak_flops_per_s"][precision] / 1e9
            rows.append(
                [
                    *first_columns(source, TRAIN_THROUGHPUT),
                    "fp32" if precision == "fp32" else "bf16 autocast",
                    f"{kqv['tokens_per_s']:,.0f}",
                    *(f"{by_model[peer]['tokens_per_s']:,.0f}" for peer in PEERS),
                    f"{summary['kqv_over_fastest_peer']:.2f}; {summary['kqv_over_fastest_peer_paired']:.2f}",
                    f"{kqv['fraction_of_matmul_peak']:.1%} of {peak:,.3g} GFLOP/s",
                ]
            )
    header = ["precision", "kqv tokens/s", *PEERS.values()]
    header += ["kqv / fastest peer", "kqv, of the matmul peak"]
    return markdown(header, rows, right=1, sources=TRAIN_THROUGHPUT)


def generation_speed_table() -> str:
    """Greedy decoding tokens/s of kqv and Hugging Face `generate`, per machine, threads and batch size."""
    rows = []
    for source in GENERATION_SPEED:
        record = source.load()
        found = {(row["threads"], row["batch"], row["precision"]): row for row in record["rows"]}
        for threads, batch, precision in sorted(found):
            if precision != "fp32":
                continue
            fp32, bf16, int8 = (found.get((threads, batch, p)) for p in ("fp32", "bf16", "int8"))
            rows.append(
                [
                    *first_columns(source, GENERATION_SPEED),
                    str(threads),
                    str(batch),
                    f"{fp32['kqv_tokens_per_s']:,.1f}",
                    f"{fp32['hf_tokens_per_s']:,.1f}",
                    f"**{fp32['kqv_over_hf_paired']:.2f}**",
                    "yes" if fp32["kqv_hf_identical"] else f"{fp32['kqv_hf_agreement']:.1%} agree",
                    "" if bf16 is None else f"{bf16['kqv_over_hf_paired']:.2f} ({bf16['kqv_tokens_per_s']:,.1f})",
                    "" if int8 is None else f"{int8['kqv_tokens_per_s']:,.1f} ({int8['kqv_over_hf_paired']:.2f})",
                ]
            )
    header = ["threads", "batch", "fp32 kqv tokens/s", "fp32 HF tokens/s"]
    header += ["**fp32 kqv / HF**", "same tokens", "bf16 kqv / HF (tokens/s)", "int8 tokens/s (/ HF fp32)"]
    return markdown(header, rows, right=0, sources=GENERATION_SPEED)


def lm_quick_job_table() -> str:
    """The main job (`kqv train lm --config quick`) by machine kind: time in all, speed, memory and loss."""
    record = json.loads((RESULTS / "lm_quick_job.json").read_text(encoding="utf-8"))
    header = ["machine", "date", 'precision (`"auto"`)', "updates", "wall-clock in all", "median tokens/s"]
    header += ["peak memory (`peak_rss_mb`)", "validation loss (nats/char)", "command"]
    rows = []
    for run in record["runs"]:
        minutes, seconds = divmod(run["wall_seconds"], 60)
        bits = "" if run["bits_per_char"] is None else f" ({run['bits_per_char']:.2f} bits/char)"
        rows.append(
            [
                run["machine"],
                run["timestamp"][:10],
                run["precision"],
                f"{run['updates']:,}",
                f"{minutes} min {seconds:02d} s",
                f"{run['median_tokens_per_s']:,}",
                f"{run['peak_rss_mb']:,} MB",
                f"**{run['val_loss']:.3f}**{bits}",
                f"`{run['command']}`",
            ]
        )
    align = ["---"] * 3 + ["---:"] * 5 + ["---"]
    table = "".join("| " + " | ".join(cells) + " |\n" for cells in [header, align, *rows])
    return f"{table}\nFrom `benchmarks/results/lm_quick_job.json`: {record['source']}.\n"


def scaling_table(run: str, cell: Callable[[dict], str]) -> str:
    """Attention cores against sequence length n (one row per n, one column per method), from one run of
    benchmarks/attention_scaling.py, with that run's machine, date and command under the table."""
    source = ATTENTION_SCALING[run]
    results = source.load()["results"]
    methods = list(dict.fromkeys(result["method"] for result in results))
    found = {(result["method"], result["n"]): result for result in results}
    lengths = sorted({result["n"] for result in results})
    rows = [
        [f"{n:,}", *(cell(found[m, n]) if found[m, n]["status"] == "ok" else found[m, n]["status"] for m in methods)]
        for n in lengths
    ]
    align = ["---:"] * (len(methods) + 1)
    table = "".join("| " + " | ".join(cells) + " |\n" for cells in [["n", *methods], align, *rows])
    return f"{table}\n{run_line(source)}"


def emphasised(text: str, best: bool) -> str:
    """`text` in bold where it is the best of its comparison."""
    return f"**{text}**" if best else text


def mt_compare_table(sources: list[Source]) -> str:
    """The Transformer against the LSTM with attention, trained for the same wall-clock time on de-en, one run of
    benchmarks/mt_compare.py per source; the better of the two in each run in bold."""
    names = {"transformer": "Transformer", "lstm": "LSTM + attention"}
    rows = []
    for source in sources:
        runs = source.load()["runs"]
        best = {key: min(run[key] for run in runs.values()) for key in ("final_val_loss",)}
        best |= {key: max(run[key] for run in runs.values()) for key in ("test_bleu", "test_chrf")}
        for kind, run in runs.items():
            rows.append(
                [
                    *first_columns(source, sources),
                    names[kind],
                    f"{run['parameters'] / 1e6:.1f}M",
                    f"{run['train_seconds'] / 60:.1f} min",
                    f"{run['steps']:,}",
                    f"{run['train_tokens'] / 1e6:.2f}M",
                    f"{run['train_flops']:.2e}",
                    emphasised(f"{run['final_val_loss']:.3f}", run["final_val_loss"] == best["final_val_loss"]),
                    emphasised(f"{run['test_bleu']:.2f}", run["test_bleu"] == best["test_bleu"]),
                    emphasised(f"{run['test_chrf']:.2f}", run["test_chrf"] == best["test_chrf"]),
                ]
            )
    header = ["model", "parameters", "training time", "updates", "training tokens", "training FLOPs (est.)"]
    header += ["dev loss", "test BLEU", "test chrF"]
    return markdown(header, rows, right=1, sources=sources)


def translation_speed_table() -> str:
    """kqv's beam search against Hugging Face Marian's on the same weights and verses."""
    record = TRANSLATION_SPEED.load()
    names = {"kqv EncoderDecoder.generate": "kqv `EncoderDecoder.generate`"}
    names["HF MarianMTModel.generate"] = "HF `MarianMTModel.generate(num_beams=4)`"
    rows = [
        [
            *first_columns(TRANSLATION_SPEED, [TRANSLATION_SPEED]),
            names[name],
            f"{result['sentences_per_s']:.2f}",
            f"{result['seconds']:.1f}",
            " / ".join(f"{seconds:.1f}" for seconds in result["rounds"]),
            f"{record['identical_translations']} of {record['sentences']}" if name.startswith("kqv") else "",
        ]
        for name, result in record["results"].items()
    ]
    header = ["decoder", f"sentences/s (beam {record['beam']})", f"seconds for {record['sentences']} verses"]
    header += ["each round, s", "translations identical to HF's"]
    return markdown(header, rows, right=1, sources=[TRANSLATION_SPEED])


def ab_compare_table() -> str:
    """The training core without host syncs beside the code without those changes (`--base`), alternating in
    one run per benchmark: tokens/s of each side (median of its runs) and new / old."""
    rows = []
    for source in AB_COMPARE:
        record = source.load()
        for row in record["rows"]:
            rows.append(
                [
                    *first_columns(source, AB_COMPARE),
                    record["command"].split()[0].removeprefix("benchmarks/"),
                    f"`{row['metric']}`",
                    f"{row['old']:,.0f}",
                    f"{row['new']:,.0f}",
                    f"{row['new_over_old']:.3f}",
                ]
            )
    header = ["benchmark", "tokens/s of", "before (`--base`)", "after", "after / before"]
    return markdown(header, rows, right=2, sources=AB_COMPARE) + "\n" + against_controls()


AB_CONTROLS = {  # kqv's tokens/s over its Hugging Face control's, in one benchmark run
    "train_step": lambda run: run["rows"][0]["tokens_per_s"] / run["rows"][1]["tokens_per_s"],
    "generation": lambda run: run["rows"][0]["kqv_tokens_per_s"] / run["rows"][0]["hf_tokens_per_s"],
}


def against_controls() -> str:
    """kqv over its Hugging Face control within each run, run by run on each side: the control's code is the same
    before and after, so these ratios cancel what the machine itself did between runs."""
    lines = []
    for source in AB_COMPARE:
        name = source.file.removeprefix("benchmarks/results/ab_").removesuffix(".json")
        if name in AB_CONTROLS:
            runs = source.load()["runs"]
            side = {key: " / ".join(f"{AB_CONTROLS[name](run):.2f}" for run in runs[key]) for key in ("old", "new")}
            lines.append(f"- {name}: before {side['old']}; after {side['new']}\n")
    return "kqv's tokens/s over its Hugging Face control's in the same run, run by run:\n\n" + "".join(lines)


def attention_target_table(n: int = 65_536) -> str:
    """Blockwise attention against bias-free causal SDPA at n tokens, forward + backward, in both scaling runs:
    time, speed relative to SDPA (SDPA's time / the method's) and peak memory above the inputs."""
    runs = [ATTENTION_SCALING["two threads"], ATTENTION_SCALING["one thread"]]
    two, one = ({r["method"]: r for r in source.load()["results"] if r["n"] == n} for source in runs)
    rows = [
        [
            label,
            f"{two[method]['train_s']:.1f} s",
            f"**{two['sdpa']['train_s'] / two[method]['train_s']:.2f}**",
            f"{one[method]['train_cpu_s']:.1f} s",
            f"**{one['sdpa']['train_cpu_s'] / one[method]['train_cpu_s']:.2f}**",
            f"{two[method]['train_peak_mb']:.0f} / {one[method]['train_peak_mb']:.0f} MB",
        ]
        for method, label in TARGET_METHODS.items()
    ]
    header = [f"at n = {n:,}, forward + backward", "run 1 (2 threads, idle): wall time", "speed vs SDPA"]
    header += ["run 2 (1 thread, shared): CPU time", "speed vs SDPA", "peak memory, run 1 / run 2"]
    return plain(header, rows, right=1) + "\n" + runs_list(runs)


def long_context_quality_table() -> str:
    """Needle retrieval: accuracy on the last query after each stage of the curriculum, per attention core."""
    source = LONG_CONTEXT_QUALITY
    found = {(r["method"], r["time"]): r for r in source.load()["results"]}
    lengths = sorted({time for _, time in found})
    rows = []
    for stage, n in enumerate(lengths):
        steps = found["full", n]["steps"]
        cells = [f"{found[method, n]['accuracy']:.1%}" for method in NEEDLE_METHODS]
        rows.append([f"{n:,}", f"+{steps}" if stage else str(steps), *cells])
    return plain(["n", "steps", *NEEDLE_METHODS.values()], rows, right=0) + "\n" + run_line(source)


LOADED = "this project's 2-core x86_64 machine, shared with other work (loaded: times are upper bounds)"
MOE_LOAD = Source("benchmarks/results/moe_load.json", "2 cores, loaded", LOADED, "", "2026-11-23")
MOE_LOAD_STEPS = (6, 60, 132, 200)  # the first logged update, the last, and two between
DMCA_MEMORY = Source("benchmarks/results/dmca_memory.json", "2 cores, loaded", LOADED, "", "2026-11-23")
DMCA_METHODS = {  # as benchmarks/attention_scaling.py configures them
    "reference": "plain attention (n x n scores)",
    "sdpa": "torch SDPA (flash, causal)",
    "local": "local, 256-token blocks",
    "memory_compressed": "memory-compressed, c = 3, 512-query chunks",
}
DMCA_LM = Source("benchmarks/results/dmca_lm.json", "2 cores, loaded", LOADED, "", "2026-11-23")
DMCA_ARMS = {  # as benchmarks/dmca_lm.py configures them
    "full": "full attention",
    "full+switch": "full attention + Switch (4 experts, every other block)",
    "dmca": "DMCA: local (64-token blocks) / memory-compressed (c = 3)",
    "dmca+switch": "DMCA + Switch",
}
VIT_SHARED = "this project's 2-core x86_64 machine, shared with other jobs (load average 3-5), one thread"
VIT_DIGITS = [
    Source(
        "benchmarks/results/vit_digits-mlp.json",
        "2 cores, loaded",
        f"{VIT_SHARED}; the JSON is the run's summary.json",
        "OMP_NUM_THREADS=1 kqv train vit --out runs/vit",
        "2026-11-23",
    ),
    Source(
        "benchmarks/results/vit_digits-conv.json",
        "2 cores, loaded",
        f"{VIT_SHARED}; the JSON is the run's summary.json",
        "OMP_NUM_THREADS=1 kqv train vit --baseline conv --out runs/vit-conv",
        "2026-11-23",
    ),
]
VIT_BASELINES = {
    "mlp": "MLP baseline (2 hidden layers of 256)",
    "conv": "convolutional baseline (two 3x3 convolutions, pooling)",
}


def moe_load_table() -> str:
    """A Switch run's routing at a few updates: dropped tokens, the auxiliary loss and each layer's busiest and
    idlest expert's share of the tokens."""
    source = with_command(MOE_LOAD)
    records = {record["step"]: record for record in source.load()["records"]}
    rows = [
        [
            str(step),
            f"{records[step]['dropped_fraction']:.3f}",
            f"{records[step]['aux_loss']:.4f}",
            ", ".join(f"{max(layer):.2f}/{min(layer):.2f}" for layer in records[step]["expert_load"]),
        ]
        for step in MOE_LOAD_STEPS
    ]
    header = ["update", "dropped", "aux loss", "max / min expert load, layers 1-4"]
    return plain(header, rows, right=0) + "\n" + run_line(source)


def dmca_memory_table(n: int = 16_384) -> str:
    """Local and memory-compressed attention against plain attention and SDPA at n tokens: peak memory above the
    inputs and forward + backward CPU time."""
    source = with_command(DMCA_MEMORY)
    found = {r["method"]: r for r in source.load()["results"] if r["n"] == n}
    rows = [
        [label, f"{found[method]['forward_peak_mb']:,.0f} MB", f"{found[method]['train_peak_mb']:,.0f} MB"]
        + [f"{found[method]['train_cpu_s']:.2f} s"]
        if found[method]["status"] == "ok"
        else [label, found[method]["status"], "", ""]
        for method, label in DMCA_METHODS.items()
    ]
    header = [f"at n = {n:,}", "forward peak", "forward + backward peak", "forward + backward CPU time"]
    return plain(header, rows, right=1) + "\n" + run_line(source)


def dmca_lm_table() -> str:
    """Four arms of one small decoder on Shakespeare at equal updates and tokens: validation loss at its own
    context, with its parameters, tokens/s on the loaded machine and the process's peak memory."""
    source = with_command(DMCA_LM)
    rows = [
        [
            DMCA_ARMS[r["arm"]],
            f"{r['context']:,}",
            f"{r['parameters'] / 1e6:.2f}M",
            f"{r['steps']:,}",
            f"{r['val_loss']:.4f}",
            f"{r['val_perplexity']:.3f}",
            f"{r['tokens_per_s']:,.0f}",
            f"{r['peak_rss_mb']:,.0f} MB",
        ]
        for r in source.load()["results"]
    ]
    header = ["arm", "context", "parameters", "updates", "validation loss (nats/char)", "perplexity"]
    header += ["tokens/s (loaded)", "peak memory"]
    return plain(header, rows, right=1) + "\n" + run_line(source)


def dmca_paper_table() -> str:
    """Liu et al. 2018's test perplexities on WikiSum, as dmca_lm.json records them beside its own arms."""
    rows = []
    for key, perplexity in DMCA_LM.load()["seed_table"].items():
        model, _, context = key.partition(", L=")
        rows.append([model, f"{int(context):,}", f"{perplexity}"])
    table = plain(["model", "context", "test perplexity"], rows, right=1)
    return table + f"\nFrom Liu et al. 2018 (WikiSum), as recorded in `{DMCA_LM.file}`.\n"


def vit_digits_table() -> str:
    """The ViT against a baseline on the same batches, for the same training time and for the same updates."""
    rows = []
    for source in VIT_DIGITS:
        r = source.load()
        first = first_columns(source, VIT_DIGITS)
        baseline = VIT_BASELINES[r["baseline"]]
        rows += [
            [*first, "ViT, 2x2 patches", f"{r['parameters']:,}", f"{r['steps']:,}", f"{r['train_seconds']:.1f} s"]
            + [f"{r['test_accuracy']:.1%}"],
            [*first, f"{baseline}, same time", f"{r['baseline_parameters']:,}", f"{r['baseline_steps']:,}"]
            + [f"{r['baseline_seconds']:.1f} s", f"{r['baseline_test_accuracy']:.1%}"],
            [*first, f"{baseline}, same updates", f"{r['baseline_parameters']:,}", f"{r['steps']:,}", ""]
            + [f"{r['baseline_test_accuracy_same_steps']:.1%}"],
        ]
    header = ["model", "parameters", "updates", "training time", f"test accuracy ({r['test_images']} images)"]
    return markdown(header, rows, right=1, sources=VIT_DIGITS)


EXPLORE_RENDER = Source(
    "benchmarks/results/explore_render.json",
    "Zen 5, loaded",
    "AMD EPYC Zen 5 (avx512f, avx512_bf16), 2 cores, shared with other jobs (load average about 11), Debian's Chromium",
    "python benchmarks/explore_render.py",
    "2026-11-24",
)


def explore_render_table() -> str:
    """The explorer's redraw after each control change at 1,024 tokens: median and largest of the timed rounds."""
    record = EXPLORE_RENDER.load()
    rows = [
        [change, f"{statistics.median(seconds):.3f}", f"{max(seconds):.3f}"]
        for change, seconds in record["changes"].items()
    ]
    rows.append(["(first drawing after Analyze)", f"{record['first_draw_seconds']:.2f}", ""])
    shape = f"{record['tokens']:,} tokens, {record['layers']} layers x {record['heads']} heads"
    header = [f"control change ({shape})", f"median s ({record['rounds']} rounds)", "largest s"]
    return plain(header, rows, right=1) + "\n" + run_line(EXPLORE_RENDER)


def explore_reply_table() -> str:
    """The analysis reply of the same run: its size and time with the weights as lists or as millionths."""
    reply = EXPLORE_RENDER.load()["reply"]
    encodings = {"lists": "nested lists (the API's default)", "micros": "millionths (what the page asks for)"}
    rows = [
        [label, f"{reply[f'{key}_identity_bytes'] / 1e6:.1f} MB", f"{reply[f'{key}_identity_seconds']:.1f} s"]
        + [f"{reply[f'{key}_gzip_bytes'] / 1e6:.1f} MB", f"{reply[f'{key}_gzip_seconds']:.1f} s"]
        for key, label in encodings.items()
    ]
    header = ["the weights as", "reply", "time to answer", "gzipped reply", "time to answer, gzipped"]
    return plain(header, rows, right=1) + "\n" + run_line(EXPLORE_RENDER)


ONE_ROW_PRODUCTS = Source(
    "benchmarks/results/one_row_products.json",
    "Zen 4",
    "AMD EPYC Zen 4, native bf16, 2 cores, idle (the fast-decoding section's machine when it was written)",
    "python benchmarks/one_row_products.py --rounds 41",
)
ONE_ROW_READERS = {
    "F.linear": "`F.linear` on the (out, in) rows `nn.Linear` keeps",
    "(in, out) copy": "`torch.addmm` on an (in, out) copy of each weight",
    "kqv one-row": "kqv's one-row products (`kqv.nn.decoding.one_row_product`)",
    "memory": "memory: a plain sum over a 256 MB tensor",
}


def one_row_products_table() -> str:
    """GB/s of the benchmark model's weights read for one row, by each way of multiplying, per thread count."""
    record = ONE_ROW_PRODUCTS.load()
    threads = sorted(record["rows"], key=int)
    rows = [[label, *(f"{record['rows'][t][key]:.1f}" for t in threads)] for key, label in ONE_ROW_READERS.items()]
    header = ["one row times every linear weight", *(f"GB/s, {t} thread{'s' if t != '1' else ''}" for t in threads)]
    return plain(header, rows, right=1) + "\n" + run_line(ONE_ROW_PRODUCTS)


KV_CACHE_MEMORY = Source(
    "benchmarks/results/kv_cache_memory.json",
    "Zen 4, shared",
    "AMD EPYC Zen 4, native bf16, 2 cores shared with other jobs (load average about 7), one thread",
    "python benchmarks/kv_cache_memory.py",
)


def kv_cache_memory_table() -> str:
    """The KV cache's bytes per token (measured on its tensors) and greedy tokens/s, per n_kv_heads."""
    rows = KV_CACHE_MEMORY.load()["rows"]
    cases = [(g["batch"], g["prompt"]) for g in rows[0]["generation"]]
    table_rows = [
        [
            f"{row['n_kv_heads']} ({row['attention']})",
            f"{row['cache_bytes_per_token']:,.0f}",
            f"{row['cache_over_multi_head']:.3f}",
            f"{row['parameters']:,}",
            *(f"{g['tokens_per_s']:,.0f}" for g in row["generation"]),
        ]
        for row in rows
    ]
    header = [f"n_kv_heads (of {rows[0]['n_heads']} heads)", "KV cache bytes / token", "of multi-head's", "parameters"]
    header += [f"tokens/s, batch {batch}, prompt {prompt}" for batch, prompt in cases]
    return plain(header, table_rows, right=1) + "\n" + run_line(KV_CACHE_MEMORY)


ZEN4_MT = "AMD EPYC Zen 4, native bf16, 2 cores, idle"
STEP_KERNELS = Source(
    "benchmarks/results/step_kernels.json",
    "Zen 4",
    f"{ZEN4_MT}, torch's two threads, 5 interleaved rounds at the shapes of a quick MT batch",
    "python benchmarks/step_kernels.py --rounds 5",
    "2026-11-23",
)
MT_THROUGHPUT = {
    "before": Source(
        "benchmarks/results/mt_throughput_epyc.json",
        "Zen 4",
        f"{ZEN4_MT}, two threads, interleaved rounds: the code before kqv's dropout and block-wise loss",
        "python benchmarks/mt_throughput.py --threads 2 --rounds 2 --out benchmarks/results/mt_throughput_epyc.json",
        "2026-11-23",
    ),
    "now": Source(
        "benchmarks/results/mt_throughput_epyc_kqv_dropout.json",
        "Zen 4",
        f"{ZEN4_MT}, two threads, interleaved rounds: with kqv's dropout and block-wise loss",
        "python benchmarks/mt_throughput.py --threads 2 --rounds 2 --max-tokens 2000 "
        "--out benchmarks/results/mt_throughput_epyc_kqv_dropout.json",
        "2026-11-23",
    ),
}
MT_RECIPE_TRIALS = Source(
    "benchmarks/results/mt_recipe_trials.json",
    "Zen 4",
    "AMD EPYC Zen 4, native bf16, 2 cores",
    "",  # the JSON names its own command
    "2026-11-23",
)
MT_PRECISION_PER_UPDATE = Source(
    "benchmarks/results/mt_precision_per_update.json", "Zen 4", "AMD EPYC Zen 4, native bf16, 2 cores", "", "2026-11-23"
)
MT_PRECISION_PARTS = Source(
    "benchmarks/results/mt_precision_parts.json",
    "Zen 4",
    "AMD EPYC Zen 4, native bf16, 2 cores, two runs at a time, one thread each",
    "",
    "2026-11-23",
)
# what each run of benchmarks/mt_precision_parts.py computed in fp32 (the rest in bf16 autocast)
PRECISION_PARTS = {
    "fp32": "everything (the fp32 run)",
    "bf16": "nothing (the bf16 run)",
    "attention-core": "attention core: scores, softmax, weighted sum",
    "query-key-value": "query, key and value projections",
    "attention-output": "attention output projections",
    "feed-forward": "feed-forward networks",
    "output-layer": "output projection and cross-entropy",
    "fp32-seed1": "everything, another seed (fp32, `--set train.seed=1`)",
    "bf16-seed1": "nothing, the same other seed (bf16)",
}


def with_command(source: Source) -> Source:
    """`source` with the command its JSON records (for JSON files that name their own command); what the JSON says
    after the command's first "; " (how the runs shared the machine) goes to the machine's description."""
    command, _, note = source.load()["command"].partition("; ")
    return Source(
        source.file, source.machine, f"{source.detail}, {note}" if note else source.detail, command, source.date
    )


def step_kernels_table() -> str:
    """torch's dropout and output loss against kqv's, per precision, at the shapes of a quick MT batch."""
    rows = [
        [
            row["kernel"],
            row["precision"],
            f"{row['torch_ms']:.2f} ms",
            f"{row['kqv_ms']:.2f} ms",
            f"{row['torch_over_kqv']:.2f}x",
        ]
        for row in STEP_KERNELS.load()["rows"]
    ]
    return plain(["kernel", "precision", "torch", "kqv", "torch / kqv"], rows, right=2) + "\n" + run_line(STEP_KERNELS)


EXAMPLE_THROUGHPUT = Source(
    "benchmarks/results/example_throughput.json",
    "Zen 5",
    "AMD EPYC Zen 5 (family 26), native bf16, 2 cores, nothing else running, 2 interleaved rounds of 60 updates a row",
    "python benchmarks/example_throughput.py",
)


EXAMPLE_THROUGHPUT_ENCYCLOPEDIA = Source(
    "benchmarks/results/example_throughput-encyclopedia.json",
    "Zen 5",
    "AMD EPYC Zen 5 (family 26), native bf16, 2 cores, nothing else running, 2 interleaved rounds of 60 updates a row",
    "python benchmarks/example_throughput.py --style encyclopedia "
    "--output benchmarks/results/example_throughput-encyclopedia.json",
)


EXAMPLE_THROUGHPUT_CS224N_A5 = Source(
    "benchmarks/results/example_throughput-cs224n-a5.json",
    "Zen 4",
    "AMD EPYC Zen 4 (family 25, model 17), native bf16, 2 cores, nothing else running, 2 interleaved rounds of 60 "
    "updates a row",
    "python benchmarks/example_throughput.py --data a5 --context 128 "
    "--output benchmarks/results/example_throughput-cs224n-a5.json",
)


def example_throughput_table(source: Source = EXAMPLE_THROUGHPUT) -> str:
    """Real tokens/s of every kind of training data, padded and packed, against plain text's on the same model."""
    record = source.load()
    rows = [
        [name, f"{row['tokens_per_s']:,.0f}", f"{row['ratio']:.2f}", f"{row['batch_ms']:.1f}", f"{row['wait_ms']:.1f}"]
        for name, row in record["rows"].items()
    ]
    context = record.get("context", 160)
    header = [f"data (quick model, context {context}, batch 32)", "real tokens/s", "vs plain text", "host ms a batch"]
    header += ["ms an update waited"]
    return plain(header, rows, right=1) + "\n" + run_line(source)


def mt_throughput_table() -> str:
    """The whole MT training step (real source + target tokens/s) before and after kqv's two step kernels."""
    before, now = ({row["setting"]: row for row in MT_THROUGHPUT[k].load()["rows"]} for k in ("before", "now"))
    rows = [
        [
            setting,
            f"{before[setting]['tokens_per_s']:,.0f}",
            f"{row['tokens_per_s']:,.0f}",
            f"{row['tokens_per_s'] / before[setting]['tokens_per_s']:.2f}x",
        ]
        for setting, row in now.items()
    ]
    header = ["setting", "before: tokens/s (run 1)", "now: tokens/s (run 2)", "now / before"]
    return plain(header, rows, right=1) + "\n" + runs_list(list(MT_THROUGHPUT.values()))


def last_evaluation(run: dict, step: int | None = None) -> dict:
    """A run's evaluation at `step` (default: its last)."""
    evaluations = run["evaluations"]
    return evaluations[-1] if step is None else next(e for e in evaluations if e["step"] == step)


def mt_recipe_trials_table() -> str:
    """Recipe trials of the quick MT job at one thread each: at 1,000 updates and at the end of each run."""
    source = with_command(MT_RECIPE_TRIALS)
    rows = []
    for name, run in source.load()["runs"].items():
        if run.get("threads", 1) != 1 or "--threads 2" in run["overrides"]:
            continue  # the two-thread runs of the same file are the quick job's, not trials of its recipe
        at_1000, last = last_evaluation(run, 1000), last_evaluation(run)
        rows.append(
            [
                name,
                f"`{run['overrides']}`",
                f"{at_1000['val_loss']:.2f}",
                f"{at_1000['dev_bleu']:.2f}",
                f"{last['step']:,}",
                f"{last['train_seconds']:,.0f}",
                f"{last['val_loss']:.2f}",
                f"{last['dev_bleu']:.2f}",
                f"{run['test_bleu']:.2f}" if "test_bleu" in run else "-",
            ]
        )
    header = ["run", "overrides", "dev loss at 1,000", "dev BLEU at 1,000", "updates in all", "training s"]
    header += ["dev loss at the end", "dev BLEU at the end", "test BLEU (greedy, 722 verses)"]
    return plain(header, rows, right=2) + "\n" + run_line(source)


def mt_precision_per_update_table() -> str:
    """The quick MT job in fp32 and in bf16 autocast, identical but for `train.precision`, per update."""
    source = with_command(MT_PRECISION_PER_UPDATE)
    rows = []
    for precision, run in source.load()["runs"].items():
        evaluation = last_evaluation(run, 1000)
        rows.append(
            [
                precision,
                " / ".join(f"{run['train_loss'][str(step)]:.2f}" for step in (500, 700, 1000)),
                f"{evaluation['val_loss']:.2f}",
                f"{evaluation['dev_bleu']:.2f}",
                f"{run['test_bleu']:.2f}",
            ]
        )
    header = ["precision", "train loss at 500 / 700 / 1,000 updates", "dev loss at 1,000", "dev BLEU (greedy)"]
    header += [f"test BLEU (beam {run['beam_size']})"]
    return plain(header, rows, right=2) + "\n" + run_line(source)


def mt_precision_parts_table() -> str:
    """Training loss of the quick MT job with one part of the model at a time in fp32, the rest in bf16."""
    source = with_command(MT_PRECISION_PARTS)
    record = source.load()
    rows = [
        [
            PRECISION_PARTS[part],
            *(
                "-" if run["train_loss"][str(step)] is None else f"{run['train_loss'][str(step)]:.3f}"
                for step in record["steps"]
            ),
        ]
        for part, run in record["runs"].items()
    ]
    header = ["in fp32 (the rest bf16)", *(f"train loss at {step}" for step in record["steps"])]
    return plain(header, rows, right=1) + "\n" + run_line(source)


FINETUNE_CORPUS = "benchmarks/results/finetune_corpus.json"
FINETUNE_QA = "benchmarks/results/finetune_qa.json"


def shared_machine(record: dict) -> str:
    """The machine a fine-tuning measurement ran on, from its JSON: CPU, kernel flags, cores and the load."""
    cpu = record["machine"]
    flags = ", ".join(cpu["flags"]) or "no AVX-512"
    threads = record.get("torch_threads")
    threads = f", {threads} torch thread{'s' * (threads != 1)}" if threads else ""
    load = record["load_average_end"][0]
    return f"{cpu['model']} ({flags}), {cpu['cores']} cores{threads}, load average {load:.1f} at the end"


def one_run(record: dict, file: str, command: str) -> str:
    return f"\nRun: {shared_machine(record)}, {day(record)}: `{command}` (`{file}`)\n"


def ci(interval: list[float] | None, digits: int = 3) -> str:
    return "" if interval is None else f" [{interval[0]:.{digits}f}, {interval[1]:.{digits}f}]"


def finetune_corpus_table() -> str:
    """nanoGPT's recipe: validation loss on the Bible after the same updates, from Shakespeare's weights or
    from random ones, per seed and their mean with a 95% t interval."""
    record = json.loads((ROOT / FINETUNE_CORPUS).read_text(encoding="utf-8"))
    rows = [
        [
            "pretrained on Shakespeare, not fine-tuned",
            "",
            f"{record['pretrain']['steps']:,} on Shakespeare",
            f"{record['pretrained_val_loss_before_finetuning']:.3f}",
            "",
            "",
        ]
    ]
    for arm in ("fine-tuned", "from scratch"):
        loss, runs = record["val_loss"][arm], [r for r in record["runs"] if r["arm"] == arm]
        start = "from the Shakespeare run (`--init`)" if arm == "fine-tuned" else "from random weights"
        rows.append(
            [
                start,
                ", ".join(str(r["seed"]) for r in runs),
                f"{runs[0]['steps']:,} on the Bible",
                f"**{loss['mean']:.3f}**{ci(loss['ci95'])}",
                " / ".join(f"{value:.3f}" for value in loss["values"]),
                f"{record['train_seconds'][arm]['mean']:.0f}",
            ]
        )
    difference = record["difference_finetuned_minus_scratch"]
    rows.append(
        [
            "fine-tuned - from scratch (paired by seed)",
            "",
            "",
            f"**{difference['mean']:+.3f}**{ci(difference['ci95'])}: {record['verdict']}",
            " / ".join(f"{value:+.3f}" for value in difference["values"]),
            "",
        ]
    )
    header = ["start", "seeds", "updates", "Bible val loss (nats/char), mean [95% CI]", "per seed", "train s"]
    align = ["---"] * 3 + ["---:"] * 3
    table = "".join("| " + " | ".join(cells) + " |\n" for cells in [header, align, *rows])
    return table + one_run(record, FINETUNE_CORPUS, "python benchmarks/finetune_corpus.py")


def proportion(figure: dict) -> str:
    return f"{figure['exact_match']:.3f}{ci(figure['exact_match_95'])} ({figure['correct']}/{figure['n']})"


LORA_PEFT = "benchmarks/results/lora_peft.json"
LORA_SIDES = {"kqv": "kqv LoRA (`kqv.nn.lora`)", "peft": "peft LoRA", "kqv-full": "kqv, every weight training"}


def lora_peft_table() -> str:
    """kqv's LoRA, peft's and a full fine-tune of one GPT-2, side by side in one run (each side in its own process,
    alternating): trainable parameters, tokens/s of a training step and peak memory."""
    record = json.loads((ROOT / LORA_PEFT).read_text(encoding="utf-8"))
    results, full = record["results"], record["results"]["kqv-full"]
    rows = [
        [
            label,
            f"{results[side]['trainable_parameters']:,}",
            f"{results[side]['tokens_per_s']:,.0f}",
            " / ".join(f"{t:,.0f}" for t in results[side]["rounds_tokens_per_s"]),
            f"{results[side]['tokens_per_s'] / full['tokens_per_s']:.2f}",
            f"{results[side]['peak_memory_mb']:,.0f}",
        ]
        for side, label in LORA_SIDES.items()
    ]
    header = ["side", "trainable parameters", "tokens/s (median)", "per round", "/ full", "peak memory, MB"]
    model = record["model"]
    shape = f"GPT-2 of {model['n_layer']} blocks, width {model['n_embd']}, context {model['n_positions']}"
    record = {**record, "machine": record["cpu"], "torch_threads": record["threads"]}
    return (
        plain(header, rows, right=1)
        + f"\n{shape}, batch {record['batch']}, rank {record['lora']['rank']}; peak memory: "
        f"{results['kqv']['peak_memory_kind']}; peft {record['peft']}, torch {record['torch']}.\n"
        + one_run(record, LORA_PEFT, f"python benchmarks/{record['command']}")
    )


def finetune_qa_table() -> str:
    """Exact match on questions about people the fine-tune never saw asked about, beside the baselines that never
    read the question (rows), per arm over its seeds with its difference to the constant per question kind paired
    over questions (the unit: never the seeds' answers pooled), with the probe of the pretrained model and each
    arm's trainable parameters, peak memory and speed."""
    record = json.loads((ROOT / FINETUNE_QA).read_text(encoding="utf-8"))
    probe, baseline = record["probe"]["held_out"], record["baselines"]
    per_kind = baseline["per_kind"]["per_question"]
    rows = [
        ["probe: the pretrained model, pretraining wording", "", proportion(probe), gap(probe, per_kind)]
        + [f"{record['probe']['seen']['exact_match']:.3f}", "", "", ""],
        *baseline_rows(baseline),
    ]
    for name, arm in record["summary"]["arms"].items():
        held = arm["held_out_questions"]
        mean = held["exact_match"] if "per_question" in held else statistics.fmean(held["per_seed"])
        rows.append(
            [
                name,
                " / ".join(f"{value:.3f}" for value in held["per_seed"]),
                f"**{mean:.3f}**",
                versus_text(arm.get("versus_constant_per_kind")),
                f"{arm['seen_questions']['exact_match']:.3f}",
                f"{arm['trainable_parameters']:,}"
                + (f" of {arm['total_parameters']:,}" if "total_parameters" in arm else ""),
                f"{arm['peak_rss_mb']:,.0f}",
                f"{arm['tokens_per_s']:,.0f}",
            ]
        )
    header = ["", "held-out EM per seed", "held-out EM, mean over seeds", "- constant per kind [95%, over questions]"]
    header += ["seen EM", "trainable parameters", "peak RSS, MB", "tokens/s"]
    return (
        plain(header, rows, right=4)  # the exact-match columns hold intervals and counts: they wrap
        + "\n"
        + qa_differences(record)
        + one_run(record, FINETUNE_QA, "python benchmarks/finetune_qa.py")
    )


PRETRAIN_QA = "benchmarks/results/pretrain_qa.json"
PRETRAIN_QA_COMMAND = (
    "python benchmarks/pretrain_qa.py --arm 'next-token, augmented, full names -> fine-tune' "
    "--arm 'mixed: next-token, augmented, full names + seen questions'"
)
PRETRAIN_QA_PLAIN = "benchmarks/results/pretrain_qa-plain.json"  # the one-version text at the default size
PRETRAIN_QA_PLAIN_COMMAND = (
    f"python benchmarks/pretrain_qa.py --arm 'next-token -> fine-tune' --output {PRETRAIN_QA_PLAIN}"
)
PRETRAIN_QA_ENCYCLOPEDIA = "benchmarks/results/pretrain_qa-encyclopedia.json"  # one paragraph a person
PRETRAIN_QA_ENCYCLOPEDIA_COMMAND = (
    "python benchmarks/pretrain_qa.py --world encyclopedia --arm 'mixed: span corruption, encyclopedia + seen "
    "questions (CS224N)' --arm 'next-token, encyclopedia -> fine-tune'"
)
PRETRAIN_QA_2100 = "benchmarks/results/pretrain_qa-2100.json"  # the first recipes, at 1,800 + 300 updates
PRETRAIN_QA_2100_COMMAND = (
    "python benchmarks/pretrain_qa.py --arm 'next-token -> fine-tune' --arm 'span corruption, augmented -> fine-tune' "
    "--arm 'span corruption, augmented -> LoRA' --arm 'mixed: span corruption, augmented + seen questions' "
    f"--arm 'random init -> fine-tune' --pretrain-steps 1800 --finetune-steps 300 --output {PRETRAIN_QA_2100}"
)
KINDS = ("town", "year", "trade")


def verdict_text(comparison: dict) -> str:
    """A paired difference as value [95%], and the verdict the interval and the exact test agree on, with its p (and
    each seed's, where the test was made seed by seed)."""

    def p_text(p_value: float) -> str:
        return f"{p_value:.2g}" if p_value > 0 else "<1e-300"  # below a double's range

    seeds = comparison.get("seed_p_values")
    # each seed's p on a line of its own in the cell: a number column does not wrap, and one line is too wide
    each = f"<br>(seeds {' / '.join(p_text(p) for p in seeds)})" if seeds else ""
    return f"{short_versus(comparison)} {comparison['verdict']}, p={p_text(comparison['p_value'])}{each}".replace(
        "p=<", "p<"
    )


def pretrain_qa_rows(summary: dict, arms: list[str]) -> tuple[list[list[str]], ...]:
    """Three rows an arm: its exact match (the mean over the seeds and each seed's) against the per-kind constant;
    its reading score against its guess and its runner-up; its exact match by kind, the seen questions' and what it
    spent per seed."""
    scores, reading_rows, spent_rows = [], [], []
    for name in arms:
        arm = summary["arms"][name]
        per_seed = " / ".join(f"{v:.3f}" for v in arm["per_seed"].values())
        reading = arm["reading"]
        spent = list(arm["compute"]["per_seed"].values())
        mean = {key: statistics.fmean(s[key] for s in spent) for key in ("steps", "tokens", "train_seconds")}
        scores.append(
            [name, f"**{arm['exact_match']:.3f}** ({per_seed})", verdict_text(arm["versus_constant_per_kind"])]
        )
        reading_rows.append(
            [
                name,
                f"{reading['exact_match']:.3f}{ci(reading['exact_match_95'])}",
                verdict_text(reading["versus_guess"]),
                verdict_text(reading["versus_runner_up"]),
            ]
        )
        spent_rows.append(
            [name] + [f"{arm['by_kind'][kind]:.3f}" for kind in KINDS]
            + [f"{arm['seen_exact_match']:.3f}", f"{mean['steps']:,.0f}", f"{mean['tokens'] / 1e6:.1f}M"]
            + [f"{mean['train_seconds'] / 60:.1f}"]
        )  # fmt: skip
    return scores, reading_rows, spent_rows


def pretrain_qa_baseline_rows(record: dict) -> tuple[list[list[str]], list[list[str]]]:
    """The answers that never read the question (the one constant, the per-kind constant, a guess): their exact
    match, and by kind."""
    baselines, summary = record["baselines"], record["summary"]["baselines"]
    names = {"constant": f"constant: always {baselines['constant']['answer']!r} (`kqv eval`'s one answer)",
             "per_kind": "constant per kind: " + " / ".join(repr(a) for a in baselines["per_kind"]["answers"].values()),
             "uniform guess per kind": "uniform guess among the seen answers of the question's kind"}  # fmt: skip
    scores = [[names[name], f"{row['exact_match']:.3f}", ""] for name, row in summary.items()]
    by_kind = [[names[name]] + [f"{row['by_kind'][k]:.3f}" for k in KINDS] + [""] * 4 for name, row in summary.items()]
    return scores, by_kind


PRETRAIN_QA_HEADER = ["recipe (equal updates)", "held-out EM (seeds)", "- constant per kind [95%]"]
PRETRAIN_QA_READING = ["recipe", "reading [95%]", "reading - guess [95%]", "reading - runner-up [95%]"]
PRETRAIN_QA_SPENT = ["recipe", "town", "year", "trade", "seen EM", "updates", "tokens", "minutes"]


def pretrain_qa_tables(record: dict, arms: list[str]) -> str:
    """Exact match against the answers that never read the question; the reading score against its guess and
    runner-up; exact match by kind with what each recipe spent."""
    scores, reading, spent = pretrain_qa_rows(record["summary"], arms)
    base_scores, base_kinds = pretrain_qa_baseline_rows(record)
    return (
        plain(PRETRAIN_QA_HEADER, scores + base_scores, right=1)
        + "\nThe reading score (exact match where the answer is not its kind's constant), against a guess among the "
        "kind's other seen answers and against the kind's runner-up answer:\n\n"
        + plain(PRETRAIN_QA_READING, reading, right=1)
        + "\nHeld-out exact match by kind of question, the seen questions' and what each recipe spent (a seed's "
        "updates, tokens and minutes, pretraining included):\n\n"
        + plain(PRETRAIN_QA_SPENT, spent + base_kinds, right=1)
    )


def pretrain_qa_probes(summary: dict) -> str:
    """Each pretraining's probe per seed: right of n, the rate and its interval, from one scoring."""
    return "; ".join(
        f"{name}: " + ", ".join(f"seed {seed} {r['correct']}/{r['n']}{ci(r['exact_match_95'])}" for seed, r in
                                seeds.items())
        for name, seeds in summary["probe_records"].items()
    )  # fmt: skip


def pretrain_qa_table(file: str = PRETRAIN_QA, command: str = PRETRAIN_QA_COMMAND, shared: bool = False) -> str:
    """Exact match on held-out people's questions per recipe at equal updates (the world of
    kqv_lab.worlds), each question's mean over the training seeds, against the strongest answer that
    never reads the question (each kind's constant), and the reading score against its own guess."""
    record = json.loads((ROOT / file).read_text(encoding="utf-8"))
    summary, sizes, world = record["summary"], record["sizes"], record["world"]
    best = "".join(f"- {name}: {verdict_text(c)}\n" for name, c in summary["best_versus"].items())
    reading = record["baselines"]["reading"]
    spans = ", ".join(f"`{option}`" for option in sizes.get("span_options", [])) or "the defaults"
    spans = f", span corruption with {spans}" if any("span" in arm for arm in summary["arms"]) else ""
    if any("(CS224N)" in arm for arm in summary["arms"]):  # the arm sets its own options
        spans = (
            ', span corruption as CS224N\'s assignment trains it (`data.random_prefix=true`, `data.span_loss="all"`, '
            "prompts written `{prompt}{mask}` with `data.prompt_loss_weight=1`)"
        )
    load = ", on a machine shared with other work: an upper bound" if shared else ""
    questions = len(record["baselines"]["kinds"])
    return (
        pretrain_qa_tables(record, list(summary["arms"]))
        + f"\nEM: exact match, each question's mean over seeds {', '.join(map(str, summary['seeds']))} (each seed's "
        f"in brackets); every interval is paired over the {questions:,} held-out questions, and a verdict needs "
        f"the interval and an exact test (p < 0.05) to agree: the sign test over the questions that differ (McNemar's "
        f"exact test on one run's 1/0 scores; on means over seeds, which side each question leans to), and against "
        f"the guess each seed's own chance that a guess gets as many right, the largest of the seeds' p deciding. "
        f"The constants count the {record['baselines'].get('reference', 'seen questions')[4:]}. Reading: exact "
        f"match over the "
        f"{len(reading['questions']):,} questions whose answer is not their kind's constant; its guess, "
        f"{statistics.fmean(reading['guess']):.3f}, picks among the kind's other seen answers by frequency; the "
        f"runner-up, each kind's most frequent other seen answer ("
        + " / ".join(repr(a) for a in reading["runner_up"]["answers"].values())
        + f"), scores {statistics.fmean(reading['runner_up']['per_question']):.3f} there, the strongest answer that "
        f"never reads a reading question. "
        f"{world['people']:,} people ({world['held_out_people']:,} held out); a {sizes['model']['n_layers']}-layer "
        f"model of width {sizes['model']['d_model']}, {sizes['pretrain_steps']:,} + {sizes['finetune_steps']:,} "
        f"updates of {sizes['batch_size']} per recipe{spans}; one torch thread per run, two "
        f"runs at a time, {record['total_seconds'] / 60:.0f} min in all (minutes are a seed's, pretraining "
        f"included{load}).\n\n"
        f"Probes (a held-out person's own biography sentence, before any fine-tune): {pretrain_qa_probes(summary)}."
        + (f"\n\nThe best recipe against each of the others, paired over questions:\n\n{best}" if best else "\n")
        + one_run(record, file, command)
    )


PRETRAIN_QA_FIM = "benchmarks/results/pretrain_qa-fim.json"
PRETRAIN_QA_FIM_COMMAND = (
    "python benchmarks/pretrain_qa.py --arm 'span corruption, augmented -> fine-tune' --arm 'mixed: span corruption, "
    "augmented + seen questions' --span-set data.random_prefix=true --span-set 'data.span_loss=\"all\"' "
    "--span-set data.span_rate=0.25 --span-set data.span_max=160 --pretrain-steps 1800 --finetune-steps 300 "
    f"--output {PRETRAIN_QA_FIM}"
)


TUTORIAL_RECIPES = (
    "next-token, augmented, full names -> fine-tune",
    "mixed: next-token, augmented, full names + seen questions",
)


def pretrain_qa_tutorial_table() -> str:
    """The tutorial's recipe and mixed training on the same text beside the answers that never read the question."""
    record = json.loads((ROOT / PRETRAIN_QA).read_text(encoding="utf-8"))
    arms = [name for name in TUTORIAL_RECIPES if name in record["summary"]["arms"]]
    return pretrain_qa_tables(record, arms) + one_run(record, PRETRAIN_QA, PRETRAIN_QA_COMMAND)


def short_versus(figures: dict) -> str:
    """A paired difference over questions as value [95%]."""
    return f"{figures['difference']:+.3f}{ci(figures['difference_95'])}"


def baseline_rows(baseline: dict) -> list[list[str]]:
    """The rows of the answers that never read the question: two constants and two uniform guesses."""
    constant, per_kind = baseline["constant"], baseline["per_kind"]
    uniform, uniform_per_kind = baseline["uniform"], baseline["uniform_per_kind"]
    answers = " / ".join(f"{name} {answer!r}" for name, answer in per_kind["answers"].items())
    kinds = " / ".join(f"1 of {count} {name}s" for name, count in uniform_per_kind["distinct_answers"].items())
    pairs = f"the fine-tune's {baseline['trained_pairs']} training pairs"
    return [
        [f"constant: always {constant['answer']!r}, the most frequent answer of {pairs} (`kqv eval`'s)", "",
         f"{constant['exact_match']:.3f} ({constant['correct']}/{constant['n']})", "", "", "", "", ""],
        [f"constant per question kind: {answers}", "",
         f"{per_kind['exact_match']:.3f} ({per_kind['correct']}/{per_kind['n']})", "", "", "", "", ""],
        [f"uniform: 1 of the {uniform['distinct_answers']} distinct answers of {pairs}", "",
         f"{uniform['exact_match']:.3f} expected", "", "", "", "", ""],
        [f"uniform per question kind: {kinds}", "", f"{uniform_per_kind['exact_match']:.3f} expected", "", "", "", "",
         ""],
    ]  # fmt: skip


def gap(figure: dict, constant: list[int]) -> str:
    """A single run's difference to the constant per kind over the same questions, where its scores are recorded."""
    if "per_question" not in figure:
        return "not recorded"
    from kqv.train.score_statistics import difference_over_questions

    return versus_text(difference_over_questions(figure["per_question"], constant).to_dict())


def versus_text(figures: dict | None) -> str:
    """A paired difference over questions: value [95%] (n questions, sign test p)."""
    if figures is None:
        return "not recorded"
    return (
        f"{figures['difference']:+.3f}{ci(figures['difference_95'])} ({figures['questions']:,} questions, "
        f"p = {figures['p_value']:.2g})"
    )


def qa_differences(record: dict) -> str:
    """The arms' differences paired over questions, or why a record has none."""
    comparisons = record["summary"]["comparisons"]
    if not all("questions" in comparison for comparison in comparisons.values()):
        return (
            "Differences between the arms and to the constant, paired over questions, need each question's score, "
            "which this run (made before they were recorded) does not hold; `python benchmarks/finetune_qa.py` "
            "records them. Its pooled intervals, which took the three seeds' answers to the same 40 questions as "
            "120 independent ones, are not shown. The baselines were added by `python benchmarks/finetune_qa.py "
            "--add-baselines benchmarks/results/finetune_qa.json`, from the world alone.\n"
        )
    lines = "".join(
        f"- {name}: {versus_text(comparison)}: {comparison['verdict']}\n" for name, comparison in comparisons.items()
    )
    return (
        "Differences of held-out exact match, paired over questions (each question's mean over the seeds; "
        "Student's t over the questions, and the exact sign test's p):\n\n" + lines
    )


CS224N_A5 = Source(
    "benchmarks/results/cs224n_a5.json",
    "Zen 4",
    "AMD EPYC Zen 4 (family 25, model 17), native bf16, 2 cores shared with other work (two torch threads)",
    "python benchmarks/cs224n_a5.py --data a5 --mingpt minGPT_birthplace_prediction/src --mingpt-epochs 8.6 "
    "--threads 2 --parallel 1 --seeds 0 1 --mingpt-seeds 0 --steps 10000 --every 1000 --work a5-runs "
    "--arm 'kqv: --config cs224n-a5' "
    "--arm 'minGPT: schedule fitted to the budget'",
)


def cs224n_a5_curve_table() -> str:
    """The birthplace task's learning curve: each kqv recipe's development exact match after every so many updates
    (its checkpoints, copied as they were written), one column per seed (blank where a seed's copy was not taken)
    and their mean where every seed has one, with the tokens read by then (the first seed's that has the point)."""
    record = CS224N_A5.load()
    curves = [run for run in record["runs"] if run.get("curve")]
    seeds = list(dict.fromkeys(run["seed"] for run in curves))
    rows = []
    for name in record["arms"]:
        runs = [run for run in curves if run["arm"] == name]
        mine = {run["seed"]: {point["updates"]: point for point in run["curve"]} for run in runs}
        for updates in sorted({u for points in mine.values() for u in points}):
            at = [mine.get(seed, {}).get(updates) for seed in seeds]
            scores = [point["exact_match"] for point in at if point]
            tokens = next(point["tokens"] for point in at if point)
            mean = f"**{sum(scores) / len(scores):.3f}**" if len(scores) == len(seeds) else ""
            cells = [f"{point['exact_match']:.3f}" if point else "" for point in at]
            rows.append([name, f"{updates:,}", f"{tokens / 1e6:.1f}M", *cells, mean])
    header = ["recipe", "updates", "tokens", *(f"seed {seed}" for seed in seeds), "mean"]
    return plain(header, rows, right=1) + "\n" + run_line(CS224N_A5)


def cs224n_a5_table() -> str:
    """The birthplace task's development split: each recipe's exact match (seeds), its difference to the constant
    over questions, updates, tokens and minutes; the constant and the rule reader beneath."""
    record = CS224N_A5.load()
    rows = []
    for name, arm in record["arms"].items():
        runs = [run for run in record["runs"] if run["arm"] == name]
        seeds = " / ".join(f"{score:.3f}" for score in arm["per_seed"])
        interval = ci(arm["seed_95"]) if len(runs) > 1 else ""
        versus = arm["versus_constant"]
        diff = (
            f"{versus['versus_constant']:+.3f}{ci(versus['versus_constant_95'])}, p={versus['versus_constant_p']:.2g}"
        )
        updates = " / ".join(f"{run['updates']:,}" for run in runs if run.get("updates"))
        tokens = " / ".join(f"{run['tokens'] / 1e6:.1f}M" for run in runs if run.get("tokens"))
        minutes = " / ".join(f"{run['minutes']:.0f}" for run in runs)
        rows.append([name, f"**{arm['exact_match']:.3f}** ({seeds}){interval}", diff, updates, tokens, minutes])
    rows.append([f"constant: always {record['constant']!r}", f"{record['constant_exact_match']:.3f}", "", "", "", ""])
    rule = record["rule_reader_exact_match"]
    rows.append(["not a model: the words after 'born in' in the person's line", f"{rule:.3f}", "", "", "", ""])
    header = ["recipe", "dev EM (seeds)", "- constant [95%]", "updates", "tokens", "minutes"]
    return plain(header, rows, right=1) + "\n" + run_line(CS224N_A5)


TABLES: dict[str, Callable[[], str]] = {
    "cs224n-a5": cs224n_a5_table,
    "cs224n-a5-curve": cs224n_a5_curve_table,
    "lora-peft": lora_peft_table,
    "finetune-corpus": finetune_corpus_table,
    "finetune-qa": finetune_qa_table,
    "pretrain-qa": pretrain_qa_table,
    "pretrain-qa-tutorial": pretrain_qa_tutorial_table,
    "pretrain-qa-plain": lambda: pretrain_qa_table(PRETRAIN_QA_PLAIN, PRETRAIN_QA_PLAIN_COMMAND, shared=True),
    "pretrain-qa-encyclopedia": lambda: pretrain_qa_table(PRETRAIN_QA_ENCYCLOPEDIA, PRETRAIN_QA_ENCYCLOPEDIA_COMMAND),
    "pretrain-qa-2100": lambda: pretrain_qa_table(PRETRAIN_QA_2100, PRETRAIN_QA_2100_COMMAND, shared=True),
    "pretrain-qa-fim": lambda: pretrain_qa_table(PRETRAIN_QA_FIM, PRETRAIN_QA_FIM_COMMAND, shared=True),
    "one-row-products": one_row_products_table,
    "kv-cache-memory": kv_cache_memory_table,
    "explore-render": explore_render_table,
    "explore-reply": explore_reply_table,
    "moe-load": moe_load_table,
    "dmca-memory": dmca_memory_table,
    "dmca-lm": dmca_lm_table,
    "dmca-paper": dmca_paper_table,
    "vit-digits": vit_digits_table,
    "attention-target": attention_target_table,
    "long-context-quality": long_context_quality_table,
    "step-kernels": step_kernels_table,
    "example-throughput": example_throughput_table,
    "example-throughput-encyclopedia": lambda: example_throughput_table(EXAMPLE_THROUGHPUT_ENCYCLOPEDIA),
    "example-throughput-cs224n-a5": lambda: example_throughput_table(EXAMPLE_THROUGHPUT_CS224N_A5),
    "mt-throughput-kernels": mt_throughput_table,
    "mt-recipe-trials": mt_recipe_trials_table,
    "mt-precision-per-update": mt_precision_per_update_table,
    "mt-precision-parts": mt_precision_parts_table,
    "ab-compare": ab_compare_table,
    "translation-speed": translation_speed_table,
    "mt-compare-60min": lambda: mt_compare_table([MT_COMPARE]),
    "mt-compare-earlier": lambda: mt_compare_table(MT_COMPARE_EARLIER),
    "attention-scaling-train-cpu": lambda: scaling_table("one thread", lambda r: f"{r['train_cpu_s']:.2f}"),
    "attention-scaling-forward-cpu": lambda: scaling_table("one thread", lambda r: f"{r['forward_cpu_s']:.2f}"),
    "attention-scaling-memory": lambda: scaling_table(
        "one thread", lambda r: f"{r['forward_peak_mb']:.0f} / {r['train_peak_mb']:.0f}"
    ),
    "attention-scaling-2threads-train-wall": lambda: scaling_table("two threads", lambda r: f"{r['train_s']:.2f}"),
    "lm-quick-job": lm_quick_job_table,
    "train-throughput": train_throughput_table,
    "generation-speed": generation_speed_table,
}


def pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def regenerate(text: str) -> str:
    """`text` with every marked table rewritten; an unknown table name is an error."""

    def table(match: re.Match) -> str:
        name = match[2]
        if name not in TABLES:
            raise SystemExit(f"unknown table {name!r}: known are {sorted(TABLES)}")
        return match[1] + TABLES[name]() + match[4]

    return MARKER.sub(table, text)


def stale() -> list[str]:
    """The pages whose tables differ from what this script writes."""
    return [str(page.relative_to(ROOT)) for page in pages() if regenerate(page.read_text()) != page.read_text()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only report pages whose tables are out of date")
    args = parser.parse_args(argv)
    if args.check:
        out_of_date = stale()
        for page in out_of_date:
            print(f"{page}: a table differs from its JSON; run `python docs/gen_tables.py`")
        return 1 if out_of_date else 0
    for page in pages():
        text = page.read_text()
        if (new := regenerate(text)) != text:
            page.write_text(new)
            print(f"rewrote {page.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
