"""BERT masked language modelling (Devlin et al. 2019, §3.1).

Per block, ``round(0.15 × n)`` of its n non-special tokens are chosen uniformly without replacement
(as BERT's create_pretraining_data.py does, rather than an independent coin per token), then each is
replaced by [MASK] (80%), a random normal token (10%) or kept (10%).
"""

from __future__ import annotations

import numpy as np

from spanlm.masking.base import MaskedBatch, MlmConfig
from spanlm.masking.ops import TokenMasker, corrupt, round_budget


class MlmMasker(TokenMasker):
    config: MlmConfig
    reads_words = False  # tokens, not words: a collator needs no word ids

    def __call__(self, batch, rng: np.random.Generator) -> MaskedBatch:
        batch_size, width = batch.input_ids.shape
        candidate = ~batch.special_mask  # (B, L)
        n_select = round_budget(self.config.rate, candidate.sum(axis=1))  # (B,)

        # A uniformly random subset of exactly n_select candidates per row: the n_select smallest of
        # i.i.d. uniform keys. Specials get key 2 so they sort after every candidate.
        keys = rng.random((batch_size, width))
        keys[~candidate] = 2.0
        kth = np.sort(keys, axis=1)[np.arange(batch_size), np.maximum(n_select - 1, 0)]  # (B,)
        selected = (keys <= kth[:, None]) & (n_select > 0)[:, None]  # (B, L)

        positions = np.flatnonzero(selected)
        input_ids, labels, kind = corrupt(
            batch.input_ids,
            positions,
            np.arange(len(positions)),
            self.config.proportions,
            self.sampler,
            self.vocab.mask_id,
            rng,
        )
        return MaskedBatch(
            input_ids=input_ids,
            attention_mask=batch.attention_mask.copy(),
            target_index=positions,
            target_labels=labels,
            target_kind=kind,
        )
