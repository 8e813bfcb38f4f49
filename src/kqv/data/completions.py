"""Prompt -> completion pairs: the data of a fine-tune that answers, and of `kqv eval --data pairs`.

A file of pairs is either a TSV (`prompt<TAB>completion`, one pair per line) or JSONL (one
`{"prompt": ..., "completion": ...}` object per line, optionally with a `"kind"`: the kind of question it asks,
which `kqv eval`'s per-kind baselines group by; a pair without one is of the kind `DEFAULT_KIND`), chosen by its
suffix (`.tsv`, `.jsonl`), in UTF-8. Lines end
at a newline alone (`\n`, or `\r\n`): a form feed, a lone carriage return, U+0085 or U+2028 inside a prompt or a
completion is part of it. A byte-order mark at the start of the file is skipped; one elsewhere, bytes that are not
UTF-8, a completion of whitespace alone, a JSON key given twice or JSON nested too deeply for Python's parser is a
`DataError` naming the file and line. The model learns to
continue `prompt` with `completion` and then the *end of text*, so that generation knows where to stop:

- a tokenizer with an end-of-text token (GPT-2's `<|endoftext|>`, a kqv BPE tokenizer's `<eos>`) ends each
  completion with it;
- a character tokenizer has none, and kqv gives it no new one (that would need a new embedding row in a fine-tune):
  its end of text is the newline, so a completion that contains a newline is refused, naming the line.

For training (`kqv.jobs.lm_completions`) the examples are encoded once (`encode_examples`: prompt and completion each
by itself, so a BPE merge never crosses the boundary between them) and split into train and validation examples
(`split_examples`); the batches are made in `kqv.data.example_batches`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..errors import ConfigError, DataError
from .lines import NEWLINE, text_lines
from .tokenizers import Tokenizer, encode_texts

PAIR_SUFFIXES = (".tsv", ".jsonl")
END_OF_TEXT_TOKENS = ("<|endoftext|>", "<eos>")  # the first a tokenizer has is its end of text
DEFAULT_KIND = ""  # the kind of a pair that names none (every TSV pair): one kind for all of them


@dataclass(frozen=True)
class Example:
    """One prompt and the completion the model should give it (without the end of text)."""

    prompt: str
    completion: str
    line: int = field(default=0, compare=False)  # its line in the file (1-based), for errors; 0: not from a file
    kind: str = DEFAULT_KIND  # the kind of question (a .jsonl pair's "kind"), for per-kind baselines


def is_pairs_file(path: str | Path) -> bool:
    """Whether `path` names a file of pairs (by its suffix), rather than plain text."""
    return Path(path).suffix.lower() in PAIR_SUFFIXES


def read_examples(path: str | Path) -> list[Example]:
    """The examples of a TSV or JSONL file of pairs; `DataError` naming the file and line for anything else."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"no file of pairs at {path}; give a .tsv (prompt<TAB>completion) or .jsonl file")
    if not is_pairs_file(path):
        raise DataError(f"{path} is not a file of pairs: name it .tsv (prompt<TAB>completion) or .jsonl")
    read_line = _tsv_example if path.suffix.lower() == ".tsv" else _jsonl_example
    examples = []
    for number, line in enumerate(text_lines(path.read_bytes(), path), 1):
        if line.strip():
            examples.append(_checked(read_line(line, f"{path}:{number}", number), f"{path}:{number}"))
    if not examples:
        raise DataError(f"{path} has no pairs; write one prompt<TAB>completion (or JSON object) per line")
    return examples


def _checked(example: Example, where: str) -> Example:
    """`example`, unless its completion is whitespace alone (the model would learn to answer with nothing)."""
    if not example.completion.strip():
        raise DataError(
            f"{where}: the completion is only whitespace ({example.completion[:20]!r}); give it the answer to learn"
        )
    return example


def _tsv_example(line: str, where: str, number: int) -> Example:
    prompt, tab, completion = line.partition("\t")
    if not tab or "\t" in completion or not prompt or not completion:
        raise DataError(f"{where}: expected prompt<TAB>completion (one tab, both sides non-empty), got {line[:60]!r}")
    return Example(prompt, completion, number)


