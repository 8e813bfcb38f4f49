"""One training loop for every kqv model: language models, machine translation, classification.

The trainer knows nothing about models or data. It is given any `nn.Module` and two functions:

* `train_batches(i)` returns the i-th micro-batch of training data (a tensor, a tuple/list/dict of tensors, or
  anything `loss_fn` understands);
* `loss_fn(model, batch)` returns the scalar loss of a batch,

and does the rest: AdamW with weight-decay groups, linear warmup then cosine decay (or inverse-sqrt, or constant),
gradient clipping and accumulation, bf16 autocast, periodic validation, metrics and a loss plot, atomic
checkpoints that resume bit-exactly, a checkpoint on Ctrl-C, and multi-process training under torchrun.

Determinism contract. `train_batches(i)` must return the same batch for the same `i`. Update `s` (0-based) uses
the micro-batches `s * grad_accum + j` for `j` in `range(grad_accum)`, so a resumed run needs no data-loader
state: it asks for the batches of the next step. The random generators (torch, `random`, numpy) are seeded at
the start of a fresh run and saved in every checkpoint, so dropout continues exactly too. Evaluation runs on a
saved-and-restored generator state, so how often you evaluate never changes the training run.

Multi-process training. Launch the same script with `torchrun --nproc_per_node N script.py`. When WORLD_SIZE > 1
the trainer joins a gloo process group and wraps the model in DistributedDataParallel. Every rank calls
`train_batches(i)` and gets the same global batch of `batch_size` rows; rank r keeps rows
`[r * batch_size / N, (r + 1) * batch_size / N)` of every tensor in it (non-tensor items are shared), so the batch
function is the same for one or N processes and the result equals one process up to float rounding. `loss_fn`
receives the wrapped model and must call it (its `forward`) for gradients to be synchronised. Only rank 0
writes files and shows progress.

Files in `run_dir`: `metrics.jsonl` (one JSON object per log or evaluation step), `loss.png`, and
`checkpoint/` holding `model.safetensors`, `optimizer.pt` (loaded with `weights_only=True`), `rng.safetensors`
(torch generator state of every rank) and `state.json` (step, config, generator states of `random` and numpy,
`extra_state`, SHA-256 of the other files).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.distributed as dist
from safetensors import SafetensorError
from safetensors.torch import load_file, load_model, save_file, save_model
from torch import Tensor, nn
from tqdm import tqdm

from ..nn.config import build_dataclass

logger = logging.getLogger(__name__)

Batch = Any
Schedule = Literal["cosine", "inverse_sqrt", "constant"]
Precision = Literal["fp32", "bf16"]
IfExists = Literal["error", "resume", "overwrite"]

CHECKPOINT_DIR = "checkpoint"
PREVIOUS_CHECKPOINT_DIR = "checkpoint.old"  # exists only between the two renames of a checkpoint swap
MODEL_FILE, OPTIMIZER_FILE, RNG_FILE, STATE_FILE = "model.safetensors", "optimizer.pt", "rng.safetensors", "state.json"
METRICS_FILE, PLOT_FILE = "metrics.jsonl", "loss.png"
_TMP_PREFIX = ".checkpoint-tmp-"
_FORMAT = 1


@dataclass
class TrainConfig:
    """How to train: schedule, optimizer, precision and how often to log, evaluate and checkpoint.

    `batch_size` is the number of rows of one micro-batch returned by `train_batches` (the global batch, before
    it is split across processes); one update sees `batch_size * grad_accum` rows. `schedule`: "cosine" warms up
    linearly for `warmup_steps` then decays to `min_lr_ratio * lr`; "inverse_sqrt" is Vaswani et al. 2017's
    d^-0.5 * min(t^-0.5, t * warmup^-1.5) scaled so its peak is `lr` (it ignores `min_lr_ratio`); "constant"
    warms up and stays at `lr`. `grad_clip=0` disables clipping. Evaluation and checkpoints happen every
    `eval_every` / `checkpoint_every` updates and always after the last one. `max_minutes > 0` makes the update
    during which that much training time (evaluation and checkpoints excluded) has passed the last one, for
    comparisons at equal wall-clock budget; the schedule still follows `steps`.
    """

    steps: int
    batch_size: int
    lr: float = 3e-4
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    schedule: Schedule = "cosine"
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    grad_accum: int = 1
    precision: Precision = "bf16"
    eval_every: int = 100
    eval_batches: int = 20
    checkpoint_every: int = 500
    seed: int = 0
    log_every: int = 10
    max_minutes: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.betas, list):  # after a JSON round trip
            self.betas = tuple(self.betas)
        for name, minimum in (("steps", 1), ("batch_size", 1), ("warmup_steps", 0), ("grad_accum", 1),
                              ("eval_every", 1), ("eval_batches", 1), ("checkpoint_every", 1), ("seed", 0),
                              ("log_every", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
            if value < minimum:
                raise ValueError(f"{name} must be at least {minimum}, got {value}")
        for name in ("lr", "min_lr_ratio", "weight_decay", "grad_clip", "max_minutes"):
            _check_float(name, getattr(self, name))
        if self.max_minutes < 0:
            raise ValueError(f"max_minutes must be >= 0 (0 = no time limit), got {self.max_minutes}")
        if self.lr <= 0:
            raise ValueError(f"lr must be positive, got {self.lr}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"min_lr_ratio must be in [0, 1] (the final lr over the peak), got {self.min_lr_ratio}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be non-negative, got {self.weight_decay}")
        if self.grad_clip < 0:
            raise ValueError(f"grad_clip must be non-negative (0 disables clipping), got {self.grad_clip}")
        if not isinstance(self.betas, tuple) or len(self.betas) != 2:
            raise ValueError(f"betas must be a pair (beta1, beta2), got {self.betas!r}")
        for beta in self.betas:
            _check_float("betas", beta)
            if not 0 <= beta < 1:
                raise ValueError(f"betas must lie in [0, 1), got {self.betas}")
        for name, options in (("schedule", Schedule), ("precision", Precision)):
            if getattr(self, name) not in options.__args__:
                raise ValueError(f"{name} must be one of {list(options.__args__)}, got {getattr(self, name)!r}")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "betas": list(self.betas)}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        return build_dataclass(cls, values, "TrainConfig")


def _check_float(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TypeError(f"{name} must be a finite number, got {type(value).__name__} {value!r}")


def learning_rate(config: TrainConfig, step: int) -> float:
    """The learning rate of update number `step` (1-based: the first update is step 1).

    Warmup rises linearly and reaches `lr` at `step == warmup_steps`; cosine then falls to `min_lr_ratio * lr`
    exactly at `step == steps`.
    """
    peak, warmup = config.lr, config.warmup_steps
    if config.schedule == "inverse_sqrt":
        warmup = max(warmup, 1)
        return peak * min(step / warmup, math.sqrt(warmup / step))
    if step <= warmup:
        return peak * step / warmup
    if config.schedule == "constant":
        return peak
    progress = min((step - warmup) / (config.steps - warmup), 1.0)  # (0, 1]
    floor = config.min_lr_ratio * peak
    return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


# ---------------------------------------------------------------------------------------------------------------
# Optimizer


def _is_norm(module: nn.Module) -> bool:
    norms = (nn.LayerNorm, nn.RMSNorm, nn.GroupNorm, nn.LocalResponseNorm, nn.modules.batchnorm._NormBase)
    return isinstance(module, norms) or "Norm" in type(module).__name__


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: weight decay for matrices (>= 2-D weights of linear layers, attention scores, ...), none for
    biases, norm gains, embeddings (also when tied to an output layer), and parameters a module names in a
    `no_weight_decay` attribute (e.g. a table of relative-position embeddings). Tied weights appear once."""
    exempt: set[int] = set()
    for module in model.modules():
        whole = isinstance(module, (nn.Embedding, nn.EmbeddingBag)) or _is_norm(module)
        named = set(getattr(module, "no_weight_decay", ()))
        for name, param in module.named_parameters(recurse=False):
            if whole or name in named:
                exempt.add(id(param))
    decay, no_decay = [], []
    for param in model.parameters():  # yields each shared parameter once
        if param.requires_grad:
            (decay if param.dim() >= 2 and id(param) not in exempt else no_decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def make_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.AdamW:
    """AdamW over `parameter_groups`; the fused CPU kernel when possible (about 4x faster than foreach)."""
    groups = [g for g in parameter_groups(model, config.weight_decay) if g["params"]]
    if not groups:
        raise ValueError("the model has no trainable parameters")
    fused = all(p.dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16)
                for g in groups for p in g["params"])
    return torch.optim.AdamW(groups, lr=config.lr, betas=config.betas, fused=fused or None)


