"""ELECTRA replaced-token detection (Clark et al. 2020, arXiv 2003.10555) with DeBERTa-V3 embedding sharing.

A generator G (a small masked LM) predicts the masked tokens; its softmax is sampled at every masked
position (Gumbel-max, temperature 1, no gradient); a discriminator D reads the original text with the
samples in place and labels every non-pad token original / replaced (a sample equal to the original is
original). Loss (ELECTRA §2)::

    L = L_MLM(G) + λ · L_RTD(D)        λ = 50 (ELECTRA), 10 (DeBERTa-V3)

with L_MLM per masked token (plus SpanBERT's SBO part for an ``sbo`` generator) and L_RTD the BCE
averaged over non-pad tokens. G and D share embeddings as ``objective.electra.sharing`` says
(:mod:`spanlm.models.sharing`: ``none`` / ``es`` / ``gdes``, He et al. 2021, arXiv 2111.09543).

Sizes: D is the recipe's ``model``; G is the same family scaled by ``generator_width`` (hidden, heads,
FFN; ELECTRA: 1/4..1/3, same depth) and ``generator_depth`` (DeBERTa-V3: same width, half the layers).
G's embedding keeps D's embedding width (ELECTRA §3.2 "embeddings the size of the discriminator's
hidden states"), projected to G's hidden size inside the model (``embedding_size`` of the electra and
deberta-v2 families).

Randomness: the masker (in DataLoader workers, seeded by the batch key) also draws a 63-bit
``sample_seed`` per batch; the Gumbel noise is hashed from it (:func:`~spanlm.objectives.electra.rtd.uniforms`). So the
replacements are a function of the batch key, like the masks: independent of the global RNG, of the
number of workers and ranks, and replayed exactly on resume.

Export: D as the downstream encoder with its effective embedding E_G + E_Δ (GDES) or E_G (ES)
materialised — ``ElectraForPreTraining`` with its RTD head for the electra family and head (``AutoModel``
loads the encoder either way) —, G as ``*ForMaskedLM`` in ``generator/``, the heads transformers has no
class for (SBO, DeBERTa-V3's RTD head) in ``heads.safetensors``.
Setting ``model.path`` to such an export continues pretraining: E_Δ is restored as E_D − E_G.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from spanlm.data.tokenizer import save_tokenizer
from spanlm.errors import ConfigError, InputError
from spanlm.heads.losses import VocabTarget, masked_lm_loss, span_bert_loss, vocab_cross_entropies
from spanlm.heads.sbo import MAX_TARGETS, SBOHead
from spanlm.masking.base import KEEP, MaskedBatch, build_masker
from spanlm.models.backbone import (
    BackboneConfig,
    backbone_layers,
    build_backbone,
    hidden_size,
    input_embeddings,
    layer_norm_eps,
    mlm_head,
)
from spanlm.models.packed import packed_block_starts
from spanlm.models.sharing import materialised_state_dict, share_embeddings
from spanlm.objectives.electra.config import ElectraConfig
from spanlm.objectives.electra.rtd import RTD_HEADS, DebertaV3RTDHead, gumbel_max_sample, replace_tokens, rtd_loss
from spanlm.objectives.masked_batch import MLM_FIELDS, SBO_FIELDS, encode, gather_rows
from spanlm.objectives.pretrained_heads import export_backbone, export_heads, load_heads
from spanlm.train.objective import Objective

GENERATOR_DIR = "generator"


class SampledMasker:
    """Any masker, then one draw from the same ``rng`` for the batch's sampling seed (masks unchanged)."""

    def __init__(self, masker):
        self.masker = masker

    def __call__(self, batch, rng: np.random.Generator) -> MaskedBatch:
        """The masker's batch plus ``sample_seed`` (1,): the seed of its replacement sampling."""
        masked = self.masker(batch, rng)
        return masked.add(KEEP, sample_seed=rng.integers(0, 2**63 - 1, size=1, dtype=np.int64))


