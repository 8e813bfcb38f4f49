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

    return GPT2Config(
        **{
            **dict(
                n_layer=2,
                n_embd=64,
                n_head=4,
                vocab_size=97,
                n_positions=32,
                bos_token_id=0,
                eos_token_id=0,
                attn_implementation="eager",
            ),
            **changes,
        }
    )


def bert_config(**changes):
    from transformers import BertConfig

    return BertConfig(
        **{
            **dict(
                num_hidden_layers=2,
                hidden_size=64,
                num_attention_heads=4,
                intermediate_size=128,
                vocab_size=97,
                max_position_embeddings=32,
                pad_token_id=0,
                attn_implementation="eager",
            ),
            **changes,
        }
    )


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
        vocab_size=97,
        d_model=64,
        n_heads=4,
        n_layers=2,
        d_ff=100,
        max_len=32,
        dropout=0.0,
        position="learned",
        norm="layernorm",
        norm_first=True,
        norm_eps=1e-6,
        activation="gelu_tanh",
        bias=True,
        tie_embeddings=True,
        embed_norm=False,
        scale_embeddings=False,
    )
    assert config_from_hf(gpt2_config()).d_ff == 4 * 64  # n_inner=None means 4 * n_embd


@pytest.mark.parametrize(
    "hf_name,kqv_name",
    [("gelu_new", "gelu_tanh"), ("gelu_pytorch_tanh", "gelu_tanh"), ("gelu", "gelu"), ("relu", "relu")],
)
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
    with pytest.raises(ValueError, match="hidden_act='mish'"):
        config_from_hf(bert_config(hidden_act="mish"))


