#!/usr/bin/env python
"""Training throughput of the MT job: where `kqv train mt` loses tokens per second.

The quick MT config's Transformer (configs/mt-quick.toml) trains on real de-en Bible batches (the job's own
`TokenBatches`, `mt_loss` with label smoothing, AdamW) under each setting in turn, interleaved for `--rounds`
rounds so that whatever else the machine runs slows all alike; the figure is the median over rounds of real
(non-padding) source + target tokens per second, and the ratio to the first setting. Settings: fp32 and bf16
autocast (emulated, hence slow, on CPUs without AVX512-BF16/AMX; `precision = "auto"` resolves to fp32 there), and
token budgets per batch (`data.max_tokens`). The padding fraction of each budget's batches is reported too.

    python benchmarks/mt_throughput.py              # writes benchmarks/results/mt_throughput.json
    python benchmarks/mt_throughput.py --quick      # a smoke test on a tiny model
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

import torch

from kqv.data import TokenBatches
from kqv.jobs import get_job, mt_loss, prepare_mt_data
from kqv.train import autocast, native_bf16, resolve_precision
from kqv_lab import benchmarking as harness

CONFIG = harness.ROOT / "src" / "kqv" / "configs" / "mt-quick.toml"
MT = get_job("mt")  # the MT job: its config reading and its model
TINY = [
    "model.d_model=64",
    "model.n_heads=2",
    "model.n_layers=1",
    "model.n_encoder_layers=1",
    "model.n_decoder_layers=1",
    "model.d_ff=128",
    "data.vocab_size=1000",
]


class Setting:
    """One model trained with one precision and token budget; `timed(steps)` returns tokens/s of those steps."""

    def __init__(self, precision: str, max_tokens: int, data, overrides: list[str]):
        config = MT.load_config(str(CONFIG), overrides)
        torch.manual_seed(0)
        self.name, self.precision, self.max_tokens = f"{precision}, max_tokens {max_tokens}", precision, max_tokens
        self.model = MT.build_model(config.model_config(data.tokenizer.vocab_size), config, {}).train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.batches = TokenBatches(
            data.splits["train"],
            max_tokens=max_tokens,
            max_rows=config.train.batch_size,
            seed=0,
            pad_id=data.pad_id,
            bos_id=data.bos_id,
            eos_id=data.eos_id,
        )
        self.label_smoothing, self.next, self.rates = config.train.label_smoothing, 0, []

    def step(self) -> int:
        batch, real = self.batches(self.next), self.batches.real_tokens(self.next)
        self.next += 1
        with autocast(self.precision):
            loss = mt_loss(self.model, batch, self.label_smoothing)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return real

    def timed(self, tokens: int) -> None:
        """Train until at least `tokens` real tokens have passed (so every setting does about the same work)."""

        def train() -> int:
            done = 0
            while done < tokens:
                done += self.step()
            return done

        timing = harness.timed(train)
        self.rates.append(timing.result / timing.seconds[0])

    def padding(self, batches: int = 200) -> float:
        real = padded = 0
        for i in range(min(batches, len(self.batches))):
            b = self.batches(i)
            real += self.batches.real_tokens(i)
            padded += b["src"].numel() + b["targets"].numel()
        return 1 - real / padded


def main(argv: list[str] | None = None) -> int:
    parser = harness.arguments(
        __doc__,
        whole=True,
        quick="tiny model, one round (a smoke test)",
        output=harness.results_path("mt_throughput"),
        output_flag="--out",
        threads=1,
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=12000, help="real tokens per setting per round")
    parser.add_argument("--max-tokens", type=int, nargs="+", default=[2000, 4000])
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    overrides = TINY if args.quick else []
    rounds, tokens = (1, 600) if args.quick else (args.rounds, args.tokens)
    with tempfile.TemporaryDirectory() as scratch:
        data = prepare_mt_data(MT.load_config(str(CONFIG), overrides), Path(scratch), reuse=False)
    budgets = args.max_tokens
    settings = [
        Setting("fp32", budgets[0], data, overrides),
        Setting("bf16", budgets[0], data, overrides),
        *(Setting("fp32", b, data, overrides) for b in budgets[1:]),
    ]
    for s in settings:  # warm-up: oneDNN builds its kernels on the first shapes it sees
        s.step()
    for _ in range(rounds):
        for s in settings:
            s.timed(tokens)
    base = statistics.median(settings[0].rates)
    rows = [
        {
            "setting": s.name,
            "precision": s.precision,
            "max_tokens": s.max_tokens,
            "tokens_per_s": round(statistics.median(s.rates), 1),
            "ratio": round(statistics.median(s.rates) / base, 3),
            "rounds": [round(r, 1) for r in s.rates],
            "padding": round(s.padding(), 4),
        }
        for s in settings
    ]
    print(
        f"MT training throughput (median of {rounds} interleaved rounds, {args.threads} thread(s); "
        f"native bf16: {native_bf16()}, precision 'auto' resolves to {resolve_precision('auto')})"
    )
    print("| setting | real tokens/s | vs fp32 2000 | padding |\n| --- | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['setting']} | {r['tokens_per_s']:,.0f} | {r['ratio']:.2f}x | {r['padding']:.1%} |")
    harness.write_record(
        args.output,
        {
            "rows": rows,
            "threads": args.threads,
            "rounds": rounds,
            "quick": args.quick,
            "native_bf16": native_bf16(),
            "auto": resolve_precision("auto"),
            "torch": torch.__version__,
        },
    )
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