# ---------------------------------------------------------------------------------------------------------------
# The trainer


class Trainer:
    """Trains `model` on `train_batches` by minimising `loss_fn`; see the module docstring for the contracts.

    `val_batches(i)` (optional) gives validation batches; every evaluation reports `val_loss`, the mean of
    `loss_fn` over `config.eval_batches` of them. `eval_fn(model)` (optional) returns further metrics (accuracy,
    BLEU, ...); it runs on rank 0 only. Both run under `torch.no_grad()`, `model.eval()` and the training
    precision. `extra_state` is any JSON-serialisable dict saved with every checkpoint (e.g. the model config)
    and restored by `resume`. `tokens_per_batch` sets the token count of a micro-batch for tokens/s; by default it
    is the numel of the batch tensor or of the first tensor of a tuple/list/dict.

    `if_exists` says what to do when `run_dir` already holds a run: "error" (refuse, the default), "resume"
    (continue its checkpoint with the `config` given here; start fresh if `run_dir` is empty) or "overwrite"
    (delete the run's files when training starts).
    """

    def __init__(self, model: nn.Module, config: TrainConfig, run_dir: str | Path, *,
                 train_batches: Callable[[int], Batch], loss_fn: Callable[[nn.Module, Batch], Tensor],
                 val_batches: Callable[[int], Batch] | None = None,
                 eval_fn: Callable[[nn.Module], dict[str, float]] | None = None,
                 extra_state: dict[str, Any] | None = None, tokens_per_batch: int | None = None,
                 if_exists: IfExists = "error", quiet: bool = False):
        if not isinstance(config, TrainConfig):
            raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
        if if_exists not in IfExists.__args__:
            raise ValueError(f"if_exists must be one of {list(IfExists.__args__)}, got {if_exists!r}")
        try:
            json.dumps(extra_state)
        except (TypeError, ValueError) as error:
            raise TypeError(f"extra_state must be JSON-serialisable (it goes into {STATE_FILE}): {error}") from None
        self.model, self.config, self.run_dir = model, config, Path(run_dir)
        self.train_batches, self.loss_fn, self.val_batches, self.eval_fn = train_batches, loss_fn, val_batches, eval_fn
        self.extra_state = dict(extra_state or {})
        self.tokens_per_batch, self.quiet = tokens_per_batch, quiet
        self.rank, self.world_size, self._owns_process_group = _init_distributed()
        if config.batch_size % self.world_size:
            raise ValueError(f"batch_size ({config.batch_size}) must be divisible by the number of processes "
                             f"({self.world_size}): every process takes an equal slice of each batch")
        self.optimizer = make_optimizer(model, config)
        self.step = 0  # updates done
        self.elapsed_s = 0.0
        self.train_seconds = 0.0  # time spent in updates: elapsed_s without evaluation and checkpoints
        self._saved_rng: list[dict | None] | None = None  # generator states to restore when training starts
        self._overwrite = False

        existing = _run_files(self.run_dir)
        if existing and if_exists == "error":
            raise FileExistsError(
                f"{self.run_dir} already holds a run ({', '.join(p.name for p in existing)}); continue it with "
                f"Trainer.resume(...) or if_exists='resume', start over with if_exists='overwrite' (deletes those "
                f"files), or choose another run_dir")
        if existing and if_exists == "resume":
            self._load(read_checkpoint(self.run_dir))
        self._overwrite = bool(existing) and if_exists == "overwrite"
        self.ddp_model = model
        if self.world_size > 1:
            self.ddp_model = nn.parallel.DistributedDataParallel(model)

    @classmethod
    def resume(cls, run_dir: str | Path, model: nn.Module, *, train_batches: Callable[[int], Batch],
               loss_fn: Callable[[nn.Module, Batch], Tensor], config: TrainConfig | None = None,
               **options: Any) -> Trainer:
        """Continue the run saved in `run_dir`. `config=None` uses the saved config; pass one to change it (e.g.
        more steps). `extra_state` is restored from the checkpoint unless given. Raises FileNotFoundError when
        there is no checkpoint and ValueError when it is corrupt."""
        saved = read_checkpoint(run_dir)
        return cls(model, config or saved.config, run_dir, train_batches=train_batches, loss_fn=loss_fn,
                   if_exists="resume", **options)

    # -- the loop ------------------------------------------------------------------------------------------------

    def train(self) -> dict[str, float]:
        """Train until `config.steps` updates are done; returns the metrics of the last step. On Ctrl-C it saves
        a checkpoint of the last completed update and re-raises KeyboardInterrupt."""
        cfg = self.config
        if self.rank == 0:
            self._prepare_run_dir()
        self._start_rng()
        self._boundary_rng = _rng_state()  # generator state after the last completed update
        self._updating = False
        self._last_saved = self.step if self._saved_rng is not None else None
        self.ddp_model.train()
        bar = tqdm(total=cfg.steps, initial=self.step, unit="step", dynamic_ncols=True,
                   disable=self.quiet or self.rank != 0 or not sys.stderr.isatty())
        window = _Window()
        clock = time.perf_counter() - self.elapsed_s
        result: dict[str, float] = {"step": self.step}
        try:
            while self.step < cfg.steps:
                started = time.perf_counter()
                lr = learning_rate(cfg, self.step + 1)
                loss, tokens, grad_norm = self._update(lr)
                self.step += 1
                self._boundary_rng = _rng_state()
                self._updating = False
                now = time.perf_counter()
                self.elapsed_s = now - clock
                self.train_seconds += now - started
                window.add(loss, tokens, now - started)
                last = self.step == cfg.steps or self._out_of_time()
                result = self._report(lr, grad_norm, window, bar, clock, last) or result
                if self.step % cfg.checkpoint_every == 0 or last:
                    self.save_checkpoint()
                bar.update(1)
                if last:
                    break
        except KeyboardInterrupt:
            self._save_after_interrupt(clock)
            raise
        finally:
            bar.close()
            if self._owns_process_group:
                dist.destroy_process_group()
                self._owns_process_group = False
        return result

    def _out_of_time(self) -> bool:
        """Whether `max_minutes` of training time have passed; rank 0's clock decides for every process."""
        if self.config.max_minutes <= 0:
            return False
        done = torch.tensor(float(self.train_seconds >= self.config.max_minutes * 60))
        if self.world_size > 1:
            dist.broadcast(done, src=0)
        return bool(done)

    def _report(self, lr: float, grad_norm: float, window: _Window, bar: tqdm, clock: float,
                last: bool) -> dict | None:
        """Log (every `log_every` updates) and evaluate (every `eval_every`); one metrics.jsonl record for both."""
        cfg = self.config
        record: dict[str, Any] = {}
        if self.step % cfg.log_every == 0 or last:
            record.update(train_loss=window.mean_loss(), lr=lr, tokens_per_s=window.tokens_per_s(),
                          grad_norm=grad_norm)
            bar.set_postfix(loss=f"{record['train_loss']:.4f}", lr=f"{lr:.2e}",
                            **({"tok/s": f"{record['tokens_per_s']:,.0f}"} if record["tokens_per_s"] else {}))
            window.reset()
        can_evaluate = self.val_batches is not None or self.eval_fn is not None
        evaluated = can_evaluate and (self.step % cfg.eval_every == 0 or last)
        if evaluated:
            record.update(self.evaluate())
        if not record:
            return None
        record = {"step": self.step, **record, "train_seconds": self.train_seconds,
                  "elapsed_s": time.perf_counter() - clock}
        if self.rank == 0:
            _append_metrics(self.run_dir / METRICS_FILE, record)
            if evaluated or last:
                plot_losses(self.run_dir / METRICS_FILE, self.run_dir / PLOT_FILE)
            if evaluated and not self.quiet:
                tqdm.write(_progress_line(self.step, cfg.steps, record))
        return record

    def _update(self, lr: float) -> tuple[float, int | None, float]:
        """One optimizer update over `grad_accum` micro-batches; returns (mean loss, tokens, gradient norm)."""
        cfg = self.config
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        total = torch.zeros(())
        tokens: int | None = 0
        for j in range(cfg.grad_accum):
            batch = self.train_batches(self.step * cfg.grad_accum + j)
            count = self.tokens_per_batch or _count_tokens(batch)
            tokens = None if tokens is None or count is None else tokens + count
            local = _slice_batch(batch, self.rank, self.world_size, cfg.batch_size)
            defer_sync = self.world_size > 1 and j < cfg.grad_accum - 1
            with self.ddp_model.no_sync() if defer_sync else nullcontext():
                with self._autocast():
                    loss = _check_loss(self.loss_fn(self.ddp_model, local))
                (loss / cfg.grad_accum).backward()
            total += loss.detach().float()
        total /= cfg.grad_accum
        if self.world_size > 1:
            dist.all_reduce(total)
            total /= self.world_size
        mean_loss = total.item()
        if not math.isfinite(mean_loss):  # the same on every rank, so all stop together
            raise FloatingPointError(f"the training loss is {mean_loss} at step {self.step + 1}; the last good "
                                     f"checkpoint is in {self.run_dir}; try a lower lr or more warmup")
        max_norm = cfg.grad_clip if cfg.grad_clip > 0 else math.inf
        grad_norm = nn.utils.clip_grad_norm_(self.model.parameters(), max_norm, foreach=True).item()
        self._updating = True  # an interrupt from here until the step counter moves leaves no clean state
        self.optimizer.step()
        return mean_loss, tokens, grad_norm

    def _autocast(self):
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.config.precision == "bf16")

    def evaluate(self) -> dict[str, float]:
        """Validation metrics now: `val_loss` and whatever `eval_fn` returns. Training randomness is untouched."""
        rng = _rng_state()
        self.model.eval()
        metrics: dict[str, float] = {}
        try:
            with torch.no_grad(), self._autocast():
                if self.val_batches is not None:
                    metrics["val_loss"] = self._val_loss()
                if self.eval_fn is not None and self.rank == 0:
                    for name, value in self.eval_fn(self.model).items():
                        try:
                            metrics[name] = float(value)
                        except (TypeError, ValueError):
                            raise TypeError(f"eval_fn must return numbers, got {name}={value!r}") from None
        finally:
            self.ddp_model.train()
            _set_rng_state(rng)
        return metrics

    def _val_loss(self) -> float:
        total = torch.zeros(())
        for i in range(self.config.eval_batches):
            local = _slice_batch(self.val_batches(i), self.rank, self.world_size, self.config.batch_size)
            total += _check_loss(self.loss_fn(self.model, local)).float()
        if self.world_size > 1:
            dist.all_reduce(total)
            total /= self.world_size
        return total.item() / self.config.eval_batches

    # -- checkpoints ---------------------------------------------------------------------------------------------

    def save_checkpoint(self) -> None:
        """Save the state after the last completed update (every rank must call this under torchrun)."""
        rng = _rng_state()
        states = [rng]
        if self.world_size > 1:
            states = [None] * self.world_size
            dist.all_gather_object(states, _rng_to_json(rng, torch_as_bytes=True))
            states = [_rng_from_json(s) for s in states]
        if self.rank == 0:
            self._write(states)

    def _save_after_interrupt(self, clock: float) -> None:
        if self.rank != 0:
            return
        if self._updating:
            logger.warning("interrupted during an optimizer update; kept the last checkpoint in %s", self.run_dir)
            return
        if self._last_saved != self.step:
            # Other ranks are somewhere else, so no collective: their generator states are not saved.
            self.elapsed_s = time.perf_counter() - clock
            self._write([self._boundary_rng])
        if (self.run_dir / METRICS_FILE).exists():
            plot_losses(self.run_dir / METRICS_FILE, self.run_dir / PLOT_FILE)
        logger.warning("interrupted: saved the checkpoint of step %d in %s; continue with Trainer.resume(...)",
                       self.step, self.run_dir / CHECKPOINT_DIR)

    def _write(self, rng_states: list[dict]) -> None:
        state = {"format": _FORMAT, "step": self.step, "config": self.config.to_dict(),
                 "extra_state": self.extra_state, "elapsed_s": self.elapsed_s, "train_seconds": self.train_seconds,
                 "world_size": self.world_size,
                 "rng": [_rng_to_json(s) for s in rng_states], "torch_version": torch.__version__}
        write_checkpoint(self.run_dir, self.model, self.optimizer, state,
                         {f"rank{r}": s["torch"] for r, s in enumerate(rng_states)})
        self._last_saved = self.step

    def _load(self, checkpoint: Checkpoint) -> None:
        load_weights(self.model, checkpoint)
        path = checkpoint.path / OPTIMIZER_FILE
        configured = [(g["betas"], g["weight_decay"]) for g in self.optimizer.param_groups]
        try:
            self.optimizer.load_state_dict(torch.load(path, weights_only=True))
        except (ValueError, KeyError, RuntimeError) as error:
            raise ValueError(f"{path} does not fit this model's optimizer ({error}); was the model built with the "
                             f"same config as the run in {self.run_dir}?") from None
        for group, (betas, weight_decay) in zip(self.optimizer.param_groups, configured):  # the config may change
            group["betas"], group["weight_decay"] = betas, weight_decay
        torch_states = load_file(checkpoint.path / RNG_FILE)
        self._saved_rng = [
            {**_rng_from_json(s), "torch": torch_states[f"rank{r}"]} if s is not None else None
            for r, s in enumerate(checkpoint.state["rng"])]
        if checkpoint.state.get("world_size") != self.world_size:
            self._saved_rng = []  # generator states belong to ranks that no longer exist
        self.step, self.elapsed_s = checkpoint.step, float(checkpoint.state.get("elapsed_s", 0.0))
        self.train_seconds = float(checkpoint.state.get("train_seconds", self.elapsed_s))
        self.extra_state = {**checkpoint.extra_state, **self.extra_state}

    def _start_rng(self) -> None:
        """Seed a fresh run; restore the saved generators of a resumed one (reseed ranks that have none)."""
        seed = self.config.seed + self.rank
        if self._saved_rng is None:
            _seed_everything(seed)
        elif self.rank < len(self._saved_rng) and self._saved_rng[self.rank] is not None:
            _set_rng_state(self._saved_rng[self.rank])
        else:
            logger.warning("rank %d has no saved generator state (the checkpoint came from an interrupt or another "
                           "number of processes); reseeding, so dropout differs from an uninterrupted run", self.rank)
            _seed_everything(seed + 1_000_003 * self.step)

    def _prepare_run_dir(self) -> None:
        if self._overwrite:
            for path in _run_files(self.run_dir):
                shutil.rmtree(path) if path.is_dir() else path.unlink()
            self._overwrite = False
        self.run_dir.mkdir(parents=True, exist_ok=True)
        metrics = self.run_dir / METRICS_FILE
        if metrics.exists():  # drop records of steps after the checkpoint: they are about to be redone
            kept = [r for r in read_metrics(metrics) if r["step"] <= self.step]
            _write_atomically(metrics, "".join(json.dumps(r) + "\n" for r in kept).encode())


