"""The Vision Transformer (Dosovitskiy et al. 2020, "An Image is Worth 16x16 Words"): an image read as a sequence.

An image (channels, height, width) is cut into non-overlapping `patch_size` x `patch_size` squares, row by row;
each square is flattened (channels * patch_size^2 pixel values) and linearly projected to d_model: one "word" of
the image. A learned [CLS] vector goes first, positions are added (`config.position`: learned in the paper, where
2-D-aware positions did no better; any of kqv's schemes here), and the unchanged stack of encoder blocks reads the
sequence. The classifier reads the [CLS] vector at the top (final norm -> linear), as BERT's sentence classifier
does. So a `ViT` is an `Encoder` whose token embedding is a `PatchEmbedding`; `ModelConfig.vocab_size` is unused.

For comparison at equal training time, two small non-attention baselines share the interface
(`forward(images, labels=None)`): `MLPClassifier` (pixels -> hidden -> classes) and `ConvClassifier` (two 3x3
convolutions, max-pooling, a hidden layer), the inductive biases a ViT does without.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import ConfigError, DataError, DataTypeError
from .config import ModelConfig
from .dropout import Dropout
from .experts import with_auxiliary_loss
from .heads import ClassificationHead
from .models import Encoder, init_weights

ImageShape = tuple[int, int, int]  # (channels, height, width)


def check_image_shape(image_shape: ImageShape, patch_size: int) -> None:
    """A clear error unless the image is (channels, height, width) of positive sizes that patches tile exactly."""
    if len(image_shape) != 3 or not all(isinstance(n, int) and n > 0 for n in image_shape):
        raise ConfigError(f"image_shape must be (channels, height, width) of positive integers, got {image_shape!r}")
    if not isinstance(patch_size, int) or patch_size < 1:
        raise ConfigError(f"patch_size must be a positive integer, got {patch_size!r}")
    _, height, width = image_shape
    if height % patch_size or width % patch_size:
        fits = [p for p in range(1, min(height, width) + 1) if height % p == 0 and width % p == 0]
        raise ConfigError(f"patch_size {patch_size} does not tile a {height}x{width} image; choose one of {fits}")


def check_images(images: Tensor, image_shape: ImageShape) -> None:
    """A clear error unless `images` is a float tensor (batch, channels, height, width) of the expected shape."""
    if not isinstance(images, Tensor):
        raise DataTypeError(f"images must be a torch.Tensor, got {type(images).__name__}")
    if not images.dtype.is_floating_point:
        raise DataTypeError(
            f"images must hold floating-point pixel values, got {images.dtype}; convert them, e.g. images.float() / 255"
        )
    expected = "(batch, channels, height, width) = (batch, {}, {}, {})".format(*image_shape)
    if images.dim() != 4 or tuple(images.shape[1:]) != tuple(image_shape) or images.shape[0] == 0:
        missing_channel = images.dim() == 3 and image_shape[0] == 1 and tuple(images.shape[1:]) == image_shape[1:]
        hint = "; add the channel dimension with images[:, None]" if missing_channel else ""
        raise DataError(f"images must have shape {expected}, got {tuple(images.shape)}{hint}")


def extract_patches(images: Tensor, patch_size: int) -> Tensor:
    """images (batch, channels, height, width) -> patches (batch, n_patches, channels * patch_size^2).

    Patches run row by row over the image; each is flattened channel first, then pixel row, then pixel column:
    the layout of a Conv2d kernel, so the linear projection of the patches equals a Conv2d with kernel and stride
    patch_size (tests/test_vision.py checks both)."""
    batch, channels, height, width = images.shape
    p = patch_size
    grid = images.unfold(2, p, p).unfold(3, p, p)  # (batch, channels, height / p, width / p, p, p)
    return grid.permute(0, 2, 3, 1, 4, 5).reshape(batch, (height // p) * (width // p), channels * p * p)


class PatchEmbedding(nn.Module):
    """Images -> [CLS] + one vector per patch: (batch, 1 + n_patches, d_model). Positions are added by
    `kqv.nn.embeddings.Embeddings` around it, as for tokens."""

    def __init__(self, image_shape: ImageShape, patch_size: int, d_model: int):
        super().__init__()
        check_image_shape(image_shape, patch_size)
        self.image_shape, self.patch_size = tuple(image_shape), patch_size
        channels, height, width = image_shape
        self.grid = (height // patch_size, width // patch_size)  # patches per column and per row
        self.to_vectors = nn.Linear(channels * patch_size**2, d_model)
        self.cls = nn.Parameter(torch.randn(1, 1, d_model) * 0.02)

    @property
    def n_patches(self) -> int:
        return self.grid[0] * self.grid[1]

    def forward(self, images: Tensor) -> Tensor:
        check_images(images, self.image_shape)
        patches = self.to_vectors(extract_patches(images, self.patch_size))  # (batch, n_patches, d_model)
        cls = self.cls.expand(images.shape[0], -1, -1).to(patches.dtype)  # (batch, 1, d_model)
        return torch.cat([cls, patches], dim=1)  # (batch, 1 + n_patches, d_model)


class ViT(Encoder):
    """A Vision Transformer classifier: patches -> encoder -> [CLS] -> classes. See the module docstring.

    `forward(images, labels=None)`: images (batch, channels, height, width) -> logits (batch, n_classes), or the
    mean cross-entropy (plus the experts' load-balancing loss in training) when labels (batch,) are given.
    `attention_weights(images)` gives every layer's (batch, heads, 1 + n_patches, 1 + n_patches);
    `cls_attention(images)` the [CLS] row over the patches as images, (layers, batch, heads, grid_h, grid_w).
    """

    def __init__(self, config: ModelConfig, image_shape: ImageShape, patch_size: int, n_classes: int):
        patches = PatchEmbedding(image_shape, patch_size, config.d_model)
        if config.position == "learned" and patches.n_patches + 1 > config.max_len:
            raise ConfigError(
                f"a {image_shape[1]}x{image_shape[2]} image in {patch_size}x{patch_size} patches is "
                f"{patches.n_patches} patches + [CLS], more than max_len={config.max_len} learned "
                f"positions; raise max_len to {patches.n_patches + 1} or enlarge the patches"
            )
        super().__init__(config, tokens=patches)
        self.head = ClassificationHead(config, n_classes, "first")
        init_weights(self)

    @property
    def patches(self) -> PatchEmbedding:
        return self.embeddings.tokens

    def forward(self, images: Tensor, labels: Tensor | None = None) -> Tensor:
        hidden, _ = self.run(images, None)
        logits = self.head(hidden)  # (batch, n_classes), from the [CLS] vector
        return logits if labels is None else with_auxiliary_loss(self, classify(logits, labels))

    def run(
        self, images: Tensor, attention_mask: Tensor | None = None, need_weights: bool = False
    ) -> tuple[Tensor, list]:
        if attention_mask is not None:
            raise DataError("a ViT reads whole images: there is no padding, so no attention_mask")
        positions = torch.arange(1 + self.patches.n_patches, device=self.patches.cls.device)
        return self.encode(self.embeddings(images, positions), None, need_weights)

    def cls_attention(self, images: Tensor) -> Tensor:
        """How much [CLS] attends to each patch: (layers, batch, heads, grid_h, grid_w), rows summing to at most 1
        (the rest goes to [CLS] itself)."""
        weights = torch.stack(self.attention_weights(images))  # (layers, batch, heads, 1 + n, 1 + n)
        return weights[..., 0, 1:].unflatten(-1, self.patches.grid)


class MLPClassifier(nn.Module):
    """The simplest baseline: flattened pixels -> hidden (GELU) -> hidden (GELU) -> classes."""

    def __init__(self, image_shape: ImageShape, n_classes: int, hidden: int = 256, dropout: float = 0.1):
        super().__init__()
        check_image_shape(image_shape, 1)
        self.image_shape = tuple(image_shape)
        channels, height, width = image_shape
        self.layers = nn.Sequential(
            nn.Flatten(),
            nn.Linear(channels * height * width, hidden),
            nn.GELU(),
            Dropout(dropout),
            nn.Linear(hidden, hidden),
            nn.GELU(),
            Dropout(dropout),
            nn.Linear(hidden, n_classes),
        )

    def forward(self, images: Tensor, labels: Tensor | None = None) -> Tensor:
        check_images(images, self.image_shape)
        return classify(self.layers(images), labels)


class ConvClassifier(nn.Module):
    """A small convolutional baseline: two 3x3 convolutions (same padding, ReLU), 2x2 max-pooling, a hidden layer."""

    def __init__(
        self, image_shape: ImageShape, n_classes: int, channels: int = 32, hidden: int = 128, dropout: float = 0.1
    ):
        super().__init__()
        check_image_shape(image_shape, 2)
        self.image_shape = tuple(image_shape)
        in_channels, height, width = image_shape
        self.layers = nn.Sequential(
            nn.Conv2d(in_channels, channels, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(channels, 2 * channels, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(2 * channels * (height // 2) * (width // 2), hidden),
            nn.ReLU(),
            Dropout(dropout),
            nn.Linear(hidden, n_classes),
        )

    def forward(self, images: Tensor, labels: Tensor | None = None) -> Tensor:
        check_images(images, self.image_shape)
        return classify(self.layers(images), labels)


def classify(logits: Tensor, labels: Tensor | None) -> Tensor:
    """logits (batch, n_classes), or their mean cross-entropy against labels (batch,)."""
    if labels is None:
        return logits
    if labels.shape != logits.shape[:1]:
        raise DataError(f"labels must have shape ({logits.shape[0]},), one class per image, got {tuple(labels.shape)}")
    return F.cross_entropy(logits.float(), labels)
