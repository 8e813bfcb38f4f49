"""FSDP jobs whose processes never hold the whole model: a job under torchrun with `train.parallel = "fsdp"` builds
its model in slices (`kqv.train.slices`), each of 2 CPU processes keeping only its rows from the first draw on,
with the same weights, loss curve and fine-tune start as one process; a resume reads only each process's rows of
the checkpoint. One torchrun launch holds every 2-process run (`fsdp_job_worker.py`)."""

import importlib.util
import json
import math
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import kqv
from kqv.errors import ConfigError, RunError
from kqv.nn.config import ModelConfig
from kqv.nn.vision import ViT
from kqv.train.metrics import read_metrics
from kqv.train.runs import read_summary
from kqv.train.slices import build_sliced, is_sliced, load_slices, own_rows, rows, take_slices
from test_fsdp import TOLERANCE, max_difference, optimizer_state, torchrun, weights

WORKER = Path(__file__).with_name("fsdp_job_worker.py")


def load_worker():
    spec = importlib.util.spec_from_file_location("fsdp_job_worker", WORKER)
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    return worker


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """One-process references (the LM job, 4 steps; a 2-step fine-tune of it), then the worker's FSDP jobs."""
    out = tmp_path_factory.mktemp("fsdp-jobs")
    worker = load_worker()
    (out / "tiny.toml").write_text(worker.CONFIG)
    (out / "text.txt").write_text(worker.TEXT)
    worker.train(out, "one-4", 4)
    worker.train(out, "one-tune", 2, init=out / "one-4")
    try:
        torchrun(str(WORKER), str(out))
    except AssertionError as failed:  # pytest.fail's, or the assert's
        if "SIGSEGV" not in str(failed):
            raise
        # torch's profiler (the start's memory) beside gloo crashed a rank twice on CI, never in 18 runs here: that
        # crash alone, in torch and not in kqv, is run again once, from scratch, and said so
        said = f"a torchrun rank died of SIGSEGV; the FSDP jobs run again once:\n{str(failed)[:2000]}"
        warnings.warn(said, stacklevel=1)
        for name in ("fsdp-4", "fsdp-2-4", "fsdp-tune"):
            shutil.rmtree(out / name, ignore_errors=True)
        for left in out.glob("fsdp-*-start-rank*.json"):
            left.unlink()
        torchrun(str(WORKER), str(out))
    return out


def start_peak(runs: Path, name: str, rank: int) -> int:
    return json.loads((runs / f"{name}-start-rank{rank}.json").read_text())["peak"]


def model_bytes(runs: Path) -> tuple[int, int]:
    """(the bytes of the whole model's parameters, of its largest parameter), fp32."""
    shapes = [t.shape for t in weights(runs / "one-4").values()]
    return 4 * read_summary(runs / "one-4")["parameters"], 4 * max(math.prod(s) for s in shapes)


@pytest.mark.parametrize("run", ["fsdp-4", "fsdp-tune"])
def test_each_of_two_fsdp_processes_holds_about_half_the_model_while_a_job_starts(runs, run):
    whole, largest = model_bytes(runs)
    assert largest < whole / 10  # so that half the model plus one tensor drawn whole is well under the whole
    assert start_peak(runs, "one-4", 0) >= whole  # one process holds it all
    for rank in (0, 1):  # its half, plus at most one tensor drawn whole, plus small change
        assert whole / 2 <= start_peak(runs, run, rank) <= whole / 2 + largest + whole / 20


def test_an_fsdp_evaluation_never_holds_a_whole_copy_of_the_model_during_or_after(runs):
    whole, _ = model_bytes(runs)
    for rank in (0, 1):  # a block's weights gathered at a time (a quarter of this model)
        evaluations = json.loads((runs / f"fsdp-4-start-rank{rank}.json").read_text())["evaluations"]
        assert len(evaluations) == 2
        # At most the root's weights (embeddings, final norm) and one of the 4 blocks whole at once (a whole copy
        # would be all of them), and nothing whole kept after
        assert all(0 < gathered < whole / 2 and kept == 0 for gathered, kept in evaluations)


def curve(run_dir: Path) -> list[tuple]:
    return [(r["step"], r.get("train_loss"), r.get("val_loss")) for r in read_metrics(run_dir / "metrics.jsonl")]


@pytest.mark.parametrize(("one", "two"), [("one-4", "fsdp-4"), ("one-tune", "fsdp-tune")])
def test_a_two_process_fsdp_job_gives_the_loss_curve_and_weights_of_one_process(runs, one, two):
    a, b = curve(runs / one), curve(runs / two)
    assert [r[0] for r in a] == [r[0] for r in b] and len(a) >= 2
    for x, y in zip(a, b):
        assert [v for v in y[1:] if v is not None] == pytest.approx(
            [v for v in x[1:] if v is not None], abs=TOLERANCE, rel=0
        )
    assert max_difference(weights(runs / one), weights(runs / two)) < TOLERANCE


