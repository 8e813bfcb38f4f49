"""`kqv world`: an invented world of people (`kqv_lab.worlds`), its biographies and its question files written."""

from __future__ import annotations

import argparse
from pathlib import Path

from kqv.cli import Command
from kqv.flag_names import FULL_NAMES, OUT, OVERWRITE, PEOPLE, SEED, STYLE, VERSIONS

from ..worlds import STYLES, write_world


class World(Command):
    """`kqv world --out DIR [--overwrite] [--people N] [--versions V] [--full-names] [--style S] [--seed S]`:
    `kqv_lab.worlds.write_world`, the files it wrote named."""

    help = "write an invented world's biographies and question files (to pretrain on, then ask)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(PEOPLE, type=int, default=1000, help="how many people (default 1000)")
        parser.add_argument(VERSIONS, type=int, default=1, help="biographies per person, each worded anew (default 1)")
        parser.add_argument(FULL_NAMES, action="store_true", help="every sentence names its person in full")
        parser.add_argument(
            STYLE,
            choices=STYLES,
            default="varied",
            help="varied (default: each sentence names the person or says a pronoun, at random) or encyclopedia "
            "(one paragraph per person, the full name once in the first sentence, then pronouns, each fact once)",
        )
        parser.add_argument(SEED, type=int, default=0, help="the world's seed (default 0)")
        parser.add_argument(OUT, type=Path, required=True, help="a new (or empty) directory to write the world into")
        parser.add_argument(
            OVERWRITE, action="store_true", help="replace an earlier world there (a directory of a world's files only)"
        )

    def run(self, args: argparse.Namespace) -> None:
        write_world(args.out, args.people, args.seed, args.versions, args.full_names, args.style, args.overwrite)
        print(f"wrote {args.out}: biographies.txt, pretrain.txt, questions-{{seen,held-out}}.{{tsv,jsonl}}, probes-*")
