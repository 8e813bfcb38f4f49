"""Pretraining objectives and data mixtures of the LM job: texts read as documents, each made into an example.

`data.objective = "span_corruption"`, or several sources (`--data pre.txt --data qa.tsv`, or `[[data.sources]]`
tables of `path` and `weight`), make the LM job train on examples rather than on blocks of one text:

- a **text** source (a file or a directory of .txt files) is cut into documents (`kqv.data.documents`: its lines,
  or the parts between `data.delimiter`); under `next_token` a document is an example of its own (the document and
  the end of text), under `span_corruption` a new span of it is masked at every draw
  (`kqv.data.document_batches`); with `data.shuffle_sentences` its sentences come in a new order at every draw,
  with `data.random_prefix` each draw first cuts it to a random prefix, and with `data.span_loss = "all"` its
  training loss is on every token of the rearranged document (a pairs source keeps `data.prompt_loss_weight`).
  A document longer than the context (context - 2 tokens: two masks and the end of text must fit) is cut into
  windows, by whole sentences where it has them, or, with `data.long_documents = "opening"` (what "auto" means
  with `data.random_prefix`, which cuts a document as CS224N's dataset does), read from its first window alone;
  the line before training counts them, and how much text the openings leave out;
- a **pairs** source (.tsv, .jsonl) is its prompt -> completion examples, as a run on pairs alone trains them,
  each prompt written into `data.template` if one is given;
- each source's examples are split into train and validation ones (the same fixed permutation as pairs), and
  batch i is drawn from one source by weight (`kqv.data.mixture`): the validation batches too, from their own draws.

The tokenizer is made from every source's text with an end of text and, where span corruption or a template's
`{mask}` needs one, the mask symbol (`kqv.data.documents`); a text that already holds the mask is refused. The
validation examples of a text source are drawn once, the same for every seed, and stored like pairs, so the
run's final figure is their completion loss (the span given its context) and it resumes without its files.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor

from ..data.completions import Example, encode_examples, end_of_text, is_pairs_file, read_examples, split_examples
from ..data.document_batches import DocumentBatches, DocumentOptions, EncodedDocuments, draw_random, prefix_max
from ..data.documents import (
    apply_template,
    check_unused,
    mask_id,
    mask_symbol,
    read_documents,
    split_sentences,
    templated,
    windows,
)
from ..data.example_batches import EncodedExamples, ExampleBatches
from ..data.mixture import MixtureBatches
from ..data.shakespeare import load_text
from ..data.tokenizers import Tokenizer, encode_texts
from ..errors import ConfigError, DataError
from ..nn.config import ModelConfig
from ..train.config import TrainConfig
from ..train.options import TrainerOptions
from ..train.topology import Topology
from .lm_completions import (
    PAIR_SETTINGS,
    Examples,
    LoadedExamples,
    batch_options,
    check_examples,
    check_lengths,
    example_batches,
    example_options,
    from_json_tensor,
    json_tensor,
)
from .lm_corpus import Settings
from .lm_data import DataConfig
from .run_tokens import Tensors, TokenizerSource

VAL_SEED = 0  # the draws of the validation documents: the same for every run


def span_advice(data: DataConfig, given: list[str]) -> str:
    return f"data.{given[0]} shapes span corruption's examples; set data.objective='span_corruption' or drop it"


def document_advice(data: DataConfig, given: list[str]) -> str:
    return (
        "data.shuffle_sentences, data.delimiter and data.long_documents read a text as documents: set "
        "data.objective or give several sources (data.sources)"
    )


# A span's rate and length, the random prefix and the loss on every token: what shapes span corruption's examples
SPAN_SETTINGS = Settings(("span_rate", "span_max", "random_prefix", "span_loss"), span_advice)
# Sentences, delimiters and the cut of long documents: how a text is read as documents
DOCUMENT_SETTINGS = Settings(("shuffle_sentences", "delimiter", "long_documents"), document_advice)


class Source(NamedTuple):
    """One source of the documents or the mixture: its `path` (None: Shakespeare), its `weight`, and whether it is
    a file of prompt -> completion pairs (`holds_pairs`, decided once by `data_sources`), else a text of documents."""

    path: str | None
    weight: float
    holds_pairs: bool


def data_sources(data: DataConfig) -> list[Source]:
    """Every source: data.sources, or data.path alone, each a file of pairs or a text by its name
    (`kqv.data.completions.is_pairs_file`), here alone."""
    given = [(s.path, s.weight) for s in data.sources] or [(data.path, 1.0)]
    return [Source(path, weight, path is not None and is_pairs_file(path)) for path, weight in given]


def read_sources(data: DataConfig) -> list[list[Example] | list[str]]:
    """Each source's pairs (prompts not yet templated) or documents."""
    read = []
    for path, _, holds_pairs in data_sources(data):
        if holds_pairs:
            read.append(read_examples(path))
            continue
        documents = read_documents(load_text(path), data.delimiter)
        if len(documents) < 2:
            raise DataError(
                f"{path or 'the text'} has {len(documents)} document(s): too few for a training and a validation "
                f"one; write one document a line (or between data.delimiter)"
            )
        read.append(documents)
    return read


