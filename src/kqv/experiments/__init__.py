"""The lecture's argument as experiments: each module tests one claim and says whether it holds here.

`kqv experiment list` names them; `kqv experiment run NAME [--quick]` runs one (see `kqv.experiments.runner`).
The contract every experiment module follows is in `kqv.experiments.base`.
"""

from __future__ import annotations

import importlib

from .base import Experiment, ExperimentError

# command-line name -> module, in the order of the lecture's argument
MODULES = {
    "parallelism": "parallelism",
    "scaling": "scaling",
    "no-causal-mask": "no_causal_mask",
    "no-positions": "no_positions",
    "no-query-key-maps": "no_query_key_maps",
    "heads": "heads",
    "depth-without-residuals": "depth_without_residuals",
    "rnn-vs-transformer": "rnn_vs_transformer",
    # part 2: which variant, and how it scales
    "position-extrapolation": "position_extrapolation",
    "norm-placement": "norm_placement",
    "modifications": "modifications",
    "scaling-laws": "scaling_laws",
    "long-attention": "long_attention",
}


def names() -> list[str]:
    return list(MODULES)


def get(name: str) -> Experiment:
    """The experiment called `name`; an unknown name is an ExperimentError that lists the known ones."""
    if name not in MODULES:
        raise ExperimentError(f"unknown experiment {name!r}; the experiments are: {', '.join(MODULES)} "
                              f"(see `kqv experiment list`)")
    return Experiment(importlib.import_module(f"{__name__}.{MODULES[name]}"))
