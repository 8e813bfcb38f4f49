"""The explorer's subject for a Vision Transformer run: attention over [CLS] and the patches of a held-out test
image, and its class probabilities (a `kqv.explore.subjects.Subject` like the text models')."""

from __future__ import annotations

from typing import Any

import torch

from ..errors import DataError
from ..nn.devices import model_device
from .analysis import check_int
from .sparse_views import self_attention_weights
from .subjects import Subject, self_view


class VitSubject(Subject):
    """A Vision Transformer run: one of its held-out test digits, chosen by number (`image`, or the page's text),
    read as [CLS] and the patches p0, p1, ... row by row; bidirectional self-attention over them, and the
    probability of every class."""

    task = "vit"

    def __init__(self, name: str, run: Any, limit: int):
        super().__init__(name, run.model, limit, run.model.config)
        digits = run.test_digits()
        self.images, self.labels = digits.images["test"], digits.labels["test"]  # (n, channels, h, w), (n,)
        self.tokens = ["[CLS]", *(f"p{i}" for i in range(self.model.patches.n_patches))]

    @classmethod
    def from_run(cls, run: Any, limit: int) -> VitSubject:
        return cls(str(run.run_dir), run, limit)

    def info(self) -> dict[str, Any]:
        return {
            **super().info(),
            "images": len(self.labels),
            "grid": list(self.model.patches.grid),
            "patch_size": self.model.patches.patch_size,
        }

    def views(self) -> list[str]:
        return [*super().views(), "classes"]

    def examples(self) -> list[str]:
        return ["0"]  # the first held-out test image

    def reads(self, text: str) -> None:
        self.image_number({"text": text})

    def image_number(self, request: dict[str, Any]) -> int:
        """The test image a request asks for: `image`, or its text holding the number."""
        last = len(self.labels) - 1
        value = request.get("image", request.get("text"))
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value)
        if isinstance(value, str) or value is None:
            raise DataError(
                f"a ViT run reads images, not text: give the number of a held-out test image, 0 to "
                f'{last} (as the text, or as "image"), got {value!r}'
            )
        return check_int(value, "image", 0, last)

    @torch.no_grad()
    def analyze(self, request: dict[str, Any]) -> dict[str, Any]:
        number = self.image_number(request)
        image = self.images[number : number + 1].to(model_device(self.model))  # (1, channels, height, width)
        self.check_length(len(self.tokens), "the image's [CLS] and patches")
        with self.lock:
            weights = self_attention_weights(
                self.model, lambda: self.model.attention_weights(image), lambda: self.model(image)
            )
            probs = self.model(image)[0].float().softmax(-1)
        view = self_view(
            "self-attention over [CLS] and the patches (bidirectional)", self.tokens, weights, causal=False
        )
        return {
            "task": self.task,
            "image": number,
            "label": int(self.labels[number]),
            "tokens": self.tokens,
            "pixels": image[0].tolist(),
            "attention": {"self": view},
            "classes": [{"label": str(c), "p": round(float(p), 6)} for c, p in enumerate(probs)],
        }
