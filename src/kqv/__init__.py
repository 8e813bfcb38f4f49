"""kqv: the Transformer of CS224N's "Self-Attention and Transformers", readable, tested and fast on a CPU."""

from .nn.attention import Attention, KVCache, MultiHeadAttention, causal_mask, scaled_dot_product_attention
from .nn.config import ModelConfig
from .nn.heads import ClassificationHead, MaskedLM, MaskedLMHead, SequenceClassifier
from .nn.layers import DecoderBlock, EncoderBlock, FeedForward
from .nn.models import DecoderLM, Encoder, EncoderDecoder, count_parameters
from .nn.rnn import RNNConfig, RNNEncoderDecoder

__all__ = [
    "Attention", "ClassificationHead", "DecoderBlock", "DecoderLM", "Encoder", "EncoderBlock", "EncoderDecoder",
    "FeedForward", "KVCache", "MaskedLM", "MaskedLMHead", "ModelConfig", "MultiHeadAttention", "SequenceClassifier",
    "causal_mask", "count_parameters", "scaled_dot_product_attention",
    "RNNConfig", "RNNEncoderDecoder",
]
__version__ = "0.1.0"
