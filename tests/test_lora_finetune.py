"""Issue 34, how much a fine-tune trains (`[finetune]`, `kqv.jobs.finetune`): freezing the embeddings and the first
blocks, and LoRA runs that save their adapters alone, load and resume from their source, and merge on export."""

import json

import pytest
import torch
from safetensors.torch import load_file

import kqv
from kqv.cli.main import main
from kqv.errors import ConfigError, RunError
from kqv.nn.lora import LoRAConfig, add_lora
from kqv.train.update import Updater
from test_finetune import FINETUNE, FINETUNE_TEXT, finetune, first_batch_loss, hf_greedy, logged_losses, tiny_run

SOURCE = ["model.n_layers=2", "model.d_model=32", "model.d_ff=64"]
LORA = [
    "finetune.lora_rank=2",
    "finetune.lora_alpha=4.0",
    "finetune.lora_dropout=0.1",
    'finetune.lora_targets=["to_queries", "up"]',
]
CONSTANT = ['train.schedule="constant"', "train.checkpoint_every=2"]  # checkpoints at 2 and 4; one at 3 is Ctrl-C's


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return tiny_run(tmp_path_factory.mktemp("lora_source"), steps=2, extra=SOURCE)


@pytest.fixture(scope="module")
def lora_run(source, tmp_path_factory):
    root = tmp_path_factory.mktemp("lora_run")
    finetune(source, root, extra=[*LORA, *CONSTANT], steps=4)
    return root / "run"


def adapted_source(source, run_dir):
    """The source model with rank-2 adapters holding the run's saved ones: the adapted model, built independently
    of the run's loading path."""
    model = kqv.load(source, device="cpu").model.eval()
    add_lora(model, LoRAConfig(rank=2, alpha=4.0, dropout=0.1, targets=("to_queries", "up")))
    saved = load_file(run_dir / "checkpoint" / "model.safetensors")
    missing, unexpected = model.load_state_dict(saved, strict=False)
    assert not unexpected and all("lora_" not in name for name in missing)
    return model.eval()


def test_a_lora_finetune_trains_only_its_adapters_and_saves_them_alone(source, lora_run):
    saved = load_file(lora_run / "checkpoint" / "model.safetensors")
    assert saved and all(name.rsplit(".", 1)[-1] in ("lora_a", "lora_b") for name in saved)
    optimizer = torch.load(lora_run / "checkpoint" / "optimizer.pt", weights_only=True)
    assert len(optimizer["state"]) == len(saved)  # AdamW holds the adapters alone
    assert all(saved[name].abs().sum() > 0 for name in saved if name.endswith("lora_b"))  # B trained off zero
    whole = (source / "checkpoint" / "model.safetensors").stat().st_size
    assert (lora_run / "checkpoint" / "model.safetensors").stat().st_size < whole / 4
    run = kqv.load(lora_run, device="cpu")
    tuned, original = run.model.state_dict(), kqv.load(source, device="cpu").model.state_dict()
    assert {name for name in tuned if "lora_" not in name} == set(original)
    for name, tensor in original.items():
        assert torch.equal(tuned[name], tensor), f"{name} changed"
    assert logged_losses(lora_run)[0] == pytest.approx(first_batch_loss(kqv.load(source).model, lora_run), abs=1e-6)
    summary = json.loads((lora_run / "summary.json").read_text())
    trained = sum(t.numel() for t in saved.values())
    assert summary["parameters"] == summary["finetune"]["trainable_parameters"] == trained


def test_a_loaded_lora_run_gives_the_adapted_models_logits_and_tokens(source, lora_run, capsys):
    run = kqv.load(lora_run, device="cpu")
    model = adapted_source(source, lora_run)
    ids = torch.tensor([run.tokenizer.encode("that is the")])
    with torch.no_grad():
        assert torch.equal(run.model(ids), model(ids))
        expected = run.tokenizer.decode(model.generate(ids[:, :4], 6, temperature=0)[0].tolist())
    assert run.generate("that", max_new_tokens=6, temperature=0) == [expected]
    assert main(["generate", str(lora_run), "--prompt", "that", "--max-new-tokens", "6", "--temperature", "0"]) == 0
    assert expected in capsys.readouterr().out


