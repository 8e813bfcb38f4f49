import pytest

from kqv import ModelConfig


def test_d_model_not_divisible_by_heads_is_rejected_with_divisors_suggested():
    with pytest.raises(ValueError, match=r"d_model \(100\) must be divisible by n_heads \(3\).*\[1, 2, 4, 5"):
        ModelConfig(vocab_size=10, d_model=100, n_heads=3)


@pytest.mark.parametrize("field", ["vocab_size", "d_model", "n_heads", "n_layers", "d_ff", "max_len"])
def test_non_positive_sizes_are_rejected(field):
    with pytest.raises(ValueError, match=f"{field} must be positive"):
        ModelConfig(**{"vocab_size": 10, field: 0})


@pytest.mark.parametrize("field,value", [("position", "absolute"), ("norm", "batchnorm"), ("activation", "tanh")])
def test_unknown_choice_lists_the_valid_ones(field, value):
    with pytest.raises(ValueError, match=f"{field} must be one of .*got '{value}'"):
        ModelConfig(vocab_size=10, **{field: value})


def test_wrong_type_is_a_type_error():
    with pytest.raises(TypeError, match="d_model must be int"):
        ModelConfig(vocab_size=10, d_model=32.0)
    with pytest.raises(TypeError, match="norm_first must be bool"):
        ModelConfig(vocab_size=10, norm_first="yes")


def test_dropout_outside_unit_interval_is_rejected():
    with pytest.raises(ValueError, match="dropout must be in"):
        ModelConfig(vocab_size=10, dropout=1.5)


def test_rope_needs_an_even_head_dim():
    with pytest.raises(ValueError, match="head_dim must be even"):
        ModelConfig(vocab_size=10, d_model=12, n_heads=4, position="rope")


def test_unknown_option_names_are_listed():
    with pytest.raises(ValueError, match=r"unknown ModelConfig option\(s\) \['n_head'\]"):
        ModelConfig.from_dict({"vocab_size": 10, "n_head": 4})


def test_config_round_trips_through_dict_and_toml():
    config = ModelConfig(
        vocab_size=99,
        d_model=48,
        n_heads=6,
        position="alibi",
        norm="rmsnorm",
        norm_first=False,
        activation="swiglu",
        tgt_vocab_size=77,
        dropout=0.25,
    )
    assert ModelConfig.from_dict(config.to_dict()) == config
    assert ModelConfig.from_toml(config.to_toml()) == config
    assert 'position = "alibi"' in config.to_toml()


def test_encoder_decoder_layer_counts_default_to_n_layers():
    config = ModelConfig(vocab_size=10, n_layers=3, n_decoder_layers=5)
    assert (config.encoder_layers, config.decoder_layers) == (3, 5)
    assert config.target_vocab_size == 10
