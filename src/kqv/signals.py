"""Ctrl-C (SIGINT) and SIGTERM end every `kqv` command cleanly, from its first instant, and never cut a save short.

SIGTERM is what `timeout`, `kill` and cluster schedulers send before SIGKILL; while a command runs it raises
`Terminated`, a KeyboardInterrupt, so whatever Ctrl-C does (the trainer saves a checkpoint of the last completed
update) SIGTERM does too, and the command exits with 128 + the signal's number (130 for SIGINT, 143 for SIGTERM).

Three phases, each with its own handlers:

* while the command imports its libraries (`guard_startup`, called by the first line of `kqv/__init__.py` inside a
  `try` whose `except KeyboardInterrupt` answers a Ctrl-C that came before the guard stood the same way:
  `interrupted_at_startup`), a signal ends the process at once with a one-line message: an exception raised inside
  an import can be swallowed by a library's `except:` (the command then runs on) or leave a half-initialised
  module (it crashes later);
* while the command runs (`interruptible`), the signals raise KeyboardInterrupt / Terminated;
* inside `deferred()` (a checkpoint write, an optimizer update) a signal waits until the block is done, then
  raises as above: a second Ctrl-C during the save of the first cannot leave a half-done state.

Once the command's work is complete (`completed`: a training's last file is written) a signal no longer
interrupts it: the command ends as it would have, exit status 0, and says that the signal came after the work was
done (`completion`); and once the command has returned (`finished`), a signal while the process exits changes
nothing, where Python itself would otherwise die by it.

This module imports nothing but the standard library: it runs before torch is loaded.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_NAMES = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: handled wherever Ctrl-C's KeyboardInterrupt is, exit status 143."""

    signum = signal.SIGTERM


def exit_status(interrupt: BaseException) -> int:
    """128 + the number of the signal behind a KeyboardInterrupt (130 for Ctrl-C, 143 for SIGTERM)."""
    return 128 + int(getattr(interrupt, "signum", signal.SIGINT))


def message(interrupt: BaseException) -> str:
    return f"kqv: {_NAMES[getattr(interrupt, 'signum', signal.SIGINT)]}"


def is_command() -> bool:
    """Whether this process is the `kqv` command (its console script, or `python -m kqv.cli`)."""
    script = os.path.basename(sys.argv[0]) if sys.argv else ""
    arguments = getattr(sys, "orig_argv", [])
    return script in ("kqv", "kqv.exe") or any(a in ("kqv.cli", "-mkqv.cli") for a in arguments[1:3])


def _exit_at_once(signum: int, frame: FrameType | None) -> None:
    """Before the command runs (and again after it returned): nothing to save, so end the process now (with status
    0 when its work was complete)."""
    if _state["completed"] is not None:
        _state["late"].append(signum)
        os.write(2, f"{completion()}\n".encode())
        os._exit(0)
    os.write(2, f"kqv: {_NAMES[signal.Signals(signum)]}\n".encode())
    os._exit(128 + signum)  # nothing is written yet: no state to save, no exception an import could swallow


def _raise(signum: int, frame: FrameType | None) -> None:
    """The first signal raises; later ones are ignored while the command ends (`_ending`), so that a second
    Ctrl-C right after the first cannot cut short the save and the message the first one started."""
    _install(_ending)
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def _ending(signum: int, frame: FrameType | None) -> None:
    """After the first signal: the command is already ending with its status; nothing more to do."""


def _install(handler: Callable[[int, FrameType | None], Any]) -> dict[int, Any]:
    """Set `handler` for SIGINT and SIGTERM (main thread only; an ignored signal stays ignored, as under nohup);
    returns the handlers it replaced."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {}
    for signum in SIGNALS:
        if signal.getsignal(signum) is not signal.SIG_IGN:
            previous[signum] = signal.signal(signum, handler)
    return previous


def _restore(previous: dict[int, Any]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


def guard_startup() -> None:
    """In the `kqv` command only: until `interruptible` takes over, a signal ends the process at once."""
    if is_command():
        _install(_exit_at_once)


def interrupted_at_startup() -> None:
    """A Ctrl-C that came while `kqv/__init__.py` was putting `guard_startup` in place: in the `kqv` command, end
    the process as the guard would have (`kqv: interrupted`, 130); elsewhere, nothing (the caller raises it on)."""
    if is_command():
        _exit_at_once(signal.SIGINT, None)


@contextmanager
def interruptible() -> Iterator[None]:
    """While the block runs, Ctrl-C raises KeyboardInterrupt and SIGTERM raises Terminated (until `completed`)."""
    _state.update(completed=None, late=[])
    previous = _install(_raise)
    try:
        yield
    finally:
        _restore(previous)


# What the running command has completed (`completed`), and the signals that came after that.
_state: dict[str, Any] = {"completed": None, "late": []}


def completed(what: str) -> None:
    """The command's work is done, every file written (`what` says so: "runs/lm is complete"). Within
    `interruptible`, a signal from now on no longer interrupts the command: it is noted, the command ends as it
    would have, and `completion` gives the line that says so. Elsewhere (kqv used from Python) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        return
    if any(signal.getsignal(signum) is _raise for signum in SIGNALS):
        _state["completed"] = what
        _install(_noted)


def _noted(signum: int, frame: FrameType | None) -> None:
    """After the command's work was completed: the signal changes nothing but what it says at the end."""
    _state["late"].append(signum)


def completion(interrupt: BaseException | None = None) -> str | None:
    """The line a command says when a signal (`interrupt`, or one noted after `completed`) came after its work was
    complete, and it ends with status 0 all the same; None when it did not."""
    what, late = _state["completed"], _state["late"]
    if what is None or (interrupt is None and not late):
        return None
    signum = getattr(interrupt, "signum", signal.SIGINT) if interrupt is not None else late[0]
    return f"kqv: {what}; {_NAMES[signal.Signals(signum)]} after its last file was written, nothing lost"


def finished() -> None:
    """The `kqv` command has returned, its exit status decided: a signal while the process exits is ignored (Python
    resets its own handlers as it shuts down, and would die by the signal then). Nothing changes elsewhere."""
    if is_command() and threading.current_thread() is threading.main_thread():
        for signum in SIGNALS:
            signal.signal(signum, signal.SIG_IGN)


@contextmanager
def deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM until the block is done, then act on the first one as the handler before would
    have (raise KeyboardInterrupt / Terminated). Nested blocks hand theirs to the outermost."""
    pending: list[int] = []
    previous = _install(lambda signum, frame: pending.append(signum))
    try:
        yield
    finally:
        _restore(previous)
        if pending:
            _act_on(pending[0], previous[pending[0]])


def _act_on(signum: int, handler: Any) -> None:
    """Deliver a held signal to the handler it would have reached (the default one raises or ends the process)."""
    if callable(handler):
        handler(signum, None)
    elif signum == signal.SIGINT:  # SIG_DFL for SIGINT in Python: KeyboardInterrupt
        raise KeyboardInterrupt()
    else:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