class _RepeatedKey(ValueError):
    """A JSON object that gives one key twice (json keeps the last silently)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    record: dict[str, Any] = {}
    for key, value in pairs:
        if key in record:
            raise _RepeatedKey(key)
        record[key] = value
    return record


def _jsonl_example(line: str, where: str, number: int) -> Example:
    try:
        record = json.loads(line, object_pairs_hook=_unique_keys)
    except _RepeatedKey as error:
        raise DataError(f"{where}: the key {error.args[0]!r} appears twice in one object; keep one") from None
    except json.JSONDecodeError as error:
        raise DataError(f"{where}: not JSON ({error.msg}): {line[:60]!r}") from None
    except RecursionError:
        raise DataError(
            f'{where}: JSON nested too deeply to read; write one flat {{"prompt": ..., "completion": ...}} object'
        ) from None
    except ValueError as error:  # an integer of more than 4,300 digits
        raise DataError(f"{where}: not JSON ({str(error).split(';')[0]})") from None
    if not isinstance(record, dict) or not all(isinstance(record.get(k), str) for k in ("prompt", "completion")):
        raise DataError(
            f'{where}: expected {{"prompt": "...", "completion": "..."}} with two strings, got {line[:60]!r}'
        )
    if not record["prompt"] or not record["completion"]:
        raise DataError(f"{where}: the prompt and the completion must both be non-empty")
    kind = record.get("kind", DEFAULT_KIND)
    if not isinstance(kind, str) or ("kind" in record and not kind.strip()):
        raise DataError(f'{where}: "kind" must be a non-empty string (the kind of question), got {kind!r}')
    for key in ("prompt", "completion"):
        try:
            record[key].encode("utf-8")
        except UnicodeEncodeError as error:
            raise DataError(
                f"{where}: the {key} holds a lone surrogate {error.object[error.start]!r} (a \\u escape of half a "
                f"pair), which is not text; write the character itself, or both halves of its pair"
            ) from None
    return Example(record["prompt"], record["completion"], number, kind)


def end_of_text(tokenizer: Tokenizer) -> tuple[int, str]:
    """The id and text of the token that ends every completion: the tokenizer's end-of-text token, or else the
    newline (a character tokenizer's)."""
    for token in END_OF_TEXT_TOKENS:
        try:
            return tokenizer.token_to_id(token), token
        except KeyError:  # UnknownTokenError: not this tokenizer's
            continue
    newline = tokenizer.encode(NEWLINE) if _encodes(tokenizer, NEWLINE) else []
    if len(newline) == 1:
        return newline[0], NEWLINE
    raise DataError(
        "the tokenizer has no end-of-text token and no newline, so a completion cannot say where it ends; "
        "fine-tune on text with newlines, or with a BPE tokenizer that has an <eos> special token"
    )


def _encodes(tokenizer: Tokenizer, text: str) -> bool:
    try:
        tokenizer.encode(text)
    except (KeyError, ValueError):  # a character tokenizer that never saw it
        return False
    return True


def check_examples(examples: list[Example], tokenizer: Tokenizer, where: str = "the pairs") -> None:
    """Refuse completions that contain the end of text itself (a character tokenizer's newline): the model would
    learn to stop inside them."""
    _, token = end_of_text(tokenizer)
    inside = [i for i, example in enumerate(examples, 1) if token in example.completion]
    if inside:
        shown = ", ".join(map(str, inside[:5])) + (" ..." if len(inside) > 5 else "")
        raise DataError(
            f"{len(inside)} completion(s) of {where} contain the end-of-text {token!r} (pairs {shown}); this "
            f"tokenizer ends a completion with it, so remove it from the completions"
        )


SPLIT_SEED = 0  # the split of a file's examples into train and validation is the same for every run


def split_examples(
    count: int, val_fraction: float, where: str = "the file", noun: str = "pair"
) -> tuple[list[int], list[int]]:
    """(train, val) indices of `count` examples: `max(1, round(val_fraction * count))` held out, chosen by a fixed
    random permutation (the same whatever the run's seed, so runs that differ in seed share their validation
    examples, and a file sorted by topic still gives validation examples of every topic); each part in file order.
    Too few is a DataError naming the file (`where`) and what it holds too few of (`noun`: pair, document)."""
    if not 0 < val_fraction <= 0.5:
        raise ConfigError(f"data.val_fraction must be in (0, 0.5], got {val_fraction}")
    held_out = max(1, round(val_fraction * count))
    if count - held_out < 1:
        raise DataError(
            f"{where} has {count} {noun}{'' if count == 1 else 's'}: too few for a training and a validation "
            f"example; write at least 2"
        )
    order = torch.randperm(count, generator=torch.Generator().manual_seed(SPLIT_SEED)).tolist()
    return sorted(order[held_out:]), sorted(order[:held_out])


def encode_examples(examples: list[Example], tokenizer: Tokenizer) -> dict[str, Tensor]:
    """The examples as token ids, one after another: `ids` (total,) int32, each example's prompt ids, completion
    ids and the end-of-text id (`end_of_text`), and `lengths` (examples, 2) int32, each example's prompt and
    completion token counts (the completion's with the end of text). Prompt and completion are encoded
    separately, so the boundary between them is a token boundary."""
    eot, _ = end_of_text(tokenizer)
    prompts = encode_texts(tokenizer, [example.prompt for example in examples])
    completions = encode_texts(tokenizer, [example.completion for example in examples])
    ids = [token for prompt, completion in zip(prompts, completions) for token in (*prompt, *completion, eot)]
    lengths = [(len(prompt), len(completion) + 1) for prompt, completion in zip(prompts, completions)]
    return {
        "ids": torch.tensor(ids, dtype=torch.int32),
        "lengths": torch.tensor(lengths, dtype=torch.int32).reshape(-1, 2),
    }


def check_lengths(examples: list[Example], lengths: Tensor, context: int, where: str) -> None:
    """Refuse an example the model cannot read whole: prompt + completion + end of text is at most context + 1
    tokens (the model reads all but the last). The DataError names the first such example's line."""
    totals = lengths.sum(dim=1).tolist()
    long = [(example, total) for example, total in zip(examples, totals) if total > context + 1]
    if long:
        (example, total), count = long[0], len(long)
        others = f" (and {count - 1} more)" if count > 1 else ""
        raise DataError(
            f"{where}:{example.line}: the example is {total} tokens with its end of text{others}, more than "
            f"data.context + 1 = {context + 1}; raise data.context or shorten the example"
        )
