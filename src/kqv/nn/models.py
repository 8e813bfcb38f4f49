"""The lecture's three architectures, each a plain `nn.Module` built from one `ModelConfig`:

* `Encoder`: bidirectional self-attention over the whole input (BERT-like), returns hidden states;
* `DecoderLM`: causal self-attention, each token sees only the past (GPT-like), returns next-token logits;
* `EncoderDecoder`: an encoder over the source and a decoder over the target that also cross-attends to the
  encoder's output (the machine-translation Transformer of Vaswani et al. 2017).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import ConfigError, DataError
from .attention import KVCache, padding_mask
from .checks import check_attention_mask, check_id_tensor, check_ids
from .config import ModelConfig
from .embeddings import Embeddings
from .experts import with_auxiliary_loss
from .generation import EncoderDecoderStepper, Translator, generate
from .layers import DecoderBlock, EncoderBlock, make_norm
from .losses import linear_cross_entropy
from .positions import position_tensor
from .sparse import share_linformer_projection
from .vocabulary import output_layer


class Encoder(nn.Module):
    """A stack of bidirectional encoder blocks: every token attends to every (non-padding) token."""

    def __init__(self, config: ModelConfig, tokens: nn.Module | None = None):
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config, config.vocab_size, tokens)
        self.blocks = nn.ModuleList(EncoderBlock(config, i) for i in range(config.encoder_layers))
        self.final_norm = make_norm(config) if config.norm_first else nn.Identity()
        if config.linformer.sharing == "layerwise":
            share_linformer_projection(self)
        init_weights(self)

    def forward(self, ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """ids (batch, time) -> hidden states (batch, time, d_model). attention_mask (batch, time): 1 = real token."""
        hidden, _ = self.run(ids, attention_mask)
        return hidden

    def attention_weights(self, ids: Tensor, attention_mask: Tensor | None = None) -> list[Tensor]:
        """Self-attention weights of every layer, each (batch, heads, time, time), for visualisation."""
        return self.run(ids, attention_mask, need_weights=True)[1]

    def run(self, ids: Tensor, attention_mask: Tensor | None, need_weights: bool = False) -> tuple[Tensor, list]:
        """Checked ids (batch, time) and padding mask -> (hidden states, weights of every layer if asked)."""
        # a forward pass reads no value (the lookup checks the ids); the weights, asked for outside training, do
        check_ids(ids, self.embeddings.vocab_size) if need_weights else check_id_tensor(ids)
        mask = check_attention_mask(attention_mask, ids)
        return self.encode(self.embeddings(ids, torch.arange(ids.shape[1], device=ids.device)), mask, need_weights)

    def encode(self, x: Tensor, mask: Tensor | None = None, need_weights: bool = False) -> tuple[Tensor, list]:
        """The blocks over embedded inputs x (batch, time, d_model) -> (hidden states, weights of every layer)."""
        all_weights = []
        for block in self.blocks:
            x, weights = block(x, mask, need_weights)
            all_weights.append(weights)
        return self.final_norm(x), all_weights


class Decoder(nn.Module):
    """A stack of decoder blocks (causal self-attention; cross-attention too when part of an encoder-decoder)."""

    def __init__(
        self,
        config: ModelConfig,
        n_layers: int,
        vocab_size: int,
        tokens: nn.Embedding | None = None,
        cross_attention: bool = False,
    ):
        super().__init__()
        self.embeddings = Embeddings(config, vocab_size, tokens, "tgt_ids" if cross_attention else "ids")
        self.blocks = nn.ModuleList(DecoderBlock(config, cross_attention, i) for i in range(n_layers))
        self.final_norm = make_norm(config) if config.norm_first else nn.Identity()
        if config.linformer.sharing == "layerwise":
            share_linformer_projection(self)

    def forward(
        self,
        ids: Tensor,
        memory: Tensor | None = None,
        *,
        attention_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        cache: list[tuple[KVCache, KVCache]] | None = None,
        need_weights: bool = False,
        positions: Tensor | range | None = None,
        left_padding: Tensor | None = None,
        sequence_positions: Tensor | None = None,
    ) -> tuple[Tensor, list[dict]]:
        """ids (batch, time) are the new tokens; with a cache they continue the cached ones.
        attention_mask, bool, broadcastable to (batch, 1, time, cached + new time), True = may attend.
        `positions` (time,) are the new tokens' places in the sequence (default: after the cached ones).
        `left_padding` (batch,) counts the padding tokens before each row's first real one: absolute positions
        (added to the embeddings) start after them; relative schemes see only distances, which padding does not
        change. `sequence_positions` (batch, time), when given, are the absolute positions instead: each token's
        place in its own sequence when a row packs several (`DecoderLM.forward`). Returns hidden
        (batch, time, d_model) and the attention weights asked for."""
        # consecutive positions, after the cached ones, are a tensor (a Python range would fix the length in a
        # compiled graph); attention makes its own from the shapes
        start = cache[0][0].length if cache else 0
        own_positions = (
            torch.arange(start, start + ids.shape[1], device=ids.device)
            if positions is None
            else position_tensor(positions, ids.device)
        )
        if left_padding is not None:
            own_positions = (own_positions - left_padding[:, None]).clamp(min=0)
        x = self.embeddings(ids, own_positions if sequence_positions is None else sequence_positions)
        all_weights = []
        for i, block in enumerate(self.blocks):
            x, weights = block(
                x,
                memory,
                mask=attention_mask,
                memory_mask=memory_mask,
                positions=positions,
                cache=cache[i] if cache else None,
                need_weights=need_weights,
            )
            all_weights.append(weights)
        return self.final_norm(x), all_weights

    def new_cache(self, capacity: int = 0) -> list[tuple[KVCache, KVCache]]:
        """An empty (self-attention, cross-attention) cache per layer, reserving `capacity` positions."""
        return [(KVCache(capacity), KVCache()) for _ in self.blocks]


class DecoderLM(nn.Module):
    """A causal language model: logits for the next token at every position, from the tokens up to it."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.decoder = Decoder(config, config.n_layers, config.vocab_size)
        vocab = config.vocab_size
        self.lm_head = output_layer(config.d_model, vocab, config.padded(vocab), config.output_bias)
        init_weights(self)
        if config.tie_embeddings:
            self.lm_head.weight = self.decoder.embeddings.tokens.weight

    def forward(
        self,
        ids: Tensor,
        targets: Tensor | None = None,
        *,
        attention_mask: Tensor | None = None,
        cache: list[tuple[KVCache, KVCache]] | None = None,
        positions: Tensor | None = None,
    ) -> Tensor:
        """ids (batch, time) -> logits (batch, time, vocab), or the mean cross-entropy when targets are given
        (targets (batch, time); -100 marks positions to ignore), plus the experts' load-balancing loss in training
        (`kqv.nn.experts`).

        `attention_mask` is a padding mask (batch, time), 1 = token, or a bool mask (batch, 1, time, time), True =
        may attend, added to the causal one: a row that packs several sequences gives it block-diagonal
        (`kqv.nn.cores.packed_mask`) so that no sequence attends to another. `positions` (batch, time) are then
        each token's place in its own sequence (restarting at 0), which absolute schemes embed; the in-attention
        schemes (RoPE, ALiBi, relative) see only distances within a sequence, the same wherever it sits in the row.
        """
        check_id_tensor(ids)  # the values: by the embedding lookup (`kqv.nn.checks`), with no host read
        past = cache[0][0].length if cache else 0
        mask = check_attention_mask(attention_mask, ids, past)
        if positions is not None and tuple(positions.shape) != tuple(ids.shape):
            raise DataError(
                f"positions must have the shape of the ids, {tuple(ids.shape)}, got {tuple(positions.shape)}"
            )
        hidden, _ = self.decoder(ids, attention_mask=mask, cache=cache, sequence_positions=positions)
        if targets is None:
            return self.lm_head(hidden)
        return with_auxiliary_loss(self, linear_cross_entropy(hidden, self.lm_head, targets))

    def next_token_logits(
        self,
        ids: Tensor,
        cache: list[tuple[KVCache, KVCache]] | None,
        *,
        positions: Tensor | None = None,
        attention_mask: Tensor | None = None,
        left_padding: Tensor | None = None,
    ) -> Tensor:
        """Logits (batch, vocab) of the token after each row of ids (batch, time), continuing the cache: the step
        of `kqv.nn.generation.generate`, which checks its inputs once, so this does not. `positions`,
        `attention_mask` (bool, (batch, 1, time, cached + time)) and `left_padding` as for `Decoder.forward`."""
        hidden, _ = self.decoder(
            ids, attention_mask=attention_mask, cache=cache, positions=positions, left_padding=left_padding
        )
        return self.lm_head(hidden)[:, -1]

    # continue prompts ids (batch, time), left-padded with attention_mask (batch, time) 0 on the padding
    generate = generate  # `kqv.nn.generation.generate` itself, the model its first argument

    def attention_weights(self, ids: Tensor) -> list[Tensor]:
        """Self-attention weights of every layer, each (batch, heads, time, time), for visualisation."""
        check_ids(ids, self.config.vocab_size)
        _, weights = self.decoder(ids, need_weights=True)
        return [w["self"] for w in weights]

    def new_cache(self, capacity: int = 0) -> list[tuple[KVCache, KVCache]]:
        """An empty KV cache per layer (self-attention, cross-attention), reserving `capacity` positions."""
        return self.decoder.new_cache(capacity)


