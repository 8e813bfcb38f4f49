"""The commands on a trained run (`kqv generate|eval|attention|translate RUN`): per job, its flags and a function
that calls the run's methods (`LMRun.generate`, `MTRun.evaluate`, ...) and prints what they return. A Hugging Face
directory (`kqv.jobs.pretrained.PretrainedRun`) offers the operations of an LM run and takes the "lm" entries."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..api import (
    ATTENTION_MAX_TOKENS,
    GENERATION_DTYPES,
    Evaluates,
    ExportsHF,
    Generates,
    LMRun,
    MLMRun,
    MTRun,
    PairsEvaluation,
    PretrainedRun,
    QuestionDifference,
    ShowsAttention,
    Translates,
    VitRun,
    escape_line,
    is_pairs_file,
    read_prompts,
    refuse_writing_over,
    run_inputs,
    showing_progress,
    write_completions,
    write_predictions,
)
from ..errors import ConfigError, DataError
from ..flag_names import (
    COUNT,
    DATA,
    DTYPE,
    FILE,
    HF,
    IMAGES,
    MAX_NEW_TOKENS,
    MAX_SENTENCES,
    MAX_TOKENS,
    MERGE,
    NO_CACHE,
    OUT,
    PREDICTIONS,
    PROMPT,
    PROMPTS,
    REF,
    SEED,
    SRC,
    TEMPERATURE,
    TEXT,
    TGT,
    TOP_K,
    TOP_P,
)
from .commands import JobCommand, RunCommand, report
from .flags import BEAM_FLAGS, JSON_FLAG, OUT_PNG_FLAG, Flag

# -- language-model runs (and Hugging Face directories, whose operations are an LM run's) ----------------------

GENERATION_FLAGS = ("max_new_tokens", "temperature", "top_k", "top_p", "count", "seed", "dtype")  # GenerationConfig


def lm_generate(run: LMRun | PretrainedRun, args: argparse.Namespace) -> None:
    options = {name: getattr(args, name) for name in GENERATION_FLAGS}  # checked as one GenerationConfig
    if (args.prompt is None) == (args.prompts is None):
        raise ConfigError("kqv generate needs --prompt TEXT or --prompts FILE (one prompt per line), one of them")
    if args.prompts is not None:
        return lm_complete(run, args, options)
    if args.out is not None:
        raise ConfigError("--out writes the completions of --prompts FILE; with --prompt, the text is printed")
    texts = run.generate(args.prompt, use_cache=not args.no_cache, **options)
    for i, text in enumerate(texts):
        print(text if args.count == 1 else f"--- sample {i + 1} ---\n{text}")


def lm_complete(run: LMRun | PretrainedRun, args: argparse.Namespace, options: dict) -> None:
    """`kqv generate RUN --prompts FILE [--out FILE]`: one completion per prompt, one a line (escaped), written
    atomically to --out or printed."""
    if args.out is not None:
        read = [(f"the file of prompts, --prompts {args.prompts}", args.prompts), *run_inputs(run.run_dir)]
        refuse_writing_over(args.out, read, OUT)
    prompts = read_prompts(args.prompts)
    with showing_progress():
        completions = run.complete(prompts, use_cache=not args.no_cache, **options)
    if args.out is None:
        print("\n".join(escape_line(text) for text in completions))
        return
    path = write_completions(args.out, completions)
    how = "greedy" if args.temperature == 0 else f"sampled at temperature {args.temperature}, seed {args.seed}"
    print(f"wrote {path}: {len(completions)} completions of {args.prompts}, one a line ({how})")


def lm_evaluate(run: LMRun | PretrainedRun, args: argparse.Namespace) -> None:
    if args.data is not None and is_pairs_file(args.data):
        return lm_evaluate_pairs(run, args)
    if args.predictions is not None:
        raise ConfigError("--predictions writes the completions of a file of pairs: give --data pairs.tsv or .jsonl")
    with showing_progress():  # a bar on a terminal, for a scoring that takes a while
        result = run.evaluate(args.data, max_tokens=args.max_tokens)
    per_char = "" if result.bits_per_char is None else f", {result.bits_per_char:.4f} bits/char"  # a pair run: None
    report(
        f"{result.source}: {result.tokens:,} tokens, loss {result.loss:.4f} nats/token, perplexity "
        f"{result.perplexity:.3f}{per_char}",
        result.to_dict(),
        args.json,
    )


def lm_evaluate_pairs(run: LMRun | PretrainedRun, args: argparse.Namespace) -> None:
    """`kqv eval RUN --data pairs.tsv|.jsonl`: completion loss and exact match, a short table."""
    if args.predictions is not None:
        read = [(f"the file of pairs it scores, --data {args.data}", args.data), *run_inputs(run.run_dir)]
        refuse_writing_over(args.predictions, read, PREDICTIONS)
    with showing_progress():  # the greedy completions, prompt batch by prompt batch
        result = run.evaluate(pairs=args.data, max_tokens=args.max_tokens)
    if args.predictions is not None:
        path = write_predictions(args.predictions, result.predictions)
        print(f"wrote {path}: prompt, expected, got and correct (1/0) for each pair")
    report(pairs_table(result), result.to_dict(), args.json)


def pairs_table(result: PairsEvaluation) -> str:
    """The figures of a pairs evaluation, one a line, with the baselines that answer without reading the question."""
    rows = [
        ("pairs", f"{result.n:,}"),
        (
            "exact match",
            f"{result.correct:,}/{result.n:,} = {result.exact_match:.1%} "
            f"(95% interval {result.low:.1%} to {result.high:.1%})",
        ),
        *baseline_rows(result),
        ("completion loss", f"{result.loss:.4f} nats/token over {result.tokens:,} tokens (end of text included)"),
        ("perplexity", f"{result.perplexity:.3f}"),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join([f"{result.source}:", *(f"  {name:<{width}}  {value}" for name, value in rows)])


def difference_text(versus: QuestionDifference) -> str:
    """A paired difference over questions, its interval and its exact test (McNemar's on 1/0 scores, the sign test on
    others, or against a guess's hits), in one phrase."""
    interval = f"95% interval over the {versus.n:,} questions {versus.low:+.1%} to {versus.high:+.1%}, paired t"
    if versus.test == "guess":
        test = f"{versus.better:,} right where a guess expects {versus.worse:,}, exact p = {versus.p_value:.3g}"
    else:
        name = "McNemar" if versus.test == "McNemar" else "sign test"  # McNemar's is the sign test on 1/0 scores
        test = f"better on {versus.better:,}, worse on {versus.worse:,}, {name} exact p = {versus.p_value:.3g}"
    return f"{versus.difference:+.1%} ({interval}; {test})"


def kind_rows(result: PairsEvaluation) -> list[tuple[str, str]]:
    """The per-kind constant (the strongest answer that never reads the question), where the pairs name more than
    one kind of question, and the reading score."""
    rows = []
    if result.versus_per_kind is not None and len(result.kind_constants) > 1:
        constants = answers_by_kind(result.kind_constants)
        score = f"{result.per_kind_correct:,}/{result.n:,} = {result.per_kind_exact_match:.1%}"
        rows += [
            ("per-kind constant", f"{score}, always answering a kind's most frequent answer ({constants})"),
            ("model - per-kind", difference_text(result.versus_per_kind)),
        ]
    if result.reading_n:
        rows.append(
            (
                "reading score",
                f"{result.reading_correct:,}/{result.reading_n:,} = {result.reading_exact_match:.1%} (95% interval "
                f"{result.reading_low:.1%} to {result.reading_high:.1%}) on the questions whose answer is not their "
                f"kind's constant; a guess among the kind's other answers by frequency: {result.reading_baseline:.1%}",
            )
        )
        rows.append(("reading - guess", difference_text(result.versus_reading_baseline)))
        runner_ups = answers_by_kind(result.reading_runner_ups)
        rows.append(
            (
                "reading runner-up",
                f"{result.reading_runner_up_correct:,}/{result.reading_n:,} = "
                f"{result.reading_runner_up_correct / result.reading_n:.1%} there, always answering a kind's most "
                f"frequent other answer ({runner_ups})",
            )
        )
        rows.append(("reading - runner-up", difference_text(result.versus_reading_runner_up)))
    return rows


def answers_by_kind(answers: dict[str, str]) -> str:
    """Each kind of question's answer, `kind: 'answer'`; a kind that would not print as itself (a newline, a
    control or bidirectional character, spaces at its ends) escaped as Python writes a string; pairs without kinds
    (one kind, "") just the answer."""
    if list(answers) == [""]:
        return repr(answers[""])
    shown = {kind: kind if kind.isprintable() and kind.strip() == kind and kind else repr(kind) for kind in answers}
    return ", ".join(f"{shown[kind]}: {answer!r}" for kind, answer in answers.items())


def baseline_rows(result: PairsEvaluation) -> list[tuple[str, str]]:
    """The constant answer's score, the model's difference to it over questions, the uniform guess, and per kind
    of question the constant and the reading score (`kind_rows`)."""
    versus = result.versus_constant
    if versus is None:
        return []
    return [
        (
            "constant baseline",
            f"{result.constant_correct:,}/{result.n:,} = {result.constant_exact_match:.1%}, always answering "
            f"{result.constant!r} (the most frequent answer of {result.constant_reference})",
        ),
        ("model - constant", difference_text(versus)),
        (
            "uniform baseline",
            f"{result.uniform:.1%} expected, a guess among the {result.distinct_answers:,} distinct answers of "
            f"{result.constant_reference.split(' (')[0]}",
        ),
        *kind_rows(result),
    ]


def lm_attention(run: LMRun | PretrainedRun, args: argparse.Namespace) -> None:
    from ..explore.plots import plot_attention_grid  # matplotlib only when drawing

    if args.text is None:
        raise ConfigError("kqv attention on a language model needs --text")
    refuse_writing_over(args.out, run_inputs(run.run_dir), OUT)  # the run's own loss.png, say
    maps = run.attention(args.text, max_tokens=args.max_tokens)
    path = plot_attention_grid(maps.weights, maps.rows, maps.columns, args.out, title=f"{run.run_dir}: self-attention")
    print(f"wrote {path}: {maps.layers} layers x {maps.heads} heads over {len(maps.rows)} tokens")


def lm_export(run: LMRun | PretrainedRun, args: argparse.Namespace) -> None:
    path = run.export_hf(args.hf, merge=args.merge)
    written = json.loads((path / "config.json").read_text(encoding="utf-8"))["architectures"][0]
    print(f"wrote {path}: a Hugging Face {written} (config.json, model.safetensors, tokenizer.json)")


def mlm_export(run: MLMRun, args: argparse.Namespace) -> None:
    path = run.export_hf(args.hf)
    print(f"wrote {path}: a Hugging Face BertForMaskedLM (config.json, model.safetensors, tokenizer.json)")


# -- translation runs ----------------------------------------------------------------------------------------------


def mt_translate(run: MTRun, args: argparse.Namespace) -> None:
    if args.text is not None and args.file is not None:
        raise ConfigError("give the text to translate as an argument or with --file, not both")
    if args.text is not None:
        sentences = [args.text]
    else:
        try:  # bytes that are not UTF-8 become surrogate escapes, which translate() names with their line
            source = (
                Path(args.file).read_text(encoding="utf-8", errors="surrogateescape")
                if args.file not in (None, "-")
                else sys.stdin.read()
            )
        except UnicodeDecodeError as error:
            raise DataError(f"the standard input is not UTF-8 text ({error}); give the sentences in UTF-8") from None
        sentences = [line for line in source.splitlines() if line.strip()]
        if not sentences:
            raise DataError("nothing to translate: the input has no non-empty lines")
    for translation in run.translate(sentences, beam_size=args.beam, length_penalty=args.length_penalty):
        print(translation)


def mt_evaluate(run: MTRun, args: argparse.Namespace) -> None:
    result = run.evaluate(
        args.src, args.ref, beam_size=args.beam, length_penalty=args.length_penalty, max_sentences=args.max_sentences
    )
    report(
        f"{result.source}: {result.sentences} sentences, BLEU {result.bleu:.2f}, chrF {result.chrf:.2f} "
        f"(beam {result.beam_size}, {result.sentences_per_second:.1f} sentences/s)",
        result.to_dict(),
        args.json,
    )


def mt_attention(run: MTRun, args: argparse.Namespace) -> None:
    from ..explore.plots import plot_attention_grid

    if args.src is None:
        raise ConfigError(
            "kqv attention on a translation run needs --src (and optionally --tgt; by default the "
            "model's own translation)"
        )
    refuse_writing_over(args.out, run_inputs(run.run_dir), OUT)  # the run's own loss.png, say
    maps = run.attention(args.src, args.tgt)
    path = plot_attention_grid(
        maps.weights,
        maps.rows,
        maps.columns,
        args.out,
        title=f"{run.run_dir}: cross-attention (rows: target, columns: source)",
    )
    print(
        f"translation: {maps.translation}\nwrote {path}: {maps.layers} layers x {maps.heads} heads, "
        f"{len(maps.rows)} target x {len(maps.columns)} source tokens"
    )


# -- vision runs ---------------------------------------------------------------------------------------------------


def vit_evaluate(run: VitRun, args: argparse.Namespace) -> None:
    result = run.evaluate()
    report(
        f"{run.run_dir}: test accuracy {result.test_accuracy:.2%} on {result.test_images} held-out digits",
        result.to_dict(),
        args.json,
    )


def vit_attention(run: VitRun, args: argparse.Namespace) -> None:
    from ..explore.plots import plot_cls_attention

    refuse_writing_over(args.out, run_inputs(run.run_dir), OUT)  # the run's own loss.png, say
    shown = run.attention(args.images)
    path = plot_cls_attention(shown.images, shown.maps, shown.labels, shown.predicted, args.out)
    layers, images, height, width = shown.maps.shape
    print(
        f"wrote {path}: [CLS] attention over {height}x{width} patches, {layers} layers (heads averaged), "
        f"{images} test images"
    )


# -- the commands, by name -----------------------------------------------------------------------------------------

RUN_COMMANDS = {
    "generate": RunCommand(
        Generates,
        {
            "lm": JobCommand(
                "continue a prompt with a trained LM",
                lm_generate,
                (
                    Flag(PROMPT, "the text to continue"),
                    Flag(
                        PROMPTS,
                        "a file of prompts, one per line (no blank lines): each is completed, stopping at the end of "
                        "text, in batches",
                    ),
                    Flag(
                        OUT,
                        "with --prompts: write the completions here, one a line (newlines as \\n, tabs as \\t, "
                        "backslashes as \\\\), instead of printing them",
                    ),
                    Flag(MAX_NEW_TOKENS, "tokens to generate", options={"type": int, "default": 300}),
                    Flag(TEMPERATURE, "0 = greedy", options={"type": float, "default": 0.8}),
                    Flag(TOP_K, "sample among the k most likely tokens", options={"type": int}),
                    Flag(TOP_P, "sample among the most likely tokens of total probability p", options={"type": float}),
                    Flag(COUNT, "how many continuations", options={"type": int, "default": 1}),
                    Flag(SEED, "seed of the sampling generator", options={"type": int, "default": 0}),
                    Flag(NO_CACHE, "recompute the whole prefix each step", options={"action": "store_true"}),
                    Flag(
                        DTYPE,
                        "weights' precision while generating: bf16 reads half the bytes per token, int8 (torch's "
                        "dynamic quantisation of the linear layers) a quarter (default fp32)",
                        options={"choices": sorted(GENERATION_DTYPES), "default": "fp32"},
                    ),
                ),
            )
        },
    ),
    "eval": RunCommand(
        Evaluates,
        {
            "lm": JobCommand(
                "perplexity and bits per character, or exact match on prompt -> completion pairs",
                lm_evaluate,
                (
                    Flag(
                        DATA,
                        "a text file to score instead of the held-out split (a Hugging Face directory needs one); "
                        "a .tsv or .jsonl file of prompt -> completion pairs is scored by completion loss and exact "
                        "match; a prepared corpus directory (`kqv prepare`) by its held-out tail (the run's own, "
                        "moved, or one prepared with the run's tokenizer)",
                    ),
                    Flag(MAX_TOKENS, "score only this many tokens", options={"type": int}),
                    Flag(PREDICTIONS, "with pairs: write prompt, expected, got and correct for each pair (TSV)"),
                    JSON_FLAG,
                ),
            ),
            "mt": JobCommand(
                "BLEU and chrF",
                mt_evaluate,
                (
                    Flag(SRC, "source sentences to translate and score (default: the test split)"),
                    Flag(REF, "reference translations aligned with --src"),
                    *BEAM_FLAGS,
                    Flag(MAX_SENTENCES, "score only the first N sentences", options={"type": int}),
                    JSON_FLAG,
                ),
            ),
            "vit": JobCommand("accuracy on the held-out test images", vit_evaluate, (JSON_FLAG,)),
        },
    ),
    "attention": RunCommand(
        ShowsAttention,
        {
            "lm": JobCommand(
                "draw the self-attention maps of every layer and head",
                lm_attention,
                (
                    Flag(TEXT, "the text whose self-attention to draw"),
                    OUT_PNG_FLAG,
                    Flag(
                        MAX_TOKENS,
                        f"the longest text drawn, in tokens (default {ATTENTION_MAX_TOKENS}): the maps hold tokens x "
                        "tokens weights per head",
                        options={"type": int, "default": ATTENTION_MAX_TOKENS},
                    ),
                ),
            ),
            "mt": JobCommand(
                "draw the cross-attention of a translation",
                mt_attention,
                (
                    Flag(SRC, "the source sentence"),
                    Flag(TGT, "its translation (default: the model's own)"),
                    OUT_PNG_FLAG,
                ),
            ),
            "vit": JobCommand(
                "draw the attention of [CLS] over the patches of test images",
                vit_attention,
                (OUT_PNG_FLAG, Flag(IMAGES, "how many test images", options={"type": int, "default": 4})),
            ),
        },
    ),
    "export": RunCommand(
        ExportsHF,
        {
            "lm": JobCommand(
                "write an LM run as a Hugging Face GPT-2, GPT-NeoX or Llama directory, whichever holds its model "
                "(transformers' from_pretrained loads it)",
                lm_export,
                (
                    Flag(HF, "the directory to write (new or empty)", options={"required": True}),
                    Flag(
                        MERGE,
                        "fold a LoRA run's adapters into its weights first (the formats hold plain weights)",
                        options={"action": "store_true"},
                    ),
                ),
            ),
            "mlm": JobCommand(
                "write an MLM run as a Hugging Face BERT directory (AutoModelForMaskedLM loads it)",
                mlm_export,
                (Flag(HF, "the directory to write (new or empty)", options={"required": True}),),
            ),
        },
    ),
    "translate": RunCommand(
        Translates,
        {
            "mt": JobCommand(
                "translate text with a trained MT run",
                mt_translate,
                (
                    Flag(
                        "text",
                        "the sentence to translate (default: one per line from --file or stdin)",
                        options={"nargs": "?"},
                    ),
                    Flag(FILE, "a file with one sentence per line ('-' = stdin)"),
                    *BEAM_FLAGS,
                ),
            )
        },
    ),
}
