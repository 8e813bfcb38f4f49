"""`rnn-interaction-distance`: an RNN connects two tokens k apart in k steps; self-attention in one.

The lecture: "RNNs take O(sequence length) steps for distant word pairs to interact", so long-distance
dependencies are hard to learn (the gradient must pass through every step between them), while in self-attention
"all words interact at every layer": the maximum interaction distance is O(1).

How it is tested: a needle task with a controlled distance. A sequence of random filler tokens holds one value
token (one of 8) k positions before its last token, a query; the model must name the value at the query (chance
1/8). The length is fixed (max distance + 1), so only k changes. A one-layer LSTM (`torch.nn.LSTM`, the layer
`kqv.nn.rnn` builds its baseline from) and a one-layer kqv `Encoder` (self-attention + FFN, RoPE), of about the
same parameter count, are trained by kqv's `Trainer` on the same batches with k drawn uniformly from 1 to the
maximum; accuracy is measured on held-out sequences per band of distances. At initialisation, before any
training, the norm of the gradient of the query position's output with respect to the value token's embedding
is measured against k: it is what training can use to connect the two.
"""

from __future__ import annotations

import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..nn.config import ModelConfig
from ..nn.models import Encoder, count_parameters
from ..train.config import TrainConfig
from ..train.trainer import Trainer
from .base import Check, ExperimentConfig, ExperimentError, Progress, mean_std, pm
from .plotting import figure, save

NAME = "rnn-interaction-distance"
CLAIM = "an LSTM's accuracy and gradient fall with the distance to the needle; attention's do not"
LECTURE = (
    "RNNs take O(sequence length) steps for distant word pairs to interact: it is hard to learn long-distance "
    "dependencies because of gradient problems. In self-attention, all words interact at every layer: the "
    "maximum interaction distance is O(1), since all words are connected directly."
)
FIELDS = ("models", "bands", "accuracy", "gradient_distances", "gradient", "parameters")
VALUES, QUERY, VOCAB = 8, 8, 32  # ids 0..7 are the values, 8 the query, 9..31 filler
MODELS = ("LSTM", "self-attention")


@dataclass
class Config(ExperimentConfig):
    """The sizes of the `rnn-interaction-distance` experiment (`FULL` and `QUICK` below), validated when made."""

    max_distance: int = 256
    bands: int = 4  # equal bands of distances that accuracy is reported for
    d_model: int = 64
    steps: int = 600
    batch_size: int = 32
    lr: float = 3e-3
    eval_sequences: int = 256  # per band
    seeds: int = 3

    def check(self) -> None:
        super().check()
        if self.max_distance % self.bands:
            raise ExperimentError(f"max_distance ({self.max_distance}) must be a multiple of bands ({self.bands})")


FULL = Config()
QUICK = Config(max_distance=32, bands=2, d_model=32, steps=60, batch_size=16, eval_sequences=64, seeds=1)


def method(config: Config) -> str:
    return (
        f"Sequences of {config.max_distance + 1} tokens: filler, one value token k positions before the final "
        f"query token, k uniform in 1..{config.max_distance}. A one-layer LSTM and a one-layer kqv Encoder (2 heads, "
        f"d_ff = 2 d, RoPE), both of width {config.d_model}, trained by kqv's Trainer for {config.steps} steps of "
        f"{config.batch_size} sequences (AdamW, lr {config.lr:g}, 10% warm-up, cosine decay, fp32) on the same "
        f"batches; accuracy on {config.eval_sequences} held-out sequences per band of distances; at "
        f"initialisation, |d output at the query / d embedding of the value| against k."
    )


def distance_batch(batch: int, config: Config, generator: torch.Generator, distances: Tensor | None = None):
    """ids (batch, max_distance + 1), distances (batch,), answers (batch,): filler, the value token k positions
    before the last token, which is the query."""
    length = config.max_distance + 1
    if distances is None:
        distances = torch.randint(1, config.max_distance + 1, (batch,), generator=generator)
    ids = torch.randint(VALUES + 1, VOCAB, (batch, length), generator=generator)
    answers = torch.randint(0, VALUES, (batch,), generator=generator)
    ids[:, -1] = QUERY
    ids[torch.arange(batch), length - 1 - distances] = answers
    return ids, distances, answers


class LSTMReader(nn.Module):
    """Embeddings, one LSTM layer, and a linear read-out of the values at the last position."""

    def __init__(self, d_model: int):
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, d_model)
        self.lstm = nn.LSTM(d_model, d_model, batch_first=True)
        self.out = nn.Linear(d_model, VALUES)

    def embed(self, ids: Tensor) -> Tensor:
        return self.tokens(ids)  # (batch, time, d_model)

    def read(self, x: Tensor) -> Tensor:
        return self.out(self.lstm(x)[0][:, -1])  # (batch, VALUES)

    def forward(self, ids: Tensor) -> Tensor:
        return self.read(self.embed(ids))