def generator_config(model: BackboneConfig, settings: ElectraConfig) -> BackboneConfig:
    """The generator's backbone: ``model`` scaled by the width / depth ratios, embedding width kept."""
    width = settings.generator_width
    hidden, heads = round(model.hidden_size * width), max(1, round(model.num_heads * width))
    if hidden < 1 or hidden % heads:
        raise ConfigError(
            f"objective.electra.generator_width {width} gives a generator of hidden size {hidden} "
            f"and {heads} heads (model.hidden_size × width must be a positive multiple of the heads)"
        )
    changes = {
        "hidden_size": hidden,
        "num_heads": heads,
        "intermediate_size": max(1, round(model.intermediate_size * width)),
        "num_layers": max(1, round(model.num_layers * settings.generator_depth)),
    }
    if model.family in ("electra", "deberta-v2"):
        changes["embedding_size"] = model.embedding_size or model.hidden_size
    elif hidden != model.hidden_size and settings.sharing != "none":
        raise ConfigError(
            f"model.family {model.family} has no embedding projection, so a generator narrower than the "
            f"discriminator (objective.electra.generator_width {width}) cannot share its embedding: use "
            f"family electra or deberta-v2, generator_width 1.0, or sharing none"
        )
    return dataclasses.replace(model, **changes)


class Electra(Objective):
    supports_packing = True
    name = "electra"

    def __init__(
        self,
        generator,
        discriminator,
        masker,
        settings: ElectraConfig,
        sbo_weight: float = 1.0,
        max_targets: int = MAX_TARGETS,
    ):
        super().__init__()
        self.generator, self.discriminator = generator, discriminator
        self.masker = masker
        self.settings = settings
        self.sbo_weight = sbo_weight
        # The Gumbel noise's seed; a SpanBERT generator's SBO targets too.
        self.batch_fields = (*MLM_FIELDS, "sample_seed", *(SBO_FIELDS if settings.generator_head == "sbo" else ()))
        std = float(generator.config.initializer_range)
        embedding = input_embeddings(generator)  # E_G: the generator's heads decode through it
        self.mlm_head = mlm_head(generator, initializer_range=std)
        self.sbo_head = None
        if settings.generator_head == "sbo":
            self.sbo_head = SBOHead(
                hidden_size(generator),
                embedding,
                max_targets=max_targets,
                layer_norm_eps=layer_norm_eps(generator),
                initializer_range=std,
            )
        head = RTD_HEADS[settings.discriminator_head]
        extra = {"layer_norm_eps": layer_norm_eps(discriminator)} if head is DebertaV3RTDHead else {}
        self.rtd_head = head(
            hidden_size(discriminator), initializer_range=float(discriminator.config.initializer_range), **extra
        )

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        # --- generator: a masked LM on the corrupted input
        hidden = encode(self.generator, batch)  # (B, L, H_G)
        rows = self.mlm_head.features(gather_rows(hidden, batch["target_index"]))  # (N, E)
        # Replacements: sampled from G's softmax at every target, without gradient (ELECTRA §2), inside
        # the MLM loss from the same log-probabilities (softmax(logits/T) is unchanged by the row shift).
        seed, temperature = batch["sample_seed"][0], self.settings.temperature
        sampler = lambda log_probs: gumbel_max_sample(log_probs, temperature, seed)  # noqa: E731
        if self.sbo_head is None:
            (mlm,) = vocab_cross_entropies([VocabTarget(rows, self.mlm_head.decoder, batch["target_labels"], sampler)])
            parts = masked_lm_loss(mlm)
        else:
            sbo_rows = self.sbo_head.features(
                hidden, batch["sbo_left"], batch["sbo_right"], batch["sbo_relative"]
            )  # (M, E)
            mlm, sbo = vocab_cross_entropies(
                [
                    VocabTarget(rows, self.mlm_head.decoder, batch["target_labels"], sampler),
                    VocabTarget(sbo_rows, self.sbo_head.decoder, batch["sbo_labels"]),
                ]
            )
            parts = span_bert_loss(mlm, sbo, self.sbo_weight)
        generator_loss = parts.pop("loss")

        # --- the discriminator's input: targets replaced by the samples
        with torch.no_grad():
            samples = mlm.samples  # (N,)
            ids, replaced = replace_tokens(
                batch["input_ids"], batch["target_index"], samples, batch["target_labels"]
            )  # (B, L) each
            # Every position is scored and the pads are masked out of the loss: selecting the non-pad rows
            # would give a data-dependent shape (a host sync on a GPU, a graph break under torch.compile).
            positions = torch.arange(ids.numel(), device=ids.device)  # (B·L,)
            block_starts = packed_block_starts(batch.get("position_ids"))  # (B·L,) or None: one block per row
            scored = batch["attention_mask"].flatten().bool()  # (B·L,)
            sample_accuracy = (samples == batch["target_labels"]).sum().float() / max(samples.numel(), 1)

        # --- discriminator: original / replaced for every non-pad token
        d_hidden = encode(self.discriminator, batch, input_ids=ids)  # (B, L, H_D)
        rtd = rtd_loss(self.rtd_head(d_hidden, positions, block_starts), replaced.flatten(), scored)
        return {
            "loss": generator_loss + self.settings.rtd_weight * rtd.mean,
            **parts,
            "rtd_loss": rtd.mean.detach(),
            **rtd.metrics(),
            # the share of samples equal to the original (ELECTRA's "sampled MLM accuracy")
            "sample_accuracy": sample_accuracy,
        }

    def export(self, directory: Path, tokenizer) -> None:
        """D as ``ElectraForPreTraining`` (its RTD head under transformers' names; other families / heads: the
        bare encoder, the head in heads.safetensors) with E_D materialised; G as ``*ForMaskedLM`` in generator/."""

        directory = Path(directory)
        written = set()
        if export_backbone(
            self.discriminator, directory, self.rtd_head, "rtd", state_dict=materialised_state_dict(self.discriminator)
        ):
            written.add("rtd_head")
        if export_backbone(self.generator, directory / GENERATOR_DIR, self.mlm_head, "mlm"):
            written.add("mlm_head")
        save_tokenizer(tokenizer, directory / GENERATOR_DIR)
        export_heads(self, directory, written, {"sharing": self.settings.sharing, "generator": GENERATOR_DIR})

    def shard_units(self):
        return backbone_layers(self.generator) + backbone_layers(self.discriminator)


