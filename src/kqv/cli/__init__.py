"""The `kqv` command line."""

from .main import build_parser, main, packaged_config

__all__ = ["build_parser", "main", "packaged_config"]
