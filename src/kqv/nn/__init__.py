"""The lecture's model: attention and its cores, positions, layers, the three architectures, generation and
search, heads, and the LSTM baseline. Imports nothing from the rest of kqv (tests/test_layout.py)."""

# The names applications (kqv_lab, the benchmarks) use, exported here: they import kqv.nn, not its modules.
from .attention import MultiHeadAttention
from .config import ModelConfig, Position
from .cores import AttentionCall, FullAttention, scaled_dot_product_attention
from .devices import Accelerator
from .environment import cpu
from .layers import FeedForward, Residual
from .models import DecoderLM, Encoder, count_parameters

__all__ = [
    "Accelerator",
    "AttentionCall",
    "DecoderLM",
    "Encoder",
    "FeedForward",
    "FullAttention",
    "ModelConfig",
    "MultiHeadAttention",
    "Position",
    "Residual",
    "count_parameters",
    "cpu",
    "scaled_dot_product_attention",
]