def test_a_lora_run_stopped_by_ctrl_c_saves_its_adapters_and_resumes_exactly(source, lora_run, tmp_path, monkeypatch):
    update = Updater.__call__

    def interrupted_at_step_4(self, module, step, lr):
        if step == 3:
            raise KeyboardInterrupt
        return update(self, module, step, lr)

    with monkeypatch.context() as patch:
        patch.setattr(Updater, "__call__", interrupted_at_step_4)
        with pytest.raises(KeyboardInterrupt):
            finetune(source, tmp_path, extra=[*LORA, *CONSTANT], steps=4)
    checkpoint = tmp_path / "run" / "checkpoint"
    assert json.loads((checkpoint / "state.json").read_text())["step"] == 3  # Ctrl-C saved update 3 (not 2)
    assert all("lora_" in name for name in load_file(checkpoint / "model.safetensors"))
    with pytest.raises(ConfigError, match=r"a resumed run cannot change finetune.lora_rank \(2 -> 4\)"):
        kqv.train("lm", out=tmp_path / "run", resume=True, overrides=["finetune.lora_rank=4"], quiet=True)
    kqv.train("lm", out=tmp_path / "run", resume=True, quiet=True)
    assert logged_losses(tmp_path / "run") == logged_losses(lora_run)
    resumed = load_file(tmp_path / "run" / "checkpoint" / "model.safetensors")
    whole = load_file(lora_run / "checkpoint" / "model.safetensors")
    assert resumed.keys() == whole.keys() and all(torch.equal(resumed[k], whole[k]) for k in whole)


