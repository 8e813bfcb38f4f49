"""The Vision Transformer (kqv.nn.vision): patches, the [CLS] classifier, its baselines and their input checks."""

import json

import pytest
import torch

from conftest import tiny_config
from kqv import ModelConfig
from kqv.data.digits import split_indices
from kqv.nn.experts import routing_metrics
from kqv.nn.vision import ConvClassifier, MLPClassifier, PatchEmbedding, ViT, extract_patches


def vit_config(**changes) -> ModelConfig:
    return tiny_config(**{"vocab_size": 1, "max_len": 17, "position": "learned", **changes})


def test_patches_of_a_hand_computed_image():
    image = torch.arange(16.0).view(1, 1, 4, 4)  # rows 0-3, 4-7, 8-11, 12-15
    expected = torch.tensor([[[0.0, 1, 4, 5], [2, 3, 6, 7], [8, 9, 12, 13], [10, 11, 14, 15]]])
    assert torch.equal(extract_patches(image, 2), expected)


def test_patches_of_a_two_channel_image_put_the_channel_first():
    image = torch.stack([torch.arange(8.0).view(2, 4), 100 + torch.arange(8.0).view(2, 4)])[None]  # (1, 2, 2, 4)
    expected = torch.tensor([[[0.0, 1, 4, 5, 100, 101, 104, 105], [2, 3, 6, 7, 102, 103, 106, 107]]])
    assert torch.equal(extract_patches(image, 2), expected)


def test_projected_patches_equal_a_convolution_with_kernel_and_stride_of_a_patch():
    embedding = PatchEmbedding((3, 8, 12), 4, 16)
    conv = torch.nn.Conv2d(3, 16, kernel_size=4, stride=4)
    with torch.no_grad():
        conv.weight.copy_(embedding.to_vectors.weight.view(16, 3, 4, 4))
        conv.bias.copy_(embedding.to_vectors.bias)
    images = torch.randn(2, 3, 8, 12)
    expected = conv(images).flatten(2).transpose(1, 2)  # (batch, 2 * 3 patches, 16), row by row
    vectors = embedding(images)
    assert vectors.shape == (2, 1 + 6, 16)
    torch.testing.assert_close(vectors[:, 1:], expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(vectors[:, 0], embedding.cls[0].expand(2, -1))


@pytest.mark.parametrize("shape", [(4, 8, 8), (4, 3, 8, 8), (4, 1, 7, 8), (0, 1, 8, 8), (4, 1, 8, 8, 1)])
def test_a_bad_image_shape_is_a_clear_error_naming_the_expected_shape(shape):
    model = ViT(vit_config(), (1, 8, 8), 2, 10)
    message = r"images must have shape \(batch, channels, height, width\) = \(batch, 1, 8, 8\), got " + str(
        shape
    ).replace("(", r"\(").replace(")", r"\)")
    with pytest.raises(ValueError, match=message):
        model(torch.rand(shape))


def test_a_missing_channel_dimension_gets_a_hint():
    with pytest.raises(ValueError, match=r"add the channel dimension with images\[:, None\]"):
        ViT(vit_config(), (1, 8, 8), 2, 10)(torch.rand(4, 8, 8))


def test_integer_pixels_are_a_type_error_with_the_conversion():
    with pytest.raises(TypeError, match=r"floating-point pixel values, got torch.uint8.*images.float\(\) / 255"):
        ViT(vit_config(), (1, 8, 8), 2, 10)(torch.zeros(2, 1, 8, 8, dtype=torch.uint8))


@pytest.mark.parametrize(
    "image_shape, patch_size, message",
    [
        ((1, 8, 8), 3, r"patch_size 3 does not tile a 8x8 image; choose one of \[1, 2, 4, 8\]"),
        ((8, 8), 2, r"image_shape must be \(channels, height, width\)"),
        ((1, 8, 8), 0, "patch_size must be a positive integer"),
    ],
)
def test_bad_image_options_are_clear_errors(image_shape, patch_size, message):
    with pytest.raises(ValueError, match=message):
        ViT(vit_config(), image_shape, patch_size, 10)


def test_too_few_learned_positions_for_the_patches_is_a_clear_error():
    with pytest.raises(ValueError, match="64 patches \\+ \\[CLS\\], more than max_len=17.*raise max_len to 65"):
        ViT(vit_config(), (1, 8, 8), 1, 10)


def test_without_positions_the_class_ignores_where_the_patches_are():
    model = ViT(vit_config(position="none"), (1, 8, 8), 4, 10).eval()  # four 4x4 patches
    images = torch.rand(3, 1, 8, 8)
    swapped = images.clone()  # the top-left and bottom-right patches trade places
    swapped[..., :4, :4], swapped[..., 4:, 4:] = images[..., 4:, 4:], images[..., :4, :4]
    torch.testing.assert_close(model(swapped), model(images), atol=1e-5, rtol=1e-5)
    with_positions = ViT(vit_config(), (1, 8, 8), 4, 10).eval()
    assert not torch.allclose(with_positions(swapped), with_positions(images), atol=1e-4)


def test_the_class_is_read_from_the_cls_vector_only():
    model = ViT(vit_config(), (1, 8, 8), 2, 10).eval()
    images = torch.rand(2, 1, 8, 8)
    hidden, _ = model.run(images)
    torch.testing.assert_close(model(images), model.head.to_classes(hidden[:, 0]))


@pytest.mark.parametrize("ffn", ["dense", "switch"])
def test_gradients_reach_every_parameter_of_the_vit(ffn):
    model = ViT(vit_config(ffn=ffn, experts={"count": 2}), (1, 8, 8), 2, 10)
    for layer in model.modules():  # at initialisation nearly every token goes to one expert: spread the routes
        if hasattr(layer, "router"):
            torch.nn.init.normal_(layer.router.weight, std=1.0)
    loss = model(torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,)))
    loss.backward()
    missing = {n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0}
    # the logits read the last layer at [CLS] only, so there only the experts [CLS] went to can learn
    last = model.blocks[-1].feed_forward
    if ffn == "switch":
        cls_experts = set(last.stats.experts.view(17, 8)[0].tolist())  # tokens are (position, image)-ordered
        missing -= {
            f"blocks.1.feed_forward.experts.{i}.{name}"
            for i in set(range(2)) - cls_experts
            for name in ("up.weight", "up.bias", "down.weight", "down.bias")
        }
        assert routing_metrics(model)["aux_loss"] > 0
    assert not missing, f"no gradient reached {missing}"


