"""Data for kqv's jobs: corpora (Shakespeare, the Bible, user text, digits), tokenizers, batching, padding, masking."""
