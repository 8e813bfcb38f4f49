#!/usr/bin/env python
"""Does cheaper attention still reach far back? A needle-retrieval check in tiny causal models.

Task (`kqv.data.needle`): a sequence of random filler tokens hides one needle, a marker token followed by a value
token (one of 8), somewhere in its first quarter; its last quarter holds 16 query tokens, and after each the model
must predict the value. The answer is only in the needle, hundreds or thousands of tokens back, so a model can
solve it only if its attention can reach that position (chance is 1/8 = 12.5%).

Models: two pre-LN kqv `DecoderBlock`s (d_model 64, 2 heads, sinusoidal positions, kqv's embeddings, norms,
feed-forward and initialisation) whose self-attention keeps `MultiHeadAttention`'s projections but swaps its core:

* full       exact causal attention (torch SDPA, is_causal=True)
* linformer  `LinformerAttention` (causal, cumulative projection), k = 32
* bigbird    `BigBirdAttention` (causal), 32-token blocks, 1 window block each side, 1 global, 1 random

Training is a curriculum, one model per method: 250 AdamW steps at n = 128 (one-cycle schedule, peak lr 1e-2),
where full attention learns the lookup, then 100 steps at 512 and 50 at 1024 (peak lr 3.3e-3), each stage
scored when it ends. Trained from scratch at 512, full attention itself stayed at chance for 300 steps: the
gradient that teaches a query to find one token among n shrinks like 1/n. At n = 128 BigBird's blocks (global + window +
random) cover the whole past, so it should match full attention there; at 512 and 1024 they cover about a quarter
and an eighth of it.

    python benchmarks/long_context_quality.py --threads 1   # ~7 CPU-minutes
    python benchmarks/long_context_quality.py --quick       # seconds: a smoke test
"""

from __future__ import annotations

import sys
import time

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kqv import DecoderBlock, ModelConfig, MultiHeadAttention
from kqv.data import needle
from kqv.nn import BigBirdAttention, Embeddings, LinformerAttention, init_weights, make_norm
from kqv_lab import benchmarking as harness

RESULTS = harness.results_path("long_context_quality")


class FullAttention(nn.Module):
    """Exact attention, the baseline."""

    def forward(self, queries: Tensor, keys: Tensor, values: Tensor, *, causal: bool = False) -> Tensor:
        return F.scaled_dot_product_attention(queries, keys, values, is_causal=causal)


class SwappedAttention(MultiHeadAttention):
    """kqv's multi-head attention with its core replaced: the proposed `ModelConfig.attention` field in small.
    Same call and return as `MultiHeadAttention` for self-attention without a cache."""

    def __init__(self, config: ModelConfig, core: nn.Module):
        super().__init__(config)
        self.core = core

    def forward(self, x: Tensor, memory: Tensor | None = None, *, causal: bool = False, **unused) -> tuple:
        queries = self.split_heads(self.to_queries(x))  # (batch, heads, time, head_dim)
        keys, values = self.project_keys_values(x)
        output = self.core(queries, keys, values, causal=causal)  # (batch, heads, time, head_dim)
        return self.to_output(self.merge_heads(output)), None


class TinyLM(nn.Module):
    """Embeddings, kqv decoder blocks with swapped attention, a final norm, and logits for the next token."""

    def __init__(self, config: ModelConfig, make_core):
        super().__init__()
        self.embeddings = Embeddings(config, config.vocab_size)
        self.blocks = nn.ModuleList(DecoderBlock(config) for _ in range(config.n_layers))
        for block in self.blocks:
            block.self_attention = SwappedAttention(config, make_core())
        self.final_norm = make_norm(config)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        init_weights(self)

    def forward(self, ids: Tensor, at: Tensor) -> Tensor:
        """Logits for the next token after the positions `at` (batch, k): (batch, k, vocab)."""
        x = self.embeddings(ids, torch.arange(ids.shape[1]))
        for block in self.blocks:
            x, _ = block(x)
        return self.head(self.final_norm(x[torch.arange(len(x))[:, None], at]))