class AttentionReader(nn.Module):
    """kqv's one-layer Encoder (bidirectional self-attention + FFN) and a linear read-out at the last position."""

    def __init__(self, d_model: int, length: int):
        super().__init__()
        config = ModelConfig(
            vocab_size=VOCAB,
            d_model=d_model,
            n_heads=2,
            n_layers=1,
            d_ff=2 * d_model,
            max_len=length,
            dropout=0.0,
            position="rope",
        )
        self.encoder = Encoder(config)
        self.out = nn.Linear(d_model, VALUES)

    def embed(self, ids: Tensor) -> Tensor:
        return self.encoder.embeddings(ids, torch.arange(ids.shape[1]))  # (batch, time, d_model)

    def read(self, x: Tensor) -> Tensor:
        return self.out(self.encoder.encode(x)[0][:, -1])  # (batch, VALUES)

    def forward(self, ids: Tensor) -> Tensor:
        return self.read(self.embed(ids))


def build(name: str, config: Config) -> nn.Module:
    return LSTMReader(config.d_model) if name == "LSTM" else AttentionReader(config.d_model, config.max_distance + 1)


def needle_loss(model: nn.Module, batch: tuple[Tensor, Tensor, Tensor]) -> Tensor:
    ids, _, answers = batch
    return F.cross_entropy(model(ids), answers)


