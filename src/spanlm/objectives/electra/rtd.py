"""Replaced-token detection (RTD): sampling the replacements, labelling them, the discriminator heads, the loss.

ELECTRA (Clark et al. 2020, arXiv 2003.10555, §2): the generator's softmax at every masked position is
sampled (Gumbel-max at temperature 1 in the authors' code, *without* gradient: the discriminator's loss
does not train the generator); the discriminator reads the original tokens with the samples in place
and labels each token ``replaced = masked & (sample != original)`` — a sample that happens to be the
original token counts as original. Loss: sigmoid binary cross-entropy averaged over all non-pad tokens.

Heads (both score gathered non-pad rows only, so padded slots cost nothing):

* :class:`ElectraRTDHead` — dense(H) + GeLU → dense(1) (ELECTRA's ``discriminator_predictions``);
* :class:`DebertaV3RTDHead` — LayerNorm(h_[CLS] + h_i) → dense(H) → GeLU → dense(1) (DeBERTa-V3,
  He et al. 2021, arXiv 2111.09543; ``LMMaskPredictionHead`` in the authors' code): every token is
  judged together with the sequence summary at [CLS].
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from spanlm.heads.hf import TaskHead, register_task_head


def gumbel_max_sample(logits: Tensor, temperature: float, seed: Tensor) -> Tensor:
    """One token per row of ``logits`` (N, V), distributed as softmax(logits / T); no gradient.

    Gumbel-max: argmax(logits / T + g) with g = −log(E), E ~ Exp(1) — exactly a categorical sample
    (ELECTRA's ``sample_from_softmax``; DeBERTa-V3's multinomial draw has the same distribution).
    All noise comes from ``seed`` (an int64 scalar tensor): element (i, j) is drawn from a hash of the
    seed, row i and column j (:func:`uniforms`), so a sample is a function of its seed and its row on every
    device, and neither reading the seed into Python nor a ``torch.Generator`` is needed (either would stall a
    GPU or break a compiled graph). The noise is one float32 (N, V) buffer, made in place from one int32 one;
    ``logits`` is added into it in its own dtype, not copied to float32 first.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    with torch.no_grad():
        noise = uniforms(seed, logits.shape, logits.device)
        noise.log_().neg_().log_().neg_()  # Gumbel: −log(E), E = −log(U) ~ Exp(1)
        return noise.add_(logits, alpha=1.0 / temperature).argmax(dim=-1)  # (N,)


# A 32-bit integer hash (Wellons' "lowbias32": xorshift-multiply rounds, a bijection of 32-bit words) in int32
# tensor arithmetic, which wraps modulo 2³² as uint32 does.
_MIX1 = 0x7FEB352D
_MIX2 = 0x846CA68B - 2**32
_GOLDEN = 0x9E3779B9 - 2**32


def _shift_right(z: Tensor, bits: int) -> Tensor:
    """Logical right shift of int32 words (>> on int32 is arithmetic: clear the copied sign bits)."""
    return (z >> bits) & ((1 << (32 - bits)) - 1)


def _hash(z: Tensor) -> Tensor:
    """lowbias32 of the int32 words ``z``, in place."""
    z ^= _shift_right(z, 16)
    z *= _MIX1
    z ^= _shift_right(z, 15)
    z *= _MIX2
    z ^= _shift_right(z, 16)
    return z


def uniforms(seed: Tensor, shape: torch.Size | tuple[int, ...], device: torch.device) -> Tensor:
    """float32 uniforms in (0, 1) of ``shape`` (..., V): element (i, j) is the top 24 bits of
    hash(hash(j) xor key_i), with key_i a hash of the int64 ``seed`` and the row i (the leading dimensions
    flattened). For a given row the V words are distinct (a xor and the hash are bijections); no tensor of
    ``shape`` but the int32 words and the result is made."""
    rows, width = math.prod(shape[:-1]), shape[-1]
    seed = seed.to(device=device, dtype=torch.int64)
    low, high = (seed & 0xFFFFFFFF).to(torch.int32), ((seed >> 32) & 0xFFFFFFFF).to(torch.int32)  # wrap to int32
    key = _hash(low ^ _hash(high + _GOLDEN))  # () the seed's 64 bits in one word
    row_keys = _hash(key + torch.arange(rows, dtype=torch.int32, device=device) * _GOLDEN)  # (rows,)
    columns = _hash(torch.arange(width, dtype=torch.int32, device=device))  # (V,)
    words = _hash(columns ^ row_keys.unsqueeze(1))  # (rows, V) int32
    return (_shift_right(words, 8).float().add_(0.5).mul_(2.0**-24)).view(shape)  # never 0 or 1: both logs finite


def replace_tokens(
    input_ids: Tensor, target_index: Tensor, samples: Tensor, originals: Tensor
) -> tuple[Tensor, Tensor]:
    """The discriminator's input and labels.

    Args:
        input_ids: (B, L) the generator's (corrupted) input; away from the targets it is the original text.
        target_index: (N,) flat positions b·L + t the generator predicted.
        samples: (N,) the sampled token at each target; originals: (N,) the original token there.

    Returns ``(ids, replaced)``, both (B, L): the input with every target set to its sample, and
    ``replaced = masked & (sample != original)``.
    """
    flat_ids = input_ids.flatten().index_put((target_index,), samples.to(input_ids.dtype))  # (B·L,)
    replaced = torch.zeros(input_ids.numel(), dtype=torch.bool, device=input_ids.device)
    replaced = replaced.index_put((target_index,), samples != originals)  # (B·L,)
    return flat_ids.view_as(input_ids), replaced.view_as(input_ids)


