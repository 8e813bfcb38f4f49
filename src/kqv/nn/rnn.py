"""The model the lecture starts from: a bidirectional LSTM encoder and an LSTM decoder with attention.

This is the recurrent sequence-to-sequence baseline that the Transformer replaced (Sutskever et al. 2014 with the
attention of Bahdanau et al. 2015 and Luong et al. 2015, as in CS224N's NMT assignment):

* the encoder reads the source in both directions; its outputs h_1..h_m (forward and backward states
  concatenated) are the keys and values of attention;
* the decoder's initial state is a projection of the encoder's final states (forward of the last token,
  backward of the first);
* at target step t the decoder state s_t is the query: a_t = Attention(s_t, h_1..h_m) with kqv's single-head
  `Attention` and a selectable score (dot, multiplicative, reduced_rank, additive); the output
  o_t = tanh(W [a_t; s_t]) is projected to the vocabulary (tied to the embeddings when sizes allow).

The decoder does not feed o_{t-1} back into its input (Luong's "input feeding"), so the whole target can be run
through `nn.LSTM` at once under teacher forcing, and step-by-step decoding with the LSTM state computes exactly
the same numbers. `RNNEncoderDecoder` has the interface of `EncoderDecoder`: `forward(src_ids, tgt_ids, targets,
src_mask=..., tgt_mask=...)`, `generate(src_ids, max_new_tokens, beam_size=..., ...)` and `attention_weights`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from ..errors import ConfigError, DataError, DataTypeError
from ..validation import Config, check_positive
from .attention import Attention, Score
from .checks import lookup_tokens
from .config import require_vocabulary
from .dropout import Dropout
from .generation import Translator

State = tuple[Tensor, Tensor]  # LSTM (h, c), each (layers, batch, d_hidden)


@dataclass
class RNNConfig(Config):
    """Sizes of the LSTM baseline. The encoder runs d_hidden / 2 units per direction, so its outputs and the
    decoder state both have d_hidden dimensions (which lets the dot-product score compare them)."""

    vocab_size: int | None = None  # None: decided by the tokenizer (set it before building a model)
    d_embed: int = 256
    d_hidden: int = 512
    n_layers: int = 2
    score: Score = "multiplicative"
    attention_hidden: int = 128  # hidden size of the additive score (its memory grows with it)
    dropout: float = 0.1
    tie_embeddings: bool = True
    tgt_vocab_size: int | None = None  # None shares the source vocabulary

    def check(self) -> None:
        for name in ("d_embed", "d_hidden", "n_layers", "attention_hidden"):
            check_positive(name, getattr(self, name))
        for name in ("vocab_size", "tgt_vocab_size"):
            if getattr(self, name) is not None:
                check_positive(name, getattr(self, name))
        if self.d_hidden % 2:
            raise ConfigError(f"d_hidden must be even (half per encoder direction), got {self.d_hidden}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"dropout must be in [0, 1), got {self.dropout}")

    @property
    def target_vocab_size(self) -> int:
        return self.tgt_vocab_size or self.vocab_size


class BiLSTMEncoder(nn.Module):
    """Source ids -> outputs (batch, src_time, d_hidden) and the decoder's initial state."""

    def __init__(self, config: RNNConfig, tokens: nn.Embedding):
        super().__init__()
        self.tokens = tokens
        self.lstm = nn.LSTM(
            config.d_embed,
            config.d_hidden // 2,
            config.n_layers,
            batch_first=True,
            bidirectional=True,
            dropout=config.dropout if config.n_layers > 1 else 0.0,
        )
        self.to_h = nn.Linear(config.d_hidden, config.d_hidden)  # W_h [h_fwd; h_bwd]
        self.to_c = nn.Linear(config.d_hidden, config.d_hidden)  # W_c [c_fwd; c_bwd]
        self.dropout = Dropout(config.dropout)

    def forward(self, src_ids: Tensor, src_mask: Tensor | None) -> tuple[Tensor, State]:
        x = self.dropout(lookup_tokens(self.tokens, src_ids, self.tokens.num_embeddings, "src_ids"))
        if src_mask is None:
            outputs, (h, c) = self.lstm(x)
        else:  # packing skips the padding, so the backward direction starts at each sequence's last real token
            lengths = source_lengths(src_mask)
            packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
            outputs, (h, c) = self.lstm(packed)
            outputs, _ = pad_packed_sequence(outputs, batch_first=True, total_length=src_ids.shape[1])
        # h, c: (layers * 2, batch, d_hidden / 2) -> (layers, batch, d_hidden), forward and backward side by side
        h = h.view(-1, 2, *h.shape[1:]).transpose(1, 2).flatten(2)
        c = c.view(-1, 2, *c.shape[1:]).transpose(1, 2).flatten(2)
        return outputs, (torch.tanh(self.to_h(h)), self.to_c(c))


