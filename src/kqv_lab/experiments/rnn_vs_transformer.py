"""`rnn-vs-transformer`: at equal training time, the Transformer translates better than the LSTM it replaced.

The lecture's motivation: recurrent encoder-decoders with attention were the state of the art, but their
recurrence makes training slow; the Transformer removes recurrence, trains faster and translates better
(Vaswani et al. 2017, Table 2: higher BLEU at a fraction of the training cost).

How it is tested (`benchmarks/mt_compare.py` packaged as an experiment, and sharing its code): the MT job's
Transformer (configs/mt-quick.toml) and LSTM-with-attention (configs/mt-lstm.toml) translate German -> English
(the verse-aligned Bible), with the same joint BPE, data split, batches, optimizer and schedule: only `[model]`
differs. To give both the same machine they train at the same time, in two processes with one torch thread each,
so whatever else the machine runs slows both alike; each stops after the same training time (evaluation
excluded). At the end each translates the test split with beam search; dev BLEU (greedy) is recorded on the way.
The full size trains smaller models than the packaged configs (`sizes = "small"`) so that a few minutes of
training are hundreds of updates on a loaded 2-core machine (`--set sizes="benchmark"` restores the packaged sizes,
which need about an hour, as `benchmarks/mt_compare.py --minutes 60` shows). The quick size trains tiny models on an
evenly spaced subset of the verses for seconds: it checks the plumbing, not the claim.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Literal

from kqv.data import load_pairs
from kqv.jobs import get_job, prepare_mt_data, spread
from kqv.train import RunFiles, read_metrics

from .base import TRAINING_DEVICE, Check, ExperimentConfig, ExperimentError, Progress, mean_std, pm
from .plotting import figure, save
from .statistics import interval_check, paired_difference

NAME = "rnn-vs-transformer"
CLAIM = "at equal wall-clock training time the Transformer reaches a higher BLEU than the LSTM with attention"
LECTURE = (
    "Recurrent models lack parallelizability: training is slow. The Transformer removes recurrence, which "
    "makes it faster to train, and it achieved better BLEU scores on machine translation than the recurrent "
    "state of the art at a fraction of the training cost."
)
FIELDS = ("minutes", "pair", "runs", "curves")
MODELS = {"transformer": "quick", "lstm": "lstm"}  # the packaged MT configs each model trains with
SIZES = {  # model overrides on top of the packaged configs: "benchmark" keeps theirs
    "benchmark": {"transformer": [], "lstm": []},
    "small": {  # trains hundreds of updates in minutes on a loaded 2-core machine
        "transformer": [
            "model.d_model=128",
            "model.n_heads=4",
            "model.n_layers=2",
            "model.n_encoder_layers=2",
            "model.n_decoder_layers=2",
            "model.d_ff=512",
        ],
        "lstm": ["model.d_embed=128", "model.d_hidden=256", "model.n_layers=1"],
    },
    "tiny": {  # the quick size: trains for seconds
        "transformer": [
            "model.d_model=64",
            "model.n_heads=2",
            "model.n_layers=1",
            "model.n_encoder_layers=1",
            "model.n_decoder_layers=1",
            "model.d_ff=128",
        ],
        "lstm": ["model.d_embed=64", "model.d_hidden=128", "model.n_layers=1"],
    },
}


@dataclass
class Config(ExperimentConfig):
    """The sizes of the `rnn-vs-transformer` experiment (`FULL` and `QUICK` below), validated when made."""

    minutes: float = 3.0  # training time of each model (evaluation excluded)
    pair: str = "de-en"
    verses: int = 0  # 0: every verse; else an evenly spaced subset of this many
    vocab_size: int = 8000
    eval_every: int = 25
    eval_sentences: int = 200
    beam_size: int = 4
    sizes: Literal["benchmark", "small", "tiny"] = "small"
    seeds: int = 1
    ZERO_ALLOWED = ("verses",)


FULL = Config(minutes=4.0, vocab_size=4000, eval_every=50, eval_sentences=100)
QUICK = Config(minutes=0.1, verses=3000, vocab_size=600, eval_every=10, eval_sentences=30, beam_size=1, sizes="tiny")


def method(config: Config) -> str:
    data = "every verse" if not config.verses else f"{config.verses:,} evenly spaced verses"
    changes = "; ".join(
        f"{kind}: " + ", ".join(o.removeprefix("model.") for o in options)
        for kind, options in SIZES[config.sizes].items()
    )
    sizes = "as in the packaged configs" if config.sizes == "benchmark" else f"{config.sizes} ({changes})"
    return (
        f"The Transformer and the LSTM with attention of `kqv train mt` (configs mt-quick.toml and mt-lstm.toml), "
        f"models {sizes}, trained side by side on "
        f"the {config.pair} Bible ({data}, joint BPE of {config.vocab_size}) for {config.minutes:g} min of "
        f"training each, one torch thread each; dev BLEU (greedy, {config.eval_sentences} verses) every "
        f"{config.eval_every} updates; test BLEU with beam {config.beam_size}."
    )


def overrides(config: Config, seed: int, data_path: Path | None) -> list[str]:
    """The `--set` overrides both models train with."""
    values = [
        f"data.pair={json.dumps(config.pair)}",
        f"data.vocab_size={config.vocab_size}",
        f"data.eval_sentences={config.eval_sentences}",
        f"train.max_minutes={config.minutes}",
        "train.steps=1000000",
        f"train.eval_every={config.eval_every}",
        f"train.checkpoint_every={config.eval_every}",
        f"train.seed={seed}",
        f"decode.beam_size={config.beam_size}",
    ]
    return values + ([f"data.path={json.dumps(str(data_path))}"] if data_path else [])


def packaged_mt_config(name: str) -> Path:
    return Path(str(resources.files("kqv") / "configs" / f"mt-{name}.toml"))


def side_by_side(
    out: Path, common: list[str], per_model: dict[str, list[str]] | None = None, threads: int = 1, quiet: bool = False
) -> None:
    """Prepare one tokenizer and split in out/data, then train the Transformer and the LSTM at the same time in two
    processes with `threads` torch threads each (logs in out/KIND.log, runs in out/KIND/)."""
    per_model = per_model or {}
    configs = {
        kind: get_job("mt").load_config(packaged_mt_config(name), common + per_model.get(kind, []))
        for kind, name in MODELS.items()
    }
    if configs["transformer"].data != configs["lstm"].data:
        raise ExperimentError("the two MT configs must share their [data] section")
    prepare_mt_data(configs["transformer"], out / "data", reuse=True)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "false",
    }
    processes = {}
    for kind, name in MODELS.items():
        command = [
            sys.executable,
            "-m",
            "kqv.cli.main",
            "train",
            "mt",
            "--config",
            str(packaged_mt_config(name)),
            "--out",
            str(out / kind),
            "--data-from",
            str(out / "data"),
            "--overwrite",
            "--threads",
            str(threads),
            "--device",
            TRAINING_DEVICE.get(),
            *(["--quiet"] if quiet else []),
        ]
        command += [a for o in common + per_model.get(kind, []) for a in ("--set", o)]
        log = open(out / f"{kind}.log", "w")  # noqa: SIM115 (closed after the process ends)
        processes[kind] = (subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env), log)
    failed = []
    for kind, (process, log) in processes.items():
        if process.wait() != 0:
            failed.append(kind)
        log.close()
    if failed:
        tail = (out / f"{failed[0]}.log").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"training the {' and the '.join(failed)} failed; the end of its log:\n{tail}")


def read_runs(out: Path) -> tuple[dict[str, dict], dict[str, list[tuple[float, float, float]]]]:
    """Each model's summary.json, and its (training minutes, dev BLEU, dev loss) at every evaluation."""
    summaries, curves = {}, {}
    for kind in MODELS:
        run = RunFiles(out / kind)
        summaries[kind] = json.loads(run.summary_file.read_text())
        records = [r for r in read_metrics(run.metrics_file) if "dev_bleu" in r]
        curves[kind] = [(r["train_seconds"] / 60, r["dev_bleu"], r["val_loss"]) for r in records]
    return summaries, curves


