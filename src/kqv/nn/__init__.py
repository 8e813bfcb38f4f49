"""The lecture's model: attention and its cores, positions, layers, the three architectures, generation and
search, heads, and the LSTM baseline. Imports nothing from the rest of kqv (tests/test_layout.py)."""

# The names applications (kqv_lab, the benchmarks) use, exported here: they import kqv.nn, not its modules.
from .attention import MultiHeadAttention
from .blockwise import blockwise_attention
from .config import ModelConfig, Position
from .cores import AttentionCall, FullAttention, scaled_dot_product_attention
from .decoding import DecodeStep, one_row_product
from .devices import Accelerator, model_device, peak_rss_bytes
from .dmca import LocalAttention, MemoryCompressedAttention
from .dropout import dropout
from .embeddings import Embeddings
from .environment import cpu
from .generation import in_dtype
from .layers import FeedForward, Residual, make_norm
from .lora import LoRAConfig, add_lora
from .losses import linear_cross_entropy
from .models import DecoderLM, Encoder, count_parameters, init_weights
from .positions import ALiBiPositions, RelativePositions
from .sparse import BigBirdAttention, LinformerAttention

__all__ = [
    "ALiBiPositions",
    "Accelerator",
    "AttentionCall",
    "BigBirdAttention",
    "DecodeStep",
    "DecoderLM",
    "Embeddings",
    "Encoder",
    "FeedForward",
    "FullAttention",
    "LinformerAttention",
    "LoRAConfig",
    "LocalAttention",
    "MemoryCompressedAttention",
    "ModelConfig",
    "MultiHeadAttention",
    "Position",
    "RelativePositions",
    "Residual",
    "add_lora",
    "blockwise_attention",
    "count_parameters",
    "cpu",
    "dropout",
    "in_dtype",
    "init_weights",
    "linear_cross_entropy",
    "make_norm",
    "model_device",
    "one_row_product",
    "peak_rss_bytes",
    "scaled_dot_product_attention",
]