class AttentionLSTMDecoder(nn.Module):
    """Target ids and an LSTM state -> combined outputs o_t (batch, time, d_embed), new state, attention weights."""

    def __init__(self, config: RNNConfig, tokens: nn.Embedding):
        super().__init__()
        self.tokens = tokens
        self.lstm = nn.LSTM(
            config.d_embed,
            config.d_hidden,
            config.n_layers,
            batch_first=True,
            dropout=config.dropout if config.n_layers > 1 else 0.0,
        )
        self.attention = Attention(config.d_hidden, config.d_hidden, config.score, hidden=config.attention_hidden)
        self.combine = nn.Linear(2 * config.d_hidden, config.d_embed, bias=False)  # W [a_t; s_t]
        self.dropout = Dropout(config.dropout)

    def forward(
        self, tgt_ids: Tensor, state: State, memory: Tensor, memory_mask: Tensor | None
    ) -> tuple[Tensor, State, Tensor]:
        x = self.dropout(lookup_tokens(self.tokens, tgt_ids, self.tokens.num_embeddings, "tgt_ids"))
        queries, state = self.lstm(x, state)  # (batch, tgt_time, d_hidden)
        context, weights = self.attention(queries, memory, memory, memory_mask)  # (batch, tgt_time, d_hidden)
        output = torch.tanh(self.combine(torch.cat((context, queries), dim=-1)))  # (batch, tgt_time, d_embed)
        return self.dropout(output), state, weights


class RNNEncoderDecoder(Translator):
    """The LSTM-with-attention translation model, with the interface of `kqv.EncoderDecoder`.

    Padding must be on the right: `src_mask` (batch, src_time) marks real source tokens (1) and padding (0);
    `tgt_mask` is accepted for interface compatibility and not needed, since the decoder is causal and right
    padding comes after every real target token.
    """

    def __init__(self, config: RNNConfig):
        super().__init__()
        self.config = config
        src_tokens = nn.Embedding(require_vocabulary(config.vocab_size), config.d_embed)
        tgt_tokens = (
            src_tokens if config.tgt_vocab_size is None else nn.Embedding(config.tgt_vocab_size, config.d_embed)
        )
        self.encoder = BiLSTMEncoder(config, src_tokens)
        self.decoder = AttentionLSTMDecoder(config, tgt_tokens)
        self.lm_head = nn.Linear(config.d_embed, config.target_vocab_size, bias=False)
        for embedding in {id(src_tokens): src_tokens, id(tgt_tokens): tgt_tokens}.values():
            nn.init.normal_(embedding.weight, 0.0, 0.1)
        if config.tie_embeddings:
            self.lm_head.weight = tgt_tokens.weight

    # -- teacher forcing -------------------------------------------------------------------------------------------

    def encode(self, src_ids: Tensor, src_mask: Tensor | None = None) -> tuple[Tensor, State, Tensor | None]:
        """(memory (batch, src_time, d_hidden), decoder initial state, attention mask (batch, 1, src_time))."""
        _check_ids(src_ids, self.config.vocab_size, "src_ids")
        src_mask = _check_mask(src_mask, src_ids)
        memory, state = self.encoder(src_ids, src_mask)
        return memory, state, None if src_mask is None else src_mask[:, None, :]

    def decoder_states(
        self, src_ids: Tensor, tgt_ids: Tensor, src_mask: Tensor | None, tgt_mask: Tensor | None
    ) -> Tensor:
        """The combined outputs o_t (batch, tgt_time, d_embed) for tgt_ids given the sources: `forward`'s."""
        memory, state, memory_mask = self.encode(src_ids, src_mask)
        _check_ids(tgt_ids, self.config.target_vocab_size, "tgt_ids")
        output, _, _ = self.decoder(tgt_ids, state, memory, memory_mask)
        return output

    def attention_weights(self, src_ids: Tensor, tgt_ids: Tensor, src_mask: Tensor | None = None) -> dict[str, list]:
        """{"cross": [weights (batch, 1 head, tgt_time, src_time)]}: the source-target alignment, as for
        `EncoderDecoder.attention_weights`."""
        memory, state, memory_mask = self.encode(src_ids, src_mask)
        _check_ids(tgt_ids, self.config.target_vocab_size, "tgt_ids")
        _, _, weights = self.decoder(tgt_ids, state, memory, memory_mask)
        return {"cross": [weights[:, None]]}

    # -- decoding --------------------------------------------------------------------------------------------------

    def step(self, last_ids: Tensor, state: State, memory: Tensor, memory_mask: Tensor | None) -> tuple[Tensor, State]:
        """One decoder step: last_ids (batch,) -> next-token log-probabilities (batch, vocab) and the new state."""
        output, state, _ = self.decoder(last_ids[:, None], state, memory, memory_mask)
        return self.lm_head(output[:, 0]).float().log_softmax(dim=-1), state

    def stepper(self, src_ids: Tensor, src_mask: Tensor | None, use_cache: bool, max_new_tokens: int) -> RNNStepper:
        """The `kqv.nn.search.Stepper` that `generate` searches with (the LSTM state has no length to reserve)."""
        memory, state, memory_mask = self.encode(src_ids, src_mask)
        return RNNStepper(self, memory, state, memory_mask, use_cache)