def test_cls_attention_is_the_first_row_of_the_attention_over_the_patch_grid():
    model = ViT(vit_config(), (1, 8, 8), 2, 10).eval()
    images = torch.rand(2, 1, 8, 8)
    maps = model.cls_attention(images)
    weights = model.attention_weights(images)
    assert maps.shape == (2, 2, 4, 4, 4)  # (layers, batch, heads, grid rows, grid columns)
    # [CLS]'s weights over the 16 patches and over itself sum to 1
    torch.testing.assert_close(maps.flatten(-2).sum(-1) + torch.stack(weights)[..., 0, 0], torch.ones(2, 2, 4))
    torch.testing.assert_close(maps[0, 1, 2, 3, 1], weights[0][1, 2, 0, 1 + 3 * 4 + 1])  # patch row 3, column 1


@pytest.mark.parametrize("baseline", [MLPClassifier, ConvClassifier])
def test_baselines_classify_and_check_images_like_the_vit(baseline):
    model = baseline((1, 8, 8), 10)
    assert model(torch.rand(5, 1, 8, 8)).shape == (5, 10)
    assert model(torch.rand(5, 1, 8, 8), torch.randint(0, 10, (5,))).dim() == 0
    with pytest.raises(ValueError, match=r"\(batch, 1, 8, 8\), got \(5, 8, 8\)"):
        model(torch.rand(5, 8, 8))


def test_labels_of_the_wrong_shape_are_named():
    with pytest.raises(ValueError, match=r"labels must have shape \(4,\), one class per image"):
        ViT(vit_config(), (1, 8, 8), 2, 10)(torch.rand(4, 1, 8, 8), torch.zeros(4, 1, dtype=torch.long))


