"""The `kqv` command line: it parses flags, calls `kqv.api` (and the methods of a loaded run), and prints."""

from .main import COMMANDS, build_parser, main, packaged_config

__all__ = ["COMMANDS", "build_parser", "main", "packaged_config"]
