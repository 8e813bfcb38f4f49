"""kqv: the Transformer of CS224N's "Self-Attention and Transformers", readable, tested and fast on a CPU.

The model's parts are exported here; so is the application layer (`kqv.api`): `kqv.train("lm")`,
`kqv.load("runs/lm").generate("ROMEO:")`, `kqv.embed([...])`, `kqv.similarity([...])`.
"""

# ruff: noqa: E402 -- guard_startup() must run before the heavy imports below
from .signals import guard_startup

guard_startup()  # the `kqv` command: Ctrl-C or SIGTERM while torch and the rest load ends it at once (130/143)

from .api import embed, export, load, similarity, train  # the application layer, above the model
from .nn.attention import Attention, KVCache, MultiHeadAttention, causal_mask, scaled_dot_product_attention
from .nn.config import ModelConfig
from .nn.generation import GenerationConfig
from .nn.heads import ClassificationHead, MaskedLM, MaskedLMHead, SequenceClassifier
from .nn.layers import DecoderBlock, EncoderBlock, FeedForward
from .nn.models import DecoderLM, Encoder, EncoderDecoder, count_parameters
from .nn.rnn import RNNConfig, RNNEncoderDecoder

__all__ = [
    "Attention",
    "ClassificationHead",
    "DecoderBlock",
    "DecoderLM",
    "Encoder",
    "EncoderBlock",
    "EncoderDecoder",
    "FeedForward",
    "GenerationConfig",
    "KVCache",
    "MaskedLM",
    "MaskedLMHead",
    "ModelConfig",
    "MultiHeadAttention",
    "SequenceClassifier",
    "causal_mask",
    "count_parameters",
    "scaled_dot_product_attention",
    "RNNConfig",
    "RNNEncoderDecoder",
    "embed",
    "export",
    "load",
    "similarity",
    "train",
]
__version__ = "0.1.0"
