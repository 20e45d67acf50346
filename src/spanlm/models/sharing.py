"""Embedding sharing between an ELECTRA-style generator G and discriminator D (Clark et al. 2020, §3.2).

Three modes (He et al. 2021, DeBERTa-V3, arXiv 2111.09543, §3):

* ``none`` (NES) — D keeps its own tables; G and D are trained apart.
* ``es`` — D reads G's tables: E_D = E_G, so the MLM loss and the RTD loss both pull on E_G (ELECTRA,
  Clark et al. 2020, §3.2, shares the embeddings this way). DeBERTa-V3 shows the two gradients point in
  different directions (the "tug-of-war") and slow both models down.
* ``gdes`` — gradient-disentangled sharing: E_D = sg(E_G) + E_Δ with E_Δ zero-initialised, so D starts
  from exactly G's embedding, the RTD loss reaches only E_Δ and E_G is trained by the MLM loss alone.

Shared tables: the word embedding and the *absolute* position embedding where the backbone has one
(BERT, RoBERTa, ELECTRA; DeBERTa-V3 has none: ``position_biased_input: false``) — never the relative
embeddings of DeBERTa's attention, nor the embedding LayerNorm, nor the token-type table (as in the
DeBERTa-V3 code; pretraining blocks are single-segment, so only one type row is ever read). ModernBERT and
EuroBERT number positions by rotation (RoPE), which has no table: they share the word embedding alone
(``embeddings.tok_embeddings`` / ``embed_tokens``), not ModernBERT's embedding LayerNorm.

:class:`SharedEmbedding` replaces D's table and computes its weight on every call from G's live table
(read from G's module at call time, so it survives ``.to()``, loading and FSDP's parameter swaps). G's
table is referenced, not registered: it is not among D's parameters and is saved once, with G.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn
from torch.nn import functional as F

Sharing = Literal["none", "es", "gdes"]

# The absolute position table, on the backbone's `embeddings` module, where the family has one.
POSITION_TABLE = "position_embeddings"


class SharedEmbedding(nn.Module):
    """D's view of G's table: E_G itself (``es``) or sg(E_G) + E_Δ (``gdes``), recomputed on each call.

    ``delta`` (``gdes`` only) is D's own parameter, the E_Δ of the paper, zero unless given.
    """

    def __init__(self, source: nn.Embedding, mode: Literal["es", "gdes"], delta: Tensor | None = None):
        super().__init__()
        if mode not in ("es", "gdes"):
            raise ValueError(f"SharedEmbedding mode must be 'es' or 'gdes', not {mode!r}")
        # object.__setattr__ keeps G's module out of D's children: D's parameters never include E_G.
        object.__setattr__(self, "source", source)
        self.mode = mode
        # What Hugging Face code reads off an nn.Embedding.
        self.num_embeddings, self.embedding_dim = source.num_embeddings, source.embedding_dim
        self.padding_idx = source.padding_idx
        if mode == "gdes":
            initial = torch.zeros_like(source.weight) if delta is None else delta.detach().clone()
            if initial.shape != source.weight.shape:
                raise ValueError(f"E_Δ has shape {tuple(initial.shape)}, E_G {tuple(source.weight.shape)}")
            self.delta = nn.Parameter(initial)

    @property
    def weight(self) -> Tensor:
        """The effective table E_D (vocab, width)."""
        if self.mode == "es":
            return self.source.weight
        # sg(E_G) + E_Δ: the detach is the stop-gradient that keeps the RTD loss off E_G.
        return self.source.weight.detach() + self.delta

    def forward(self, ids: Tensor) -> Tensor:
        # Same lookup as nn.Embedding (the padding row gets no gradient), over the effective table.
        return F.embedding(ids, self.weight, padding_idx=self.padding_idx)

    def extra_repr(self) -> str:
        formula = "E_G" if self.mode == "es" else "sg(E_G) + E_Δ"
        return f"{self.num_embeddings}, {self.embedding_dim}, {self.mode}: {formula}"


def shared_tables(backbone: nn.Module) -> dict[str, nn.Module]:
    """The backbone's shareable tables by module path: the word embedding (the model's input embedding) and, if
    the family has one, the absolute position embedding."""
    tables = [backbone.get_input_embeddings(), getattr(getattr(backbone, "embeddings", None), POSITION_TABLE, None)]
    paths = {id(module): path for path, module in backbone.named_modules()}
    return {paths[id(module)]: module for module in tables if isinstance(module, (nn.Embedding, SharedEmbedding))}


def share_embeddings(
    generator: nn.Module, discriminator: nn.Module, mode: Sharing, keep_discriminator: bool = False
) -> None:
    """Make ``discriminator`` read ``generator``'s word / absolute position tables in ``mode``.

    ``keep_discriminator=False`` (a new run): E_Δ = 0, so E_D == E_G exactly. ``True`` (continued
    pretraining from an export, whose discriminator holds the materialised E_G + E_Δ): E_Δ is set to
    E_D − E_G so the discriminator's effective embedding is the exported one.
    """
    if mode == "none":
        return
    generator_tables, discriminator_tables = shared_tables(generator), shared_tables(discriminator)
    if generator_tables.keys() != discriminator_tables.keys():
        raise ValueError(
            f"generator tables {sorted(generator_tables)} differ from the discriminator's "
            f"{sorted(discriminator_tables)}"
        )
    for name, source in generator_tables.items():
        own = discriminator_tables[name]
        if own.weight.shape != source.weight.shape:
            raise ValueError(
                f"cannot share {name}: the generator's is {tuple(source.weight.shape)}, "
                f"the discriminator's {tuple(own.weight.shape)}"
            )
        delta = (own.weight - source.weight) if keep_discriminator and mode == "gdes" else None
        discriminator.set_submodule(name, SharedEmbedding(source, mode, delta))


@torch.no_grad()
def materialised_state_dict(backbone: nn.Module) -> dict[str, Tensor]:
    """``backbone.state_dict()`` as a plain model of its class has it: every shared table's effective
    weight under ``embeddings.<table>.weight`` (E_G + E_Δ for GDES, E_G for ES) and no ``delta``."""
    state = {name: tensor for name, tensor in backbone.state_dict().items() if not name.endswith(".delta")}
    for name, module in shared_tables(backbone).items():
        state[f"{name}.weight"] = module.weight.detach().clone()
    return state
