"""Data for kqv's jobs: corpora (Shakespeare, the Bible, user text, digits), tokenizers, batching, padding, masking."""

# The names applications (kqv_lab, the benchmarks) use, exported here: they import kqv.data, not its modules.
from . import needle  # the needle-in-a-haystack task: needle.VOCAB, needle.QUERIES, needle.needle_batch
from .batches import batch_generator, sample_batch
from .bible import bible_dir, clean_verse, load_pairs, read_bible
from .completions import read_examples, split_examples
from .pairs import TokenBatches
from .shakespeare import load_text, split_text
from .tokenizers import BPETokenizer, Tokenizer, encode_text, load_tokenizer, make_tokenizer

__all__ = [
    "BPETokenizer",
    "TokenBatches",
    "Tokenizer",
    "batch_generator",
    "bible_dir",
    "clean_verse",
    "encode_text",
    "load_pairs",
    "load_text",
    "load_tokenizer",
    "make_tokenizer",
    "needle",
    "read_bible",
    "read_examples",
    "sample_batch",
    "split_examples",
    "split_text",
]
