"""Kernels per device: `train.compile` (kqv.train.compiling) and flex_attention for the cores and position schemes
that add a score bias or a mask (kqv.nn.flex).

torch.compile runs here with the "aot_eager" backend (`compiling.BACKEND`): Dynamo captures the same forward and
AOTAutograd the same joint forward-backward graph as inductor would, without inductor's C++ code generation, which
takes about a minute per graph on this machine's two shared cores.
"""

import json
import warnings
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import tiny_config
from kqv.cli.main import main
from kqv.nn import flex
from kqv.nn.devices import CPU_KERNELS, CUDA_KERNELS, kernels
from kqv.nn.models import DecoderLM, Encoder
from kqv.train import compiling
from kqv.train.checkpoints import load_weights, read_checkpoint
from kqv.train.config import TrainConfig
from kqv.train.layout import MODEL_FILE
from kqv.train.trainer import Trainer
from test_devices import _ids, _padding, cuda, exact_fp32, tiny_lm_trainer


@pytest.fixture
def quick_compile(monkeypatch):
    monkeypatch.setattr(compiling, "BACKEND", "aot_eager")
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _losses(run_dir):
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["train_loss"] for r in records if "train_loss" in r]


def test_a_compiled_run_has_the_losses_and_the_checkpoint_of_an_uncompiled_one(tmp_path, quick_compile):
    eager = tiny_lm_trainer(tmp_path / "eager", steps=3)
    eager.train()
    compiled = tiny_lm_trainer(tmp_path / "compiled", steps=3, compile=True)
    assert isinstance(compiled.ddp_model, torch._dynamo.eval_frame.OptimizedModule)
    compiled.train()
    losses = _losses(tmp_path / "compiled")
    assert len(losses) == 3
    assert losses == pytest.approx(_losses(tmp_path / "eager"), abs=1e-4)
    saved = load_file(tmp_path / "compiled" / "checkpoint" / MODEL_FILE)
    assert not any("_orig_mod" in name for name in saved)
    fresh = DecoderLM(eager.callers_model.config)  # an uncompiled model loads it (load_weights is strict)
    assert set(saved) <= set(fresh.state_dict())
    checkpoint = read_checkpoint(tmp_path / "compiled")
    load_weights(fresh, checkpoint)
    checkpoint.close()
    for a, b in zip(fresh.parameters(), eager.model.parameters()):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_a_compiled_run_resumes_uncompiled(tmp_path, quick_compile):
    tiny_lm_trainer(tmp_path, steps=2, compile=True).train()
    resumed = tiny_lm_trainer(tmp_path, steps=3)
    assert resumed.step == 2 and resumed.ddp_model is resumed.model
    resumed.train()


def test_compile_must_be_a_bool():
    from kqv.errors import ConfigError

    with pytest.raises(ConfigError, match="compile"):
        TrainConfig(steps=1, batch_size=1, compile="yes")


def test_compile_is_set_from_the_command_line_and_each_graph_is_a_line_of_its_output(
    tmp_path, quick_compile, monkeypatch, capsys
):
    from test_cli import TINY

    seen = []
    built = Trainer.__init__

    def spy(self, model, config, *args, **kwargs):
        seen.append(config.compile)
        built(self, model, config, *args, **kwargs)

    monkeypatch.setattr(Trainer, "__init__", spy)
    corpus = tmp_path / "tiny.txt"
    corpus.write_text("To be, or not to be, that is the question.\n" * 40)
    (tmp_path / "tiny.toml").write_text(TINY.format(position="rope"))
    command = ["train", "lm", "--config", str(tmp_path / "tiny.toml"), "--data", str(corpus)]
    assert main([*command, "--out", str(tmp_path / "lm"), "--steps", "2", "--set", "train.compile=true"]) == 0
    assert seen == [True]
    assert "compile = true" in (tmp_path / "lm" / "run.toml").read_text()
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("kqv: train.compile: graph")]
    assert said and said[0].startswith("kqv: train.compile: graph 1 compiled"), said


# ---------------------------------------------------------------------------------------------------------------
# flex_attention (kqv.nn.flex): on CUDA only; here it runs uncompiled on the CPU (the same function, unfused) and
# must give today's cores' outputs and gradients.

FLEX_CASES = {
    "alibi": dict(position="alibi"),
    "relative-keys": dict(position="relative", relative={"max_distance": 4, "values": False}),
    "local": dict(attention="local", local={"block": 4}, position="rope"),
    "bigbird": dict(attention="bigbird", bigbird={"block": 4, "window": 1, "global_blocks": 1, "random_blocks": 1}),
}


