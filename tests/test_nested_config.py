"""Nested, typed configs: ModelConfig's per-kind sub-configs, the old flat option names, and RunConfig.model."""

import tomllib

import pytest
import tomli_w
import torch

from kqv import DecoderLM, Encoder, EncoderDecoder, MaskedLM, ModelConfig, RNNConfig, SequenceClassifier
from kqv.cli.main import packaged_config
from kqv.errors import ConfigError
from kqv.jobs import get_job
from kqv.jobs.mt import MTTrainConfig
from kqv.nn.config import OLD_NAMES, BigBirdConfig, ExpertsConfig, LinformerConfig
from kqv.nn.rnn import RNNEncoderDecoder
from kqv.nn.vision import ViT

BASE = {"vocab_size": 37, "d_model": 32, "n_heads": 4, "n_layers": 2, "d_ff": 64, "max_len": 64}

# Each kind in the flat form of kqv before the sub-tables, and the same config written nested.
KINDS = {
    "relative": (
        {"position": "relative", "max_relative_distance": 4, "relative_values": False},
        {"position": "relative", "relative": {"max_distance": 4, "values": False}},
    ),
    "linformer": (
        {"attention": "linformer", "linformer_k": 16, "linformer_sharing": "layerwise"},
        {"attention": "linformer", "linformer": {"k": 16, "sharing": "layerwise"}},
    ),
    "bigbird": (
        {
            "attention": "bigbird",
            "bigbird_block": 8,
            "bigbird_window": 2,
            "bigbird_global": 0,
            "bigbird_random": 1,
            "bigbird_seed": 5,
        },
        {
            "attention": "bigbird",
            "bigbird": {"block": 8, "window": 2, "global_blocks": 0, "random_blocks": 1, "seed": 5},
        },
    ),
    "local": ({"attention": "local", "local_block": 16}, {"attention": "local", "local": {"block": 16}}),
    "memory_compressed": (
        {"attention": "memory_compressed", "compression": 4},
        {"attention": "memory_compressed", "memory_compressed": {"compression": 4}},
    ),
    "dmca": (
        {"layer_pattern": "local,memory_compressed", "local_block": 8, "compression": 2},
        {"layer_pattern": "local,memory_compressed", "local": {"block": 8}, "memory_compressed": {"compression": 2}},
    ),
    "switch": (
        {"ffn": "switch", "n_experts": 4, "capacity_factor": 2.0, "aux_loss_coefficient": 0.1, "moe_every": 2},
        {"ffn": "switch", "experts": {"count": 4, "capacity_factor": 2.0, "aux_loss_coefficient": 0.1, "every": 2}},
    ),
    "moe": ({"ffn": "moe", "n_experts": 3, "top_k": 3}, {"ffn": "moe", "experts": {"count": 3, "top_k": 3}}),
}


@pytest.mark.parametrize("kind", KINDS)
def test_old_flat_options_load_to_the_nested_config(kind):
    flat, nested = KINDS[kind]
    old, new = ModelConfig.from_dict({**BASE, **flat}), ModelConfig.from_dict({**BASE, **nested})
    assert old == new
    assert old != ModelConfig.from_dict(BASE)  # the options were read, not dropped
    assert ModelConfig.from_toml(tomli_w.dumps({**BASE, **flat})) == new
    written = tomllib.loads(new.to_toml())
    assert not set(written) & set(OLD_NAMES)  # written nested, never flat
    assert ModelConfig.from_dict(written) == new


