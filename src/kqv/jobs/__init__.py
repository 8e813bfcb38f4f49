"""The jobs: each module trains one kind of model end to end and knows how to use its runs.

`lm` (a GPT-style language model), `mt` (translation: the Transformer or its LSTM baseline), `mlm` (masked-LM
pretraining of an encoder), `cls` (text classification), and `embeddings` (sentence embeddings from pretrained
MiniLM, not a training job). Every job implements the contract in `kqv.jobs.base` and registers itself by being
defined in a module of this package; `get_job(name)` and `load_run(run_dir)` find them.
"""

from .base import Flag, Job, RunCommand, TrainedRun, all_jobs, get_job, load_run

__all__ = ["Flag", "Job", "RunCommand", "TrainedRun", "all_jobs", "get_job", "load_run"]