def build_sources(tokenizers: TokenizerSource, data: DataConfig, corrupt: bool) -> tuple[Tokenizer, Tensors]:
    """The tokenizer and encoded splits of every source (the module docstring), spans masked if `corrupt`, and
    the completion and kind of every training pair of its pairs sources (`pair_answers`), as tokens.safetensors
    holds them (`LoadedDocuments.tensors`); what it refuses, it refuses before anything is written."""
    read = read_sources(data)
    texts = [
        text
        for items in read
        for item in items
        for text in (
            (apply_template(data.template, item.prompt, ""), item.completion) if isinstance(item, Example) else (item,)
        )
    ]
    tokenizer = tokenizers.make_tokenizer("\n".join(texts))
    _, eot_text = end_of_text(tokenizer)
    mask = mask_symbol(data.mask, tokenizer.kind)
    if corrupt:
        check_unused([t for items in read for t in texts_of(items)], mask, "the training data")
        mask_id(tokenizer, mask)
    options = document_options(data, tokenizer, corrupt)
    splits: dict[str, list[dict[str, Tensor]]] = {"train": [], "val": []}
    cut = [0, 0, 0, 0]  # documents cut, their windows, tokens left out (openings only), tokens read
    for (path, _, holds_pairs), items in zip(data_sources(data), read):
        where = path or "the text"
        if holds_pairs:
            for split, part in zip(("train", "val"), encode_pairs(items, data, tokenizer, mask, where)):
                splits[split].append(part)
            continue
        if any(eot_text in document for document in items):
            raise DataError(
                f"{where}: a document holds {eot_text!r}, the end of text that closes every example of this tokenizer; "
                + split_at_end_of_text(eot_text, data.delimiter)
            )
        train, val = encode_documents(items, data, tokenizer, options, cut, where)
        splits["train"].append(train)
        splits["val"].append(val)
    tokens = stored(splits, cut)
    answers = [  # the pairs the run trains on, as a fine-tune's reference holds them (its validation share out)
        (items[k].completion, items[k].kind)
        for source, items in zip(data_sources(data), read)
        if source.holds_pairs
        for k in split_examples(len(items), data.val_fraction)[0]
    ]
    if answers:  # the reference of `kqv eval`'s baselines (`Documents.trained_answers`)
        tokens["pair_answers"] = json_tensor(answers)
    return tokenizer, tokens


def split_at_end_of_text(eot_text: str, delimiter: str | None) -> str:
    """What to do about a document holding the end of text: split the documents at it (a newline: documents are
    lines unless data.delimiter says otherwise), or take it out of the text."""
    if eot_text == "\n":
        return "split the documents at it (drop data.delimiter) or use the 'bpe' tokenizer, whose end of text is <eos>"
    return f"split the documents at it (data.delimiter={eot_text!r}) or remove it from the text"


def texts_of(items: list) -> list[str]:
    return [t for item in items for t in ((item.prompt, item.completion) if isinstance(item, Example) else (item,))]


def document_options(data: DataConfig, tokenizer: Tokenizer, corrupt: bool) -> DocumentOptions:
    """How the documents of `data` become examples with `tokenizer`'s mask (spans masked if `corrupt`) and end of
    text."""
    mask = mask_id(tokenizer, mask_symbol(data.mask, tokenizer.kind)) if corrupt else -1
    separator = tuple(tokenizer.encode(" ")) if data.shuffle_sentences else None
    longest = prefix_max(data.context) if data.random_prefix else 0
    return DocumentOptions(mask, end_of_text(tokenizer)[0], corrupt, data.span_rate, data.span_max, separator, longest)


