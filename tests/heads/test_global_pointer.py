"""GlobalPointer / Efficient GlobalPointer: the paper's formulas, RoPE, masks, bf16, gradients."""

import math

import pytest
import torch

from spanlm.config import from_dict
from spanlm.errors import ConfigError
from spanlm.heads.global_pointer import GlobalPointer, GlobalPointerConfig, rotary
from spanlm.heads.zlpr import ZlprConfig, global_pointer_loss

HIDDEN, TYPES, SIZE = 24, 3, 8


def make_inputs(seed=0, batch=3, length=11):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(batch, length, HIDDEN, generator=generator)
    mask = torch.ones(batch, length, dtype=torch.bool)
    mask[1, 7:] = False  # padding
    mask[:, 0] = False  # [CLS]
    return hidden, mask


def make_head(kind, rope=True, seed=0):
    torch.manual_seed(seed)
    return GlobalPointer(HIDDEN, TYPES, GlobalPointerConfig(kind=kind, head_size=SIZE, rope=rope))


def rope_reference(x):
    """RoPE written as the block-diagonal rotation matrix R_m of RoFormer eq. (15), one position at a time:
    pair (2i, 2i+1) rotated by m·θ_i, θ_i = 10000^(-2i/d)."""
    length, size = x.shape[1], x.shape[-1]
    out = torch.empty_like(x)
    for m in range(length):
        rotation = torch.zeros(size, size)
        for i in range(size // 2):
            angle = m * 10000 ** (-2 * i / size)
            c, s = math.cos(angle), math.sin(angle)
            rotation[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = torch.tensor([[c, -s], [s, c]])
        out[:, m] = x[:, m] @ rotation.T
    return out


def masked_reference(scores, mask):
    """Masks written out: padding rows/columns and j < i get the dtype minimum."""
    out = scores.clone()
    batch, _, length, _ = scores.shape
    for b in range(batch):
        for i in range(length):
            for j in range(length):
                if not (mask[b, i] and mask[b, j] and i <= j):
                    out[b, :, i, j] = torch.finfo(scores.dtype).min
    return out


@pytest.mark.parametrize("rope", [True, False])
def test_standard_matches_paper_formula(rope):
    hidden, mask = make_inputs()
    head = make_head("standard", rope)
    with torch.no_grad():
        projected = hidden @ head.dense.weight.T + head.dense.bias  # (B, L, T·2d)
        scores = []
        for alpha in range(TYPES):  # type α's block: [q_α; k_α]
            q = projected[..., alpha * 2 * SIZE : alpha * 2 * SIZE + SIZE]
            k = projected[..., alpha * 2 * SIZE + SIZE : (alpha + 1) * 2 * SIZE]
            if rope:
                q, k = rope_reference(q), rope_reference(k)
            scores.append(q @ k.transpose(1, 2) / math.sqrt(SIZE))
        expected = masked_reference(torch.stack(scores, 1), mask)
        torch.testing.assert_close(head(hidden, mask), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rope", [True, False])
def test_efficient_matches_paper_formula(rope):
    hidden, mask = make_inputs(1)
    head = make_head("efficient", rope)
    with torch.no_grad():
        p = hidden @ head.dense.weight.T + head.dense.bias  # (B, L, 2d)
        q, k = p[..., 0::2], p[..., 1::2]
        if rope:
            q, k = rope_reference(q), rope_reference(k)
        shared = q @ k.transpose(1, 2) / math.sqrt(SIZE)  # (B, L, L)
        bias = (p @ head.bias_dense.weight.T + head.bias_dense.bias) / 2  # (B, L, 2T): (end_α, start_α) pairs
        expected = torch.stack(
            [shared + bias[:, :, None, 2 * a + 1] + bias[:, None, :, 2 * a] for a in range(TYPES)], 1
        )
        torch.testing.assert_close(head(hidden, mask), masked_reference(expected, mask), rtol=1e-5, atol=1e-5)


def test_rotary_matches_rotation_matrices():
    x = torch.randn(2, 9, 4, 16, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(rotary(x), torch.stack([rope_reference(x[:, :, t]) for t in range(4)], 2))


def test_rope_scores_depend_only_on_relative_position():
    generator = torch.Generator().manual_seed(4)
    q, k = torch.randn(1, 1, 16, generator=generator), torch.randn(1, 1, 16, generator=generator)
    length = 12
    scores = rotary(q.expand(1, length, 16)) @ rotary(k.expand(1, length, 16)).transpose(1, 2)  # (1, L, L)
    for offset in range(-length + 1, length):
        diagonal = torch.diagonal(scores[0], offset)
        torch.testing.assert_close(diagonal, diagonal[:1].expand_as(diagonal), rtol=1e-4, atol=1e-4)
    # and it is not constant across offsets (the position does enter)
    assert torch.diagonal(scores[0], 0)[0] != pytest.approx(float(torch.diagonal(scores[0], 3)[0]), abs=1e-3)


@pytest.mark.parametrize("kind", ["standard", "efficient"])
def test_shifted_text_gets_the_same_span_scores(kind):
    """The same tokens placed s positions later score the same spans the same (relative RoPE)."""
    hidden = torch.randn(1, 8, HIDDEN, generator=torch.Generator().manual_seed(5))
    prefix = torch.randn(1, 5, HIDDEN, generator=torch.Generator().manual_seed(6))
    head = make_head(kind)
    with torch.no_grad():
        plain = head(hidden, torch.ones(1, 8, dtype=torch.bool))
        shifted = head(torch.cat([prefix, hidden], 1), torch.ones(1, 13, dtype=torch.bool))[:, :, 5:, 5:]
    torch.testing.assert_close(shifted, plain, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", ["standard", "efficient"])
def test_masks_use_the_dtype_minimum(kind):
    hidden, mask = make_inputs()
    logits = make_head(kind)(hidden, mask.long())  # 0/1 masks work as bool masks
    allowed = mask[:, :, None] & mask[:, None, :] & torch.ones(11, 11, dtype=torch.bool).triu()
    allowed = allowed.unsqueeze(1).expand_as(logits)
    assert bool((logits[~allowed] == torch.finfo(torch.float32).min).all())
    assert bool(torch.isfinite(logits).all())
    assert bool((logits[allowed].abs() < 1e3).all())


@pytest.mark.parametrize("kind", ["standard", "efficient"])
@pytest.mark.parametrize("mode", ["dense", "sparse"])
def test_bf16_autocast_logits_and_loss_finite(kind, mode):
    hidden, mask = make_inputs()
    head = make_head(kind)
    spans = torch.tensor([[[0, 1, 3], [2, 4, 4]], [[1, 2, 6], [-1, -1, -1]], [[-1, -1, -1]] * 2])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = head(hidden, mask)
        loss = global_pointer_loss(logits, spans, ZlprConfig(mode=mode))
    assert logits.dtype == torch.bfloat16
    assert bool(torch.isfinite(logits).all())
    assert logits[0, 0, 3, 1] == torch.finfo(torch.bfloat16).min
    assert loss.dtype == torch.float32 and torch.isfinite(loss) and loss > 0
    loss.backward()
    assert all(bool(torch.isfinite(p.grad).all()) for p in head.parameters())


@pytest.mark.parametrize("kind", ["standard", "efficient"])
@pytest.mark.parametrize("mode", ["dense", "sparse"])
def test_gradients_reach_every_parameter_and_the_encoder(kind, mode):
    hidden, mask = make_inputs()
    hidden.requires_grad_(True)
    head = make_head(kind)
    spans = torch.tensor([[[0, 1, 3], [2, 4, 4]], [[1, 2, 6], [-1, -1, -1]], [[2, 5, 9], [0, 5, 5]]])
    global_pointer_loss(head(hidden, mask), spans, ZlprConfig(mode=mode)).backward()
    for name, parameter in head.named_parameters():
        assert parameter.grad is not None and bool(parameter.grad.abs().sum() > 0), name
    assert bool(hidden.grad[mask].abs().sum(-1).gt(0).all())  # every unmasked token
    assert bool((hidden.grad[~mask] == 0).all())  # masked tokens take part in no candidate cell


def test_config_is_validated_through_from_dict():
    assert from_dict(GlobalPointerConfig, {"kind": "standard", "head_size": 32}).kind == "standard"
    with pytest.raises(ConfigError, match="kind"):
        from_dict(GlobalPointerConfig, {"kind": "fast"})
    with pytest.raises(ConfigError, match="even"):
        from_dict(GlobalPointerConfig, {"head_size": 7})
    assert from_dict(GlobalPointerConfig, {"head_size": 7, "rope": False}).head_size == 7