def train(name: str, config: Config, seed: int) -> nn.Module:
    """One model trained by kqv's Trainer on batch i of `seed` (the same batches for both models)."""
    torch.manual_seed(seed)
    model = build(name, config)
    settings = TrainConfig(
        steps=config.steps,
        batch_size=config.batch_size,
        lr=config.lr,
        warmup_steps=max(1, config.steps // 10),
        precision="fp32",
        eval_every=config.steps,
        checkpoint_every=config.steps,
        log_every=config.steps,
        seed=seed,
    )
    batches = lambda i: distance_batch(config.batch_size, config, torch.Generator().manual_seed(seed * 1_000_003 + i))
    with tempfile.TemporaryDirectory(prefix="kqv-interaction-distance-") as run_dir:
        Trainer(model, settings, run_dir, train_batches=batches, loss_fn=needle_loss, quiet=True).train()
    return model


def band_accuracy(model: nn.Module, config: Config, seed: int) -> list[float]:
    """Accuracy on held-out sequences, per band of distances (nearest first)."""
    width = config.max_distance // config.bands
    found = []
    model.eval()
    with torch.no_grad():
        for band in range(config.bands):
            generator = torch.Generator().manual_seed(777_000_000 + 1000 * seed + band)
            distances = torch.randint(
                band * width + 1, (band + 1) * width + 1, (config.eval_sequences,), generator=generator
            )
            ids, _, answers = distance_batch(config.eval_sequences, config, generator, distances)
            found.append(float((model(ids).argmax(-1) == answers).float().mean()))
    model.train()
    return found


def gradient_distances(config: Config) -> list[int]:
    return sorted({1, *(config.max_distance * j // 8 for j in range(1, 9))} - {0})


def needle_gradient(model: nn.Module, config: Config, seed: int) -> list[float]:
    """Mean |d (r . output at the query) / d embedding of the value token| at each distance, r random: how much
    signal connects the query to the needle before any training."""
    generator = torch.Generator().manual_seed(555_000_000 + seed)
    found = []
    for k in gradient_distances(config):
        ids, _, _ = distance_batch(64, config, generator, torch.full((64,), k))
        x = model.embed(ids).detach().requires_grad_(True)  # (64, time, d_model)
        projection = torch.randn(64, VALUES, generator=generator)
        (model.read(x) * projection).sum().backward()
        found.append(float(x.grad[:, -1 - k].norm(dim=-1).mean()))
    return found


def run(config: Config, seeds: list[int], progress: Progress) -> dict:
    progress.plan(len(MODELS) * len(seeds))
    accuracy = {name: [] for name in MODELS}
    gradient = {name: [] for name in MODELS}
    parameters = {}
    for seed in seeds:
        for name in MODELS:
            torch.manual_seed(seed)
            gradient[name].append(needle_gradient(build(name, config), config, seed))  # at initialisation
            model = train(name, config, seed)
            accuracy[name].append(band_accuracy(model, config, seed))
            parameters[name] = count_parameters(model)
            progress.step(f"{name} seed {seed}: accuracy by band {[round(a, 2) for a in accuracy[name][-1]]}")
    width = config.max_distance // config.bands
    return {
        "models": list(MODELS),
        "bands": [[b * width + 1, (b + 1) * width] for b in range(config.bands)],
        "accuracy": accuracy,  # per model: per seed, per band
        "gradient_distances": gradient_distances(config),
        "gradient": gradient,  # per model: per seed, per distance
        "parameters": parameters,
    }


def _ratios(results: dict, name: str) -> list[float]:
    """Per seed: the gradient at the longest distance / at the shortest."""
    return [g[-1] / g[0] for g in results["gradient"][name]]


def table(results: dict) -> tuple[list[str], list[list]]:
    columns = ["distance k", *[f"{name} accuracy" for name in MODELS]]
    rows = [
        [f"{lo}-{hi}", *[pm([seed[b] for seed in results["accuracy"][name]], 3) for name in MODELS]]
        for b, (lo, hi) in enumerate(results["bands"])
    ]
    rows += [
        [f"k = {k}: gradient at init", *[_sci([seed[j] for seed in results["gradient"][name]]) for name in MODELS]]
        for j, k in enumerate(results["gradient_distances"])
    ]
    rows.append(["gradient at longest / shortest k", *[_sci(_ratios(results, name)) for name in MODELS]])
    rows.append(["parameters", *[results["parameters"][name] for name in MODELS]])
    return columns, rows


def _sci(values: list[float]) -> str:
    """'mean ± std' in scientific notation: the LSTM's gradients span many orders of magnitude."""
    mean, std = mean_std(values)
    return f"{mean:.2e}" if len(values) == 1 else f"{mean:.2e} ± {std:.1e}"


# thresholds, fixed before the experiment ran
FLAT, FLOOR = 0.1, 0.9  # attention: farthest band >= nearest - FLAT, and >= FLOOR
LEARNED, FALL = 0.5, 0.2  # LSTM: nearest band >= LEARNED (it learned the task), farthest <= nearest - FALL
BEATS = 0.2  # attention - LSTM at the farthest band, on every seed
DECAYS, KEEPS = 0.01, 0.5  # gradient at the longest / shortest distance at initialisation: LSTM <=, attention >=


def checks(results: dict) -> list[Check]:
    near, far = (
        {name: mean_std([seed[b] for seed in results["accuracy"][name]])[0] for name in MODELS} for b in (0, -1)
    )
    gaps = [a[-1] - r[-1] for a, r in zip(results["accuracy"]["self-attention"], results["accuracy"]["LSTM"])]
    ratio = {name: mean_std(_ratios(results, name))[0] for name in MODELS}
    lo, hi = results["bands"][0], results["bands"][-1]
    span = f"k {lo[0]}-{lo[1]} vs {hi[0]}-{hi[1]}"
    return [
        Check(
            "self-attention's accuracy does not fall with the distance",
            f"farthest band >= nearest - {FLAT} and >= {FLOOR}",
            f"{span}: {near['self-attention']:.3f} vs {far['self-attention']:.3f}",
            far["self-attention"] >= near["self-attention"] - FLAT and far["self-attention"] >= FLOOR,
        ),
        Check(
            "the LSTM learns near needles but its accuracy falls with the distance",
            f"nearest band >= {LEARNED}; farthest <= nearest - {FALL}",
            f"{span}: {near['LSTM']:.3f} vs {far['LSTM']:.3f}",
            near["LSTM"] >= LEARNED and far["LSTM"] <= near["LSTM"] - FALL,
        ),
        Check(
            "at the farthest distances self-attention beats the LSTM",
            f"accuracy gap >= {BEATS} on every seed",
            ", ".join(f"{g:+.3f}" for g in gaps),
            all(g >= BEATS for g in gaps),
        ),
        Check(
            "at initialisation the LSTM's gradient to the needle decays with the distance, attention's does not",
            f"gradient at k={results['gradient_distances'][-1]} / at k=1: LSTM <= {DECAYS}, attention >= {KEEPS}",
            f"LSTM {ratio['LSTM']:.2e}, attention {ratio['self-attention']:.3f}",
            ratio["LSTM"] <= DECAYS and ratio["self-attention"] >= KEEPS,
        ),
    ]


def plots(results: dict, directory: Path) -> list[Path]:
    fig, (accuracy, gradient) = figure(2)
    centres = [statistics.fmean(band) for band in results["bands"]]
    for name, marker in zip(MODELS, "os"):
        per_band = list(zip(*results["accuracy"][name]))
        accuracy.errorbar(
            centres,
            [mean_std(b)[0] for b in per_band],
            yerr=[mean_std(b)[1] for b in per_band],
            marker=marker,
            capsize=3,
            label=name,
        )
        per_k = list(zip(*results["gradient"][name]))
        gradient.plot(results["gradient_distances"], [mean_std(g)[0] for g in per_k], marker=marker, label=name)
    accuracy.axhline(1 / VALUES, color="grey", linestyle=":", label="chance")
    accuracy.set(
        ylim=(0, 1.05),
        xlabel="distance k from the needle to the query",
        ylabel="accuracy",
        title="after training (mean over seeds)",
    )
    gradient.set(yscale="log", xlabel="distance k", ylabel="|d output / d needle embedding|", title="at initialisation")
    accuracy.legend(), gradient.legend()
    return [save(fig, directory / "rnn-interaction-distance.png")]