class ElectraRTDHead(nn.Module):
    """ELECTRA's discriminator head: dense(H→H) + GeLU → dense(H→1), one logit per token."""

    def __init__(self, hidden_size: int, initializer_range: float = 0.02):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.activation = nn.GELU()  # exact (erf) GeLU: ELECTRA's and DeBERTa-V3's hidden_act "gelu"
        self.classifier = nn.Linear(hidden_size, 1)
        # BERT/ELECTRA initialisation: N(0, initializer_range) weights, zero biases.
        for linear in (self.dense, self.classifier):
            nn.init.normal_(linear.weight, mean=0.0, std=initializer_range)
            nn.init.zeros_(linear.bias)

    def score(self, rows: Tensor) -> Tensor:
        """(T, H) → (T,) logits."""
        return self.classifier(self.activation(self.dense(rows))).squeeze(-1)

    def forward(self, hidden: Tensor, positions: Tensor, block_starts: Tensor | None = None) -> Tensor:
        """``hidden`` (B, L, H), ``positions`` (T,) flat b·L + t of the tokens to score → logits (T,).
        (``block_starts``: see :class:`DebertaV3RTDHead`; this head reads each token alone.)"""
        return self.score(hidden.flatten(0, 1).index_select(0, positions))  # rows (T, H)


class DebertaV3RTDHead(ElectraRTDHead):
    """DeBERTa-V3's head: LayerNorm(h_[CLS] + h_i) → dense(H→H) → GeLU → dense(H→1)."""

    def __init__(self, hidden_size: int, layer_norm_eps: float = 1e-7, initializer_range: float = 0.02):
        super().__init__(hidden_size, initializer_range)
        self.layer_norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)  # γ = 1, β = 0

    def forward(self, hidden: Tensor, positions: Tensor, block_starts: Tensor | None = None) -> Tensor:
        """``hidden`` (B, L, H), ``positions`` (T,) flat b·L + t of the tokens to score → logits (T,).
        ``block_starts`` (T,): the flat position of each token's block [CLS] in a packed batch (several
        blocks per row); None: each row is one block, its [CLS] at column 0."""
        length = hidden.shape[1]
        flat = hidden.flatten(0, 1)
        rows = flat.index_select(0, positions)  # (T, H)
        if block_starts is None:
            context = hidden[:, 0].index_select(
                0, torch.div(positions, length, rounding_mode="floor")
            )  # (T, H): its row's [CLS]
        else:
            context = flat.index_select(0, block_starts)  # (T, H): its block's [CLS]
        return self.score(self.layer_norm(context + rows))


RTD_HEADS = {"electra": ElectraRTDHead, "deberta_v3": DebertaV3RTDHead}

# ELECTRA's discriminator head in ElectraForPreTraining (kind "rtd"): an ELECTRA export is that task model, and
# continued pretraining from one starts from its head. Named beside the head: wherever one exists, so do its names.
TRANSFORMERS_RTD_HEADS = {
    "electra": TaskHead(
        "ElectraForPreTraining",
        {
            "dense.weight": "discriminator_predictions.dense.weight",
            "dense.bias": "discriminator_predictions.dense.bias",
            "classifier.weight": "discriminator_predictions.dense_prediction.weight",
            "classifier.bias": "discriminator_predictions.dense_prediction.bias",
        },
    ),
}
register_task_head("rtd", ElectraRTDHead, TRANSFORMERS_RTD_HEADS)


@dataclasses.dataclass
class RTDLoss:
    """Summed BCE over the scored tokens and the counts behind accuracy / precision / recall.

    Counts (not ratios) so that sums over batches, steps and ranks give exact corpus-level metrics.
    """

    total: Tensor  # float32 scalar: summed binary cross-entropy
    count: Tensor  # int64: tokens scored (non-pad)
    correct: Tensor  # int64: tokens whose prediction (logit > 0) matches the label
    replaced: Tensor  # int64: tokens labelled replaced
    predicted: Tensor  # int64: tokens predicted replaced
    true_positive: Tensor  # int64: replaced tokens predicted replaced

    @property
    def mean(self) -> Tensor:
        return self.total / self.count.clamp(min=1)

    def metrics(self) -> dict[str, Tensor]:
        return {
            "rtd_accuracy": self.correct.float() / self.count.clamp(min=1),
            # Precision and recall of the "replaced" class; 0 where nothing was predicted / replaced.
            "rtd_precision": self.true_positive.float() / self.predicted.clamp(min=1),
            "rtd_recall": self.true_positive.float() / self.replaced.clamp(min=1),
            "n_rtd": self.count,
            "n_replaced": self.replaced,
            "n_predicted_replaced": self.predicted,
            "n_true_replaced": self.true_positive,
        }


def rtd_loss(logits: Tensor, labels: Tensor, scored: Tensor | None = None) -> RTDLoss:
    """Sigmoid BCE of ``logits`` (T,) against boolean ``labels`` (T,), summed in float32 (T may be 0),
    over the rows where ``scored`` (T,) is true (all rows without it)."""
    if scored is None:
        scored = torch.ones_like(labels, dtype=torch.bool)
    with torch.autocast(device_type=logits.device.type, enabled=False):
        total = F.binary_cross_entropy_with_logits(
            logits.float(), labels.float(), weight=scored.float(), reduction="sum"
        )
    with torch.no_grad():
        predicted = (logits > 0) & scored
        labels = labels & scored
        return RTDLoss(
            total=total,
            count=scored.sum(),
            correct=((predicted == labels) & scored).sum(),
            replaced=labels.sum(),
            predicted=predicted.sum(),
            true_positive=(predicted & labels).sum(),
        )
