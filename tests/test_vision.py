"""The Vision Transformer (kqv.nn.vision): patches, the [CLS] classifier, its baselines and their input checks."""

import pytest
import torch

from kqv import ModelConfig
from kqv.nn.experts import routing_metrics
from kqv.nn.vision import ConvClassifier, MLPClassifier, PatchEmbedding, ViT, extract_patches

from conftest import tiny_config


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
    message = r"images must have shape \(batch, channels, height, width\) = \(batch, 1, 8, 8\), got " + \
        str(shape).replace("(", r"\(").replace(")", r"\)")
    with pytest.raises(ValueError, match=message):
        model(torch.rand(shape))


def test_a_missing_channel_dimension_gets_a_hint():
    with pytest.raises(ValueError, match=r"add the channel dimension with images\[:, None\]"):
        ViT(vit_config(), (1, 8, 8), 2, 10)(torch.rand(4, 8, 8))


def test_integer_pixels_are_a_type_error_with_the_conversion():
    with pytest.raises(TypeError, match=r"floating-point pixel values, got torch.uint8.*images.float\(\) / 255"):
        ViT(vit_config(), (1, 8, 8), 2, 10)(torch.zeros(2, 1, 8, 8, dtype=torch.uint8))


@pytest.mark.parametrize("image_shape, patch_size, message", [
    ((1, 8, 8), 3, r"patch_size 3 does not tile a 8x8 image; choose one of \[1, 2, 4, 8\]"),
    ((8, 8), 2, r"image_shape must be \(channels, height, width\)"),
    ((1, 8, 8), 0, "patch_size must be a positive integer"),
])
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
    model = ViT(vit_config(ffn=ffn, n_experts=2), (1, 8, 8), 2, 10)
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
        missing -= {f"blocks.1.feed_forward.experts.{i}.{name}" for i in set(range(2)) - cls_experts
                    for name in ("up.weight", "up.bias", "down.weight", "down.bias")}
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
