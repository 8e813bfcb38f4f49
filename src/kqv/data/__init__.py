"""Data for kqv's jobs: corpora (Shakespeare, the Bible, user text, digits), tokenizers, batching, padding, masking."""

# The names applications (kqv_lab, the benchmarks) use, exported here: they import kqv.data, not its modules.
from . import needle  # the needle-in-a-haystack task: needle.VOCAB, needle.QUERIES, needle.needle_batch
from .batches import batch_generator, sample_batch
from .bible import load_pairs
from .completions import split_examples
from .shakespeare import load_text, split_text
from .tokenizers import Tokenizer, encode_text, make_tokenizer

__all__ = [
    "Tokenizer",
    "batch_generator",
    "encode_text",
    "load_pairs",
    "load_text",
    "make_tokenizer",
    "needle",
    "sample_batch",
    "split_examples",
    "split_text",
]