@pytest.fixture
def flex_here(monkeypatch):
    """`use(True)` gives the CPU the CUDA kernels' flex_attention, `use(False)` its own; `calls` counts its use."""
    calls = []
    attend = flex.attend

    def counted(*args, **kwargs):
        calls.append(kwargs.get("mask_mod") is not None)
        return attend(*args, **kwargs)

    def use(on):
        monkeypatch.setattr(flex, "kernels", lambda device: CUDA_KERNELS if on else CPU_KERNELS)

    monkeypatch.setattr(flex, "attend", counted)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*flex_attention.*")
        yield use, calls


def _forward_backward(model, causal, ids, mask):
    model.zero_grad()
    output = model(ids) if causal else model(ids, mask)
    (output * torch.linspace(-1, 1, output.shape[-1], device=output.device)).sum().backward()
    return output.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("case", list(FLEX_CASES))
@pytest.mark.parametrize("causal", [True, False])
def test_flex_attention_gives_todays_cores_outputs(case, causal, flex_here):
    """Forward only: torch has no CPU backward for flex_attention (the CUDA test below checks gradients)."""
    use, calls = flex_here
    # head_dim 16, the smallest flex takes (`flex.head_dim_fits`); dropout 0: flex has none
    model = (DecoderLM if causal else Encoder)(tiny_config(d_model=64, **FLEX_CASES[case])).eval()
    ids, mask = _ids(2, 13), _padding(2, 13)  # 13: blocks of 4 with a short last one; padding in row 0
    run = (lambda: model(ids)) if causal else (lambda: model(ids, mask))
    use(False)
    with torch.no_grad():
        expected = run()
        assert not calls  # the CPU's own kernels never take it
        use(True)
        output = run()
    assert len(calls) == tiny_config().n_layers  # every layer took it
    assert all(calls)  # with its mask: the future, or the padding of row 0 (and the blocks)
    torch.testing.assert_close(output, expected, atol=1e-5, rtol=1e-5)


def test_flex_attention_leaves_what_it_cannot_take_exactly_to_todays_cores(flex_here):
    use, calls = flex_here
    use(True)
    ids = _ids(2, 13)
    with torch.no_grad():
        DecoderLM(tiny_config(d_model=64, position="relative"))(ids)  # Shaw's relative values need the weights
        DecoderLM(tiny_config(d_model=64, attention="memory_compressed", memory_compressed={"compression": 3}))(ids)
        DecoderLM(tiny_config(d_model=64, position="rope"))(ids)  # no bias: SDPA (flash / memory-efficient on a GPU)
        DecoderLM(tiny_config(d_model=64, position="alibi", dropout=0.1)).train()(ids)  # attention dropout
        DecoderLM(tiny_config(position="alibi"))(ids)  # head_dim 8: below the smallest block flex's kernel takes
        DecoderLM(tiny_config(d_model=96, n_heads=4, position="alibi"))(ids)  # head_dim 24: not a power of two
        decoder = DecoderLM(tiny_config(d_model=64, attention="local", local={"block": 4})).eval()
        decoder.generate(ids[:1, :5], 3, temperature=0)  # decoding with a cache: only the prompt takes it
    assert len(calls) == tiny_config().n_layers


def test_flex_takes_heads_its_kernel_can():
    assert [d for d in (4, 8, 12, 16, 24, 32, 48, 64, 128) if flex.head_dim_fits(d)] == [16, 32, 64, 128]


def test_block_masks_of_a_shape_are_built_once(flex_here, monkeypatch):
    """Causal, local and BigBird block masks depend on the shape alone: the second forward builds none; padding's
    differ with every batch and are built once in each forward, by its first layer."""
    use, _ = flex_here
    use(True)
    built = []
    create = flex.create_block_mask
    monkeypatch.setattr(flex, "create_block_mask", lambda *a, **k: built.append(a[3:5]) or create(*a, **k))
    monkeypatch.setattr(flex, "_block_masks", type(flex._block_masks)())
    ids, mask = _ids(2, 13), _padding(2, 13)
    with torch.no_grad():
        for case in ("alibi", "local", "bigbird"):
            model = DecoderLM(tiny_config(d_model=64, **FLEX_CASES[case])).eval()
            model(ids)
            first = len(built)
            model(ids)
            assert len(built) == first and first >= 1, case
        encoder = Encoder(tiny_config(d_model=64, **FLEX_CASES["alibi"])).eval()
        before = len(built)
        encoder(ids, mask), encoder(ids, mask)
    assert tiny_config().n_layers > 1 and len(built) == before + 2  # one per forward, not one per layer


