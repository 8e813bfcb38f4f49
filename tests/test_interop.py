"""kqv.interop: Hugging Face configs and weights become kqv models, offline, from objects or safetensors directories."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import kqv
import kqv.interop
from kqv.interop import config_from_hf, from_hf


def gpt2_config(**changes):
    from transformers import GPT2Config

    return GPT2Config(**{**dict(n_layer=2, n_embd=64, n_head=4, vocab_size=97, n_positions=32, bos_token_id=0,
                                eos_token_id=0, attn_implementation="eager"), **changes})


def bert_config(**changes):
    from transformers import BertConfig

    return BertConfig(**{**dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                                vocab_size=97, max_position_embeddings=32, pad_token_id=0,
                                attn_implementation="eager"), **changes})


def hf_gpt2(**changes):
    from transformers import GPT2LMHeadModel

    return GPT2LMHeadModel(gpt2_config(**changes)).eval()


def hf_bert(**changes):
    from transformers import BertModel

    return BertModel(bert_config(**changes)).eval()


# ---------------------------------------------------------------------------------------------------------------
# Config translation


def test_gpt2_config_becomes_a_pre_ln_learned_position_decoder_config():
    config = config_from_hf(gpt2_config(layer_norm_epsilon=1e-6, n_inner=100))
    assert config == kqv.ModelConfig(
        vocab_size=97, d_model=64, n_heads=4, n_layers=2, d_ff=100, max_len=32, dropout=0.0, position="learned",
        norm="layernorm", norm_first=True, norm_eps=1e-6, activation="gelu_tanh", bias=True, tie_embeddings=True,
        embed_norm=False, scale_embeddings=False,
    )
    assert config_from_hf(gpt2_config()).d_ff == 4 * 64  # n_inner=None means 4 * n_embd


@pytest.mark.parametrize("hf_name,kqv_name", [("gelu_new", "gelu_tanh"), ("gelu_pytorch_tanh", "gelu_tanh"),
                                              ("gelu", "gelu"), ("relu", "relu")])
def test_hugging_face_activation_names_map_to_kqv_activations(hf_name, kqv_name):
    assert config_from_hf(gpt2_config(activation_function=hf_name)).activation == kqv_name
    assert config_from_hf(bert_config(hidden_act=hf_name)).activation == kqv_name


def test_untied_gpt2_config_keeps_a_separate_output_matrix():
    assert config_from_hf(gpt2_config(tie_word_embeddings=False)).tie_embeddings is False
    model = from_hf(hf_gpt2(tie_word_embeddings=False))
    assert model.lm_head.weight is not model.decoder.embeddings.tokens.weight


def test_bert_config_becomes_a_post_ln_encoder_config_with_an_embedding_norm():
    config = config_from_hf(bert_config(layer_norm_eps=1e-12))
    assert (config.norm_first, config.embed_norm, config.position) == (False, True, "learned")
    assert (config.d_model, config.n_heads, config.n_layers, config.d_ff, config.max_len) == (64, 4, 2, 128, 32)
    assert (config.norm_eps, config.activation, config.dropout, config.bias) == (1e-12, "gelu", 0.0, True)


def test_unsupported_activation_is_refused_with_the_supported_names():
    with pytest.raises(ValueError, match="activation_function='quick_gelu'.*gelu_new"):
        config_from_hf(gpt2_config(activation_function="quick_gelu"))
    with pytest.raises(ValueError, match="hidden_act='silu'"):
        config_from_hf(bert_config(hidden_act="silu"))


@pytest.mark.parametrize("option,value", [("scale_attn_by_inverse_layer_idx", True), ("scale_attn_weights", False),
                                          ("add_cross_attention", True)])
def test_gpt2_options_kqv_cannot_represent_are_refused(option, value):
    with pytest.raises(ValueError, match=f"kqv cannot represent GPT-2.*{option}"):
        config_from_hf(gpt2_config(**{option: value}))


def test_bert_with_relative_position_embeddings_is_refused():
    config = bert_config()
    config.position_embedding_type = "relative_key"  # older transformers versions; the option must not pass silently
    with pytest.raises(ValueError, match="position_embedding_type"):
        config_from_hf(config)


def test_unsupported_architecture_is_refused_with_the_list_of_supported_ones():
    from transformers import BertForSequenceClassification, T5Config

    for bad in (lambda: config_from_hf(T5Config(num_layers=1, d_model=8, num_heads=2, d_kv=4, d_ff=8)),
                lambda: from_hf(BertForSequenceClassification(bert_config()))):
        with pytest.raises(ValueError) as error:
            bad()
        message = str(error.value)
        assert "supported architectures" in message
        for name in ("GPT2LMHeadModel", "BertModel", "BertForMaskedLM", "DecoderLM", "Encoder"):
            assert name in message
    assert "BertForSequenceClassification" in message


# ---------------------------------------------------------------------------------------------------------------
# Weight conversion


def test_converted_model_is_in_eval_mode_with_tied_embeddings():
    torch.manual_seed(0)
    model = from_hf(hf_gpt2().train())
    assert isinstance(model, kqv.DecoderLM) and not model.training
    assert model.lm_head.weight is model.decoder.embeddings.tokens.weight


def test_gpt2_attention_weights_are_split_into_queries_and_stacked_keys_values():
    torch.manual_seed(0)
    hf = hf_gpt2()
    attention = from_hf(hf).decoder.blocks[1].self_attention
    c_attn = hf.transformer.h[1].attn.c_attn  # Conv1D: y = x @ W + b with W (64, 192) = [q | k | v]
    x = torch.randn(5, 64)
    with torch.no_grad():
        queries, keys, values = c_attn(x).split(64, dim=-1)
        assert torch.allclose(attention.to_queries(x), queries, atol=1e-6)
        assert torch.allclose(attention.to_keys_values(x), torch.cat((keys, values), dim=-1), atol=1e-6)


def test_bert_token_type_zero_is_folded_into_the_position_table():
    torch.manual_seed(0)
    hf = hf_bert()
    model = from_hf(hf)
    embeddings = hf.embeddings
    expected = embeddings.position_embeddings.weight + embeddings.token_type_embeddings.weight[0]
    assert torch.equal(model.embeddings.positions.embedding.weight, expected)
    ids = torch.randint(1, 97, (2, 9))
    with torch.no_grad():
        explicit = hf(ids, token_type_ids=torch.zeros_like(ids)).last_hidden_state
        assert torch.allclose(model(ids), explicit, atol=1e-5)
        second_segment = hf(ids, token_type_ids=torch.ones_like(ids)).last_hidden_state
        assert not torch.allclose(model(ids), second_segment, atol=1e-3)  # documented limit: type 1 is lost


# ---------------------------------------------------------------------------------------------------------------
# Loading from a directory


@torch.no_grad()
def test_gpt2_directory_with_safetensors_gives_the_same_logits(tmp_path):
    torch.manual_seed(0)
    hf = hf_gpt2()
    hf.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    ids = torch.randint(0, 97, (2, 10))
    model = from_hf(tmp_path)
    torch.testing.assert_close(model(ids), hf(ids).logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(from_hf(str(tmp_path))(ids), model(ids), atol=0, rtol=0)


@torch.no_grad()
def test_bert_directory_with_safetensors_gives_the_same_hidden_states(tmp_path):
    torch.manual_seed(0)
    hf = hf_bert()
    hf.save_pretrained(tmp_path)
    ids = torch.randint(1, 97, (2, 10))
    torch.testing.assert_close(from_hf(tmp_path)(ids), hf(ids).last_hidden_state, atol=1e-5, rtol=0)


@torch.no_grad()
def test_sharded_safetensors_directory_gives_the_same_logits(tmp_path):
    torch.manual_seed(0)
    hf = hf_gpt2()
    hf.save_pretrained(tmp_path, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").is_file() and not (tmp_path / "model.safetensors").exists()
    ids = torch.randint(0, 97, (2, 10))
    torch.testing.assert_close(from_hf(tmp_path)(ids), hf(ids).logits, atol=1e-5, rtol=0)


def test_directory_with_only_a_pickled_checkpoint_is_refused_without_unpickling(tmp_path, monkeypatch):
    gpt2_config().save_pretrained(tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"not to be unpickled")

    def no_unpickling(*args, **kwargs):
        raise AssertionError("torch.load was called")

    monkeypatch.setattr(torch, "load", no_unpickling)
    with pytest.raises(ValueError, match="only pytorch_model.bin.*safetensors only"):
        from_hf(tmp_path)


def test_directory_without_config_is_refused(tmp_path):
    save_file({"wte.weight": torch.zeros(2, 2)}, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="no config.json"):
        from_hf(tmp_path)


def test_weight_kqv_has_no_place_for_is_refused(tmp_path):
    hf_gpt2().save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    save_file({**weights, "transformer.h.0.attn.q_norm.weight": torch.ones(64)}, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=r"no place for: \['h.0.attn.q_norm.weight'\]"):
        from_hf(tmp_path)


def test_missing_weight_is_reported_by_name(tmp_path):
    hf_gpt2().save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    del weights["transformer.h.1.ln_2.bias"]
    save_file(weights, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="no weight 'h.1.ln_2.bias'"):
        from_hf(tmp_path)


def test_directory_of_an_unsupported_architecture_is_refused(tmp_path):
    hf_gpt2().save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "architectures": ["GPT2ForSequenceClassification"]}))
    with pytest.raises(ValueError, match="cannot convert GPT2ForSequenceClassification; supported architectures"):
        from_hf(tmp_path)


def test_kqv_interop_imports_transformers_only_inside_functions():
    tree = ast.parse(Path(kqv.interop.__file__).read_text())
    top_level = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    names = [alias.name for node in top_level for alias in node.names] + [
        node.module for node in top_level if isinstance(node, ast.ImportFrom) and node.module]
    assert not [name for name in names if name.split(".")[0] == "transformers"]
    inside = [node for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module == "transformers"]
    assert inside  # it is used, lazily
