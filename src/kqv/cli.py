"""The `kqv` command: train, generate, evaluate and look inside models.

    kqv train lm [--config quick] [--out runs/lm] [--data text.txt] [--set train.steps=200]
    kqv generate runs/lm --prompt "ROMEO:"
    kqv eval runs/lm [--data other.txt]
    kqv attention runs/lm --text "To be, or not to be" --out attention.png
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib import resources
from pathlib import Path

import torch


def packaged_config(name: str) -> Path:
    """A config shipped with kqv (`quick`, `best`), or any path to a TOML file."""
    if Path(name).suffix == ".toml" or Path(name).exists():
        return Path(name)
    packaged = resources.files("kqv") / "configs" / f"lm-{name}.toml"
    if not packaged.is_file():
        shipped = sorted(p.name for p in (resources.files("kqv") / "configs").iterdir())
        raise FileNotFoundError(f"no config {name!r}: give a .toml path or one of {shipped}")
    return Path(str(packaged))


def run_task(run_dir: str | Path) -> str:
    """Which job wrote a run directory ("lm", "mt", ...), from the `task` key of its run.toml."""
    import tomllib

    config = Path(run_dir) / "run.toml"
    if not Path(run_dir).is_dir():
        raise FileNotFoundError(f"no run directory at {run_dir}; train one with `kqv train ... --out {run_dir}`")
    if not config.is_file():
        raise FileNotFoundError(f"{run_dir} is not a kqv run: run.toml is missing")
    return tomllib.loads(config.read_text()).get("task", "lm")


def cmd_train_lm(args: argparse.Namespace) -> None:
    from .lm import load_run_config, read_run_config, train_lm

    overrides = list(args.set)
    if args.data is not None:
        overrides.append(f"data.path={json.dumps(args.data)}")
    if args.steps is not None:
        overrides.append(f"train.steps={args.steps}")
    if args.resume and args.config is None:
        config, _ = read_run_config(args.out)
        if overrides:
            raise ValueError("with --resume and no --config the run's own run.toml is used; pass --config to change it")
    else:
        config = load_run_config(packaged_config(args.config or "quick"), overrides)
    train_lm(config, args.out, resume=args.resume, overwrite=args.overwrite, quiet=args.quiet)


def cmd_generate(args: argparse.Namespace) -> None:
    from .lm import generate_text, load_run

    run = load_run(args.run)
    generator = torch.Generator().manual_seed(args.seed)
    for i in range(args.count):
        text = generate_text(run.model, run.tokenizer, args.prompt, args.max_new_tokens, temperature=args.temperature,
                             top_k=args.top_k, top_p=args.top_p, use_cache=not args.no_cache, generator=generator)
        print(text if args.count == 1 else f"--- sample {i + 1} ---\n{text}")


def cmd_eval(args: argparse.Namespace) -> None:
    task = run_task(args.run)
    if task != "lm":
        raise ValueError(f"kqv eval does not know runs of task {task!r} yet")
    from .data import load_text
    from .evaluation import perplexity
    from .lm import TOKENS_FILE, encode, load_run
    from safetensors.torch import load_file

    run = load_run(args.run)
    if args.data is not None:
        text = load_text(args.data)
        ids, n_chars, source = encode(run.tokenizer, text), len(text), args.data
    else:
        tokens = load_file(run.run_dir / TOKENS_FILE)
        ids, n_chars, source = tokens["val"], int(tokens["chars"][1]), "the held-out validation split"
    result = perplexity(run.model, ids, context=run.config.data.context, n_chars=n_chars, max_tokens=args.max_tokens)
    print(f"{source}: {result['tokens']:,} tokens, loss {result['loss']:.4f} nats/token, perplexity "
          f"{result['perplexity']:.3f}, {result['bits_per_char']:.4f} bits/char")
    if args.json:
        print(json.dumps(result))


def cmd_attention(args: argparse.Namespace) -> None:
    task = run_task(args.run)
    if task != "lm":
        raise ValueError(f"kqv attention does not know runs of task {task!r} yet")
    from .lm import load_run
    from .models import check_ids
    from .visualization import plot_attention_grid

    run = load_run(args.run)
    ids = run.tokenizer.encode(args.text)
    if not ids:
        raise ValueError("--text is empty; give the text whose attention to draw")
    ids_tensor = torch.tensor([ids])
    check_ids(ids_tensor, run.model.config.vocab_size)
    with torch.no_grad():
        weights = run.model.attention_weights(ids_tensor)
    tokens = [run.tokenizer.decode([i]) for i in ids]
    path = plot_attention_grid(weights, tokens, tokens, args.out, title=f"{args.run}: self-attention")
    print(f"wrote {path}: {len(weights)} layers x {weights[0].shape[1]} heads over {len(ids)} tokens")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kqv", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train", help="train a model").add_subparsers(dest="task", required=True)
    lm = train.add_parser("lm", help="train a GPT-style language model (default: Shakespeare, quick config)")
    lm.add_argument("--config", help="quick (default), best, or a path to a TOML run config")
    lm.add_argument("--out", default="runs/lm", help="run directory (default runs/lm)")
    lm.add_argument("--data", help="a text file or directory of .txt files instead of Shakespeare")
    lm.add_argument("--steps", type=int, help="number of optimizer updates")
    lm.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="override a config value, e.g. --set model.d_model=128 (repeatable)")
    lm.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    lm.add_argument("--overwrite", action="store_true", help="replace the run in --out")
    lm.add_argument("--quiet", action="store_true")
    lm.set_defaults(func=cmd_train_lm)

    gen = commands.add_parser("generate", help="continue a prompt with a trained LM")
    gen.add_argument("run")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--max-new-tokens", type=int, default=300)
    gen.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    gen.add_argument("--top-k", type=int)
    gen.add_argument("--top-p", type=float)
    gen.add_argument("--count", type=int, default=1)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--no-cache", action="store_true", help="recompute the whole prefix each step")
    gen.set_defaults(func=cmd_generate)

    ev = commands.add_parser("eval", help="perplexity and bits per character of a trained LM")
    ev.add_argument("run")
    ev.add_argument("--data", help="a text file to score instead of the held-out split")
    ev.add_argument("--max-tokens", type=int, help="score only this many tokens")
    ev.add_argument("--json", action="store_true", help="also print the result as JSON")
    ev.set_defaults(func=cmd_eval)

    att = commands.add_parser("attention", help="draw the attention maps of every layer and head as a PNG")
    att.add_argument("run")
    att.add_argument("--text", required=True)
    att.add_argument("--out", default="attention.png")
    att.set_defaults(func=cmd_attention)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (ValueError, TypeError, FileNotFoundError, FileExistsError, RuntimeError) as error:
        print(f"kqv: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kqv: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
