"""GlobalPointer and Efficient GlobalPointer span heads (Su et al. 2022, arXiv 2208.03054).

GlobalPointer scores every (start, end) token pair for every entity type at once, so nested and
overlapping entities need no special decoding: cell (α, i, j) > 0 means "tokens i..j are an entity of
type α".

Standard GP (§3.1): one dense layer D → T·2d (with bias); for type α the first d columns are q_α and
the last d are k_α (the per-type split of Su's bert4keras ``GlobalPointer``); RoPE on q and k; then
s_α(i, j) = q_{α,i}ᵀ k_{α,j} / √d for all types in one batched matmul.

Efficient GP (Su, "Efficient GlobalPointer", kexue.fm/archives/8877): the "what is an entity" part is
shared across types and only a cheap per-type bias distinguishes them::

    p = dense(D → 2d);   q = p[..., 0::2],  k = p[..., 1::2]   (Su's even/odd split)
    s(i, j) = RoPE(q)_iᵀ RoPE(k)_j / √d
    b = dense(2d → 2T)(p) / 2;  b_start_α(i), b_end_α(j)
    logits_α(i, j) = s(i, j) + b_start_α(i) + b_end_α(j)

Su's code orders the 2T bias columns as (end_α, start_α) pairs (``bias[:, ::2]`` is added along the
end axis, ``bias[:, 1::2]`` along the start axis); the same layout is used here.

RoPE (Su et al. 2021, RoFormer): θ_i = 10000^(-2i/d), positions from 0, applied in the *interleaved*
(adjacent-pair) layout of Su's ``SinusoidalPositionEmbedding`` + ``apply_rotary_position_embeddings``:
dimensions (2i, 2i+1) form one pair rotated by angle m·θ_i. Rotate-half is a fixed permutation of the
same thing; interleaved is kept so weights trained by Su's implementations keep their meaning. With
RoPE, q_iᵀk_j depends only on j - i (plus the content), which makes the pair score relative.

Masking: a cell whose start or end token is masked (padding, [CLS], [SEP]) or whose end precedes its
start gets ``torch.finfo(dtype).min``. Su's code subtracts 1e12 or uses -inf; 1e12 overflows to -inf
in fp16/bf16 and -inf turns the ZLPR loss into NaN (∞ - ∞), while the dtype minimum stays finite and
exp(min) is exactly 0, so masked cells drop out of every sum.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

import torch
from torch import Tensor, nn

ROPE_BASE = 10000.0


@dataclasses.dataclass
class GlobalPointerConfig:
    """Which GlobalPointer head, its per-type (standard) or shared (efficient) width d, and RoPE on/off."""

    kind: Literal["standard", "efficient"] = "efficient"
    head_size: int = 64
    rope: bool = True

    def __post_init__(self) -> None:
        if self.kind not in ("standard", "efficient"):
            raise ValueError(f"kind must be 'standard' or 'efficient', got {self.kind!r}")
        if self.head_size < 1:
            raise ValueError(f"head_size must be positive, got {self.head_size}")
        if self.rope and self.head_size % 2:
            raise ValueError(f"RoPE rotates pairs of dimensions: head_size must be even, got {self.head_size}")


def rotary(x: Tensor) -> Tensor:
    """Apply RoPE to ``x`` (B, L, ..., d) over positions 0..L-1 along dim 1, interleaved pairs (2i, 2i+1).

    The angles are computed in float32 whatever ``x``'s dtype (positions up to thousands times θ_0 = 1
    would lose their low bits in bf16) and cast to ``x``'s dtype for the rotation.
    """
    length, size = x.shape[1], x.shape[-1]
    theta = ROPE_BASE ** (-torch.arange(0, size, 2, device=x.device, dtype=torch.float32) / size)  # (d/2,)
    angle = torch.arange(length, device=x.device, dtype=torch.float32)[:, None] * theta  # (L, d/2)
    # broadcast over the middle dimensions of x (the type axis of standard GP)
    shape = (length,) + (1,) * (x.dim() - 3) + (size // 2,)
    cos, sin = angle.cos().to(x.dtype).view(shape), angle.sin().to(x.dtype).view(shape)
    pairs = x.unflatten(-1, (size // 2, 2))  # (B, L, ..., d/2, 2): (x_2i, x_2i+1)
    even, odd = pairs[..., 0], pairs[..., 1]
    return torch.stack([even * cos - odd * sin, odd * cos + even * sin], dim=-1).flatten(-2)  # (B, L, ..., d)


class GlobalPointer(nn.Module):
    """GlobalPointer (``kind="standard"``) or Efficient GlobalPointer (``kind="efficient"``) over encoder states.

    Args:
        hidden_size: the encoder's output width D.
        n_types: number of entity types T.
        config: the head's :class:`GlobalPointerConfig`.
    """

    def __init__(self, hidden_size: int, n_types: int, config: GlobalPointerConfig):
        super().__init__()
        if n_types < 1:
            raise ValueError(f"n_types must be positive, got {n_types}")
        self.config = config
        self.n_types = n_types
        size = config.head_size
        if config.kind == "standard":
            self.dense = nn.Linear(hidden_size, n_types * 2 * size)  # per type [q_α; k_α]
        else:
            self.dense = nn.Linear(hidden_size, 2 * size)  # shared p = [q; k] interleaved
            self.bias_dense = nn.Linear(2 * size, 2 * n_types)  # per type (end_α, start_α) from p

    def forward(self, hidden: Tensor, mask: Tensor) -> Tensor:
        """Logits (B, T, L, L): cell (b, α, i, j) scores tokens i..j (inclusive) of row b as type α.

        Args:
            hidden: encoder output (B, L, D).
            mask: (B, L) bool or 0/1; 1 = the token may start or end an entity.
        """
        size = self.config.head_size
        scale = 1.0 / math.sqrt(size)
        projected = self.dense(hidden)
        if self.config.kind == "standard":
            pairs = projected.unflatten(-1, (self.n_types, 2 * size))  # (B, L, T, 2d)
            q, k = pairs[..., :size], pairs[..., size:]  # (B, L, T, d) each
            if self.config.rope:
                q, k = rotary(q), rotary(k)
            # 1/√d folded into q: O(L·d) multiplications instead of O(L²) on the logits. A batched matmul
            # of the (small) transposed q, k gives a fresh (B, T, L, L) tensor; an einsum may return a
            # permuted view, and the in-place mask below would then make autograd clone the whole gradient.
            logits = (q * scale).transpose(1, 2) @ k.permute(0, 2, 3, 1)  # (B, T, L, d) @ (B, T, d, L)
        else:
            q, k = projected[..., 0::2], projected[..., 1::2]  # (B, L, d) each
            if self.config.rope:
                q, k = rotary(q), rotary(k)
            shared = (q * scale) @ k.transpose(1, 2)  # (B, L, d) @ (B, d, L) → (B, L, L)
            bias = (self.bias_dense(projected) / 2).unflatten(-1, (self.n_types, 2)).transpose(1, 2)  # (B, T, L, 2)
            # one (B, T, L, L) allocation: the outer sum of the biases, then the shared score added in place
            logits = bias[..., 1].unsqueeze(-1) + bias[..., 0].unsqueeze(-2)  # start_α(i) + end_α(j)
            logits.add_(shared.unsqueeze(1))
        return logits.masked_fill_(~cell_mask(mask, logits.shape[-1]).unsqueeze(1), torch.finfo(logits.dtype).min)


def cell_mask(mask: Tensor, length: int) -> Tensor:
    """(B, L, L) bool: True where cell (i, j) is a candidate span — both tokens unmasked and i ≤ j."""
    mask = mask.bool()
    upper = torch.ones(length, length, dtype=torch.bool, device=mask.device).triu_()  # (L, L) j ≥ i
    return mask.unsqueeze(2) & mask.unsqueeze(1) & upper  # (B, L, L)
