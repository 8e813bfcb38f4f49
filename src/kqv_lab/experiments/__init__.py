"""The lecture's argument as experiments: each module tests one claim and says whether it holds here.

`kqv experiment list` names them; `kqv experiment run NAME [--quick]` runs one (see `kqv_lab.experiments.runner`).
The contract every experiment module follows is in `kqv_lab.experiments.base`; `EXPERIMENTS` below is the registry:
a new experiment is a module of this package with an entry there.
"""

from __future__ import annotations

from . import (
    depth_without_residuals,
    ffn_needed,
    heads,
    long_attention,
    modifications,
    multihead_cost,
    no_causal_mask,
    no_positions,
    no_query_key_maps,
    norm_placement,
    parallelism,
    position_extrapolation,
    quadratic_cost,
    rnn_interaction_distance,
    rnn_vs_transformer,
    scaling,
    scaling_head_dim,
    scaling_laws,
)
from .base import Experiment, ExperimentError

# command-line name -> experiment, in the order of the lecture's argument; each module's parts are checked here
EXPERIMENTS: dict[str, Experiment] = {
    "parallelism": Experiment.of(parallelism),
    "scaling": Experiment.of(scaling),
    "no-causal-mask": Experiment.of(no_causal_mask),
    "no-positions": Experiment.of(no_positions),
    "no-query-key-maps": Experiment.of(no_query_key_maps),
    "heads": Experiment.of(heads),
    "depth-without-residuals": Experiment.of(depth_without_residuals),
    "rnn-vs-transformer": Experiment.of(rnn_vs_transformer),
    # part 2: which variant, and how it scales
    "position-extrapolation": Experiment.of(position_extrapolation),
    "norm-placement": Experiment.of(norm_placement),
    "modifications": Experiment.of(modifications),
    "scaling-laws": Experiment.of(scaling_laws),
    "long-attention": Experiment.of(long_attention),
    # part 3: the lecture's own claims, measured directly
    "quadratic-cost": Experiment.of(quadratic_cost),
    "rnn-interaction-distance": Experiment.of(rnn_interaction_distance),
    "ffn-needed": Experiment.of(ffn_needed),
    "multihead-cost": Experiment.of(multihead_cost),
    "scaling-head-dim": Experiment.of(scaling_head_dim),
}

# the modules of this package that are not experiments (tests check that every other module is registered)
SUPPORT_MODULES = (
    "ablations",
    "actions",
    "base",
    "gallery",
    "lm",
    "plotting",
    "provenance",
    "records",
    "report",
    "reproduction",
    "runner",
    "statistics",
)


def names() -> list[str]:
    return list(EXPERIMENTS)


def get(name: str) -> Experiment:
    """The experiment called `name`; an unknown name is an ExperimentError that lists the known ones."""
    if name not in EXPERIMENTS:
        raise ExperimentError(
            f"unknown experiment {name!r}; the experiments are: {', '.join(EXPERIMENTS)} (see `kqv experiment list`)"
        )
    return EXPERIMENTS[name]
