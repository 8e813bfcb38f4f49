"""kqv: the Transformer of CS224N's "Self-Attention and Transformers", readable, tested and fast on a CPU.

The model's parts are exported here; so is the application layer (`kqv.api`): `kqv.train("lm")`,
`kqv.load("runs/lm").generate("ROMEO:")`, `kqv.embed([...])`, `kqv.similarity([...])`.
"""

# ruff: noqa: E402 -- the guard must stand before the heavy imports below
try:  # the `kqv` command: from kqv's first line, Ctrl-C or SIGTERM while torch and the rest load ends it (130/143)
    from .signals import guard_startup

    guard_startup()
except KeyboardInterrupt:  # one that came before the guard stood, answered as the guard answers it
    from .signals import interrupted_at_startup

    interrupted_at_startup()  # the `kqv` command ends here; kqv imported from Python raises it on
    raise

from .api import embed, export, load, similarity, train  # the application layer, above the model
from .nn.attention import Attention, KVCache, MultiHeadAttention, causal_mask, scaled_dot_product_attention
from .nn.config import ModelConfig
from .nn.generation import GenerationConfig
from .nn.heads import ClassificationHead, MaskedLM, MaskedLMHead, SequenceClassifier
from .nn.layers import DecoderBlock, EncoderBlock, FeedForward
from .nn.models import DecoderLM, Encoder, EncoderDecoder, count_parameters
from .nn.rnn import RNNConfig, RNNEncoderDecoder
from .validation import Config, field_types  # the validated dataclass every config derives from, and its fields

__all__ = [
    "Attention",
    "ClassificationHead",
    "Config",
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
    "field_types",
    "export",
    "load",
    "similarity",
    "train",
]
__version__ = "0.1.0"
