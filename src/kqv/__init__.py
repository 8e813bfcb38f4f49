"""kqv: the Transformer of CS224N's "Self-Attention and Transformers", readable, tested and fast on a CPU."""

from .attention import Attention, KVCache, MultiHeadAttention, causal_mask, scaled_dot_product_attention
from .config import ModelConfig
from .layers import DecoderBlock, EncoderBlock, FeedForward
from .models import DecoderLM, Encoder, EncoderDecoder, count_parameters

__all__ = [
    "Attention", "DecoderBlock", "DecoderLM", "Encoder", "EncoderBlock", "EncoderDecoder", "FeedForward", "KVCache",
    "ModelConfig", "MultiHeadAttention", "causal_mask", "count_parameters", "scaled_dot_product_attention",
]
__version__ = "0.1.0"