# ---------------------------------------------------------------------------------------------------------------
# Checkpoint files


@dataclass
class Checkpoint:
    """A verified checkpoint: where it is, the update it was taken after, its config and extra_state."""

    path: Path
    step: int
    config: TrainConfig
    extra_state: dict[str, Any]
    state: dict[str, Any]  # the whole state.json


def write_checkpoint(run_dir: Path, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any],
                     tensors: dict[str, Tensor]) -> None:
    """Write a checkpoint into a temporary directory, then swap it in for `run_dir/checkpoint`.

    The old checkpoint stays until the new one is complete: it is renamed to `checkpoint.old`, the new directory
    is renamed to `checkpoint`, and only then is the old one deleted. A crash between the two renames leaves
    `checkpoint.old`, which `read_checkpoint` falls back to.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    final, previous = run_dir / CHECKPOINT_DIR, run_dir / PREVIOUS_CHECKPOINT_DIR
    for stale in run_dir.glob(_TMP_PREFIX + "*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=_TMP_PREFIX, dir=run_dir))
    try:
        save_model(model, str(tmp / MODEL_FILE))  # drops the duplicate names of tied weights
        torch.save(optimizer.state_dict(), tmp / OPTIMIZER_FILE)
        save_file(tensors, str(tmp / RNG_FILE))
        state = {**state, "files": {name: _sha256(tmp / name) for name in (MODEL_FILE, OPTIMIZER_FILE, RNG_FILE)}}
        (tmp / STATE_FILE).write_text(json.dumps(state, indent=1))
        for name in (MODEL_FILE, OPTIMIZER_FILE, RNG_FILE, STATE_FILE):
            _fsync(tmp / name)
        if final.exists():
            if previous.exists():  # a leftover from an earlier, completed swap
                shutil.rmtree(previous)
            os.replace(final, previous)
        os.replace(tmp, final)
        _fsync(run_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(previous, ignore_errors=True)


def read_checkpoint(run_dir: str | Path) -> Checkpoint:
    """Read and verify (SHA-256 of every file) the checkpoint of a run, without loading any tensors."""
    run_dir = Path(run_dir)
    path = run_dir / CHECKPOINT_DIR
    if not path.exists() and (run_dir / PREVIOUS_CHECKPOINT_DIR).exists():
        path = run_dir / PREVIOUS_CHECKPOINT_DIR  # a swap was interrupted after the old checkpoint moved aside
    state_path = path / STATE_FILE
    remedy = (f"restore {path} from a backup, or start the run over with if_exists='overwrite' (deletes it)")
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint in {run_dir}: {state_path} does not exist; start a fresh run "
                                f"instead of resuming, or check the run_dir")
    if not state_path.is_file():
        raise FileNotFoundError(f"{state_path} is missing, so the checkpoint in {path} is incomplete; {remedy}")
    try:
        state = json.loads(state_path.read_text())
        step, config = state["step"], TrainConfig.from_dict(state["config"])
        files, extra_state = state["files"], state["extra_state"]
        if state["format"] != _FORMAT:
            raise ValueError(f"format {state['format']} is not {_FORMAT}")
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as error:
        raise ValueError(f"{state_path} is corrupt or not a kqv checkpoint ({error}); {remedy}") from None
    for name, digest in files.items():
        file = path / name
        if not file.is_file():
            raise FileNotFoundError(f"{file} is missing from the checkpoint; {remedy}")
        if _sha256(file) != digest:
            raise ValueError(f"{file} is corrupt: its SHA-256 differs from the one recorded in {state_path}; {remedy}")
    return Checkpoint(path, step, config, extra_state, state)


def load_weights(model: nn.Module, checkpoint: str | Path | Checkpoint) -> Checkpoint:
    """Load the weights of a checkpoint (or of the run in a run_dir) into `model`, e.g. for evaluation."""
    if not isinstance(checkpoint, Checkpoint):
        checkpoint = read_checkpoint(checkpoint)
    path = checkpoint.path / MODEL_FILE
    try:
        load_model(model, str(path), strict=True)
    except (RuntimeError, SafetensorError) as error:
        raise ValueError(f"{path} does not fit the model ({error}); build the model with the config the run was "
                         f"trained with (saved in extra_state if the training script put it there)") from None
    return checkpoint


def _run_files(run_dir: Path) -> list[Path]:
    names = (CHECKPOINT_DIR, PREVIOUS_CHECKPOINT_DIR, METRICS_FILE, PLOT_FILE)
    return [run_dir / name for name in names if (run_dir / name).exists()]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------------------------
# Metrics and the loss plot


def _append_metrics(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a") as file:
        file.write(json.dumps(record) + "\n")


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl, skipping a line left incomplete by a crash."""
    records = []
    for line in Path(path).read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return [r for r in records if isinstance(r, dict) and "step" in r]