def encode_pairs(examples: list[Example], data: DataConfig, tokenizer: Tokenizer, mask: str, where: str) -> list[dict]:
    """The train and val parts of a pairs source, each prompt written into the template."""
    examples = templated(examples, data.template, tokenizer, mask, where)
    check_examples(examples, tokenizer, where)
    parts = []
    for chosen in split_examples(len(examples), data.val_fraction, where):
        part = [examples[k] for k in chosen]
        ids = encode_examples(part, tokenizer)
        check_lengths(part, ids["lengths"], data.context, where)
        chars = sum(len(e.prompt) + len(e.completion) for e in part)
        parts.append({"ids": ids["ids"], "lengths": ids["lengths"], "sentences": [0] * len(part), "chars": chars})
    return parts


def encode_documents(
    documents: list[str],
    data: DataConfig,
    tokenizer: Tokenizer,
    options: DocumentOptions,
    cut: list[int],
    where: str = "the text",
) -> tuple[dict, dict]:
    """The train part of a text source (`where`: its path) of documents, cut into windows, and its val part (drawn
    once, as examples)."""
    size = data.context + 1 - options.extra()
    if size < 2:
        raise ConfigError(f"data.context ({data.context}) leaves no room for a document; raise it")
    parts = []
    for split, chosen in zip(("train", "val"), split_examples(len(documents), data.val_fraction, where, "document")):
        docs: list[tuple[list[int], list[int]]] = []
        for k in chosen:
            pieces = document_windows(documents[k], tokenizer, size, options.separator)
            if len(pieces) > 1:
                cut[0] += 1
                cut[1] += len(pieces)
                if data.openings_only:  # the tokens of every window after the first, left out
                    cut[2] += sum(len(ids) for ids, _ in pieces[1:])
                    pieces = pieces[:1]
            cut[3] += sum(len(ids) for ids, _ in pieces)
            docs += pieces
        chars = sum(len(documents[k]) for k in chosen)
        if split == "train":
            ids = [t for doc, _ in docs for t in doc]
            parts.append(
                {
                    "ids": torch.tensor(ids, dtype=torch.int32),
                    "lengths": torch.tensor([(len(doc), 0) for doc, _ in docs], dtype=torch.int32).reshape(-1, 2),
                    "sentences": [len(s) for _, s in docs],
                    "sentence_lengths": [n for _, s in docs for n in s],
                    "chars": chars,
                }
            )
            continue
        drawn = [options.example(doc, s, draw_random(VAL_SEED, k)) for k, (doc, s) in enumerate(docs)]
        ids = [t for prompt, completion in drawn for t in (*prompt, *completion)]
        lengths = [(len(prompt), len(completion)) for prompt, completion in drawn]
        parts.append(
            {
                "ids": torch.tensor(ids, dtype=torch.int32),
                "lengths": torch.tensor(lengths, dtype=torch.int32).reshape(-1, 2),
                "sentences": [0] * len(drawn),
                "chars": chars,
            }
        )
    return parts[0], parts[1]


def document_windows(
    document: str, tokenizer: Tokenizer, size: int, separator: tuple[int, ...] | None
) -> list[tuple[list[int], list[int]]]:
    """(ids, sentence token counts) of each window of at most `size` tokens of `document`: the whole document
    when it fits; with sentences (`separator` given), whole sentences joined by it where they fit."""
    if separator is None:
        return [(window, []) for window in windows(tokenizer.encode(document), size)]
    pieces = [piece for ids in encode_texts(tokenizer, split_sentences(document)) for piece in windows(ids, size)]
    out: list[tuple[list[int], list[int]]] = []
    for piece in pieces:
        if out and len(out[-1][0]) + len(separator) + len(piece) <= size:
            out[-1][0].extend([*separator, *piece])
            out[-1][1].append(len(piece))
        else:
            out.append((list(piece), [len(piece)]))
    return out