def test_the_fine_tune_starts_from_its_source_not_from_scratch(runs):
    first_tune, first_scratch = (
        read_metrics(runs / "fsdp-tune" / "metrics.jsonl")[0],
        read_metrics(runs / "fsdp-4" / "metrics.jsonl")[0],
    )
    assert first_tune["train_loss"] < first_scratch["train_loss"] - 0.1


def test_a_resumed_two_process_fsdp_job_continues_exactly(runs):
    straight, resumed = runs / "fsdp-4", runs / "fsdp-2-4"
    assert curve(resumed) == curve(straight)
    a, b = weights(straight), weights(resumed)
    assert all(torch.equal(a[name], b[name]) for name in a)
    sa, sb = optimizer_state(straight)["state"], optimizer_state(resumed)["state"]
    assert sa.keys() == sb.keys() and all(torch.equal(sa[i][k], sb[i][k]) for i in sa for k in sa[i])


SIZES = dict(vocab_size=37, d_model=32, n_heads=2, n_layers=2, d_ff=64, max_len=32, dropout=0.0)
MODELS = {
    **{f"lm-{p}": (lambda p=p: kqv.DecoderLM(ModelConfig(**SIZES, position=p))) for p in ("learned", "rope", "alibi")},
    "lm-relative-rmsnorm-swiglu": lambda: kqv.DecoderLM(
        ModelConfig(**SIZES, position="relative", norm="rmsnorm", activation="swiglu", output_bias=True)
    ),
    "mlm": lambda: kqv.MaskedLM(ModelConfig(**SIZES)),
    "cls": lambda: kqv.SequenceClassifier(ModelConfig(**SIZES), 3),
    "mt-untied": lambda: kqv.EncoderDecoder(ModelConfig(**SIZES, tgt_vocab_size=41, tie_embeddings=False)),
    "vit": lambda: ViT(ModelConfig(**{**SIZES, "vocab_size": 1}), (1, 8, 8), 4, 10),
}


@pytest.mark.parametrize("name", MODELS)
def test_a_model_built_in_slices_holds_each_ranks_rows_of_the_model_one_process_builds(name):
    torch.manual_seed(7)
    whole = MODELS[name]()
    reference = dict(whole.named_parameters(remove_duplicate=False))
    for world_size in (2, 3):
        for rank in range(world_size):
            torch.manual_seed(7)
            model = build_sliced(MODELS[name], rank, world_size)
            assert all(p.is_meta for p in model.parameters())
            assert all(torch.equal(a, b) for a, b in zip(model.buffers(), whole.buffers()))  # whole, as built
            slices = take_slices(model)
            assert slices.keys() == reference.keys() and not is_sliced(model)
            for key, mine in slices.items():
                assert torch.equal(mine, reference[key].detach()[rows(len(reference[key]), rank, world_size)])


def test_rows_cut_as_torch_chunk_does():
    for length in (1, 5, 6, 7):
        for world_size in (2, 3, 4):
            chunks = torch.arange(length).chunk(world_size)
            for rank in range(world_size):
                expected = chunks[rank] if rank < len(chunks) else torch.arange(0)
                assert torch.equal(torch.arange(length)[rows(length, rank, world_size)], expected)


class WritesIntoAView(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(4, 3))
        torch.nn.init.normal_(self.weight)
        with torch.no_grad():
            self.weight[0].zero_()  # a padding row, say: needs the whole tensor


def test_building_in_slices_refuses_what_needs_a_whole_parameter():
    with pytest.raises(ConfigError, match='cannot do aten.zero_.*train.parallel = "ddp"'):
        build_sliced(WritesIntoAView, 0, 2)


def test_loading_slices_reads_each_ranks_rows_of_a_safetensors_file(tmp_path):
    torch.manual_seed(1)
    source = kqv.DecoderLM(ModelConfig(**SIZES))
    path = tmp_path / "model.safetensors"
    save_file({k: v for k, v in source.state_dict().items() if k != "lm_head.weight"}, str(path))  # one of tied
    for rank in (0, 1):
        model = build_sliced(lambda: kqv.DecoderLM(ModelConfig(**SIZES)), rank, 2)
        load_slices(model, path)
        slices = take_slices(model)
        for key, value in source.state_dict().items():
            if key in slices:
                assert torch.equal(slices[key], own_rows(value, rank, 2))
    wrong = build_sliced(lambda: kqv.DecoderLM(ModelConfig(**{**SIZES, "d_ff": 32})), 0, 2)
    with pytest.raises(RunError, match="does not fit the model.*has shape"):
        load_slices(wrong, path)