def plot_losses(metrics_path: str | Path, png_path: str | Path) -> None:
    """Draw training and validation loss against step from metrics.jsonl (Agg canvas; no pyplot state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    records = read_metrics(metrics_path) if Path(metrics_path).exists() else []
    figure = Figure(figsize=(7, 4), dpi=100, layout="tight")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for key, style in (("train_loss", "-"), ("val_loss", "o-")):
        points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
        if points:
            axes.plot(*zip(*points), style, label=key.replace("_", " "))
    axes.set(xlabel="step", ylabel="loss")
    axes.grid(alpha=0.3)
    if axes.lines:
        axes.legend()
    png_path = Path(png_path)
    tmp = png_path.with_name(png_path.name + ".tmp")
    figure.savefig(tmp, format="png")
    os.replace(tmp, png_path)


# ---------------------------------------------------------------------------------------------------------------
# Batches, distributed set-up and random generators


class _Window:
    """Losses, tokens and compute time since the last log record."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.loss, self.steps, self.tokens, self.seconds = 0.0, 0, 0, 0.0

    def add(self, loss: float, tokens: int | None, seconds: float) -> None:
        self.loss += loss
        self.steps += 1
        self.tokens = None if tokens is None or self.tokens is None else self.tokens + tokens
        self.seconds += seconds

    def mean_loss(self) -> float:
        return self.loss / self.steps

    def tokens_per_s(self) -> float | None:
        return None if self.tokens is None else self.tokens / self.seconds


