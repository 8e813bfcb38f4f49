"""Data for kqv's jobs: corpora (Shakespeare, the Bible, user text, digits), tokenizers, batching, padding, masking."""

from . import needle  # the needle-in-a-haystack task: needle.VOCAB, needle.QUERIES, needle.needle_batch
from .bible import bible_dir, clean_verse, read_bible
from .completions import read_examples, split_examples
from .pairs import TokenBatches
from .shakespeare import load_text, split_text
from .tokenizers import BPETokenizer, load_tokenizer

__all__ = [
    "BPETokenizer",
    "TokenBatches",
    "bible_dir",
    "clean_verse",
    "load_text",
    "load_tokenizer",
    "needle",
    "read_bible",
    "read_examples",
    "split_examples",
    "split_text",
]
