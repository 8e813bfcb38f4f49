"""What the explorer looks at: a trained model with its tokenizer, answering the page's questions about one input.

One class per kind of model: `LMSubject` (a `DecoderLM`: causal self-attention, next-token predictions and
sampling), `MTSubject` (an encoder-decoder: translation, cross-attention alignment, encoder and decoder self-
attention), the encoders (`MLMSubject`, `ClassifierSubject`, `EmbeddingSubject`: self-attention plus what the head
predicts); `kqv.explore.vision.VitSubject` does the same for a Vision Transformer. Each opens itself with
`load(path, limit)` (a run through its job's own loader, `kqv.jobs.load_run`) and answers `info()` (with the
`example` text the page opens with) and `analyze(request)` with plain dicts; `LMSubject` also streams a
continuation. `kqv.explore.loading.SUBJECTS` names the class of each job. Requests are the page's JSON bodies: every
field is checked here and a bad one is a DataError whose message says what to send instead.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..errors import DataError, KqvError
from ..nn.devices import model_device
from ..nn.generation import GenerationConfig, GenerationLimits, sample_next
from .analysis import (
    attention_view,
    check_int,
    check_length,
    check_text,
    input_limit,
    limit_hint,
    readable_piece,
    top_tokens,
)
from .sparse_views import Weights, self_attention_weights

MASK = "[MASK]"
EXAMPLE = "To be, or not to be, that is the question:"  # the text the page opens with, where the model reads it


@dataclass(frozen=True)
class ServedGeneration(GenerationConfig):
    """kqv's generation options as the explorer takes them from a page: the same config and checks, within a
    server's limits (one continuation of at most 2,000 tokens a request, streamed as it is sampled)."""

    limits: ClassVar[GenerationLimits] = GenerationLimits(max_new_tokens=2000, count=1)


class NotApplicable(DataError):
    """The request asks for a view this kind of model does not have (e.g. sampling from a translation model)."""