def build_electra(recipe, corpus) -> Electra:
    settings = recipe.objective.electra
    source = Path(recipe.model.path) if recipe.model.path else None
    if source is None:
        generator_model = generator_config(recipe.model, settings)
    else:
        if not (source / GENERATOR_DIR / "config.json").is_file():
            raise InputError(
                f"{source}: continuing ELECTRA pretraining needs a spanlm electra export "
                f"(the generator in {source / GENERATOR_DIR}/); none found"
            )
        generator_model = dataclasses.replace(recipe.model, path=str(source / GENERATOR_DIR))
    generator = build_backbone(generator_model, corpus)
    discriminator = build_backbone(recipe.model, corpus)
    try:
        share_embeddings(generator, discriminator, settings.sharing, keep_discriminator=source is not None)
    except ValueError as error:
        raise ConfigError(f"objective.electra.sharing {settings.sharing}: {error}") from None
    objective = Electra(
        generator,
        discriminator,
        SampledMasker(build_masker(recipe.masking, corpus)),
        settings,
        recipe.objective.sbo_weight,
        recipe.masking.span.max_targets,
    )
    if source is not None:
        load_heads(
            objective,
            source,
            {
                "mlm_head": ("mlm", source / GENERATOR_DIR, generator.config),
                "rtd_head": ("rtd", source, discriminator.config),
            },
        )
    return objective