def run(config: Config, seeds: list[int], progress: Progress) -> dict:
    progress.plan(len(seeds))
    runs, curves = {kind: [] for kind in MODELS}, {kind: [] for kind in MODELS}
    with tempfile.TemporaryDirectory(prefix="kqv-rnn-vs-transformer-") as tmp:
        data_path = None
        if config.verses:
            data_path = Path(tmp) / "verses.tsv"
            chosen = spread(load_pairs(config.pair), config.verses)
            data_path.write_text("".join(f"{p.src}\t{p.tgt}\n" for p in chosen), encoding="utf-8")
        for seed in seeds:
            out = Path(tmp) / f"seed{seed}"
            out.mkdir()
            progress.start(f"seed {seed}: Transformer and LSTM, {config.minutes:g} min each")
            side_by_side(out, overrides(config, seed, data_path), SIZES[config.sizes], quiet=True)
            summaries, seed_curves = read_runs(out)
            for kind in MODELS:
                runs[kind].append(summaries[kind])
                curves[kind].append(seed_curves[kind])
            gap = summaries["transformer"]["test_bleu"] - summaries["lstm"]["test_bleu"]
            progress.step(f"seed {seed}: Transformer - LSTM {gap:+.2f} test BLEU")
    return {"minutes": config.minutes, "pair": config.pair, "runs": runs, "curves": curves}


