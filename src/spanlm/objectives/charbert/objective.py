"""CharBERT (Ma et al. 2020, arXiv 2011.01513): MLM on the token channel + noisy LM on the char channel.

Masking is the noise scheme (:mod:`spanlm.objectives.charbert.masker`): 10% of the term-vocabulary words are
misspelt (insert / delete / swap) and re-tokenised, every sub-word of a noised word is an NLM target
labelled with the original word; whole-word MLM at 10% (80/10/10) never picks a noised word. The
masker here adds the char inputs (:func:`spanlm.data.chars.char_stream`), spelling every MLM target
as a single pad char so its characters never leak the answer — [MASK] has no characters anyway, and
the kept / random 10% + 10% must not show the char channel the original token either.

Model: :class:`~spanlm.models.charbert.DualChannel` over the recipe's backbone (from scratch, or from
a Hugging Face checkpoint as in the paper, which starts from bert-base / roberta-base), BERT's MLM
head on the token channel (decoder tied to the word embedding), :class:`~spanlm.objectives.charbert.nlm.NLMHead` on
the char channel; both run only on their target rows. Loss::

    L = MLM_sum / n_mlm + w_nlm · NLM_sum / n_nlm      (a part with no targets is 0)

Export: both channels as a directory transformers loads (:func:`~spanlm.models.charbert.save_charbert`:
``AutoModel.from_pretrained(export, trust_remote_code=True)`` runs the dual channel, plain ``AutoModel``
the subword backbone alone, with a load report naming the char channel's weights) — which is also what
``load_encoder`` turns into a 2H fine-tuning encoder — and the heads plus the NLM term list so
pretraining can continue from the export.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from spanlm.data.chars import CharVocab, Spelling, build_char_vocab, char_stream
from spanlm.errors import ConfigError, InputError
from spanlm.heads.hf import HEADS_FILE
from spanlm.heads.losses import TokenLoss, VocabTarget, prediction_tallies, vocab_cross_entropies
from spanlm.masking.base import KEEP, MaskedBatch
from spanlm.models.backbone import build_backbone, layer_norm_eps, mlm_head
from spanlm.models.charbert import (
    CharChannelConfig,
    DualChannel,
    is_charbert_directory,
    load_char_weights,
    read_char_vocab,
    read_charbert_config,
    save_charbert,
)
from spanlm.objectives.charbert.masker import NoiseMasker
from spanlm.objectives.charbert.nlm import NLMHead
from spanlm.objectives.masked_batch import MLM_FIELDS, gather_rows
from spanlm.objectives.pretrained_heads import OBJECTIVE_FILE, load_heads
from spanlm.train.objective import Objective

TERMS_FILE = "nlm_terms.json"


class CharNoiseMasker:
    """CharBERT noise + whole-word MLM, then the char stream with every MLM target blanked."""

    # Packed rows keep one pad between blocks: the fusion convolution reads a token to each side.
    packing_gap = 1

    def __init__(self, noise: NoiseMasker, spelling: Spelling, pad_id: int):
        self.noise, self.spelling, self.pad_id = noise, spelling, pad_id

    @property
    def terms(self) -> list[str]:
        return self.noise.terms

    def prepare(self) -> None:
        self.noise.prepare()

    def __call__(self, batch, rng: np.random.Generator) -> MaskedBatch:
        """The noise-masked batch plus its char inputs (see :func:`spanlm.data.chars.char_stream`): ``char_ids``
        (B, C), ``char_lengths`` (B,), ``char_first`` / ``char_last`` (B, L), in the block layout (the model maps
        them into a packed stream with ``source_index``)."""
        masked = self.noise(batch, rng)
        blank = np.zeros(masked.input_ids.size, dtype=bool)
        blank[masked.target_index] = True
        chars = char_stream(masked.input_ids, blank.reshape(masked.input_ids.shape), self.spelling, self.pad_id)
        return masked.add(KEEP, **chars)


def charbert_loss(mlm: TokenLoss, nlm: TokenLoss, nlm_weight: float) -> dict[str, torch.Tensor]:
    """``MLM_sum / n_mlm + w · NLM_sum / n_nlm`` (an empty part is 0, not NaN) and the logged parts."""
    mlm_part = mlm.total / mlm.count.clamp(min=1)
    nlm_part = nlm.total / nlm.count.clamp(min=1)
    return {
        "loss": mlm_part + nlm_weight * nlm_part,
        "mlm_loss": mlm_part.detach(),
        "nlm_loss": nlm_part.detach(),
        "n_mlm": mlm.count,
        "n_nlm": nlm.count,
        "mlm_accuracy": mlm.accuracy,
        "nlm_accuracy": nlm.accuracy,
        **prediction_tallies(mlm=mlm, nlm=nlm),
    }


class CharBERT(Objective):
    supports_packing = True
    batch_fields = (*MLM_FIELDS, "nlm_index", "nlm_labels", "char_ids", "char_lengths", "char_first", "char_last")
    name = "charbert"

    def __init__(self, model: DualChannel, masker: CharNoiseMasker, char_vocab: CharVocab, nlm_weight: float):
        super().__init__()
        self.model = model
        self.masker = masker
        self.char_vocab = char_vocab
        self.nlm_weight = nlm_weight
        eps = layer_norm_eps(model.backbone)
        hidden = model.config.hidden_size
        std = float(model.backbone.config.initializer_range)
        self.mlm_head = mlm_head(model.backbone, initializer_range=std)
        self.nlm_head = NLMHead(hidden, len(masker.terms), layer_norm_eps=eps, initializer_range=std)

    @property
    def terms(self) -> list[str]:
        return self.masker.terms

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        token, char = self.model(batch)  # (B, L, H) each
        mlm_rows = self.mlm_head.features(gather_rows(token, batch["target_index"]))  # (N, E)
        nlm_rows = self.nlm_head.features(gather_rows(char, batch["nlm_index"]))  # (K, H)
        mlm, nlm = vocab_cross_entropies(
            [
                VocabTarget(mlm_rows, self.mlm_head.decoder, batch["target_labels"]),
                VocabTarget(nlm_rows, self.nlm_head.decoder, batch["nlm_labels"]),
            ]
        )
        return charbert_loss(mlm, nlm, self.nlm_weight)

    def heads_state(self) -> dict[str, torch.Tensor]:
        """MLM and NLM heads' own weights (the MLM decoder's tied weight belongs to the backbone)."""
        return {
            name: tensor.detach().contiguous()
            for name, tensor in self.named_parameters()
            if name.startswith(("mlm_head.", "nlm_head."))
        }

    def export(self, directory: Path, tokenizer) -> None:
        from safetensors.torch import save_file

        directory = Path(directory)
        save_charbert(self.model, directory, self.char_vocab)
        save_file(self.heads_state(), str(directory / HEADS_FILE))
        (directory / TERMS_FILE).write_text(json.dumps(self.terms, ensure_ascii=False) + "\n", encoding="utf-8")
        (directory / OBJECTIVE_FILE).write_text(json.dumps({"objective": self.name}) + "\n", encoding="utf-8")

    def shard_units(self):
        return self.model.shard_units()


def _continue_from(objective: CharBERT, directory: Path, charbert_export: bool) -> None:
    """Continued pretraining: the char channel of a CharBERT export, the MLM head of a transformers
    ``*ForMaskedLM`` or of the export, and the NLM head when its term vocabulary is this corpus's."""
    if charbert_export:
        load_char_weights(objective.model, directory)
    terms = directory / TERMS_FILE
    skip = {}
    if not terms.is_file():
        skip["nlm_head"] = f"no {TERMS_FILE} in the checkpoint"
    elif json.loads(terms.read_text(encoding="utf-8")) != objective.terms:
        skip["nlm_head"] = "the checkpoint's NLM terms are another corpus's"
    load_heads(objective, directory, {"mlm_head": ("mlm", directory, objective.model.backbone.config)}, skip)


