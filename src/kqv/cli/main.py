"""The `kqv` command: train, generate, evaluate and look inside models.

kqv train lm [--config quick] [--out runs/lm] [--data text.txt] [--set train.steps=200]
kqv prepare big.txt --out corpus/                   (a token corpus on disk; then kqv train lm --data corpus/)
kqv generate runs/lm --prompt "ROMEO:"
kqv eval runs/lm [--data other.txt]
kqv attention runs/lm --text "To be, or not to be" --out attention.png
kqv export runs/lm --hf lm-hf                        (a Hugging Face GPT-NeoX, Llama or GPT-2: from_pretrained loads it)
kqv train mt [--config quick|lstm] [--out runs/mt] [--pair de-en] [--data pairs.tsv]
kqv translate runs/mt "Im Anfang war das Wort"      (or one sentence per line on stdin / --file)
kqv eval runs/mt [--beam 4]                          (BLEU and chrF on the test split)
kqv attention runs/mt --src "Im Anfang war das Wort" --out alignment.png
kqv train mlm [--config quick] [--out runs/mlm]      (masked-LM pretraining of an encoder on Shakespeare)
kqv train cls --data file.tsv [--init runs/mlm]      (classify text<TAB>label lines; dev accuracy)
kqv embed "some text" ... [--out embeddings.npy]     (all-MiniLM-L6-v2 sentence embeddings)
kqv similarity "first text" "second text" ...        (their cosine similarities as a table)
kqv explore runs/lm [--port 8765] [--open]            (a local web app: every layer and head of any run)
kqv experiment list | run NAME [--quick]             (test the lecture's claims)
kqv world --out world [--versions 8 --full-names]    (an invented world: biographies, questions to ask of them)
kqv env [--json]                                     (versions, CPU, GPUs, what `auto` chooses: for bug reports)
kqv reseal runs/lm                                   (its SHA256SUMS recorded anew: on purpose, after restoring files)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from importlib.metadata import EntryPoint, entry_points

from ..api import packaged_config  # noqa: F401 -- kqv.cli.main.packaged_config, as before
from ..errors import KqvError, command_line, describe_os_error
from ..signals import completion, exit_status, finished, interruptible, message
from .commands import Command, Prepare, Reseal, Train
from .embeddings import Embed, Similarity
from .environment import Env
from .explore import Explore
from .runs import RUN_COMMANDS

# Every command of kqv's own, by name, in the order `kqv --help` lists them (the applications' after them): the only
# place one is registered.
COMMANDS: dict[str, Command] = {
    "train": Train(),
    "prepare": Prepare(),
    "reseal": Reseal(),
    **RUN_COMMANDS,  # generate, eval, attention, translate: answered by the job of the run
    "embed": Embed(),
    "similarity": Similarity(),
    "explore": Explore(),
    "env": Env(),
}


# The entry-point group through which an application adds commands to `kqv`: each entry point is named as its command
# and names its `Command` class (kqv_lab's `kqv experiment` and `kqv world`: pyproject.toml's
# [project.entry-points."kqv.commands"]). The library imports no application: it reads what is installed.
APPLICATION_COMMANDS = "kqv.commands"


def application_commands(found: Iterable[EntryPoint] | None = None) -> dict[str, Command]:
    """The commands installed applications add (the entry points of `APPLICATION_COMMANDS`, or `found`), by name,
    sorted, each its class made; one that would replace a command of kqv's own is a bug in its application."""
    found = entry_points(group=APPLICATION_COMMANDS) if found is None else found
    added = {point.name: point.load()() for point in sorted(found, key=lambda point: point.name)}
    if clash := sorted(set(added) & set(COMMANDS)):
        raise RuntimeError(f"an application's commands {clash} would replace kqv's own; rename them")
    return added


def all_commands(found: Iterable[EntryPoint] | None = None) -> dict[str, Command]:
    """Every command of `kqv`: its own (`COMMANDS`), then the applications' (`application_commands`)."""
    return {**COMMANDS, **application_commands(found)}


def build_parser(found: Iterable[EntryPoint] | None = None) -> argparse.ArgumentParser:
    """The `kqv` parser: a subcommand per command of `all_commands` (`found`: the applications' entry points, by
    default those installed)."""
    parser = argparse.ArgumentParser(prog="kqv", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    for name, command in all_commands(found).items():
        command.add_arguments(subparser := commands.add_parser(name, help=command.help))
        subparser.set_defaults(func=command.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line. Expected errors (kqv's own, the file system's: a missing file, a full disk) print one
    line and exit with status 2; anything else is a bug and shows its traceback. Ctrl-C and SIGTERM (`kqv.signals`)
    end it with status 130 and 143, after what they interrupted has saved its work (training: a checkpoint); after a
    training's last file is written they end it with status 0, saying so (`kqv.signals.completed`)."""
    try:
        with interruptible():
            args = build_parser().parse_args(argv)
            with command_line():  # error messages name flags, not Python arguments
                status = args.func(args)
    except (KqvError, OSError) as error:  # OSError: a missing file, a full disk, a read-only directory, ...
        print(f"kqv: error: {describe_os_error(error) if isinstance(error, OSError) else error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as interrupt:  # Ctrl-C, or SIGTERM as kqv.signals.Terminated
        if (done := completion(interrupt)) is not None:  # after the last file was written: nothing was lost
            print(done, file=sys.stderr)
            return 0
        print(message(interrupt), file=sys.stderr)
        return exit_status(interrupt)
    finally:
        finished()  # the status is decided: a signal while the process exits changes nothing
    if (done := completion()) is not None:
        print(done, file=sys.stderr)
    return status or 0


if __name__ == "__main__":
    sys.exit(main())