@pytest.mark.parametrize("kind", KINDS)
def test_old_flat_keyword_names_of_model_config_work_with_a_deprecation_warning(kind):
    """Issue 35: `kqv.ModelConfig(ffn="switch", n_experts=4)`, Python written for the previous release, was a
    TypeError; it is translated as a [model] table is (`from_dict`, one table: OLD_NAMES), and warned about."""
    flat, nested = KINDS[kind]
    with pytest.warns(DeprecationWarning, match="deprecated") as warned:
        config = ModelConfig(**BASE, **flat)
    old = [name for name in flat if name in OLD_NAMES]
    message = str(warned[0].message)
    assert all(f"{name}= is now {OLD_NAMES[name][0]}=" in message for name in old), message
    assert warned[0].filename == __file__  # it points at the caller's line
    assert config == ModelConfig.from_dict({**BASE, **flat}) == ModelConfig(**BASE, **nested)
    with pytest.warns(DeprecationWarning, match="ModelConfig.replace"):
        assert ModelConfig(**BASE).replace(**flat) == config


def test_an_old_keyword_name_beside_its_new_spelling_is_a_config_error_naming_both():
    with (
        pytest.warns(DeprecationWarning),
        pytest.raises(ConfigError, match="n_experts is the old name of experts.count"),
    ):
        ModelConfig(**BASE, ffn="switch", n_experts=4, experts={"count": 2})


@pytest.mark.parametrize("kind", KINDS)
def test_an_old_flat_run_toml_of_each_kind_loads_unchanged(kind, tmp_path):
    """A run.toml of the flat form (as kqv wrote before the sub-tables) gives the config of the nested form."""
    flat, nested = KINDS[kind]
    values = tomllib.loads(packaged_config("quick").read_text())
    old_run = {**values, "task": "lm", "model": {**BASE, **flat}}
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.toml").write_text(tomli_w.dumps(old_run))
    job = get_job("lm")
    assert job.model_config_of_run(old_run) == ModelConfig.from_dict({**BASE, **nested})
    config = job.read_config(run_dir)
    assert config.model == ModelConfig.from_dict({**BASE, **nested, "vocab_size": None})


@pytest.mark.parametrize(
    "flat, nested",
    [
        ("linformer_k", {"linformer": {"k": 8}}),
        ("n_experts", {"experts": {"count": 2}}),
        ("max_relative_distance", {"relative": {"max_distance": 2}}),
    ],
)
def test_a_flat_option_with_its_nested_twin_is_an_error_saying_which_to_keep(flat, nested):
    table, name = OLD_NAMES[flat]
    with pytest.raises(
        ConfigError,
        match=rf"{flat} is the old name of {table}\.{name}.*keep {table}\.{name}.*"
        rf"remove {flat}",
    ):
        ModelConfig.from_dict({**BASE, flat: 4, **nested})


def test_every_old_name_points_at_a_field_of_its_sub_config():
    config = ModelConfig()
    for old, (table, name) in OLD_NAMES.items():
        assert hasattr(getattr(config, table), name), old
        assert not hasattr(config, old)


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.linformer.k=0", "model.linformer.k must be positive"),
        ("model.bigbird.window=-1", "model.bigbird.window must be >= 0"),
        ("model.experts.capacity_factor=0.0", "model.experts.capacity_factor must be positive"),
        ("model.memory_compressed.compression=1", "model.memory_compressed.compression must be at least 2"),
        (
            "model.linformer.kk=3",
            r"unknown \[linformer\] option\(s\) \['kk'\] \(did you mean 'k'\?\); valid options are \['k', 'sharing'\]",
        ),
        ("model.n_heads=3", r"d_model \(256\) must be divisible by n_heads \(3\)"),
    ],
)
def test_a_bad_model_option_fails_when_the_run_config_is_read(override, message):
    with pytest.raises(ConfigError, match=message):
        get_job("lm").load_config(packaged_config("quick"), [override])


def test_run_config_model_is_a_model_config_with_the_job_defaults_from_other_sections():
    job = get_job("lm")
    config = job.load_config(
        packaged_config("quick"), ["data.context=96", "model.attention=linformer", "model.linformer.k=48"]
    )
    assert isinstance(config.model, ModelConfig)
    assert config.model.vocab_size is None  # the tokenizer decides it
    assert config.model.max_len == 96  # the LM's max_len defaults to data.context
    assert config.model.linformer == LinformerConfig(k=48)
    assert job.load_config(packaged_config("quick"), ["data.context=96", "model.max_len=200"]).model.max_len == 200
    assert get_job("mlm").load_config(packaged_config("quick", "mlm"), ["data.context=80"]).model.max_len == 80