@pytest.mark.parametrize(
    "option,value",
    [("scale_attn_by_inverse_layer_idx", True), ("scale_attn_weights", False), ("add_cross_attention", True)],
)
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

    for bad in (
        lambda: config_from_hf(T5Config(num_layers=1, d_model=8, num_heads=2, d_kv=4, d_ff=8)),
        lambda: from_hf(BertForSequenceClassification(bert_config())),
    ):
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
    trees = [ast.parse(path.read_text()) for path in Path(kqv.interop.__file__).parent.glob("*.py")]
    top_level = [node for tree in trees for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    names = [alias.name for node in top_level for alias in node.names] + [
        node.module for node in top_level if isinstance(node, ast.ImportFrom) and node.module
    ]
    assert not [name for name in names if name.split(".")[0] == "transformers"]
    inside = [
        node
        for tree in trees
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "transformers"
    ]
    assert inside  # it is used, lazily


# ---------------------------------------------------------------------------------------------------------------
# Both ways, for every supported architecture: to_hf(from_hf(m)) is m, and kqv's logits are Hugging Face's.
# Every parameter and buffer is random first (biases, norm gains, BART's unused position rows, the logit bias), so a
# tensor copied to the wrong place or dropped shows up.


def marian_config(**changes):
    from transformers import MarianConfig

    return MarianConfig(
        **{
            **dict(
                vocab_size=97,
                d_model=64,
                encoder_layers=2,
                decoder_layers=3,
                encoder_attention_heads=4,
                decoder_attention_heads=4,
                encoder_ffn_dim=128,
                decoder_ffn_dim=128,
                max_position_embeddings=32,
                pad_token_id=96,
                decoder_start_token_id=96,
                eos_token_id=0,
                activation_function="swish",
                scale_embedding=True,
            ),
            **changes,
        }
    )


def bart_config(**changes):
    from transformers import BartConfig

    return BartConfig(
        **{
            **dict(
                vocab_size=97,
                d_model=64,
                encoder_layers=3,
                decoder_layers=2,
                encoder_attention_heads=4,
                decoder_attention_heads=4,
                encoder_ffn_dim=128,
                decoder_ffn_dim=128,
                max_position_embeddings=32,
            ),
            **changes,
        }
    )


def randomized(model):
    """Every trainable parameter and every float buffer random (gains near 1); fixed tables (Marian's sinusoids,
    which have requires_grad=False) stay as they are."""
    with torch.no_grad():
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            if tensor.requires_grad or name.endswith("final_logits_bias"):
                is_gain = tensor.dim() == 1 and name.endswith("weight")
                tensor.copy_(1 + 0.1 * torch.randn_like(tensor) if is_gain else 0.1 * torch.randn_like(tensor))
    return model.eval()


def hf_model(kind: str, **changes):
    import transformers

    config = {
        "GPT2LMHeadModel": gpt2_config,
        "BertModel": bert_config,
        "BertForMaskedLM": bert_config,
        "MarianMTModel": marian_config,
        "BartForConditionalGeneration": bart_config,
    }[kind](**changes)
    return randomized(getattr(transformers, kind)(config))


CASES = {
    "gpt2": ("GPT2LMHeadModel", {}),
    "gpt2_untied": ("GPT2LMHeadModel", {"tie_word_embeddings": False}),
    "bert": ("BertModel", {}),
    "bert_relu": ("BertModel", {"hidden_act": "relu"}),
    "bert_mlm": ("BertForMaskedLM", {}),
    "bert_mlm_untied": ("BertForMaskedLM", {"tie_word_embeddings": False}),
    "marian": ("MarianMTModel", {}),
    "marian_separate_vocabularies": (
        "MarianMTModel",
        {
            "share_encoder_decoder_embeddings": False,
            "decoder_vocab_size": 53,
            "pad_token_id": 52,
            "decoder_start_token_id": 52,
        },
    ),
    "marian_untied": ("MarianMTModel", {"tie_word_embeddings": False}),
    "bart": ("BartForConditionalGeneration", {}),
    "bart_untied_scaled": ("BartForConditionalGeneration", {"tie_word_embeddings": False, "scale_embedding": True}),
}
KQV_CLASSES = {
    "GPT2LMHeadModel": kqv.DecoderLM,
    "BertModel": kqv.Encoder,
    "BertForMaskedLM": kqv.MaskedLM,
    "MarianMTModel": kqv.EncoderDecoder,
    "BartForConditionalGeneration": kqv.EncoderDecoder,
}


def inputs(kind: str, hf, padded: bool):
    """(kqv outputs, Hugging Face outputs, mask of the positions to compare) for a batch of 3 with padding:
    sources (and encoder inputs) have a right-padded and a left-padded row; decoder inputs are right-padded."""
    gen = torch.Generator().manual_seed(1)
    src, tgt = torch.randint(1, 50, (3, 11), generator=gen), torch.randint(1, 50, (3, 7), generator=gen)
    src_mask, tgt_mask = torch.ones(3, 11, dtype=torch.long), torch.ones(3, 7, dtype=torch.long)
    if padded:
        src_mask[1, -3:], src_mask[2, :2], tgt_mask[1, -2:] = 0, 0, 0
    ours = from_hf(hf)
    if kind == "GPT2LMHeadModel":
        return ours(tgt, attention_mask=tgt_mask), hf(tgt, attention_mask=tgt_mask).logits, tgt_mask
    if kind == "BertModel":
        return ours(src, src_mask), hf(src, attention_mask=src_mask).last_hidden_state, src_mask
    if kind == "BertForMaskedLM":
        return ours(src, attention_mask=src_mask), hf(src, attention_mask=src_mask).logits, src_mask
    expected = hf(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt, decoder_attention_mask=tgt_mask)
    return ours(src, tgt, src_mask=src_mask, tgt_mask=tgt_mask), expected.logits, tgt_mask


def assert_same_state_dict(ours, reference):
    ours, reference = ours.state_dict(), reference.state_dict()
    assert sorted(ours) == sorted(reference)
    different = [name for name in reference if not torch.equal(ours[name], reference[name])]
    assert not different


@pytest.mark.parametrize("case", CASES)
def test_to_hf_of_from_hf_gives_back_the_same_state_dict(case):
    torch.manual_seed(0)
    kind, changes = CASES[case]
    hf = hf_model(kind, **changes)
    ours = from_hf(hf)
    assert type(ours) is KQV_CLASSES[kind]
    back = kqv.interop.to_hf(ours)
    assert type(back) is type(hf) and not back.training
    assert_same_state_dict(back, hf)


@pytest.mark.parametrize("padded", [False, True], ids=["no_padding", "padding"])
@pytest.mark.parametrize("case", CASES)
@torch.no_grad()
def test_kqv_outputs_equal_hugging_face_at_every_real_position(case, padded):
    torch.manual_seed(0)
    kind, changes = CASES[case]
    ours, expected, real = inputs(kind, hf_model(kind, **changes), padded)
    assert ours.shape == expected.shape
    torch.testing.assert_close(ours[real.bool()], expected[real.bool()], atol=1e-5, rtol=0)


@pytest.mark.parametrize("case", ["marian", "marian_separate_vocabularies", "bart", "bert_mlm"])
@torch.no_grad()
def test_seq2seq_and_masked_lm_directories_load_with_the_same_logits(case, tmp_path):
    torch.manual_seed(0)
    kind, changes = CASES[case]
    hf = hf_model(kind, **changes)
    hf.save_pretrained(tmp_path)
    ours, expected, real = inputs(kind, hf, padded=True)
    from_dir = from_hf(tmp_path)
    assert type(from_dir) is KQV_CLASSES[kind]
    assert_same_state_dict(from_dir, from_hf(hf))
    assert_same_state_dict(kqv.interop.to_hf(from_dir), hf)


def test_marian_config_becomes_a_post_ln_sinusoidal_encoder_decoder_config():
    config = config_from_hf(marian_config())
    assert (config.position, config.norm_first, config.scale_embeddings, config.embed_norm) == (
        "sinusoidal",
        False,
        True,
        False,
    )
    assert (config.activation, config.output_bias, config.tgt_vocab_size, config.tie_embeddings) == (
        "silu",
        True,
        None,
        True,
    )
    assert (config.encoder_layers, config.decoder_layers, config.d_ff, config.max_len) == (2, 3, 128, 32)
    separate = config_from_hf(marian_config(share_encoder_decoder_embeddings=False, decoder_vocab_size=53))
    assert separate.tgt_vocab_size == 53


def test_bart_config_becomes_a_post_ln_learned_position_encoder_decoder_with_embedding_norms():
    config = config_from_hf(bart_config())
    assert (config.position, config.norm_first, config.scale_embeddings, config.embed_norm) == (
        "learned",
        False,
        False,
        True,
    )
    assert (config.activation, config.output_bias, config.max_len, config.norm_eps) == ("gelu", True, 32, 1e-5)


def test_bart_positions_skip_the_two_offset_rows_and_keep_them_for_export():
    torch.manual_seed(0)
    hf = hf_model("BartForConditionalGeneration")
    ours = from_hf(hf)
    table = hf.model.encoder.embed_positions.weight
    assert torch.equal(ours.encoder.embeddings.positions.embedding.weight, table[2:])
    assert torch.equal(ours.hf_origin.kept["encoder.embed_positions.weight"][:2], table[:2])


def test_marian_with_encoder_and_decoder_of_different_widths_is_refused():
    with pytest.raises(ValueError, match="encoder_ffn_dim=128 and decoder_ffn_dim=256.*share one d_ff"):
        config_from_hf(marian_config(decoder_ffn_dim=256))
    with pytest.raises(ValueError, match="encoder_attention_heads=4 and decoder_attention_heads=8"):
        config_from_hf(bart_config(decoder_attention_heads=8))


def test_marian_with_a_changed_sinusoid_table_is_refused():
    hf = hf_model("MarianMTModel")
    with torch.no_grad():
        hf.model.encoder.embed_positions.weight.add_(0.1)
    with pytest.raises(ValueError, match="encoder.embed_positions.weight is not the fixed table kqv computes"):
        from_hf(hf)


# ---------------------------------------------------------------------------------------------------------------
# Exporting models that kqv trained (no Hugging Face origin)


def exportable(kind: str, **changes) -> torch.nn.Module:
    base = dict(vocab_size=97, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_len=32, dropout=0.1)
    configs = {
        "DecoderLM": dict(position="learned", norm_first=True, activation="gelu_tanh"),
        "Encoder": dict(position="learned", norm_first=False, embed_norm=True, activation="gelu"),
        "MaskedLM": dict(position="learned", norm_first=False, embed_norm=True, activation="gelu"),
        "Marian": dict(
            position="sinusoidal",
            norm_first=False,
            scale_embeddings=True,
            output_bias=True,
            activation="silu",
            n_decoder_layers=3,
        ),
        "BART": dict(position="learned", norm_first=False, embed_norm=True, output_bias=True, activation="gelu"),
    }
    cls = {"Marian": kqv.EncoderDecoder, "BART": kqv.EncoderDecoder}.get(kind) or getattr(kqv, kind)
    model = cls(kqv.ModelConfig(**{**base, **configs[kind], **changes}))
    return randomized(model)


@pytest.mark.parametrize(
    "kind,hf_class",
    [
        ("DecoderLM", "GPT2LMHeadModel"),
        ("Encoder", "BertModel"),
        ("MaskedLM", "BertForMaskedLM"),
        ("Marian", "MarianMTModel"),
        ("BART", "BartForConditionalGeneration"),
    ],
)
@torch.no_grad()
def test_a_kqv_trained_model_exports_with_the_same_outputs(kind, hf_class):
    torch.manual_seed(0)
    ours = exportable(kind)
    hf = kqv.interop.to_hf(ours)
    assert type(hf).__name__ == hf_class
    src, tgt = torch.randint(0, 97, (2, 9)), torch.randint(0, 97, (2, 6))
    if kind in ("Marian", "BART"):
        expected, got = hf(input_ids=src, decoder_input_ids=tgt).logits, ours(src, tgt)
    elif kind == "Encoder":
        expected, got = hf(src).last_hidden_state, ours(src)
    else:
        expected, got = hf(src).logits, ours(src)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    assert_same_state_dict(from_hf(hf), ours)  # and back


@torch.no_grad()
def test_a_bert_changed_after_import_exports_its_changed_positions():
    torch.manual_seed(0)
    ours = from_hf(hf_model("BertModel"))
    ours.embeddings.positions.embedding.weight.add_(0.5)  # as fine-tuning would
    ids = torch.randint(1, 97, (2, 10))
    torch.testing.assert_close(kqv.interop.to_hf(ours)(ids).last_hidden_state, ours(ids), atol=1e-5, rtol=0)


def test_to_hf_names_every_option_the_target_cannot_represent():
    with pytest.raises(
        ValueError,
        match="position='rope'.*cannot become a GPT2LMHeadModel, which needs position='learned': "
        "train one with --set model.position=learned ",
    ):
        kqv.interop.to_hf(exportable("DecoderLM", position="rope"), "GPT2LMHeadModel")
    with pytest.raises(ValueError, match="train one with --set model.norm_first=true --set model.bias=true "):
        kqv.interop.to_hf(exportable("DecoderLM", norm_first=False, bias=False))
    with pytest.raises(ValueError, match="activation='swiglu' cannot become a BertModel"):
        kqv.interop.to_hf(exportable("Encoder", activation="swiglu"))
    with pytest.raises(ValueError, match="cannot become a MarianMTModel, which needs position='sinusoidal'") as error:
        kqv.interop.to_hf(exportable("Marian", position="relative"))  # the nearest class: BART needs more changed
    assert "position='relative'" in str(error.value) and "Bart" not in str(error.value)


def test_to_hf_of_a_model_without_a_hugging_face_class_lists_the_supported_ones():
    classifier = kqv.SequenceClassifier(kqv.ModelConfig(vocab_size=10, d_model=8, n_heads=2, n_layers=1, d_ff=8), 2)
    with pytest.raises(ValueError, match="not SequenceClassifier; supported architectures: GPT2LMHeadModel"):
        kqv.interop.to_hf(classifier)


def test_encoder_decoder_exports_to_the_architecture_asked_for():
    model = exportable("BART")
    with pytest.raises(ValueError, match="cannot become a MarianMTModel, which needs position='sinusoidal'"):
        kqv.interop.to_hf(model, "MarianMTModel")
    with pytest.raises(ValueError, match="cannot become a GPT2LMHeadModel; it can become MarianMTModel or Bart"):
        kqv.interop.to_hf(model, "GPT2LMHeadModel")
