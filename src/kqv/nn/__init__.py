"""The lecture's model: attention and its cores, positions, layers, the three architectures, generation and
search, heads, and the LSTM baseline. Imports nothing from the rest of kqv (tests/test_layout.py)."""

from .blockwise import blockwise_attention
from .decoding import DecodeStep, one_row_product
from .devices import Accelerator, model_device, peak_rss_bytes
from .dmca import LocalAttention, MemoryCompressedAttention
from .dropout import dropout
from .embeddings import Embeddings
from .generation import in_dtype
from .layers import make_norm
from .lora import LoRAConfig, add_lora
from .losses import linear_cross_entropy
from .models import init_weights
from .positions import ALiBiPositions, RelativePositions
from .sparse import BigBirdAttention, LinformerAttention

__all__ = [
    "ALiBiPositions",
    "Accelerator",
    "BigBirdAttention",
    "DecodeStep",
    "Embeddings",
    "LinformerAttention",
    "LoRAConfig",
    "LocalAttention",
    "MemoryCompressedAttention",
    "RelativePositions",
    "add_lora",
    "blockwise_attention",
    "dropout",
    "in_dtype",
    "init_weights",
    "linear_cross_entropy",
    "make_norm",
    "model_device",
    "one_row_product",
    "peak_rss_bytes",
]