def stored(splits: dict[str, list[dict]], cut: list[int]) -> dict[str, Tensor]:
    """The tensors of tokens.safetensors: each split's items of every source one after another, with how many
    each source has (`train_sources`, `val_sources`), the train documents' sentence counts and lengths, the
    characters of each split and the documents cut into windows (`windows`: documents, windows)."""
    tokens: dict[str, Tensor] = {}
    for split, parts in splits.items():
        tokens[split] = torch.cat([part["ids"] for part in parts])
        tokens[f"{split}_lengths"] = torch.cat([part["lengths"] for part in parts])
        tokens[f"{split}_sources"] = torch.tensor([len(part["lengths"]) for part in parts])
    train = splits["train"]
    tokens["train_sentence_counts"] = torch.tensor([n for part in train for n in part["sentences"]], dtype=torch.int32)
    lengths = [n for part in train for n in part.get("sentence_lengths", [])]
    tokens["train_sentence_lengths"] = torch.tensor(lengths, dtype=torch.int32)
    tokens["chars"] = torch.tensor([sum(p["chars"] for p in splits[s]) for s in ("train", "val")])
    tokens["windows"] = torch.tensor(cut[:2])
    tokens["left_out"] = torch.tensor(cut[2:])  # tokens left out and read, of documents read from their openings
    return tokens


@dataclass(frozen=True, eq=False)
class LoadedDocuments(LoadedExamples):
    """Documents made into examples, or a mixture of sources, loaded: every source's training items (a text's
    documents, cut into windows; a pairs source's examples) one after another in `train`, and its validation
    examples in `val` (`LoadedExamples`), with how many items each source has (`train_sources`, `val_sources`),
    the training documents' sentence counts and lengths, the documents cut into windows (`windows`: documents,
    windows) and the tokens their openings left out (`left_out`: left out, read), the completion and kind of every
    training pair (`pair_answers`; None for a run trained before it kept them), and whether spans are masked."""

    train_sources: Tensor
    val_sources: Tensor
    sentence_counts: Tensor
    sentence_lengths: Tensor
    windows: tuple[int, int]
    left_out: tuple[int, int]
    pair_answers: tuple[tuple[str, str], ...] | None
    corrupt: bool

    def tensors(self) -> Tensors:
        """tokens.safetensors's tensors (`stored`)."""
        answers = {} if self.pair_answers is None else {"pair_answers": json_tensor(self.pair_answers)}
        train, val = self.train, self.val
        return {
            "train": train.ids,
            "train_lengths": train.lengths,
            "train_sources": self.train_sources,
            "val": val.ids,
            "val_lengths": val.lengths,
            "val_sources": self.val_sources,
            "train_sentence_counts": self.sentence_counts,
            "train_sentence_lengths": self.sentence_lengths,
            "chars": torch.tensor(self.chars),
            "windows": torch.tensor(self.windows),
            "left_out": torch.tensor(self.left_out),
            **answers,
        }

    @classmethod
    def from_tensors(cls, tokenizer: Tokenizer, tensors: Tensors, data: DataConfig, corrupt: bool) -> LoadedDocuments:
        """The corpus `tensors()` stored (a run stored before the windows, the openings or the pairs' answers were
        has none of them)."""
        answers = tensors.get("pair_answers")
        pairs = None if answers is None else tuple((answer, kind) for answer, kind in from_json_tensor(answers))
        counted = [tuple(tensors[key].tolist()) if key in tensors else (0, 0) for key in ("windows", "left_out")]
        return cls(
            tokenizer,
            EncodedExamples(tensors["train"], tensors["train_lengths"]),
            EncodedExamples(tensors["val"], tensors["val_lengths"]),
            tuple(tensors["chars"].tolist()),
            data,
            tensors["train_sources"],
            tensors["val_sources"],
            tensors["train_sentence_counts"],
            tensors["train_sentence_lengths"],
            *counted,
            pairs,
            corrupt,
        )

    @staticmethod
    def per_source(examples: EncodedExamples, sources: Tensor) -> list[tuple[Tensor, Tensor, slice]]:
        """(ids, lengths, sentence-count slice) of each source's items of a split, `examples`, of which each source
        has its count of `sources`."""
        out, item, token = [], 0, 0
        for count in sources.tolist():
            lengths = examples.lengths[item : item + count]
            size = int(lengths.sum())
            out.append((examples.ids[token : token + size], lengths, slice(item, item + count)))
            item, token = item + count, token + size
        return out

    def trainer_options(self, train: TrainConfig, topology: Topology, model: ModelConfig) -> TrainerOptions:
        """train_batches, val_batches, loss_fn, loss_terms and tokens_per_batch of a mixture: each batch from one
        source, drawn by weight (`MixtureBatches`); a text source's documents made into new examples at every draw
        (spans masked if `corrupt`); each source's packing decided for `model` (`example_batches`)."""
        data, packing = self.data, self.data.packing
        shared = batch_options(data, train)
        options = document_options(data, self.tokenizer, self.corrupt)
        counts = self.sentence_counts
        sentence_starts = [0, *torch.cumsum(counts, 0).tolist()]
        training, validation = [], []
        paths = data_sources(data)
        for source, (ids, lengths, items), (val_ids, val_lengths, _) in zip(
            paths, self.per_source(self.train, self.train_sources), self.per_source(self.val, self.val_sources)
        ):
            if source.holds_pairs:
                made = ExampleBatches(EncodedExamples(ids, lengths), shuffle=True, **shared)
            else:
                sentences = self.sentence_lengths[sentence_starts[items.start] : sentence_starts[items.stop]]
                documents = EncodedDocuments(ids, lengths, options, sentences, counts[items])
                every_token = {"prompt_loss_weight": 1.0} if data.span_loss == "all" else {}
                made = DocumentBatches(documents, shuffle=True, **(shared | every_token))
            training.append(example_batches(made, model, packing))
            held = ExampleBatches(EncodedExamples(val_ids, val_lengths), shuffle=False, **shared)
            validation.append(example_batches(held, model, packing))
        weights = [source.weight for source in paths]
        train_mix = MixtureBatches(training, weights, train.seed, "train")
        return example_options(train_mix, MixtureBatches(validation, weights, train.seed, "val"))

    def describe(self) -> str:
        """What the line before training adds for documents longer than the context (empty when none were): the
        windows they were cut into, or the share of the text their openings leave out."""
        documents, made = self.windows
        if not documents:
            return ""
        counted = f"{documents:,} document{'s' if documents != 1 else ''} longer than the context"
        left_out, read = self.left_out
        if left_out:
            share = left_out / (left_out + read)
            return (
                f"; {counted} read from {'their openings' if documents != 1 else 'its opening'} alone, leaving out "
                f"{left_out:,} of {left_out + read:,} tokens ({share:.1%}; data.long_documents='windows' reads them "
                f"all)"
            )
        return f"; {counted} cut into {made:,} windows"

    def answers(self) -> tuple[list[str], list[str]] | None:
        """The completion and kind of every pair the mixture trained on (its pairs files less their validation
        share, the reference a fine-tune's `kqv eval` baselines count too), as the run read them (its
        tokens.safetensors holds them; a run trained before it kept them reads the files while they are where it
        read them); None for a mixture without pairs."""
        if self.pair_answers is not None:
            return [answer for answer, _ in self.pair_answers], [kind for _, kind in self.pair_answers]
        files = [Path(source.path) for source in data_sources(self.data) if source.holds_pairs]
        if not files or not all(file.is_file() for file in files):
            return None
        examples = []
        for file in files:
            read = read_examples(file)
            examples += [read[k] for k in split_examples(len(read), self.data.val_fraction)[0]]
        return [example.completion for example in examples], [example.kind for example in examples]


