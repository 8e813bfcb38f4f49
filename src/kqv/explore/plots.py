"""Pictures of what attention does: a grid of attention maps, one panel per layer and head."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from torch import Tensor  # noqa: E402

from ..train.files import write_png  # noqa: E402


def plot_attention_grid(
    weights: Sequence[Tensor],
    query_tokens: Sequence[str],
    key_tokens: Sequence[str],
    path: str | Path,
    title: str = "attention",
) -> Path:
    """Write a PNG with one heat map per (layer, head). weights: per layer (heads, q_time, k_time), or with a
    leading batch axis of 1. Rows are queries (who looks), columns keys (who is looked at)."""
    maps = [w[0] if w.dim() == 4 else w for w in weights]
    layers, heads = len(maps), maps[0].shape[0]
    size = max(2.0, 0.22 * max(len(query_tokens), len(key_tokens)))
    fig, axes = plt.subplots(layers, heads, figsize=(size * heads, size * layers), squeeze=False)
    for layer, layer_maps in enumerate(maps):
        for head in range(heads):
            ax = axes[layer][head]
            ax.imshow(layer_maps[head].float().cpu().numpy(), cmap="viridis", vmin=0.0, vmax=1.0)
            ax.set_title(f"layer {layer + 1} head {head + 1}", fontsize=8)
            ax.set_xticks(range(len(key_tokens)), labels=key_tokens, rotation=90, fontsize=6)
            ax.set_yticks(range(len(query_tokens)), labels=query_tokens, fontsize=6)
    fig.suptitle(title)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_cls_attention(
    images: Tensor, maps: Tensor, labels: Sequence[int], predicted: Sequence[int], path: str | Path
) -> Path:
    """A ViT's [CLS] attention: one row per image (the image, then its map over the patch grid for each layer).
    images (n, height, width); maps (layers, n, grid_h, grid_w)."""
    layers, n = maps.shape[:2]
    fig, axes = plt.subplots(n, 1 + layers, figsize=(1.8 * (1 + layers), 1.9 * n), squeeze=False)
    for row in range(n):
        axes[row][0].imshow(images[row].float().cpu().numpy(), cmap="gray_r")
        axes[row][0].set_title(f"label {labels[row]}, predicted {predicted[row]}", fontsize=7)
        for layer in range(layers):
            axes[row][1 + layer].imshow(maps[layer, row].float().cpu().numpy(), cmap="viridis")
            axes[row][1 + layer].set_title(f"layer {layer + 1}", fontsize=7)
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle("[CLS] attention over the patches (heads averaged)", fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path)


def save_figure(fig: plt.Figure, path: str | Path) -> Path:
    """Write the figure as a PNG (creating its directory), atomically: a full disk leaves no empty or partial file
    (`kqv.train.files.write_png`); then close it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        write_png(path, fig, dpi=110)
    finally:
        plt.close(fig)
    return path