def build_charbert(recipe, corpus) -> CharBERT:
    settings = recipe.objective.charbert
    backbone = build_backbone(recipe.model, corpus)
    if backbone.config.model_type not in ("bert", "roberta", "electra"):
        raise ConfigError(
            f"objective 'charbert' runs over bert, roberta or electra backbones, not '{backbone.config.model_type}'"
        )
    if int(backbone.config.hidden_size) % 4:
        raise ConfigError(
            f"objective 'charbert' needs model.hidden_size divisible by 4 (a BiGRU of H/4 per direction, "
            f"read at the first and last char), got {backbone.config.hidden_size}"
        )
    source = Path(recipe.model.path) if recipe.model.path else None
    continuing = source is not None and is_charbert_directory(source)
    if continuing:
        # The char embedding rows belong to the export's character vocabulary: keep it.
        char_vocab = read_char_vocab(source)
        config = read_charbert_config(source)
    else:
        char_vocab = build_char_vocab(corpus, settings.char_vocab_size)
        config = CharChannelConfig(
            char_vocab_size=char_vocab.size,
            hidden_size=int(backbone.config.hidden_size),
            char_embedding_size=settings.char_embedding_size,
            fusion=settings.fusion,
            num_layers=int(backbone.config.num_hidden_layers),
            layer_norm_eps=layer_norm_eps(backbone),
        )
    if config.hidden_size != int(backbone.config.hidden_size):
        raise InputError(
            f"{source}: charbert.json is for hidden size {config.hidden_size}, the backbone has "
            f"{backbone.config.hidden_size}"
        )
    model = DualChannel(backbone, config)
    noise = NoiseMasker.from_corpus(recipe.masking.noise, corpus)
    masker = CharNoiseMasker(
        noise, Spelling.from_tokenizer(corpus.tokenizer, char_vocab), int(corpus.special_ids["pad"])
    )
    objective = CharBERT(model, masker, char_vocab, settings.nlm_weight)
    if source is not None:
        _continue_from(objective, source, continuing)
    return objective
