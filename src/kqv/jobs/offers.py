"""What a loaded run can do, as small protocols: `Generates`, `Completes`, `Evaluates`, `Translates`,
`ShowsAttention`, `ExportsHF`. A run class offers a capability by subclassing its protocol and defining its method
(`LMRun(TrainedRun, Generates, ...)`); a run that lacks one has no such method at all.

`CAPABILITIES` is the one registry of them, by method name (a job with an operation of its own adds its protocol
there). A run (`Offering`, the base of `TrainedRun` and
`PretrainedRun`) asked for a method it does not offer answers with `refusal`, one line naming what it is and what
it offers instead (`kqv.load("runs/mt").generate(...)`); the commands check `require` once, as they start.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ..errors import RunError
from ..nn.generation import GenerationConfig


@runtime_checkable
class Generates(Protocol):
    """Continues a prompt (`LMRun.generate`)."""

    def generate(self, prompt: str, config: GenerationConfig | None = None, **options: Any) -> list[str]: ...


@runtime_checkable
class Completes(Protocol):
    """Completes many prompts, each to its end of text (`LMRun.complete`)."""

    def complete(self, prompts: list[str], config: GenerationConfig | None = None, **options: Any) -> list[str]: ...


@runtime_checkable
class Evaluates(Protocol):
    """Scores its model on held-out data; each job's arguments and result are its own (`LMRun.evaluate`,
    `MTRun.evaluate`, `VitRun.evaluate`)."""

    def evaluate(self, *args: Any, **options: Any) -> Any: ...


@runtime_checkable
class Translates(Protocol):
    """Translates sentences (`MTRun.translate`)."""

    def translate(self, sentences: str | Sequence[str], **options: Any) -> list[str]: ...


@runtime_checkable
class ShowsAttention(Protocol):
    """The attention weights of one input (`LMRun.attention`, `MTRun.attention`, `VitRun.attention`)."""

    def attention(self, *args: Any, **options: Any) -> Any: ...


@runtime_checkable
class ExportsHF(Protocol):
    """Writes itself as a Hugging Face directory (`LMRun.export_hf`, `MLMRun.export_hf`)."""

    def export_hf(self, directory: str | Path, *, merge: bool = False) -> Path: ...


@dataclass(frozen=True)
class Capability:
    """One thing a run may do: its protocol, its method's name, and in the words of a refusal what it does and
    which runs do it (tests/test_offers.py keeps `where` true to the run classes)."""

    protocol: type
    method: str
    does: str  # "generate text": what "X cannot ..." says
    where: str  # "lm runs and causal LM directories": what "METHOD works on ..." says


CAPABILITIES = {
    capability.method: capability
    for capability in (
        Capability(Generates, "generate", "generate text", "lm runs and causal LM directories"),
        Capability(Completes, "complete", "complete prompts", "lm runs and causal LM directories"),
        Capability(Evaluates, "evaluate", "evaluate its model", "lm, mt and vit runs and causal LM directories"),
        Capability(Translates, "translate", "translate", "mt runs and Marian and BART directories"),
        Capability(
            ShowsAttention, "attention", "show attention", "lm, mt and vit runs and causal LM and BERT directories"
        ),
        Capability(
            ExportsHF, "export_hf", "write a Hugging Face directory", "lm and mlm runs and causal LM directories"
        ),
    )
}


def refusal(run: Offering, capability: Capability) -> NotOffered:
    """The one-line error for asking `run` (an `Offering`) for `capability`, which it does not offer."""
    return NotOffered(
        f"{run.place} is {run.kind}, which cannot {capability.does}; {capability.method} works on {capability.where}"
    )


def require(run: Offering, protocol: type) -> None:
    """Refuse `run` (`refusal`) unless it offers `protocol`, one of `CAPABILITIES`: what a command checks once, as it
    starts."""
    if not isinstance(run, protocol):
        raise refusal(run, {c.protocol: c for c in CAPABILITIES.values()}[protocol])


class Offering:
    """The base of every loaded run: it names itself (`place`, `kind`) and answers a capability it lacks
    (`CAPABILITIES`) with `refusal`, a `RunError` that is also an AttributeError (`hasattr` is False)."""

    place: Path  # where the run is (its directory)
    kind: str  # what it is, in a message: "a translation run", "a Hugging Face BertModel directory"

    def __getattr__(self, name: str) -> Any:
        """Called only for an attribute not found: a capability's method is refused in one line, anything else is
        Python's AttributeError."""
        if name in CAPABILITIES:
            raise refusal(self, CAPABILITIES[name])
        return object.__getattribute__(self, name)  # Python's own AttributeError


class NotOffered(RunError, AttributeError):
    """A capability the run does not offer (`refusal`): a RunError, and an AttributeError for `hasattr`."""