class RNNStepper:
    """The `kqv.nn.search.Stepper` of the LSTM baseline: next-token log-probabilities for each row, carrying the
    LSTM state (or, with use_cache=False, re-running the decoder over the whole prefix from the initial state)."""

    def __init__(
        self, model: RNNEncoderDecoder, memory: Tensor, state: State, memory_mask: Tensor | None, use_cache: bool
    ):
        self.model, self.memory, self.memory_mask, self.use_cache = model, memory, memory_mask, use_cache
        self.initial, self.state = state, state
        self.prefixes: Tensor | None = None  # every token so far, kept only without the state

    def step(self, last_ids: Tensor) -> Tensor:
        if self.use_cache:
            log_probs, self.state = self.model.step(last_ids, self.state, self.memory, self.memory_mask)
            return log_probs
        ids = last_ids[:, None]
        self.prefixes = ids if self.prefixes is None else torch.cat((self.prefixes, ids), dim=1)
        output, _, _ = self.model.decoder(self.prefixes, self.initial, self.memory, self.memory_mask)
        return self.model.lm_head(output[:, -1]).float().log_softmax(dim=-1)

    def reorder(self, rows: Tensor) -> None:
        select = lambda s: (s[0][:, rows], s[1][:, rows])  # (layers, rows, d_hidden) each
        self.memory = self.memory[rows]
        self.memory_mask = None if self.memory_mask is None else self.memory_mask[rows]
        self.state, self.initial = select(self.state), select(self.initial)
        self.prefixes = None if self.prefixes is None else self.prefixes[rows]


def _check_ids(ids: Tensor, vocab_size: int, name: str) -> None:
    """Type and shape; the values are checked by the embedding lookup (`kqv.nn.checks.lookup_tokens`)."""
    if not isinstance(ids, Tensor) or ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise DataTypeError(
            f"{name} must be an integer tensor of token ids, got "
            f"{ids.dtype if isinstance(ids, Tensor) else type(ids).__name__}"
        )
    if ids.dim() != 2 or ids.numel() == 0:
        raise DataError(f"{name} must have shape (batch, time) with time >= 1, got {tuple(ids.shape)}")


def _check_mask(mask: Tensor | None, ids: Tensor) -> Tensor | None:
    if mask is None:
        return None
    if tuple(mask.shape) != tuple(ids.shape):
        raise DataError(f"src_mask must have the shape of src_ids {tuple(ids.shape)}, got {tuple(mask.shape)}")
    return mask.bool()


def source_lengths(mask: Tensor) -> Tensor:
    """The real tokens of each row of a right-padded source mask (batch, src_time), on the CPU, as packing needs
    them: the one host read of the LSTM's forward (cuDNN takes the lengths on the host), which also carries the
    checks of the mask (every row non-empty, padding on the right only)."""
    lengths = mask.sum(dim=1)
    right_padded = (mask == (torch.arange(mask.shape[1], device=mask.device)[None, :] < lengths[:, None])).all(1)
    lengths, right_padded = torch.stack((lengths, right_padded.long())).tolist()  # the one read
    if 0 in lengths:
        raise DataError("src_mask marks a source sentence with no tokens; every sentence needs at least one")
    if not all(right_padded):
        raise DataError("src_mask must mark padding on the right only (1 1 1 0 0), as the LSTM encoder packs it")
    return torch.tensor(lengths, device="cpu")  # where pack_padded_sequence takes them
