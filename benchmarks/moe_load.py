#!/usr/bin/env python
"""Per-expert load over a short Switch run: does the load-balancing loss (Fedus et al. 2021) keep the experts
evenly used?

Trains the lm job on Shakespeare (character level) with a Switch feed-forward (`ffn = "switch"`, 4 experts in
every block, capacity factor 1.25, aux_loss_coefficient 0.01) and reads back what the trainer logs every
`log_every` updates from the last training batch: each layer's fraction of tokens per expert, the fraction of
tokens dropped over capacity, and the auxiliary loss. Plots the loads (one panel per layer; an even split is
1/4) and writes the figures as JSON. Loads after a fixed number of updates do not depend on the machine's load.

    OMP_NUM_THREADS=1 python benchmarks/moe_load.py                    # 300 updates, a few minutes
    OMP_NUM_THREADS=1 python benchmarks/moe_load.py --steps 20 --plot /tmp/moe.png --output /tmp/moe.json
"""

from __future__ import annotations

import json
import sys
import tempfile
from importlib import resources
from pathlib import Path

from kqv_lab import benchmarking as harness

RESULTS = harness.results_path("moe_load")
PLOT = harness.ROOT / "docs" / "moe_load.png"
N_EXPERTS = 4


def train(steps: int, coefficient: float) -> list[dict]:
    """The metrics.jsonl records of a short Switch LM run."""
    from kqv.jobs import get_job

    JOB = get_job("lm")
    from kqv.train import read_metrics

    values = {
        "model.d_model": 128,
        "model.n_layers": 4,
        "model.d_ff": 512,
        "model.ffn": "switch",
        "model.experts.count": N_EXPERTS,
        "model.experts.aux_loss_coefficient": coefficient,
        "data.context": 128,
        "train.batch_size": 16,
        "train.steps": steps,
        "train.budget_minutes": 0,  # exactly these steps (the quick config plans to a budget)
        "train.warmup_steps": max(1, steps // 10),
        "train.precision": "fp32",
        "train.log_every": max(1, steps // 30),
        "train.eval_every": steps,
        "train.eval_batches": 4,
        "train.checkpoint_every": steps,
        "sample.count": 1,
        "sample.max_new_tokens": 20,
    }
    config = JOB.load_config(
        Path(str(resources.files("kqv") / "configs" / "lm-quick.toml")),
        [f"{k}={json.dumps(v)}" for k, v in values.items()],
    )
    with tempfile.TemporaryDirectory() as run_dir:
        JOB.train(config, run_dir, quiet=True)
        return [r for r in read_metrics(Path(run_dir) / "metrics.jsonl") if "expert_load" in r]


def plot(records: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in records]
    layers = len(records[0]["expert_load"])
    fig, axes = plt.subplots(1, layers, figsize=(3.2 * layers, 3), sharey=True, squeeze=False)
    for layer, ax in enumerate(axes[0]):
        for expert in range(N_EXPERTS):
            ax.plot(steps, [r["expert_load"][layer][expert] for r in records], label=f"expert {expert}")
        ax.axhline(1 / N_EXPERTS, color="grey", linestyle=":", linewidth=1)
        ax.set_title(f"layer {layer + 1}", fontsize=9)
        ax.set_xlabel("update")
    axes[0][0].set_ylabel("fraction of tokens")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle("Switch routing: per-expert load over training (dotted: an even split)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = harness.arguments(harness.summary(__doc__), output=RESULTS)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--aux-loss-coefficient", type=float, default=0.01)
    parser.add_argument("--plot", type=Path, default=PLOT)
    args = parser.parse_args()
    records = train(args.steps, args.aux_loss_coefficient)
    if not records:
        raise SystemExit("the run logged no expert loads")
    plot(records, args.plot)
    print(f"{'update':>7}  {'dropped':>8}  {'aux loss':>9}  max / min expert load per layer")
    shown = records[:: max(1, len(records) // 10)]
    for r in shown + ([] if shown[-1] is records[-1] else records[-1:]):
        spread = "  ".join(f"{max(load):.2f}/{min(load):.2f}" for load in r["expert_load"])
        print(f"{r['step']:>7}  {r['dropped_fraction']:>8.3f}  {r['aux_loss']:>9.4f}  {spread}")
    report = {
        "command": "OMP_NUM_THREADS=1 python benchmarks/moe_load.py " + " ".join(sys.argv[1:]),
        "n_experts": N_EXPERTS,
        "records": [
            {k: r[k] for k in ("step", "expert_load", "dropped_fraction", "aux_loss", "train_loss")} for r in records
        ],
    }
    harness.write_record(args.output, report)
    print(f"wrote {args.output} and {args.plot}")


if __name__ == "__main__":
    main()
