"""The device speed backend: code that makes training faster on one kind of device, applied in one place.

Models, heads and objectives are plain PyTorch and transformers code that runs on every device; they
never import this package. The training engine calls :func:`apply` once on the model it is about to
train, as the recipe's ``train.accel`` says:

* ``auto`` — the backend of the device. On CPU that is spanlm's CPU path: compiled kernels
  (:mod:`spanlm.accel.native`), dropout drawn four decisions per random word
  (:mod:`spanlm.accel.dropout`), BERT-family self-attention as one autograd function
  (:mod:`spanlm.accel.attention`), ModernBERT's and EuroBERT's rotary embeddings as one autograd function
  (:mod:`spanlm.accel.rotary`) and ModernBERT's GeGLU gate (:mod:`spanlm.accel.glu`), the vocabulary
  cross-entropy fused with its projection (:mod:`spanlm.accel.cross_entropy`) handing its weight gradient
  to the tied embedding (:mod:`spanlm.accel.tied_embedding`), freed host memory kept mapped
  (:mod:`spanlm.accel.host_memory`) and the clipping norm in one kernel call. On CUDA it is DeBERTa-V2 / V3's
  disentangled attention as one fused call (:mod:`spanlm.accel.disentangled`: FlexAttention, or SDPA with the
  relative terms as its bias under attention dropout); beyond that, CUDA's plain PyTorch path (SDPA's fused
  kernels, fused AdamW, ``torch.compile``) is what runs fast there, and other devices get nothing.
* under either mode, a packed run's attention is the device's path over the stream (:mod:`spanlm.accel.varlen`:
  per-segment SDPA on the CPU, FlashAttention's varlen kernel on CUDA), and whether ``data.packing: auto``
  packs is this package's decision (:func:`packs_by_default`).
* ``off`` — nothing: the model trains exactly as built, the same losses up to float rounding (and, with
  dropout on, other random draws).

Each piece checks, call by call, that it applies (a float32 CPU tensor, outside autocast and
``torch.compile``) and otherwise runs the plain code it replaces; none changes a parameter, a state-dict
key or a saved config, so checkpoints and exports are the same either way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from torch import nn

Accel = Literal["auto", "off"]


def backend(device: torch.device, mode: Accel = "auto") -> str:
    """The backend :func:`apply` puts in for ``device``: ``"cpu"``, ``"cuda"`` or ``"off"`` (none)."""
    if mode == "off" or device.type not in ("cpu", "cuda"):
        return "off"
    if device.type == "cuda":
        return "cuda"
    from spanlm.accel import native

    return "cpu" if native.kernels() is not None else "off"  # not buildable here: warned once, with the reason


def packs_by_default(device: torch.device) -> bool:
    """What ``data.packing: auto`` becomes on ``device`` (:mod:`spanlm.accel.varlen`)."""
    from spanlm.accel.varlen import packs_by_default as device_packs

    return device_packs(device)


def apply(model: nn.Module, device: torch.device, mode: Accel = "auto", packed: bool = False) -> str:
    """Put the speed backend of ``device`` into ``model``, in place; returns its name (:func:`backend`).

    ``packed``: the run's batches are packed streams. Their attention is the device's path
    (:mod:`spanlm.accel.varlen`) under either mode — it is which kernel computes the attention, as SDPA picks
    one, not a change of the model — set here, before the first (maybe compiled) forward."""
    if packed:
        from spanlm.accel.varlen import use_packed_attention

        use_packed_attention(model)
    name = backend(device, mode)
    if name == "cuda":
        from spanlm.accel.disentangled import use_fused_disentangled_attention

        use_fused_disentangled_attention(model)  # measured no faster on the CPU: CUDA only
    if name != "cpu":
        return name
    from spanlm.accel.attention import use_fused_self_attention
    from spanlm.accel.cross_entropy import FusedCrossEntropies
    from spanlm.accel.dropout import use_fast_dropout
    from spanlm.accel.glu import use_fused_geglu
    from spanlm.accel.host_memory import retain_freed_memory
    from spanlm.accel.rotary import use_fused_rotary
    from spanlm.accel.tied_embedding import tie_gradients
    from spanlm.heads.mlm import TiedDecoder

    retain_freed_memory()
    use_fast_dropout(model)
    use_fused_self_attention(model)
    use_fused_rotary(model)
    use_fused_geglu(model)
    for module in model.modules():
        if isinstance(module, TiedDecoder):
            tie_gradients(module.embedding)  # its lookup takes the decoder's weight gradient over
            module.cross_entropies = FusedCrossEntropies()  # read by spanlm.heads.losses.vocab_cross_entropies
    return name


def gradient_norm(
    name: str, total_norm: Callable[[list[torch.Tensor]], torch.Tensor]
) -> Callable[[list[torch.Tensor]], torch.Tensor]:
    """The total-norm function gradient clipping uses under backend ``name``: the engine's ``total_norm``
    unless the backend has a faster one (which falls back to ``total_norm`` for gradients it does not take)."""
    if name != "cpu":
        return total_norm
    from spanlm.accel import native

    def norm(gradients: list[torch.Tensor]) -> torch.Tensor:
        # Plain float32 CPU gradients: every square added in float32 over 1,024 elements and those sums in
        # float64, in one kernel call (spanlm.accel.native's sum_of_squares); anything else: total_norm.
        if all(type(g) is torch.Tensor and g.device.type == "cpu" and g.dtype == torch.float32 for g in gradients):
            return torch.tensor(
                native.kernels().sum_of_squares([g.contiguous() for g in gradients]) ** 0.5, dtype=torch.float32
            )
        return total_norm(gradients)

    return norm
