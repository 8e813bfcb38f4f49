"""`kqv explore`: the attention explorer (kqv.explore) as a local web app, or one input as an HTML file."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..api import refuse_writing_over, run_inputs
from ..errors import ConfigError, MissingResourceError
from ..flag_names import BEAM, HOST, HTML, MAX_TOKENS, OPEN, PORT, TEXT
from .commands import Command
from .flags import DEVICE_FLAG


def cmd_explore(args: argparse.Namespace) -> None:
    try:
        import uvicorn  # noqa: F401 -- needed by serve(); checked here for the message

        from ..explore.app import serve
        from ..explore.export import write_standalone
        from ..explore.loading import load_subject
    except ImportError as error:
        raise MissingResourceError(
            f"kqv explore needs the web app's packages ({error.name} is missing): in kqv's clone, "
            "python -m pip install -c constraints.txt -e '.[explore]'"
        ) from None
    if args.html is None:
        if args.text is not None:
            raise ConfigError("--text goes with --html (the page itself has a text box)")
        options = {"open_browser": args.open, "max_tokens": args.max_tokens, "device": args.device}
        return serve(args.run, host=args.host, port=args.port, **options)
    if args.text is None:
        raise ConfigError("--html writes the views of one input: give it with --text")
    read = run_inputs(args.run) if Path(args.run).is_dir() else []  # `minilm`: the installed package's
    refuse_writing_over(args.html, read, HTML)  # before the model is loaded
    options = {"beam": args.beam} if args.beam is not None else {}
    subject = load_subject(args.run, args.max_tokens, args.device)
    path = write_standalone(subject, args.text, args.html, **options)
    print(f"wrote {path}: open it in a browser (it needs no server)")


class Explore(Command):
    """`kqv explore RUN`: serve the attention explorer for one run, or write one input's page as HTML."""

    help = "look inside a trained model in the browser: every layer and head"

    def add_arguments(self, explore: argparse.ArgumentParser) -> None:
        explore.description = (
            "Serve a local web page over RUN's model: type text and see every layer and head (head view, model "
            "view, per-head statistics; next tokens and 'continue' for a language model; the translation and its "
            "cross-attention for a translation model). Offline: the app serves every script itself. "
            "Or, with --html and --text, write those views for one input to one file that needs no server."
        )
        explore.epilog = (
            "examples: kqv explore runs/lm --open  |  kqv explore runs/mt --port 8000  |  "
            "kqv explore runs/lm --html attention.html --text 'To be, or not to be'  "
            "(see docs/explorer.md)"
        )
        explore.add_argument(
            "run",
            help="a run directory (lm, mt, mlm, cls or vit), `minilm` (all-MiniLM-L6-v2), or a Hugging Face "
            "GPT-2, GPT-NeoX, Llama-family, BERT, Marian or BART directory saved with its tokenizer.json",
        )
        explore.add_argument(PORT, type=int, default=8765, help="port to serve on (default 8765)")
        explore.add_argument(
            HOST,
            default="127.0.0.1",
            help="address to listen on (default 127.0.0.1: this machine only; any other address "
            "is announced with a warning, since anyone who can connect can run the model)",
        )
        explore.add_argument(OPEN, action="store_true", help="open the page in the default browser")
        explore.add_argument(
            MAX_TOKENS,
            type=int,
            default=None,
            help="the input length limit, in tokens (default: the model's context, its max_len, at most 1024; "
            "a run with learned positions allows at most its max_len): longer inputs are refused with a "
            "message, since every view holds tokens x tokens weights per head",
        )
        explore.add_argument(HTML, help="write the views of --text to this self-contained HTML file and exit")
        explore.add_argument(TEXT, help="with --html: the input (MT: the source sentence)")
        explore.add_argument(BEAM, type=int, help="with --html on an MT run: the beam size of the translation")
        DEVICE_FLAG.add_to(explore)

    def run(self, args: argparse.Namespace) -> None:
        cmd_explore(args)
