"""Collectives that cannot hang (issue 43): the process group is joined with `train.collective_timeout_minutes`
(10 by default, where torch's is 30), and an interrupted rank saves from what its last update queued, never
waiting on a collective of the next one (`kqv.train.distributed.reads_up_to`)."""

import logging
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import kqv
from conftest import tiny_config
from kqv.errors import ConfigError
from kqv.train import distributed, placement
from kqv.train.config import TrainConfig
from kqv.train.metrics import Window
from kqv.train.topology import Topology
from kqv.train.trainer import Trainer


def test_the_process_group_is_joined_with_the_configured_timeout(monkeypatch):
    joined = {}
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(
        dist, "init_process_group", lambda backend, **options: joined.update(backend=backend, **options)
    )
    monkeypatch.setattr(distributed, "_note_processes", lambda world_size: None)
    monkeypatch.setattr(dist, "get_rank", lambda: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    assert distributed.init_distributed(Topology(1, 1, 2), torch.device("cpu"), 3.5) is True  # it made the group
    assert joined == {"backend": "gloo", "timeout": timedelta(minutes=3.5)}


def test_a_training_joins_with_the_config_s_timeout_ten_minutes_by_default(monkeypatch):
    asked = []
    joined = lambda topology, device, minutes: asked.append(minutes) or False  # noqa: E731
    monkeypatch.setattr(distributed, "init_distributed", joined)
    for config in (
        TrainConfig(steps=1, batch_size=2),
        TrainConfig(steps=1, batch_size=2, collective_timeout_minutes=2),
    ):
        placement.place_model(kqv.DecoderLM(tiny_config()), config, Topology())
    assert asked == [10.0, 2]
    with pytest.raises(ConfigError, match="collective_timeout_minutes"):
        TrainConfig(steps=1, batch_size=2, collective_timeout_minutes=0)


class Pending:
    """A mark in a GPU's queue whose work never finishes: a collective another process never joins."""

    def query(self) -> bool:
        return False


def test_an_interrupt_while_the_last_update_waits_for_another_process_saves_nothing_and_says_so(
    tmp_path, caplog, monkeypatch
):
    cfg = TrainConfig(steps=4, batch_size=2, precision="fp32", warmup_steps=1)
    batch = torch.randint(0, 37, (2, 9))
    options = dict(train_batches=lambda i: (batch[:, :-1], batch[:, 1:]), loss_fn=lambda m, b: m(*b), quiet=True)
    trainer = Trainer(kqv.DecoderLM(tiny_config()), cfg, tmp_path, **options)
    trainer._start_rng()
    trainer._mark = Pending()
    monkeypatch.setattr(Window, "read", lambda self: pytest.fail("read while a collective was pending"))
    with caplog.at_level(logging.WARNING, logger="kqv.train.trainer"):
        trainer._save_after_interrupt(Window(), 0.0)
    assert not (tmp_path / "checkpoint").exists()
    assert "waited for another process" in caplog.text
    with distributed.reads_up_to(None) as readable:  # no mark (the CPU, one process): everything is readable
        assert readable


@pytest.mark.parametrize("position", ["rope", "alibi", "sinusoidal", "relative"])
def test_ddp_syncs_no_buffers_before_each_forward_since_every_buffer_comes_from_the_config(position, tmp_path):
    """DDP's default broadcasts every buffer from rank 0 before each forward, one collective per step. kqv's
    buffers (RoPE's frequencies, ALiBi's slopes) are made from the config and saved in no checkpoint, so the
    wrapper leaves them out, and a model's buffers are the same when built twice."""
    model = kqv.DecoderLM(tiny_config(position=position))
    assert not {name for name, _ in model.named_buffers()} & set(model.state_dict())  # none saved
    again = dict(kqv.DecoderLM(tiny_config(position=position)).named_buffers())
    assert all(torch.equal(buffer, again[name]) for name, buffer in model.named_buffers())
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        wrapped = distributed.data_parallel(model)
        assert wrapped.require_forward_param_sync and not wrapped.will_sync_module_buffers()
    finally:
        dist.destroy_process_group()