class Subject:
    """A loaded model and what the page may ask of it. `limit` is the longest input, in tokens, it will draw
    (None: the model's context, kqv.explore.subjects.input_limit)."""

    task = "?"

    def __init__(self, name: str, model: nn.Module, limit: int | None, config: Any = None):
        self.name, self.model = name, model.eval()
        # the model's context sets the limit (e.g. learned positions have no embedding past max_len): the message
        # says so, rather than suggesting a larger --max-tokens
        self.limit, self.positions_limit = input_limit(limit, config)
        self.lock = threading.Lock()  # one model call at a time: the server may answer requests from several threads

    @classmethod
    def load(cls, path: Path, limit: int, device: str = "cpu") -> Subject:
        """The subject of the run directory `path`, loaded by its job (weights from safetensors) onto `device`."""
        from ..jobs import load_run

        return cls.from_run(load_run(path, device), limit)

    def ids(self, *rows: list[int]) -> Tensor:
        """Token ids (len(rows), time) where the model is (what the views read comes back to the CPU)."""
        return torch.tensor(rows, device=model_device(self.model))

    @classmethod
    def from_run(cls, run: Any, limit: int) -> Subject:
        """The subject of a loaded run (a `kqv.jobs.TrainedRun` of its job)."""
        raise NotImplementedError

    def info(self) -> dict[str, Any]:
        config = self.model.config
        described = {k: v for k, v in asdict(config).items() if isinstance(v, (int, float, str, bool))}
        return {
            "task": self.task,
            "name": self.name,
            "model": type(self.model).__name__,
            "config": described,
            "max_tokens": self.limit,
            "views": self.views(),
            "example": self.example(),
        }

    def examples(self) -> list[str]:
        """Texts the page may open with, the most telling first."""
        return [EXAMPLE]

    def reads(self, text: str) -> None:
        """Raise (DataError, KeyError or ValueError) unless `analyze` takes `text` (each kind checks only that it
        encodes within the limit; this fallback analyses it)."""
        self.analyze({"text": text})

    def example(self) -> str | None:
        """The text the page opens with: the first of `examples()` this model reads, its words cut from the end
        until it fits the input limit; None when the model reads none of them (the page opens empty)."""
        for text in self.examples():
            words = text.split(" ")
            for n in range(len(words), 0, -1):
                try:
                    self.reads(" ".join(words[:n]))
                except (KqvError, KeyError, ValueError):
                    continue
                return " ".join(words[:n])
        return None

    def views(self) -> list[str]:
        return ["head", "model", "stats"]

    def analyze(self, request: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def continuation(self, request: dict[str, Any]) -> Iterator[dict[str, Any]]:
        raise NotApplicable(f"continuing a text applies to language models; this is a {self.task} run")

    def check_length(self, n_tokens: int, what: str = "the input") -> None:
        check_length(n_tokens, self.limit, what, limit_hint(self.limit, self.positions_limit, self.model.config))


def self_view(label: str, tokens: list[str], weights: Weights, causal: bool) -> dict[str, Any]:
    """The self-attention view of one input; over Linformer's slots rather than tokens when that is what it has."""
    return attention_view(
        label,
        tokens,
        weights.keys or tokens,
        weights.layers,
        causal=causal and weights.over_tokens,
        self_attention=weights.over_tokens,
        note=weights.note,
    )


def token_labels(
    decode: Callable[[list[int]], str], ids: list[int], specials: dict[int, str] | None = None
) -> list[str]:
    specials = specials or {}
    return [specials[i] if i in specials else decode([i]) for i in ids]


# ---------------------------------------------------------------------------------------------------------------
# Language models


class LMSubject(Subject):
    """A `DecoderLM` run: causal self-attention, the top-k next tokens at every position, and sampling."""

    task = "lm"

    def __init__(self, name: str, run: Any, limit: int):
        super().__init__(name, run.model, limit, run.model.config)
        self.tokenizer, self.sample = run.tokenizer, run.config.sample

    @classmethod
    def from_run(cls, run: Any, limit: int) -> LMSubject:
        return cls(str(run.run_dir), run, limit)

    def info(self) -> dict[str, Any]:
        return {**super().info(), "sample": asdict(self.sample)}

    def views(self) -> list[str]:
        return [*super().views(), "next", "continue"]

    def examples(self) -> list[str]:
        return [EXAMPLE, *([self.sample.prompt] if self.sample.prompt else [])]  # the prompt: the corpus's start

    def reads(self, text: str) -> None:
        self.encode(text)

    def encode(self, text: str) -> list[int]:
        ids = self.tokenizer.encode(check_text(text))
        self.check_length(len(ids))
        return ids

    @torch.no_grad()
    def analyze(self, request: dict[str, Any]) -> dict[str, Any]:
        ids = self.encode(request.get("text"))
        k = check_int(request.get("top_k", 5), "top_k", 1, 50)
        tokens = [self.label(i) for i in ids]
        batch = self.ids(ids)
        with self.lock:
            logits = self.model(batch)[0]  # (time, vocab)
            weights = self_attention_weights(
                self.model, lambda: self.model.attention_weights(batch), lambda: self.model(batch)
            )
        return {
            "task": self.task,
            "tokens": tokens,
            "ids": ids,
            "attention": {"self": self_view("self-attention", tokens, weights, causal=True)},
            "next_tokens": top_tokens(logits, self.label, k),
        }

    def label(self, i: int) -> str:
        """Token `i` readable: a byte-level BPE's lone byte as <0xE2> rather than U+FFFD (analysis.readable_piece)."""
        hf = getattr(self.tokenizer, "tokenizer", None)  # a BPETokenizer's Hugging Face tokenizer
        return readable_piece(self.tokenizer.decode, hf.id_to_token if hf else lambda i: None, i)

    def sampling_options(self, request: dict[str, Any], prompt_length: int) -> dict[str, Any]:
        """The run's [sample] settings with the request's overrides, checked as one `ServedGeneration` (kqv's
        `GenerationConfig` within the explorer's limits); on learned positions no more new tokens than fit."""
        chosen = ServedGeneration(
            max_new_tokens=request.get("max_new_tokens", min(self.sample.max_new_tokens, 200)),
            temperature=request.get("temperature", self.sample.temperature),
            top_k=request.get("top_k", self.sample.top_k),
            top_p=request.get("top_p"),
            seed=request.get("seed", 0),
        )
        new, config = chosen.max_new_tokens, self.model.config
        if config.position == "learned":
            new = min(new, config.max_len - prompt_length + 1)
            if new < 1:
                raise DataError(f"the text fills the model's {config.max_len} learned positions; shorten it")
        return {**chosen.sampling, "max_new_tokens": new, "seed": chosen.seed}

    def continuation(self, request: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """Sample a continuation with the run's settings, one {"token", "id"} at a time as each is generated, then
        {"done": true, "text": prompt + continuation, "options": ...}. Checks happen before the first token."""
        ids = self.encode(request.get("text"))
        options = self.sampling_options(request, len(ids))
        seed = options.pop("seed")
        return self._stream(ids, options, torch.Generator(model_device(self.model)).manual_seed(seed))

    def _stream(self, ids: list[int], options: dict[str, Any], generator: torch.Generator) -> Iterator[dict]:
        sample = {k: options[k] for k in ("temperature", "top_k", "top_p")}
        new_ids: list[int] = []
        with torch.no_grad():
            with self.lock:
                cache = self.model.new_cache()
                logits = self.model(self.ids(ids), cache=cache)[:, -1]  # (1, vocab)
            for step in range(options["max_new_tokens"]):
                next_id = sample_next(logits, generator=generator, **sample)  # (1,)
                new_ids.append(int(next_id))
                yield {"token": self.tokenizer.decode([new_ids[-1]]), "id": new_ids[-1]}
                if step + 1 < options["max_new_tokens"]:
                    with self.lock:
                        logits = self.model(next_id[:, None], cache=cache)[:, -1]
        yield {"done": True, "text": self.tokenizer.decode(ids + new_ids), "options": options}


# ---------------------------------------------------------------------------------------------------------------
# Translation


class MTSubject(Subject):
    """An encoder-decoder translation run (Transformer or the LSTM baseline): the translation with a chosen beam,
    cross-attention (target x source, the alignment), and the encoder's and decoder's self-attention."""

    task = "mt"

    def __init__(self, name: str, run: Any, limit: int, special_tokens: tuple[str, str, str]):
        super().__init__(name, run.model, limit, run.model.config)
        self.run, self.tokenizer = run, run.tokenizer
        self.pad_id, self.bos_id, self.eos_id = (run.tokenizer.token_to_id(t) for t in special_tokens)
        self.specials = dict(zip((self.pad_id, self.bos_id, self.eos_id), special_tokens))

    @classmethod
    def from_run(cls, run: Any, limit: int) -> MTSubject:
        from ..jobs.mt import SPECIAL_TOKENS

        return cls(str(run.run_dir), run, limit, SPECIAL_TOKENS)

    def info(self) -> dict[str, Any]:
        return {**super().info(), "kind": self.run.config.kind, "decode": asdict(self.run.config.decode)}

    def views(self) -> list[str]:
        return [*super().views(), "translation"]

    def examples(self) -> list[str]:
        """The run's first held-out source sentence (in its language and domain), then John 1:1 in German (the
        default corpus's source)."""
        try:
            held_out = self.run.test_texts()[0][:1]
        except (KqvError, OSError, AttributeError, IndexError):  # a Hugging Face directory keeps no test texts
            held_out = []
        return [*held_out, "Im Anfang war das Wort"]

    def reads(self, text: str) -> None:
        self.encode(text, "text")

    def encode(self, text: str, what: str) -> list[int]:
        ids = self.tokenizer.encode(" ".join(check_text(text, what).split()))  # as the MT job cleans its corpus
        self.check_length(len(ids) + 1, f"the {what}")
        return ids

    @torch.no_grad()
    def analyze(self, request: dict[str, Any]) -> dict[str, Any]:
        src_ids = self.encode(request.get("text"), "text") + [self.eos_id]
        beam = check_int(request.get("beam", self.run.config.decode.beam_size), "beam", 1, 16)
        target = request.get("target")
        with self.lock:
            if target is None:
                target = self.run.translate([request["text"]], beam_size=beam)[0]
            if not isinstance(target, str):
                raise DataError(f"target must be a string (a translation to align), got {type(target).__name__}")
            tgt_ids = [self.bos_id] + (self.encode(target, "target") if target.strip() else [])
            sparse = getattr(self.model.config, "attention", "full") != "full"
            weights = {} if sparse else self.model.attention_weights(self.ids(src_ids), self.ids(tgt_ids))
            weights = {part: [w.cpu() for w in layers] for part, layers in weights.items()}
        labels = lambda ids: token_labels(self.tokenizer.decode, ids, self.specials)
        source, decoder_in = labels(src_ids), labels(tgt_ids)
        return {
            "task": self.task,
            "translation": target,
            "beam": beam,
            "source_tokens": source,
            "target_tokens": decoder_in,
            "attention": self.attention_views(source, decoder_in, weights),
            "notes": self.notes(weights, sparse),
        }

    @staticmethod
    def attention_views(source: list[str], decoder_in: list[str], weights: dict[str, list[Tensor]]) -> dict[str, Any]:
        produced = decoder_in[1:] + ["<eos>"]  # row i of the decoder reads token i and produces token i + 1
        views = {}
        if "cross" in weights:
            views["cross"] = attention_view(
                "cross-attention (rows: the target token produced, columns: source)",
                produced,
                source,
                weights["cross"],
                causal=False,
                self_attention=False,
            )
        if "encoder" in weights:
            views["encoder"] = attention_view(
                "encoder self-attention", source, source, weights["encoder"], causal=False
            )
            views["decoder"] = attention_view(
                "decoder self-attention (causal)", decoder_in, decoder_in, weights["decoder"], causal=True
            )
        return views

    def notes(self, weights: dict[str, list[Tensor]], sparse: bool) -> list[str]:
        if sparse:
            return [
                f"this model's self-attention is {self.model.config.attention}, which forms no attention weights; "
                f"the explorer draws sparse patterns for language models and encoders only"
            ]
        if "encoder" not in weights:
            return ["an LSTM has no self-attention: its attention over the source (one head) is the cross-attention"]
        return []


# ---------------------------------------------------------------------------------------------------------------
# Encoders: masked LM, classifier, sentence embeddings


class EncoderSubject(Subject):
    """An encoder's self-attention over one input, plus what its head makes of it (`predictions`)."""

    def __init__(self, name: str, model: nn.Module, encoder: nn.Module, limit: int):
        super().__init__(name, model, limit, encoder.config)
        self.encoder = encoder

    def tokenize(self, text: str) -> tuple[list[int], list[str]]:
        raise NotImplementedError

    def predictions(self, batch: Tensor, ids: list[int]) -> dict[str, Any]:
        return {}

    def reads(self, text: str) -> None:
        ids, _ = self.tokenize(check_text(text))
        self.check_length(len(ids))

    @torch.no_grad()
    def analyze(self, request: dict[str, Any]) -> dict[str, Any]:
        ids, tokens = self.tokenize(check_text(request.get("text")))
        self.check_length(len(ids))
        batch = self.ids(ids)
        with self.lock:
            weights = self_attention_weights(
                self.encoder, lambda: self.encoder.attention_weights(batch), lambda: self.encoder(batch)
            )
            extra = self.predictions(batch, ids)
        view = self_view("self-attention (bidirectional)", tokens, weights, causal=False)
        return {"task": self.task, "tokens": tokens, "ids": ids, "attention": {"self": view}, **extra}


class MLMSubject(EncoderSubject):
    """A masked-LM run: write [MASK] where a token should be guessed; the top-k guesses at each mask."""

    task = "mlm"

    def __init__(self, name: str, model: nn.Module, vocabulary: Any, limit: int):
        super().__init__(name, model, model.encoder, limit)
        self.vocabulary = vocabulary
        self.specials = {i: token for token, i in vocabulary.specials.items()}

    @classmethod
    def from_run(cls, run: Any, limit: int) -> MLMSubject:
        return cls(str(run.run_dir), run.model, run.vocabulary, limit)

    def info(self) -> dict[str, Any]:
        return {**super().info(), "mask_token": MASK}

    def views(self) -> list[str]:
        return [*super().views(), "masked"]

    def examples(self) -> list[str]:
        return [f"To be, or not to {MASK}, that is the question:", *super().examples()]

    def tokenize(self, text: str) -> tuple[list[int], list[str]]:
        ids: list[int] = []
        for number, piece in enumerate(text.split(MASK)):
            ids += ([self.vocabulary.mask_id] if number else []) + (self.vocabulary.encode(piece) if piece else [])
        return ids, token_labels(self.vocabulary.tokenizer.decode, ids, self.specials)

    def predictions(self, batch: Tensor, ids: list[int]) -> dict[str, Any]:
        masked = [i for i, token in enumerate(ids) if token == self.vocabulary.mask_id]
        if not masked:
            return {
                "masked": [],
                "notes": [f"write {MASK} where a token should be predicted, e.g. 'To be, or not to {MASK}{MASK}'"],
            }
        logits = self.model(batch)[0, masked]  # (masks, vocab)
        decode = lambda i: self.specials.get(i) or self.vocabulary.tokenizer.decode([i])
        return {"masked": [{"position": p, "top": row} for p, row in zip(masked, top_tokens(logits, decode, 5))]}


class ClassifierSubject(EncoderSubject):
    """A classification run: [CLS] + the text, as it was trained; the probability of every label."""

    task = "cls"

    def __init__(self, name: str, model: nn.Module, vocabulary: Any, labels: list[str], limit: int):
        super().__init__(name, model, model.encoder, limit)
        self.vocabulary, self.labels = vocabulary, labels
        self.specials = {i: token for token, i in vocabulary.specials.items()}

    @classmethod
    def from_run(cls, run: Any, limit: int) -> ClassifierSubject:
        return cls(str(run.run_dir), run.model, run.tokenizer, run.labels, limit)

    def info(self) -> dict[str, Any]:
        return {**super().info(), "labels": self.labels}

    def views(self) -> list[str]:
        return [*super().views(), "classes"]

    def tokenize(self, text: str) -> tuple[list[int], list[str]]:
        ids = [self.vocabulary.cls_id, *self.vocabulary.encode(text)]
        return ids, token_labels(self.vocabulary.tokenizer.decode, ids, self.specials)

    def predictions(self, batch: Tensor, ids: list[int]) -> dict[str, Any]:
        probs = self.model(batch)[0].float().softmax(-1)
        return {"classes": [{"label": label, "p": round(float(p), 6)} for label, p in zip(self.labels, probs)]}


class EmbeddingSubject(EncoderSubject):
    """A sentence-transformers model run by kqv (all-MiniLM-L6-v2): its WordPiece tokens and self-attention."""

    task = "embedding"

    def __init__(self, name: str, sentence_encoder: Any, limit: int):
        longest = sentence_encoder.max_seq_length
        super().__init__(name, sentence_encoder.encoder, sentence_encoder.encoder, min(limit or longest, longest))
        self.sentence_encoder = sentence_encoder

    @classmethod
    def load(cls, path: Path | None, limit: int, device: str = "cpu") -> EmbeddingSubject:
        """all-MiniLM-L6-v2 as installed (path None), or the sentence-transformers directory `path`."""
        from ..interop.sentence_encoder import SentenceEncoder

        return cls(str(path) if path else "minilm", SentenceEncoder.load(path).to(device), limit)

    def tokenize(self, text: str) -> tuple[list[int], list[str]]:
        tokenizer = self.sentence_encoder.tokenizer
        tokenizer.no_truncation()  # the length check says when a text is too long, rather than cutting it
        try:
            encoding = tokenizer.encode(text.strip())
        finally:
            tokenizer.enable_truncation(self.sentence_encoder.max_seq_length)
        return encoding.ids, encoding.tokens
