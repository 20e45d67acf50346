"""Running a transformers encoder over a packed batch (:mod:`spanlm.data.packing`).

A packed row holds several blocks; each must attend only to itself and number its positions from the
start. Given the row's ``position_ids`` (restarting at 0 per block) and ``attention_mask`` (real
tokens), :func:`encoder_states` passes the encoder

* a 4-D mask (R, 1, W, W), True where query and key are in the same block and the key is real. transformers
  5 hands a 4-D mask to the attention unchanged (``masking_utils._preprocess_mask_arguments``), and
  spanlm's CPU self-attention and SDPA take it as a boolean mask; the eager attention of BERT, RoBERTa
  and ELECTRA adds its mask to the scores, so it gets the additive form;
* the positions: BERT and ELECTRA number from 0, RoBERTa from ``padding_idx + 1`` (what its embeddings
  compute from the ids of an unpacked row).

DeBERTa-V2 / V3 positions are relative (i − j within a row, unchanged by where a block starts), but its
model multiplies the embeddings by the mask it is given, which only works with a 2-D mask, so it is run
as embeddings (2-D mask) → encoder (4-D mask). Its optional convolution after the first layer
(``conv_kernel_size``) reads neighbouring tokens across block edges and ``z_steps`` re-runs the last
layer with the 2-D mask: such models cannot be packed (:func:`check_packable`).
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import PreTrainedModel

from spanlm.errors import ConfigError


def block_attention(position_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """(R, 1, W, W) bool: query and key in the same block (a block starts at each position 0), key real."""
    block = torch.cumsum(position_ids == 0, dim=1)  # (R, W) block number within the row
    same = block.unsqueeze(2) == block.unsqueeze(1)  # (R, W, W)
    return (same & attention_mask.bool().unsqueeze(1)).unsqueeze(1)


def packed_block_starts(position_ids: Tensor | None) -> Tensor | None:
    """(R·W,) the flat position where each token's block begins (its [CLS]) in a packed batch; None when
    ``position_ids`` is None or empty (a padded batch: one block per row)."""
    if position_ids is None or position_ids.numel() == 0:
        return None
    flat = position_ids.flatten()
    # A padding position (numbered 1) gets its left neighbour: a valid index, and padding is never scored.
    return torch.arange(flat.numel(), device=flat.device) - flat


def check_packable(model) -> None:
    """Refuse, naming why, an encoder whose outputs packing would change."""
    config = model.config
    if config.model_type == "deberta-v2":
        if int(getattr(config, "conv_kernel_size", 0) or 0) > 0:
            raise ConfigError("data.packing: DeBERTa-V2 with conv_kernel_size > 0 convolves neighbouring tokens across "
                              "block edges in a packed row; set data.packing: false")
        if int(getattr(config, "z_steps", 0) or 0) > 1:
            raise ConfigError("data.packing: DeBERTa-V2 with z_steps > 1 re-runs its last layer on a 2-D mask, which "
                              "would let packed blocks see each other; set data.packing: false")
    elif config.model_type not in ("bert", "roberta", "electra"):
        raise ConfigError(f"data.packing: packed rows are supported for bert, roberta, electra and deberta-v2 encoders, "
                          f"not '{config.model_type}'; set data.packing: false")


def encoder_positions(model, position_ids: Tensor) -> Tensor:
    """Per-block positions as the encoder's position table numbers them."""
    if model.config.model_type == "roberta":
        return position_ids + model.config.pad_token_id + 1
    return position_ids


def encoder_mask(model, position_ids: Tensor, attention_mask: Tensor, dtype: torch.dtype) -> Tensor:
    """The block-diagonal mask in the form ``model``'s attention implementation adds or applies."""
    allowed = block_attention(position_ids, attention_mask)
    if model.config.model_type != "deberta-v2" and model.config._attn_implementation == "eager":
        return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, torch.finfo(dtype).min)
    return allowed


def encoder_states(model, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor | None = None,
                   token_type_ids: Tensor | None = None) -> Tensor:
    """The encoder's last hidden states (R, W, H): padded rows when ``position_ids`` is None or empty, else packed."""
    extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
    if position_ids is None or position_ids.numel() == 0:
        return model(input_ids=input_ids, attention_mask=attention_mask.long(), **extra).last_hidden_state
    dtype = model.get_input_embeddings().weight.dtype
    mask = encoder_mask(model, position_ids, attention_mask, dtype)
    positions = encoder_positions(model, position_ids)
    if model.config.model_type == "deberta-v2":
        embedded = model.embeddings(input_ids=input_ids, position_ids=positions, mask=attention_mask.long(), **extra)
        return model.encoder(embedded, mask, output_hidden_states=False).last_hidden_state
    return model(input_ids=input_ids, attention_mask=mask, position_ids=positions, **extra).last_hidden_state


def unpack_rows(hidden: Tensor, unpack_index: Tensor) -> Tensor:
    """Packed states (R, W, H) → one window per row (B, L, H), by the batch's ``unpack_index`` (B, L)."""
    return hidden.flatten(0, 1).index_select(0, unpack_index.flatten()).view(*unpack_index.shape, hidden.shape[-1])


# Devices on which packed rows measured at least as fast as padded ones (bench/packing.py, BENCHMARKS.md):
# what data.packing: auto becomes there.
PACKED_BY_DEFAULT = {"cpu": True}  # not yet measured on a GPU: padded there until it is


def resolve_packing(setting: bool | str, objective: torch.nn.Module, device: torch.device | str) -> bool:
    """``data.packing`` as a run uses it. "auto" is the device's default (PACKED_BY_DEFAULT), and false for an
    objective or encoder that cannot be packed; true for one is refused."""
    if setting is False:
        return False
    try:
        if not getattr(objective, "supports_packing", False):
            raise ConfigError(f"data.packing: objective {type(objective).__name__} reads one block per row only; "
                              "set data.packing: false")
        for module in objective.modules():
            if isinstance(module, PreTrainedModel):
                check_packable(module)
    except ConfigError:
        if setting is True:
            raise
        return False
    return setting is True or PACKED_BY_DEFAULT.get(torch.device(device).type, False)
