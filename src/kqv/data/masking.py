"""BERT's corruption of a batch for masked-language-model training (Devlin et al. 2019).

15% of the tokens are selected; 80% of those become [MASK], 10% a random token, 10% stay as they are (so the
model cannot learn that only [MASK] needs predicting), and the loss is taken at the selected positions only.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .vocabulary import Vocabulary


def mask_tokens(
    ids: Tensor,
    generator: torch.Generator,
    vocabulary: Vocabulary,
    *,
    mask_prob: float = 0.15,
    mask_token_prob: float = 0.8,
    random_token_prob: float = 0.1,
    attention_mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """BERT's corruption of ids (batch, time) -> (inputs, targets).

    Each token that is neither padding (attention_mask 0) nor a special token is selected independently with
    probability `mask_prob`; a selected token becomes [MASK] with probability `mask_token_prob`, a random regular
    token with probability `random_token_prob`, and stays otherwise. targets hold the original id at the selected
    positions and -100 (ignored by the loss) everywhere else.
    """
    eligible = ~torch.isin(ids, vocabulary.special_ids)
    if attention_mask is not None:
        eligible &= attention_mask.bool()
    selected = eligible & (torch.rand(ids.shape, generator=generator) < mask_prob)
    how = torch.rand(ids.shape, generator=generator)  # which of the three corruptions a selected token gets
    to_mask = selected & (how < mask_token_prob)
    to_random = selected & (how >= mask_token_prob) & (how < mask_token_prob + random_token_prob)
    random_ids = vocabulary.regular_ids[torch.randint(len(vocabulary.regular_ids), ids.shape, generator=generator)]
    inputs = torch.where(to_mask, vocabulary.mask_id, torch.where(to_random, random_ids, ids))
    return inputs, torch.where(selected, ids, -100)
