"""`kqv env`: what a bug report needs (`kqv.nn.environment`), printed."""

from __future__ import annotations

import argparse
import json

from ..api import describe_environment, environment
from ..flag_names import DEVICE, JSON
from .commands import Command


class Env(Command):
    """`kqv env [--device D] [--json]`: versions, CPU, GPUs, and the device, precision and kernels `auto` chooses."""

    help = "what a bug report needs: versions, CPU, GPUs, and what device/precision 'auto' chooses here"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(DEVICE, default="auto", help="the device to describe (default: auto)")
        parser.add_argument(JSON, action="store_true", help="print it as one JSON object")

    def run(self, args: argparse.Namespace) -> None:
        values = environment(args.device)
        print(json.dumps(values) if args.json else "\n".join(describe_environment(values)))