class Documents(Examples):
    """A text's documents made into examples by `data.objective`, or a mixture of sources (the module docstring):
    what a run on `data.sources`, or with an objective other than the next token, trains on."""

    settings = (SPAN_SETTINGS, DOCUMENT_SETTINGS, PAIR_SETTINGS)

    def __init__(self, data: DataConfig) -> None:
        self.corrupt = data.objective == "span_corruption"
        super().__init__(data)

    @staticmethod
    def reads(data: DataConfig) -> bool:
        return bool(data.sources) or data.objective != "next_token"

    @classmethod
    def takes(cls, data: DataConfig) -> tuple[Settings, ...]:
        """The documents' settings and the pairs' (a mixture's pairs source); a span's, under span corruption."""
        corrupt = data.objective == "span_corruption"
        return tuple(group for group in cls.settings if corrupt or group is not SPAN_SETTINGS)

    @staticmethod
    def sources(data: DataConfig) -> list[str | None]:
        return [source.path for source in data_sources(data)]

    def check(self) -> None:
        data = self.data
        if data.template is not None and not any(source.holds_pairs for source in data_sources(data)):
            raise ConfigError(
                "data.template writes the prompts of a file of prompt -> completion pairs, and no source is one "
                "(a .tsv or .jsonl file); drop it, or add the pairs to the sources"
            )

    def build(self, tokenizers: TokenizerSource) -> LoadedDocuments:
        return self.read(*build_sources(tokenizers, self.data, self.corrupt))

    def read(self, tokenizer: Tokenizer, tensors: Tensors) -> LoadedDocuments:
        return LoadedDocuments.from_tensors(tokenizer, tensors, self.data, self.corrupt)
