"""Host -> device batch copies that overlap the device's work (issue 43): a batch bound for a GPU goes through
`Accelerator.put` contiguous and pinned, with a `non_blocking` copy, and a training step reads nothing back, so
the host prepares the next batch while the device runs. The sync counter (`tests/syncs.py`) sees copies from a
device to the host and `torch.cuda.synchronize()`, and the batch path runs here on a fake GPU."""

from __future__ import annotations

from contextlib import suppress
from dataclasses import dataclass

import pytest
import torch

import kqv
from conftest import tiny_config
from kqv.nn.devices import Accelerator
from kqv.train import placement
from syncs import SyncCounter
from test_step_syncs import SEQ, lm_batches, syncs_per_update


def test_the_counter_sees_copies_from_a_device_to_the_host_and_cuda_s_synchronize():
    on_device, host = torch.ones(3, device="meta"), torch.empty(3)  # the meta device stands for a GPU
    copies = [on_device.cpu, lambda: on_device.to("cpu"), lambda: host.copy_(on_device)]
    waits, original = (
        [lambda: torch.cuda.synchronize(), lambda: torch.cuda.Event.synchronize(None)],
        torch.cuda.synchronize,
    )
    with SyncCounter() as syncs:
        for copy in copies + waits:
            with suppress(NotImplementedError, AssertionError, AttributeError, RuntimeError, TypeError):
                copy()  # a meta tensor has no data to copy, and this torch may have no CUDA: counted first
    assert syncs.count == 5, syncs.report()
    assert sum("device to the host" in op for op, _ in syncs.syncs) == 3
    with SyncCounter() as none:  # host to host, and host to device
        host.clone().to("cpu"), host.cpu(), host.copy_(torch.zeros(3)), host.to("meta")
        torch.empty(3, device="meta").copy_(host)
    assert none.count == 0, none.report()
    assert torch.cuda.synchronize is original  # unwrapped when the counter closes


@dataclass(frozen=True)
class FakeGPU(Accelerator):
    """A CUDA GPU as the batch path sees it (pinned memory, `non_blocking` copies), computing on the CPU."""

    @property
    def type(self) -> str:
        return "cuda"

    @classmethod
    def resolve(cls, name=None) -> FakeGPU:
        return cls(torch.device("cpu"))

    def peak_memory(self) -> None:
        """None: CUDA's memory counters take a CUDA device, and this one is the CPU."""
        return None


@pytest.fixture
def as_where_cuda_is(monkeypatch):
    """torch.cuda's per-device counters as a machine with CUDA has them: given the CPU, they fail (without CUDA
    they answer 0 whatever the device), so a fake GPU that reached them fails here too, not only on a GPU."""
    from torch.cuda._utils import _get_device_index

    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: _get_device_index(device) and 0)


@pytest.fixture
def pinned(monkeypatch) -> list[torch.Tensor]:
    """Every tensor pinned on the way to the fake GPU (torch's pinning needs a real one), kept as it was given."""
    given: list[torch.Tensor] = []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda t: given.append(t) or t)
    return given


def test_a_view_bound_for_a_gpu_is_pinned_contiguous_and_copied_without_waiting(pinned, monkeypatch):
    copied = []
    real_to = torch.Tensor.to
    monkeypatch.setattr(torch.Tensor, "to", lambda t, device, non_blocking=False: copied.append(non_blocking) or t)
    inputs, targets = lm_batches(0)  # views of one (4, SEQ + 1) block: strides (SEQ + 1, 1)
    assert not inputs.is_contiguous()
    with SyncCounter() as syncs:
        on_gpu = Accelerator(torch.device("cuda")).put((inputs, targets))
    assert syncs.count == 0, syncs.report()
    assert len(pinned) == 2 and all(t.is_contiguous() for t in pinned) and copied == [True, True]
    monkeypatch.setattr(torch.Tensor, "to", real_to)
    assert torch.equal(on_gpu[0], inputs) and torch.equal(on_gpu[1], targets)


def test_a_training_step_on_the_fake_gpu_pins_contiguous_batches_and_reads_nothing_between_log_records(
    tmp_path, pinned, monkeypatch, as_where_cuda_is
):
    monkeypatch.setattr(placement, "Accelerator", FakeGPU)
    syncs, run = syncs_per_update(kqv.DecoderLM(tiny_config(max_len=SEQ)), tmp_path)
    assert isinstance(run.device, FakeGPU) and run.step == 8
    assert len(pinned) == 2 * 8 and all(t.is_contiguous() for t in pinned)  # inputs and targets of every step
    assert [count for step, count in enumerate(syncs, 1) if step % 4] == [0] * 6, syncs


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@cuda
@pytest.mark.parametrize("compiled", [False, True])
def test_a_cuda_update_never_waits_for_the_gpu_eager_or_compiled_by_inductor(tmp_path, compiled):
    """On a GPU (`bash benchmarks/gpu.sh`): after a first update (kernels built, the model compiled), updates run
    under `torch.cuda.set_sync_debug_mode("error")`, which raises at any wait for the device: batches pinned and
    copied without blocking, the loss, clipping, guard and fused optimizer step all on the device."""
    from kqv.train.config import TrainConfig
    from kqv.train.trainer import Trainer

    values = dict(steps=4, batch_size=4, lr=1e-3, warmup_steps=1, log_every=100, eval_every=100, checkpoint_every=100)
    config = TrainConfig(**values, precision="bf16", device="cuda", compile=compiled)
    model = kqv.DecoderLM(tiny_config(max_len=SEQ))
    trainer = Trainer(model, config, tmp_path, train_batches=lm_batches, loss_fn=lambda m, b: m(*b), quiet=True)

    def update(step: int):
        outcome = trainer.updater(trainer.ddp_model, step, 1e-3)
        trainer.updater.apply(outcome)
        return outcome

    update(0)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        outcomes = [update(step) for step in (1, 2)]
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert all(torch.isfinite(outcome.loss).item() for outcome in outcomes)
