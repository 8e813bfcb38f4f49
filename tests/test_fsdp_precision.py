"""FSDP2 in bf16 (issue 43): each block's weights gathered in bf16 and its gradients reduced in fp32 into fp32
shards (`kqv.train.sharding.precision_policy`), and gradient accumulation reduce-scattering each micro-batch
(tests/test_fsdp.py). A 2-process gloo run in bf16 on the CPU trains as one process does within bf16's rounding."""

import json

import pytest
import torch

from fsdp_bf16_worker import BF16, train
from kqv.train.metrics import read_metrics
from kqv.train.sharding import precision_policy
from test_fsdp import WORKER, torchrun


def test_bf16_gathers_weights_in_bf16_and_reduces_gradients_in_fp32_other_precisions_as_they_are():
    bf16 = precision_policy("bf16")
    assert (bf16.param_dtype, bf16.reduce_dtype) == (torch.bfloat16, torch.float32)
    for other in ("fp32", "fp16"):
        assert precision_policy(other).param_dtype is None and precision_policy(other).reduce_dtype is None


def test_a_two_process_bf16_fsdp_run_computes_in_bf16_from_fp32_shards_as_one_process_does(tmp_path):
    torchrun(str(WORKER.with_name("fsdp_bf16_worker.py")), str(tmp_path))
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        assert seen["policies"] == [["torch.bfloat16", "torch.float32"]]  # every FSDP module's
        assert seen["computed"] == ["torch.bfloat16"] and seen["shards"] == ["torch.float32"]
    two = [r["train_loss"] for r in read_metrics(tmp_path / "fsdp" / "metrics.jsonl") if "train_loss" in r]
    train(tmp_path / "one")  # one process: bf16 autocast over fp32 weights
    one = [r["train_loss"] for r in read_metrics(tmp_path / "one" / "metrics.jsonl") if "train_loss" in r]
    assert len(two) == BF16.steps and two == pytest.approx(one, rel=1e-2)