def test_a_merged_export_gives_transformers_the_lora_runs_greedy_tokens(lora_run, tmp_path, capsys):
    expected = kqv.load(lora_run).generate("that is", max_new_tokens=6, temperature=0)[0]
    with pytest.raises(ConfigError, match=r"LoRA fine-tune .* add --merge|merge=True"):
        kqv.export(lora_run, hf=tmp_path / "plain")
    assert not (tmp_path / "plain").exists()
    assert main(["export", str(lora_run), "--hf", str(tmp_path / "plain")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--merge" in err and not (tmp_path / "plain").exists()
    assert main(["export", str(lora_run), "--hf", str(tmp_path / "hf"), "--merge"]) == 0
    assert hf_greedy(tmp_path / "hf", "that is", 6) == expected
    assert kqv.export(lora_run, hf=tmp_path / "py", merge=True) == tmp_path / "py"


def test_frozen_weights_stay_bit_identical_and_the_others_train(source, tmp_path):
    extra = ["finetune.freeze_embeddings=true", "finetune.freeze_blocks=1"]
    finetune(source, tmp_path, extra=extra, steps=2)
    summary = kqv.train("lm", out=tmp_path / "run", resume=True, steps=3, quiet=True)  # frozen again on a resume
    tuned = kqv.load(tmp_path / "run", device="cpu").model.state_dict()
    original = kqv.load(source, device="cpu").model.state_dict()
    frozen = [n for n in original if n.startswith(("decoder.embeddings.", "decoder.blocks.0.", "lm_head."))]
    assert "lm_head.weight" in frozen  # tied to the token embedding: one tensor, frozen with it
    for name in original:
        assert torch.equal(tuned[name], original[name]) == (name in frozen), name
    optimizer = torch.load(tmp_path / "run" / "checkpoint" / "optimizer.pt", weights_only=True)
    trained = {n for n in original if n not in frozen}
    assert sum(len(group["params"]) for group in optimizer["param_groups"]) == len(trained)  # no frozen weight in it
    assert summary["finetune"]["trainable_parameters"] < summary["finetune"]["total_parameters"]


@pytest.mark.parametrize(
    "init, extra, words",
    [
        (False, LORA, r"fine-tune a trained model: give the model to start from with init=SOURCE"),
        (True, ["finetune.freeze_blocks=3"], r"finetune.freeze_blocks \(3\) is more than the source's 2 blocks"),
        (True, ["finetune.lora_rank=2", "finetune.freeze_blocks=1"], r"LoRA already freezes every weight"),
        (True, ['finetune.lora_targets=["query"]'], r"finetune.lora_targets\[0\] must be one of"),
    ],
    ids=["lora-without-init", "too-many-blocks", "lora-and-freezing", "unknown-target"],
)
def test_what_a_finetune_config_cannot_do_is_refused_with_nothing_written(source, tmp_path, init, extra, words):
    (tmp_path / "new.txt").write_text(FINETUNE_TEXT)
    overrides = [f"data.path={tmp_path / 'new.txt'}", "data.context=16", *extra]
    with pytest.raises(ConfigError, match=words):
        kqv.train("lm", init=source if init else None, out=tmp_path / "run", overrides=overrides, quiet=True)
    assert not (tmp_path / "run").exists()


def test_a_loaded_lora_runs_repr_counts_every_parameter_and_the_trainable_ones(lora_run):
    """A LoRA run's model is its source's frozen weights plus the adapters: its repr counts both, and what trains."""
    run = kqv.load(lora_run, device="cpu")
    total = sum(p.numel() for p in run.model.parameters())  # each shared (tied) tensor once
    trainable = sum(p.numel() for p in run.model.parameters() if p.requires_grad)
    assert 0 < trainable < total
    assert repr(run) == f"LMRun({str(lora_run)!r}, task='lm', {total:,} parameters, {trainable:,} trainable)"


def test_a_finetune_that_would_train_nothing_is_refused_in_one_line(tmp_path, capsys):
    """A post-LN model with tied embeddings has no final norm and no separate output layer: frozen embeddings and
    every block leave nothing to train (nanoGPT #161, a fine-tune that silently changed nothing)."""
    post_ln = tiny_run(tmp_path / "src", steps=1, extra=["model.norm_first=false"])
    (tmp_path / "new.txt").write_text(FINETUNE_TEXT)
    argv = ["train", "lm", "--init", str(post_ln), "--data", str(tmp_path / "new.txt"), "--out", str(tmp_path / "r")]
    sets = ["--set", "data.context=16", "--set", "finetune.freeze_embeddings=true", "--set", "finetune.freeze_blocks=1"]
    assert main([*argv, *sets]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "this fine-tune would train nothing" in err
    assert not (tmp_path / "r").exists()


def test_a_lora_run_whose_source_changed_or_moved_is_refused_by_name(source, lora_run, tmp_path, capsys):
    import shutil

    moved = tmp_path / "source"
    shutil.copytree(source, moved)
    run_dir = tmp_path / "lora"
    shutil.copytree(lora_run, run_dir)
    toml = run_dir / "run.toml"
    toml.write_text(toml.read_text().replace(str(source), str(moved)))
    from kqv.train.layout import record

    record(run_dir)  # run.toml's checksum: the edit above stands for a run whose source is at `moved`
    assert kqv.load(run_dir, device="cpu").model is not None
    weights = moved / "checkpoint" / "model.safetensors"
    state = load_file(weights)
    state[next(iter(state))] += 1.0
    from safetensors.torch import save_file

    save_file(state, weights)
    with pytest.raises(RunError, match=r"has changed since the run trained: its weights' SHA-256 is"):
        kqv.load(run_dir)
    assert main(["generate", str(run_dir), "--prompt", "to"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"restore {moved} as it was" in err
    shutil.rmtree(moved)
    gone = rf"holds only its adapters, and its source {moved} cannot be read: {moved} does not exist; put the source"
    with pytest.raises(RunError, match=gone):
        kqv.load(run_dir)


def test_a_lora_finetune_of_a_gpt2_directory_loads_it_with_the_adapters(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    from kqv.data.tokenizers import BPETokenizer
    from test_finetune import TEXT

    gpt2 = tmp_path / "gpt2"
    tokenizer = BPETokenizer.train(TEXT, vocab_size=300)
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=tokenizer.vocab_size, n_positions=32, n_embd=32, n_layer=2, n_head=2)
    GPT2LMHeadModel(config).save_pretrained(gpt2)
    PreTrainedTokenizerFast(tokenizer_object=tokenizer.tokenizer).save_pretrained(gpt2)
    finetune(gpt2, tmp_path / "ft", extra=[*LORA, "model.dropout=0.0"], steps=2)
    run = kqv.load(tmp_path / "ft" / "run", device="cpu")
    model = adapted_source(gpt2, tmp_path / "ft" / "run")
    ids = torch.tensor([run.tokenizer.encode("that is the question")[:16]])
    with torch.no_grad():
        assert torch.equal(run.model(ids), model(ids))
        tuned, original = run.model.state_dict(), kqv.load(gpt2, device="cpu").model.state_dict()
    assert all(torch.equal(tuned[name], tensor) for name, tensor in original.items())


def test_checkpoints_of_the_adapters_alone_are_refused_under_fsdp():
    from kqv.nn.lora import adapters
    from kqv.train.placement import check_saved_weights

    with pytest.raises(ConfigError, match=r"cannot be sharded; set train.parallel=\"ddp\""):
        check_saved_weights(adapters, sharded=True)
    check_saved_weights(adapters, sharded=False)  # DDP, or one process
    check_saved_weights(None, sharded=True)  # FSDP saves whole models as before


def test_a_lora_finetune_on_pairs_saves_its_adapters_alone_and_loads(source, tmp_path):
    from test_pair_finetune import SHORT, pairs_file

    qa = pairs_file(tmp_path / "qa.tsv")
    overrides = [f"data.path={qa}", *FINETUNE, *LORA]
    kqv.train("lm", init=source, out=tmp_path / "run", steps=2, quiet=True, overrides=overrides)
    saved = load_file(tmp_path / "run" / "checkpoint" / "model.safetensors")
    assert saved and all("lora_" in name for name in saved)
    run = kqv.load(tmp_path / "run", device="cpu")
    ids = torch.tensor([run.tokenizer.encode(SHORT[0].prompt)])
    with torch.no_grad():
        assert torch.equal(run.model(ids), adapted_source(source, tmp_path / "run")(ids))
    assert run.evaluate(pairs=qa).n == len(SHORT) * 3