class EncoderDecoder(Translator):
    """The encoder reads the source; the decoder predicts the target causally while cross-attending to it."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.encoder = Encoder(config)
        shared = self.encoder.embeddings.tokens if config.tgt_vocab_size is None else None
        self.decoder = Decoder(config, config.decoder_layers, config.target_vocab_size, shared, cross_attention=True)
        vocab = config.target_vocab_size
        self.lm_head = output_layer(config.d_model, vocab, config.padded(vocab), config.output_bias)
        init_weights(self)
        if config.tie_embeddings:
            self.lm_head.weight = self.decoder.embeddings.tokens.weight

    def encode(self, src_ids: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """The encoder's states (batch, src_time, d_model) of the source, which every decoding step attends to."""
        return self.encoder(src_ids, src_mask)

    def decode_hidden(
        self,
        tgt_ids: Tensor,
        memory: Tensor,
        src_mask: Tensor | None = None,
        *,
        tgt_mask: Tensor | None = None,
        cache: list[tuple[KVCache, KVCache]] | None = None,
    ) -> Tensor:
        """The decoder's last hidden states (batch, tgt_time, d_model), before the output projection."""
        check_id_tensor(tgt_ids, "tgt_ids")
        past = cache[0][0].length if cache else 0
        mask = check_attention_mask(tgt_mask, tgt_ids, past, "tgt_mask")
        hidden, _ = self.decoder(
            tgt_ids, memory, attention_mask=mask, memory_mask=self.memory_mask(src_mask), cache=cache
        )
        return hidden

    def decoder_states(
        self, src_ids: Tensor, tgt_ids: Tensor, src_mask: Tensor | None, tgt_mask: Tensor | None
    ) -> Tensor:
        """The decoder's last states (batch, tgt_time, d_model) for tgt_ids given the sources: `forward`'s."""
        return self.decode_hidden(tgt_ids, self.encode(src_ids, src_mask), src_mask, tgt_mask=tgt_mask)

    def stepper(
        self, src_ids: Tensor, src_mask: Tensor | None, use_cache: bool, max_new_tokens: int
    ) -> EncoderDecoderStepper:
        """The `kqv.nn.search.Stepper` that `generate` searches with for up to max_new_tokens tokens."""
        config = self.config
        if config.position == "learned" and max_new_tokens > config.max_len:
            raise ConfigError(f"max_new_tokens={max_new_tokens} exceeds max_len={config.max_len} of learned positions")
        return EncoderDecoderStepper(self, src_ids, src_mask, use_cache, capacity=1 + max_new_tokens)

    def attention_weights(self, src_ids: Tensor, tgt_ids: Tensor, src_mask: Tensor | None = None) -> dict[str, list]:
        """Attention weights by kind ('encoder', 'decoder', 'cross'), each a list over layers of
        (batch, heads, q_time, k_time); 'cross' is the source-target alignment."""
        memory, encoder_weights = self.encoder.run(src_ids, src_mask, need_weights=True)
        check_ids(tgt_ids, self.config.target_vocab_size, "tgt_ids")
        _, weights = self.decoder(tgt_ids, memory, memory_mask=self.memory_mask(src_mask), need_weights=True)
        return {
            "encoder": encoder_weights,
            "decoder": [w["self"] for w in weights],
            "cross": [w["cross"] for w in weights],
        }

    def memory_mask(self, src_mask: Tensor | None) -> Tensor | None:
        """The cross-attention mask (batch, 1, 1, src_time) hiding the source's padding, from src_mask."""
        return None if src_mask is None else padding_mask(src_mask)

    def new_cache(self, capacity: int = 0) -> list[tuple[KVCache, KVCache]]:
        """An empty KV cache per decoder layer (self-attention, cross-attention), reserving `capacity` positions."""
        return self.decoder.new_cache(capacity)


def lm_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean cross-entropy of next-token predictions; targets of -100 are ignored (padding)."""
    if targets.shape != logits.shape[:-1]:
        raise DataError(f"targets must have shape {tuple(logits.shape[:-1])} like the ids, got {tuple(targets.shape)}")
    return F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten(), ignore_index=-100)


def init_weights(model: nn.Module) -> None:
    """GPT-2's initialisation: N(0, 0.02) weights, zero biases, output projections scaled by 1/sqrt(2 * layers)."""
    layers = sum(isinstance(m, (EncoderBlock, DecoderBlock)) for m in model.modules())
    for name, module in model.named_modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            std = 0.02 / math.sqrt(2 * layers) if name.endswith(("to_output", "down")) else 0.02
            nn.init.normal_(module.weight, 0.0, std)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)


def count_parameters(model: nn.Module, exclude_embeddings: bool = False) -> int:
    """Number of distinct trainable parameters (tied weights counted once); optionally without embeddings."""
    params = {id(p): p for p in model.parameters() if p.requires_grad}
    if exclude_embeddings:
        for module in model.modules():
            if isinstance(module, nn.Embedding):
                params.pop(id(module.weight), None)
    return sum(p.numel() for p in params.values())