def test_mt_label_smoothing_is_a_typed_train_option_and_the_model_follows_its_kind():
    job = get_job("mt")
    config = job.load_config(packaged_config("quick", "mt"), ["train.label_smoothing=0.2"])
    assert isinstance(config.train, MTTrainConfig) and config.train.label_smoothing == 0.2
    assert config.to_dict()["train"]["label_smoothing"] == 0.2 and "label_smoothing" not in config.to_dict()
    assert isinstance(config.model, ModelConfig) and config.model.max_len == config.data.max_len
    assert type(config).from_dict(config.to_dict()) == config
    with pytest.raises(ConfigError, match=r"train.label_smoothing must be in \[0, 1\), got 1.5"):
        job.load_config(packaged_config("quick", "mt"), ["train.label_smoothing=1.5"])
    lstm = job.load_config(packaged_config("lstm", "mt"))
    assert isinstance(lstm.model, RNNConfig) and lstm.kind == "lstm"
    assert type(lstm).from_dict(lstm.to_dict()) == lstm
    with pytest.raises(ConfigError, match="unknown RNNConfig option"):
        job.load_config(packaged_config("lstm", "mt"), ["model.n_heads=2"])


def test_to_dict_writes_the_sub_tables_of_the_kinds_in_use():
    dense = ModelConfig(**BASE)
    assert not {"relative", "linformer", "bigbird", "local", "memory_compressed", "experts"} & set(dense.to_dict())
    switch = ModelConfig(**BASE, ffn="switch", experts={"count": 2})
    assert switch.to_dict()["experts"] == ExpertsConfig(count=2).to_dict()
    assert "linformer" not in switch.to_dict()
    assert ModelConfig.from_dict(switch.to_dict()) == switch
    unused = ModelConfig(**BASE, linformer={"k": 8})  # not in use, but not the default: kept so it round-trips
    assert unused.to_dict()["linformer"] == {"k": 8, "sharing": "headwise"}
    assert ModelConfig.from_dict(unused.to_dict()) == unused


def test_replace_changes_one_option_of_a_sub_config_and_keeps_the_others():
    config = ModelConfig(**BASE, attention="bigbird", bigbird={"block": 8, "seed": 3})
    assert config.replace(bigbird={"window": 2}).bigbird == BigBirdConfig(block=8, window=2, seed=3)
    with pytest.warns(DeprecationWarning, match="bigbird_window= is now bigbird="):
        assert config.replace(bigbird_window=2) == config.replace(bigbird={"window": 2})
    assert config.replace(bigbird=BigBirdConfig()).bigbird == BigBirdConfig()


@pytest.mark.parametrize(
    "build",
    [DecoderLM, Encoder, EncoderDecoder, MaskedLM, lambda c: SequenceClassifier(c, 2)],
    ids=["DecoderLM", "Encoder", "EncoderDecoder", "MaskedLM", "SequenceClassifier"],
)
def test_models_refuse_a_config_whose_vocab_size_is_undecided(build):
    with pytest.raises(ConfigError, match=r"vocab_size is None.*replace\(vocab_size="):
        build(ModelConfig(**{**BASE, "vocab_size": None}))


def test_the_rnn_baseline_refuses_an_undecided_vocab_size_and_a_vit_needs_none():
    with pytest.raises(ConfigError, match="vocab_size is None"):
        RNNEncoderDecoder(RNNConfig(d_embed=8, d_hidden=16))
    vit = ViT(ModelConfig(**{**BASE, "vocab_size": None, "max_len": 17}), (1, 8, 8), 2, 10)
    assert vit(torch.zeros(3, 1, 8, 8)).shape == (3, 10)