CORES = {
    "full": lambda time: FullAttention,
    "linformer": lambda time: lambda: LinformerAttention(max_len=time, k=32, chunk=256),
    "bigbird": lambda time: lambda: BigBirdAttention(block=32, window=1, global_blocks=1, random_blocks=1),
}


def evaluate(model: TinyLM, time_steps: int, seed: int) -> float:
    """Accuracy on the last query of 512 held-out sequences."""
    model.eval()
    correct = 0
    test_data = torch.Generator().manual_seed(10_000 + seed)
    with torch.no_grad():
        for _ in range(8):
            ids, queries, answers = needle.needle_batch(64, time_steps, test_data)
            correct += int((model(ids, queries[:, -1:]).argmax(-1)[:, 0] == answers).sum())
    model.train()
    return correct / 512


def run(method: str, stages: list[tuple[int, int]], batch: int, seed: int, lr: float) -> list[dict]:
    """Train one model through the stages (length, steps), scoring it at each stage's length when it ends."""
    torch.manual_seed(seed)
    longest = max(length for length, _ in stages)
    config = ModelConfig(
        vocab_size=needle.VOCAB,
        d_model=64,
        n_heads=2,
        n_layers=2,
        d_ff=128,
        max_len=longest,
        dropout=0.0,
        position="sinusoidal",
    )
    model = TinyLM(config, CORES[method](longest))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    train_data = torch.Generator().manual_seed(seed)
    results = []
    for stage, (length, steps) in enumerate(stages):
        peak = lr if stage == 0 else lr / 3  # later stages fine-tune what the first one found
        schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=peak, total_steps=steps, pct_start=0.1)
        start, start_cpu = time.perf_counter(), time.process_time()
        losses = []
        for _ in range(steps):
            ids, queries, answers = needle.needle_batch(batch, length, train_data)
            logits = model(ids, queries)  # (batch, QUERIES, vocab)
            loss = F.cross_entropy(logits.flatten(0, 1), answers.repeat_interleave(needle.QUERIES))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            losses.append(loss.item())
        results.append(
            {
                "method": method,
                "time": length,
                "steps": steps,
                "batch": batch,
                "train_s": time.perf_counter() - start,
                "train_cpu_s": time.process_time() - start_cpu,
                "final_loss": sum(losses[-10:]) / len(losses[-10:]),
                "accuracy": evaluate(model, length, seed),
            }
        )
        print(
            f"{method:>10} n={length:>5}: accuracy {results[-1]['accuracy']:.1%}, final loss "
            f"{results[-1]['final_loss']:.3f}, {results[-1]['train_s']:.0f} s",
            flush=True,
        )
    return results


def main() -> None:
    parser = harness.arguments(
        harness.summary(__doc__), quick="stages 64:30 and 128:20: a smoke test", output=RESULTS, seed=True, threads=None
    )
    parser.add_argument(
        "--stages",
        nargs="+",
        default=["128:250", "512:100", "1024:50"],
        help="length:steps, trained in order on one model per method",
    )
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-2)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    stages = [tuple(int(x) for x in stage.split(":")) for stage in (["64:30", "128:20"] if args.quick else args.stages)]
    start = time.perf_counter()
    results = [r for method in CORES for r in run(method, stages, args.batch, args.seed, args.lr)]
    print(f"\nneedle retrieval accuracy, last query, 512 held-out sequences (chance 12.5%); batch {args.batch}")
    print(f"{'n':>6} {'steps':>6} " + "".join(f"{m:>12}" for m in CORES))
    for length, steps in stages:
        row = {r["method"]: r for r in results if r["time"] == length}
        print(f"{length:>6} {steps:>6} " + "".join(f"{row[m]['accuracy']:>12.1%}" for m in CORES))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "command": "python benchmarks/long_context_quality.py " + " ".join(sys.argv[1:]),
        "threads": torch.get_num_threads(),
        "total_s": time.perf_counter() - start,
        "results": results,
    }
    harness.write_record(args.output, report)
    print(f"wrote {args.output} in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