def test_embedded_images_equal_hugging_face_vit_embeddings_with_the_same_weights():
    transformers = pytest.importorskip("transformers")
    hf_config = transformers.ViTConfig(
        image_size=8,
        patch_size=2,
        num_channels=1,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    hf = transformers.models.vit.modeling_vit.ViTEmbeddings(hf_config).eval()
    torch.nn.init.normal_(hf.cls_token)
    torch.nn.init.normal_(hf.position_embeddings)
    model = ViT(vit_config(d_model=16, dropout=0.0, embed_norm=False), (1, 8, 8), 2, 10).eval()
    with torch.no_grad():
        model.patches.to_vectors.weight.copy_(hf.patch_embeddings.projection.weight.flatten(1))
        model.patches.to_vectors.bias.copy_(hf.patch_embeddings.projection.bias)
        model.patches.cls.copy_(hf.cls_token)
        model.embeddings.positions.embedding.weight.copy_(hf.position_embeddings[0])
    images = torch.randn(3, 1, 8, 8)
    ours = model.embeddings(images, torch.arange(17))
    torch.testing.assert_close(ours, hf(images), atol=1e-5, rtol=1e-5)


def test_kqv_train_vit_writes_a_run_whose_eval_prints_its_test_accuracy(tmp_path, capsys):
    from kqv.cli import main
    from kqv.jobs import load_run

    run = tmp_path / "vit"
    main(
        [
            "train",
            "vit",
            "--out",
            str(run),
            "--steps",
            "30",
            "--quiet",
            "--baseline",
            "conv",
            "--set",
            "model.d_model=32",
            "--set",
            "model.n_layers=1",
            "--set",
            "train.eval_every=15",
        ]
    )
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 30 and summary["baseline"] == "conv" and summary["test_images"] == 270
    assert 0.0 <= summary["test_accuracy"] <= 1.0 and 0.0 <= summary["baseline_test_accuracy"] <= 1.0
    assert 0.0 <= summary["baseline_test_accuracy_same_steps"] <= 1.0 and summary["baseline_steps"] >= 1
    assert isinstance(load_run(run).model, ViT)
    capsys.readouterr()
    main(["eval", str(run), "--json"])
    line, result = capsys.readouterr().out.strip().splitlines()
    assert json.loads(result)["test_accuracy"] == pytest.approx(summary["test_accuracy"])
    assert f"test accuracy {summary['test_accuracy']:.2%} on 270 held-out digits" in line
    main(["attention", str(run), "--out", str(tmp_path / "cls.png"), "--images", "2"])
    assert (tmp_path / "cls.png").stat().st_size > 0


def test_the_split_is_disjoint_and_covers_every_digit():
    parts = split_indices(100, 0.2, 0.1, seed=3)
    together = torch.cat(list(parts.values()))
    assert sorted(together.tolist()) == list(range(100))
    assert [len(parts[k]) for k in ("test", "val", "train")] == [10, 20, 70]
    with pytest.raises(ValueError, match="leave some training data"):
        split_indices(100, 0.5, 0.5, seed=0)


def test_a_vit_config_without_training_images_is_a_clear_error(tmp_path):
    from kqv.errors import ConfigError
    from kqv.jobs import get_job

    job = get_job("vit")
    with pytest.raises(ConfigError, match=r"must be in \(0, 1\) and leave some training images"):
        job.load_config("configs/vit-quick.toml", ["data.val_fraction=0.6", "data.test_fraction=0.5"])


@pytest.mark.parametrize("seconds, updates", [(5.5, 6), (1.5, 2)])
def test_the_baseline_trains_for_the_vit_s_time_and_reports_the_same_steps_too(monkeypatch, seconds, updates):
    """On a clock where every update takes one second, a budget of 5.5 s buys 6 updates (more than the ViT's 3) and
    1.5 s buys 2 (fewer: training goes on to the ViT's 3 for the same-steps accuracy)."""
    import itertools

    from kqv.jobs import vit

    config = vit.VitRunConfig.from_dict({"train": {"steps": 3, "batch_size": 8}})
    digits = vit.Digits.load(config.data, seed=0)
    clock = itertools.count()
    monkeypatch.setattr(vit.time, "perf_counter", lambda: float(next(clock)))
    result = vit.train_baseline("mlp", config, digits, seconds)
    assert result["baseline_steps"] == updates and result["baseline_seconds"] == float(updates)
    assert 0.0 <= result["baseline_test_accuracy"] <= 1.0 and 0.0 <= result["baseline_test_accuracy_same_steps"] <= 1.0
