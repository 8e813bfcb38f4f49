"""GPT-NeoX and the Llama family, both ways (`kqv.interop.decoders`): a kqv run of the `quick` config's kind (RoPE,
LayerNorm, GELU) exports as a `GPTNeoXForCausalLM`, one with RMSNorm, SwiGLU and grouped-query attention as a
`LlamaForCausalLM`, each loaded by `transformers` with kqv's logits, greedy tokens and tokenizer ids; random-weight
GPT-NeoX, Llama, Mistral and Qwen2 models saved by `transformers` load into kqv with their logits, and what kqv
cannot compute (RoPE scaling, another base, partial rotary, a parallel residual, a sliding window) is refused in one
line. Every model is made here from a config, with random weights; nothing is downloaded."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

import kqv
from kqv.cli.main import main
from kqv.data.tokenizers import BPETokenizer
from kqv.errors import ConfigError, ConversionError
from kqv.interop import from_hf, to_hf
from test_finetune import FINETUNE, finetune, first_batch_loss, logged_losses
from test_interop import randomized
from test_pretrained_dirs import TEXT, save

TINY = ["model.d_model=32", "model.n_heads=4", "model.n_layers=2", "model.d_ff=48", "model.dropout=0.0"]
SHORT = ["train.steps=3", "train.batch_size=4", "train.eval_batches=1", "sample.count=1", "sample.max_new_tokens=4"]
FAMILIES = {  # kqv options -> the class that holds them, and the tokenizer the run trains
    "neox": (["model.tie_embeddings=true"], "GPTNeoXForCausalLM", "char"),
    "llama": (
        ['model.norm="rmsnorm"', 'model.activation="swiglu"', "model.n_kv_heads=2", "model.tie_embeddings=false"],
        "LlamaForCausalLM",
        "bpe",
    ),
}
PROMPT = "whether 'tis"


@pytest.fixture(scope="module", params=FAMILIES)
def exported(request, tmp_path_factory):
    """(the kqv run, the Hugging Face directory it exported, the class expected): a run of the shipped `quick`
    config (RoPE, LayerNorm, GELU) shrunk, and one changed to RMSNorm, SwiGLU and 2 key/value heads for 4 queries."""
    options, hf_class, tokenizer = FAMILIES[request.param]
    root = tmp_path_factory.mktemp(request.param)
    (root / "text.txt").write_text(TEXT)
    overrides = [f"data.path={root / 'text.txt'}", f'data.tokenizer="{tokenizer}"', "data.vocab_size=300"]
    overrides += [*TINY, *SHORT, *options, 'train.precision="fp32"', "train.budget_minutes=0"]
    kqv.train("lm", "quick", out=root / "run", overrides=overrides, quiet=True)
    assert main(["export", str(root / "run"), "--hf", str(root / "hf")]) == 0
    return kqv.load(root / "run"), root / "hf", hf_class


@torch.no_grad()
def test_an_exported_run_loads_in_transformers_with_its_logits_and_50_greedy_tokens(exported):
    from transformers import AutoModelForCausalLM

    run, directory, hf_class = exported
    hf = AutoModelForCausalLM.from_pretrained(directory).eval()
    assert type(hf).__name__ == hf_class
    ids = torch.tensor([run.tokenizer.encode(TEXT[:60])])
    torch.testing.assert_close(hf(ids).logits, run.model(ids), atol=1e-4, rtol=0)
    prompt = torch.tensor([run.tokenizer.encode(PROMPT)])
    greedy = hf.generate(prompt, max_new_tokens=50, do_sample=False, pad_token_id=0)[0, prompt.shape[1] :]
    assert len(greedy) == 50  # no end-of-text id stops it early: kqv's tokenizers have none
    assert run.generate(PROMPT, max_new_tokens=50, temperature=0) == [PROMPT + run.tokenizer.decode(greedy.tolist())]


def test_an_exported_tokenizer_loads_with_auto_tokenizer_and_gives_kqv_s_ids(exported):
    from transformers import AutoTokenizer

    run, directory, _ = exported
    tokenizer = AutoTokenizer.from_pretrained(directory)
    text = "To be, or not to be: that is the question.  whether"  # characters of the corpus only
    assert tokenizer(text)["input_ids"] == run.tokenizer.encode(text)
    assert tokenizer.decode(run.tokenizer.encode(text)) == text


def test_an_exported_config_says_kqv_s_rope_norm_and_activation(exported):
    from transformers import AutoConfig

    run, directory, hf_class = exported
    config, ours = AutoConfig.from_pretrained(directory), run.model.config
    assert config.rope_parameters["rope_theta"] == 10000.0 and config.rope_parameters["rope_type"] == "default"
    assert config.max_position_embeddings == ours.max_len and config.tie_word_embeddings == ours.tie_embeddings
    assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == (None, None, None)
    if hf_class == "GPTNeoXForCausalLM":
        assert config.rope_parameters["partial_rotary_factor"] == 1.0 and config.use_parallel_residual is False
        assert (config.hidden_act, config.layer_norm_eps) == ("gelu", ours.norm_eps)  # erf GELU, not gelu_new
    else:
        assert (config.hidden_act, config.rms_norm_eps, config.num_key_value_heads) == ("silu", ours.norm_eps, 2)
        assert config.attention_bias is config.mlp_bias is ours.bias


# ---------------------------------------------------------------------------------------------------------------
# Hugging Face checkpoints into kqv

SMALL = dict(
    vocab_size=97,
    hidden_size=32,
    num_attention_heads=4,
    num_hidden_layers=2,
    intermediate_size=48,
    max_position_embeddings=64,
)
CHECKPOINTS = {
    "llama_gqa_biased_untied": ("LlamaForCausalLM", dict(num_key_value_heads=2, attention_bias=True)),
    "llama_mqa_mlp_bias_tied": (
        "LlamaForCausalLM",
        dict(num_key_value_heads=1, mlp_bias=True, tie_word_embeddings=True),
    ),
    "llama_geglu": ("LlamaForCausalLM", dict(hidden_act="gelu")),
    "neox": ("GPTNeoXForCausalLM", dict(rotary_pct=1.0, use_parallel_residual=False)),
    "neox_tied_no_attention_bias": (
        "GPTNeoXForCausalLM",
        dict(rotary_pct=1.0, use_parallel_residual=False, attention_bias=False, tie_word_embeddings=True),
    ),
    "qwen2_gqa": ("Qwen2ForCausalLM", dict(num_key_value_heads=2)),
    # today's bases: Llama 3's 500,000 and Qwen2's 1,000,000 (kqv's model.rope_base)
    "llama_rope_base_500000": (
        "LlamaForCausalLM",
        dict(num_key_value_heads=2, rope_parameters={"rope_type": "default", "rope_theta": 500000.0}),
    ),
    "qwen2_rope_base_1000000": (
        "Qwen2ForCausalLM",
        dict(num_key_value_heads=2, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
    ),
    "mistral_window_covering_every_position": ("MistralForCausalLM", dict(num_key_value_heads=2, sliding_window=64)),
}


def hf_decoder(hf_class: str, **changes):
    import transformers

    config_class = getattr(transformers, hf_class.replace("ForCausalLM", "Config"))
    torch.manual_seed(0)
    config = config_class(**{**SMALL, **changes, "attn_implementation": "eager"})
    return randomized(getattr(transformers, hf_class)(config))  # every weight random, norm gains near 1


@pytest.mark.parametrize("case", CHECKPOINTS)
@torch.no_grad()
def test_a_saved_checkpoint_loads_into_kqv_with_its_logits(case, tmp_path):
    hf_class, changes = CHECKPOINTS[case]
    hf = hf_decoder(hf_class, **changes)
    hf.save_pretrained(tmp_path)
    if case == "neox":  # transformers saves a GPT-NeoX's output layer under its checkpoints' name
        assert "embed_out.weight" in load_file(tmp_path / "model.safetensors")
    ours = from_hf(tmp_path)
    ids = torch.randint(0, 97, (2, 24), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(ours(ids), hf(ids).logits, atol=1e-4, rtol=0)
    assert ours.config.kv_heads == getattr(hf.config, "num_key_value_heads", 4)
    back = to_hf(ours)  # written again: as itself, or a Mistral or Qwen2 as the Llama it computes
    assert type(back).__name__ == ("GPTNeoXForCausalLM" if hf_class == "GPTNeoXForCausalLM" else "LlamaForCausalLM")
    torch.testing.assert_close(back(ids).logits, hf(ids).logits, atol=1e-4, rtol=0)
    theirs, again = hf.state_dict(), back.state_dict()
    if hf_class == type(back).__name__:  # every tensor back in its place; biases it had none of are zero
        assert all(torch.equal(again[name], tensor) for name, tensor in theirs.items())
        assert all(not again[name].any() for name in again.keys() - theirs.keys())


REFUSED = {
    "llama rope scaling": (
        "LlamaForCausalLM",
        dict(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}),
        "rope_type='linear': kqv's RoPE has no scaling",
    ),
    "llama head_dim": ("LlamaForCausalLM", dict(head_dim=16), "head_dim=16: kqv's heads are"),
    "mistral sliding window": (
        "MistralForCausalLM",
        dict(sliding_window=16, num_key_value_heads=2),
        "sliding_window=16 below max_position_embeddings=64",
    ),
    "qwen2 sliding window": (
        "Qwen2ForCausalLM",
        dict(use_sliding_window=True, sliding_window=16, max_window_layers=1),
        "sliding_window=16 below max_position_embeddings=64",
    ),
    "neox partial rotary": (
        "GPTNeoXForCausalLM",
        dict(rotary_pct=0.25, use_parallel_residual=False),
        "partial rotary (rotary_pct / partial_rotary_factor=0.25)",
    ),
    "neox parallel residual": (
        "GPTNeoXForCausalLM",
        dict(rotary_pct=1.0, use_parallel_residual=True),
        "use_parallel_residual=true",
    ),
}


@pytest.mark.parametrize("case", REFUSED)
def test_what_kqv_cannot_compute_is_refused_in_one_line(case, tmp_path):
    hf_class, changes, words = REFUSED[case]
    hf_decoder(hf_class, **changes).save_pretrained(tmp_path)
    with pytest.raises(ConversionError, match="kqv cannot represent") as error:
        from_hf(tmp_path)
    assert words in str(error.value) and "\n" not in str(error.value)


def test_a_refused_directory_is_one_line_from_the_command_line(tmp_path, capsys):
    tokenizer = BPETokenizer.train(TEXT, vocab_size=300)
    mistral = hf_decoder(
        "MistralForCausalLM", sliding_window=16, num_key_value_heads=2, vocab_size=tokenizer.vocab_size
    )
    save(mistral, tokenizer, tmp_path)
    capsys.readouterr()  # transformers' progress bars
    assert main(["generate", str(tmp_path), "--prompt", "To be"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "sliding_window=16" in err


def test_a_model_no_class_holds_is_refused_naming_the_nearest_classes():
    config = dict(vocab_size=50, d_model=16, n_heads=2, n_layers=1, d_ff=32, position="rope")
    with pytest.raises(ConversionError) as error:  # LayerNorm with SwiGLU: one option from NeoX and from Llama
        to_hf(kqv.DecoderLM(kqv.ModelConfig(**config, activation="swiglu")))
    message = str(error.value)
    assert "GPTNeoXForCausalLM, which needs activation='gelu', 'gelu_tanh', 'relu' or 'silu'" in message
    assert "LlamaForCausalLM, which needs norm='rmsnorm': train one with --set model.norm=rmsnorm" in message
    assert "GPT2LMHeadModel" not in message and "\n" not in message  # two options away
    with pytest.raises(ConversionError, match="GPTNeoXForCausalLM, which needs bias=True") as error:
        to_hf(kqv.DecoderLM(kqv.ModelConfig(**config, bias=False)))  # NeoX's LayerNorms and MLP have biases
    assert "Llama" not in str(error.value)


# ---------------------------------------------------------------------------------------------------------------
# Directories as runs: generate, attention, the explorer, and fine-tunes (full and LoRA)


@pytest.fixture(scope="module")
def directories(tmp_path_factory):
    """A random Llama with grouped-query attention and a random GPT-NeoX, each saved with a BPE tokenizer."""
    tokenizer = BPETokenizer.train(TEXT, vocab_size=300)
    made = {}
    for name, hf_class, changes in [
        ("llama", "LlamaForCausalLM", dict(num_key_value_heads=2, vocab_size=tokenizer.vocab_size)),
        (
            "neox",
            "GPTNeoXForCausalLM",
            dict(rotary_pct=1.0, use_parallel_residual=False, vocab_size=tokenizer.vocab_size),
        ),
    ]:
        made[name] = save(hf_decoder(hf_class, **changes), tokenizer, tmp_path_factory.mktemp(name))
    return made


@pytest.mark.parametrize("name", ["llama", "neox"])
def test_a_directory_generates_evaluates_and_shows_attention_as_transformers_does(directories, name, tmp_path):
    from transformers import AutoModelForCausalLM

    run = kqv.load(directories[name])
    hf = AutoModelForCausalLM.from_pretrained(directories[name], attn_implementation="eager").eval()
    prompt = torch.tensor([run.tokenizer.encode(PROMPT)])
    with torch.no_grad():
        expected = hf.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0)
        attentions = hf(prompt, output_attentions=True).attentions
    assert run.generate(PROMPT, max_new_tokens=12, temperature=0) == [run.tokenizer.decode(expected[0].tolist())]
    maps = run.attention(PROMPT)
    assert (maps.layers, maps.heads) == (2, 4)
    for ours, theirs in zip(maps.weights, attentions, strict=True):  # (1, heads, time, time) each
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)
    (tmp_path / "text.txt").write_text(TEXT[:50])  # fewer tokens than the 64 positions: one block, scored whole
    ids = torch.tensor([run.tokenizer.encode(TEXT[:50])])
    with torch.no_grad():
        loss = hf(ids, labels=ids).loss.item()  # transformers' own mean next-token cross-entropy
    assert run.evaluate(tmp_path / "text.txt").loss == pytest.approx(loss, abs=1e-4)


def test_the_explorer_opens_a_llama_directory_like_an_lm_run(directories):
    from starlette.testclient import TestClient

    from kqv.explore.app import create_app

    client = TestClient(create_app(directories["llama"]))
    info = client.get("/api/info").json()
    assert info["hf_class"] == "LlamaForCausalLM" and info["task"] == "lm"


def test_a_full_finetune_of_a_gpt_neox_directory_starts_at_its_loss(directories, tmp_path):
    summary = finetune(directories["neox"], tmp_path / "ft", extra=["model.dropout=0.0"])
    run_dir = tmp_path / "ft" / "run"
    assert summary["source"]["kind"] == "Hugging Face GPT-NeoX" and summary["steps"] == 2
    assert logged_losses(run_dir)[0] == pytest.approx(first_batch_loss(from_hf(directories["neox"]), run_dir), abs=1e-5)


def test_a_lora_finetune_of_a_llama_directory_on_pairs_trains(directories, tmp_path):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("".join(f"Q: is it {word}? A:\t {word}\n" for word in ["to be", "not", "nobler", "the mind"] * 4))
    argv = ["train", "lm", "--init", str(directories["llama"]), "--data", str(pairs), "--out", str(tmp_path / "qa")]
    sets = ["finetune.lora_rank=8", "train.steps=2", *[o for o in FINETUNE if not o.startswith("data.")]]
    assert main([*argv, *[w for s in sets for w in ("--set", s)]]) == 0
    tuned = kqv.load(tmp_path / "qa")
    losses = logged_losses(tmp_path / "qa")
    assert len(losses) == 2 and all(loss == loss for loss in losses)  # two updates, finite
    adapters = [name for name, _ in tuned.model.named_parameters() if "lora_" in name]
    assert adapters and tuned.model.config.kv_heads == 2


def test_weights_whose_shapes_do_not_fit_together_are_one_line(tmp_path):
    from safetensors.torch import save_file

    hf_decoder("LlamaForCausalLM", num_key_value_heads=2).save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    weights["model.layers.0.self_attn.v_proj.weight"] = torch.zeros(16, 40)  # keys (16, 32): no [k; v] of them
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ConversionError, match="the checkpoint's weights do not fit its config") as error:
        from_hf(tmp_path)
    assert "v_proj.weight (16, 40)" in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("base", [0.5, 1.0, float("inf"), float("nan")])
def test_a_rope_base_that_turns_no_angle_or_none_finite_is_refused_in_one_line(base):
    with pytest.raises(ConfigError, match="rope_base") as error:
        kqv.ModelConfig(vocab_size=10, d_model=16, n_heads=2, position="rope", rope_base=base)
    assert "\n" not in str(error.value)
