"""`TrainState`: a training's progress, the one thing of the Trainer that a checkpoint saves and a resume restores.

The Trainer owns one `TrainState` and no other copy of these numbers; `saved` writes it into a checkpoint's
state.json and `restored` reads it back, each in one place, so a field added here is saved and resumed alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class TrainState:
    """Where a training is: updates done (`step`), seconds since the run started over every session (`elapsed_s`),
    seconds spent in updates (`train_seconds`: `elapsed_s` without evaluations and checkpoints), updates skipped
    by the non-finite guard over the whole run (`bad_steps`) and a budgeted run's plan (`plan`, once fixed:
    `kqv.train.budget`)."""

    step: int = 0
    elapsed_s: float = 0.0
    train_seconds: float = 0.0
    bad_steps: int = 0
    plan: dict[str, Any] | None = None

    def saved(self) -> dict[str, Any]:
        """The entries of a checkpoint's state.json that hold this state."""
        return {
            "step": self.step,
            "elapsed_s": self.elapsed_s,
            "train_seconds": self.train_seconds,
            "bad_steps": self.bad_steps,
            "plan": self.plan,
        }

    @classmethod
    def restored(cls, state: dict[str, Any]) -> TrainState:
        """The state a checkpoint's state.json holds (entries older checkpoints lack take their defaults)."""
        elapsed_s = float(state.get("elapsed_s", 0.0))
        return cls(
            step=int(state["step"]),
            elapsed_s=elapsed_s,
            train_seconds=float(state.get("train_seconds", elapsed_s)),
            bad_steps=int(state.get("bad_steps", 0)),
            plan=state.get("plan"),
        )