def table(results: dict) -> tuple[list[str], list[list]]:
    columns = [
        "model",
        "parameters",
        "training time (min)",
        "updates",
        "training tokens",
        "training FLOPs (est.)",
        "dev loss",
        "dev BLEU (greedy)",
        "test BLEU",
        "test chrF",
    ]
    rows = []
    for kind, runs in results["runs"].items():
        get = lambda key, runs=runs: [r[key] for r in runs]
        rows.append(
            [
                kind,
                runs[0]["parameters"],
                pm([s / 60 for s in get("train_seconds")], 1),
                pm(get("steps"), 0),
                pm(get("train_tokens"), 0),
                f"{mean_std(get('train_flops'))[0]:.2e}",
                pm(get("final_val_loss")),
                pm(get("dev_bleu"), 2),
                pm(get("test_bleu"), 2),
                pm(get("test_chrf"), 2),
            ]
        )
    return columns, rows


BLEU_FLOOR = 1.0  # a model whose test BLEU is below this has not learned to translate: its comparison is no test


def checks(results: dict) -> list[Check]:
    runs = results["runs"]
    bleu = {k: [r["test_bleu"] for r in v] for k, v in runs.items()}
    loss = {k: [r["final_val_loss"] for r in v] for k, v in runs.items()}
    silent = [k for k, v in bleu.items() if mean_std(v)[0] < BLEU_FLOOR]
    return [
        interval_check(
            f"after {results['minutes']:g} min of training each, the Transformer translates better",
            f"Transformer - LSTM test BLEU > 0.5 (paired by seed, 95% interval); both above BLEU {BLEU_FLOOR}",
            paired_difference(bleu["transformer"], bleu["lstm"]),
            0.5,
            failed_arm=f"did not learn to translate (BLEU < {BLEU_FLOOR}): {', '.join(silent)}" if silent else None,
            detail=f"Transformer {pm(bleu['transformer'], 2)}, LSTM {pm(bleu['lstm'], 2)}",
        ),
        interval_check(
            "... and predicts the dev set better",
            "Transformer - LSTM dev loss < 0 (paired by seed, 95% interval)",
            paired_difference(loss["transformer"], loss["lstm"]),
            0.0,
            above=False,
            detail=f"Transformer {pm(loss['transformer'])}, LSTM {pm(loss['lstm'])}",
        ),
    ]


def plot_curves(curves: dict[str, list[tuple[float, float, float]]], path: Path, title: str) -> Path:
    """Dev BLEU and dev loss against training time, one line per model."""
    fig, (bleu_axes, loss_axes) = figure(2)
    for kind, points in curves.items():
        if points:
            minutes, bleu, loss = zip(*points)
            bleu_axes.plot(minutes, bleu, "o-", markersize=3, label=kind)
            loss_axes.plot(minutes, loss, "o-", markersize=3, label=kind)
    bleu_axes.set(xlabel="training time (minutes, evaluation excluded)", ylabel="dev BLEU (greedy)")
    loss_axes.set(xlabel="training time (minutes, evaluation excluded)", ylabel="dev cross-entropy (nats/token)")
    for axes in (bleu_axes, loss_axes):
        axes.legend()
    fig.suptitle(title)
    return save(fig, path)


def plots(results: dict, directory: Path) -> list[Path]:
    seed0 = {kind: curves[0] for kind, curves in results["curves"].items()}
    return [
        plot_curves(
            seed0,
            directory / "rnn-vs-transformer.png",
            f"{results['pair']} Bible: Transformer vs LSTM, trained side by side, 1 thread each (seed 0)",
        )
    ]