def _progress_line(step: int, steps: int, record: dict[str, Any]) -> str:
    """One line per evaluation, e.g. `step  200/1200  train 1.912  val 1.987  41,250 tok/s  1.2 min`."""
    parts = [f"step {step:>{len(str(steps))}}/{steps}"]
    parts += [f"{name.removesuffix('_loss')} {record[name]:.3f}" for name in ("train_loss", "val_loss") if name in record]
    shown_otherwise = ("train_loss", "val_loss", "lr", "tokens_per_s", "grad_norm", "train_seconds", "elapsed_s")
    parts += [f"{name} {value:.4g}" for name, value in record.items()
              if isinstance(value, float) and name not in shown_otherwise]
    if record.get("tokens_per_s"):
        parts.append(f"{record['tokens_per_s']:,.0f} tok/s")
    return "  ".join(parts + [f"{record['elapsed_s'] / 60:.1f} min"])


def _slice_batch(batch: Batch, rank: int, world_size: int, batch_size: int) -> Batch:
    """This rank's rows of every tensor in the batch (the batch itself in a single process)."""
    if world_size == 1:
        return batch
    if isinstance(batch, Tensor):
        if batch.dim() == 0 or batch.shape[0] != batch_size:
            raise ValueError(f"under torchrun every tensor in a batch is split along dim 0, which must be "
                             f"batch_size={batch_size}; got a tensor of shape {tuple(batch.shape)}")
        rows = batch_size // world_size
        return batch[rank * rows:(rank + 1) * rows]
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(_slice_batch(x, rank, world_size, batch_size) for x in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(_slice_batch(x, rank, world_size, batch_size) for x in batch)
    if isinstance(batch, dict):
        return {k: _slice_batch(v, rank, world_size, batch_size) for k, v in batch.items()}
    return batch


def _count_tokens(batch: Batch) -> int | None:
    if isinstance(batch, dict):
        batch = next(iter(batch.values()), None)
    if isinstance(batch, (tuple, list)) and batch:
        batch = batch[0]
    return batch.numel() if isinstance(batch, Tensor) else None


def _check_loss(loss: Any) -> Tensor:
    if not isinstance(loss, Tensor) or loss.numel() != 1:
        shape = tuple(loss.shape) if isinstance(loss, Tensor) else type(loss).__name__
        raise TypeError(f"loss_fn must return a scalar tensor (the mean loss of the batch), got {shape}")
    return loss.reshape(())


def _init_distributed() -> tuple[int, int, bool]:
    """(rank, world size, whether we created the process group); joins a gloo group under torchrun."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return 0, 1, False
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), False
    dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size(), True


def _seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)


def _rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])


def _rng_to_json(state: dict[str, Any], torch_as_bytes: bool = False) -> dict[str, Any]:
    """JSON form of the `random` and numpy states (the torch state is a tensor, saved in rng.safetensors)."""
    version, internal, gauss = state["python"]
    name, keys, position, has_gauss, cached = state["numpy"]
    out = {"python": [version, list(internal), gauss],
           "numpy": [name, keys.tolist(), int(position), int(has_gauss), float(cached)]}
    if torch_as_bytes:
        out["torch"] = state["torch"].numpy().tobytes()
    return out


def _rng_from_json(state: dict[str, Any]) -> dict[str, Any]:
    version, internal, gauss = state["python"]
    name, keys, position, has_gauss, cached = state["numpy"]
    out = {"python": (version, tuple(internal), gauss),
           "numpy": (name, np.array(keys, dtype=np.uint32), position, has_gauss, cached)}
    if "torch" in state:
        out["torch"] = torch.frombuffer(bytearray(state["torch"]), dtype=torch.uint8)
    return out