def test_a_padding_block_mask_is_reused_only_for_the_same_unchanged_tensor(monkeypatch):
    built = []
    monkeypatch.setattr(flex, "create_block_mask", lambda *a, **k: built.append(1) or object())
    monkeypatch.setattr(flex, "_padding_block_mask", None)
    padding = torch.ones(2, 1, 1, 13, dtype=torch.bool)
    mask_mod = flex.padding(padding[:, 0, 0, :])
    shape = (2, 13, 13, torch.device("cpu"))  # rows, query and key length, device
    first = flex._padding_mask(mask_mod, padding, "causal", *shape)
    assert flex._padding_mask(mask_mod, padding, "causal", *shape) is first and len(built) == 1
    assert flex._padding_mask(mask_mod, padding, "local", *shape) is not first  # another mask
    padding[0, ..., 10:] = False  # changed in place: its version moved
    assert flex._padding_mask(mask_mod, padding, "local", *shape) is not first and len(built) == 3
    assert flex._padding_mask(mask_mod, padding.clone(), "local", *shape) and len(built) == 4


def test_only_cuda_takes_flex_attention():
    assert kernels(torch.device("cuda")).flex_attention
    assert not kernels(torch.device("cpu")).flex_attention and not kernels(torch.device("mps")).flex_attention


@cuda
@pytest.mark.parametrize("case", list(FLEX_CASES))
@pytest.mark.parametrize("causal", [True, False])
def test_flex_attention_on_cuda_matches_the_reference_cores(case, causal):
    config = tiny_config(d_model=64, **FLEX_CASES[case])  # head_dim 16: the smallest Triton block
    model = (DecoderLM if causal else Encoder)(config).cuda()
    reference = (DecoderLM if causal else Encoder)(config).cuda()
    reference.load_state_dict(model.state_dict())
    ids, mask = _ids(2, 200).cuda(), _padding(2, 200).cuda()  # two of flex's 128-row blocks
    with exact_fp32():
        output, grads = _forward_backward(model, causal, ids, mask)
        with kernels_of_the_cpu():
            expected, expected_grads = _forward_backward(reference, causal, ids, mask)
    torch.testing.assert_close(output, expected, atol=1e-4, rtol=1e-4)
    for grad, reference_grad in zip(grads, expected_grads):
        torch.testing.assert_close(grad, reference_grad, atol=1e-4, rtol=1e-3)


@contextmanager
def kernels_of_the_cpu():
    """Today's cores on a GPU too: flex's choice of kernels as the CPU's (SDPA and the rest stay the GPU's)."""
    chosen = flex.kernels
    flex.kernels = lambda device: CPU_KERNELS
    try:
        yield
    finally:
        flex.kernels = chosen


@pytest.mark.parametrize("time", [7, 16, 29])
@pytest.mark.parametrize("causal", [False, True])
def test_the_bigbird_and_local_masks_are_the_dense_masks_of_their_cores(time, causal):
    from torch.nn.attention.flex_attention import create_mask

    from kqv.nn.dmca import LocalAttention
    from kqv.nn.sparse import BigBirdAttention, bigbird_mask

    core = BigBirdAttention(block=4, window=1, global_blocks=1, random_blocks=2, seed=3)
    cpu = torch.device("cpu")  # said: torch before 2.12 builds the mask on "cuda" by default, where there is one
    as_flex = create_mask(flex.combined(core.flex_mask(time, causal, cpu), causal, None), None, None, time, time, cpu)
    assert torch.equal(as_flex[0, 0], bigbird_mask(time, 4, 1, 1, 2, causal=causal, seed=3))
    local = create_mask(
        flex.combined(LocalAttention(4).flex_mask(time, causal, cpu), causal, None), None, None, time, time, cpu
    )
    block = torch.arange(time) // 4
    expected = block[:, None] == block[None, :]
    assert torch.equal(local[0, 0], expected & torch.ones(time, time, dtype=torch.bool).tril() if causal else expected)


def test_compiled_ddp_and_fsdp_runs_on_two_processes_equal_one_uncompiled_process(tmp_path, quick_compile):
    from test_fsdp import TOLERANCE, load_worker, max_difference, torchrun, weights

    load_worker().train(tmp_path / "one", 6)
    torchrun(str(Path(__file__).with_name("compile_worker.py")), str(tmp_path))
    for parallel in ("ddp", "fsdp"):
        saved = read_checkpoint(tmp_path / parallel)
        saved.close()
        assert saved.config.compile and saved.config.parallel == parallel
        assert _losses(tmp_path / parallel) == pytest.approx(_losses(tmp_path / "one"), abs=TOLERANCE)
        assert max_difference(weights(tmp_path / parallel), weights(tmp_path / "one")) < TOLERANCE
