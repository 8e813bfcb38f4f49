"""The `kqv` command line: it parses flags, calls `kqv.api` (and the methods of a loaded run), and prints.

An application adds a command through the entry-point group `APPLICATION_COMMANDS` ("kqv.commands"): a `Command`
class, which spells its flags with `kqv.flag_names` and may say `DEVICE_HELP` of its --device."""

from .commands import Command
from .flags import DEVICE_HELP
from .main import (
    APPLICATION_COMMANDS,
    COMMANDS,
    all_commands,
    application_commands,
    build_parser,
    main,
    packaged_config,
)

__all__ = [
    "APPLICATION_COMMANDS",
    "COMMANDS",
    "Command",
    "DEVICE_HELP",
    "all_commands",
    "application_commands",
    "build_parser",
    "main",
    "packaged_config",
]
