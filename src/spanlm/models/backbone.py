"""The encoder every objective trains: a bare Hugging Face model, built from a small config or loaded.

Two ways to get one, chosen by ``BackboneConfig.path``:

* ``path: null`` — pretraining from scratch. A transformers config of ``family`` is filled from the
  size fields below and from the *prepared corpus* (vocabulary size and special ids come from the
  tokenizer the shards were made with, never from a default), then ``AutoModel.from_config``.
* ``path: <dir>`` — continued pretraining from a local Hugging Face checkpoint directory
  (``AutoModel.from_pretrained(dir, local_files_only=True)``). The architecture is the checkpoint's own
  (its config.json); the size, dropout and ``extra`` fields are ignored. :func:`check_vocabulary` then
  makes sure the checkpoint can read the prepared token ids.

Either way the model is the bare encoder (``BertModel``, ``RobertaModel``, ``ElectraModel``,
``DebertaV2Model``, ``ModernBertModel``, ``EuroBertModel``) without a pooler: pretraining heads live in
:mod:`spanlm.heads`, and a pooler that no loss reaches would be an unused parameter under DDP.
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from torch import nn

from spanlm.data.tokenizer import load_tokenizer, tokenizer_fingerprint
from spanlm.errors import ConfigError, InputError
from spanlm.heads.mlm import MLMHead
from spanlm.models.modern_config import MODERN_FAMILIES, modern_values, with_settings_of_no_weight

if TYPE_CHECKING:  # transformers is imported lazily: reading a recipe must not pay for it
    from transformers import PreTrainedModel

    from spanlm.data.shards import PreparedCorpus

Family = Literal["bert", "roberta", "electra", "deberta-v2", "modernbert", "eurobert"]

# The modern encoders (Warner et al. 2024, ModernBERT, arXiv 2412.13663; Boizard et al. 2025, EuroBERT, arXiv
# 2503.05500): rotary positions (no position table), no biases, pre-norm layers with a final norm; ModernBERT
# alternates sliding-window and global attention. Their own settings are BackboneConfig fields below.

# Attention implementation per family. BERT, RoBERTa and ELECTRA set `_supports_sdpa = True` in
# transformers 5.23, so attention runs through torch.nn.functional.scaled_dot_product_attention
# (fused kernels on CPU and GPU). DeBERTa-V2/V3 does not: its disentangled attention adds the
# content→position and position→content terms (c2p / p2c) to the attention scores inside
# DisentangledSelfAttention, which only has the eager path, and `from_config(attn_implementation="sdpa")`
# raises a ValueError. tests/models/test_backbone.py checks this table against `_supports_sdpa`, so a
# transformers upgrade that adds SDPA to DeBERTa fails loudly instead of leaving speed on the table.
ATTENTION = {
    "bert": "sdpa",
    "roberta": "sdpa",
    "electra": "sdpa",
    "deberta-v2": "eager",
    "modernbert": "sdpa",
    "eurobert": "sdpa",
}

# Models without a pooler argument (ELECTRA and DeBERTa-V2 never build one).
_HAS_POOLER = {"bert", "roberta"}

# DeBERTa-V3 (He et al. 2021, arXiv 2111.09543) is the "deberta-v2" model type with relative attention
# configured as in microsoft/deberta-v3-{xsmall,small,base,large}/config.json: log-bucketed relative
# positions (256 buckets), both disentangled terms, no absolute position embedding added to the input,
# LayerNorm on the relative embeddings and keys/queries shared between content and position.
DEBERTA_V3_DEFAULTS: dict[str, Any] = {
    "relative_attention": True,
    "position_buckets": 256,
    "pos_att_type": ["p2c", "c2p"],
    "position_biased_input": False,
    "norm_rel_ebd": "layer_norm",
    "share_att_key": True,
    "max_relative_positions": -1,
    "layer_norm_eps": 1e-7,
    "type_vocab_size": 0,
    "hidden_act": "gelu",
}

# DeBERTa-V2 reads these with getattr(config, ...) in modeling_deberta_v2.py instead of declaring them
# as config fields; they are valid `extra` keys although a default DebertaV2Config lacks them.
_DEBERTA_OPTIONAL_KEYS = {
    "position_buckets",
    "norm_rel_ebd",
    "share_att_key",
    "attention_head_size",
    "conv_kernel_size",
    "conv_groups",
    "conv_act",
}

# Fields that come from the prepared corpus (or from the named BackboneConfig field) and so may not be
# overridden through `extra`.
_RESERVED_EXTRA_KEYS = {
    "vocab_size",
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
    "model_type",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "embedding_size",
    "layer_norm_eps",
    "initializer_range",
    # the modern families' named fields (or the corpus's special ids)
    "norm_eps",
    "rms_norm_eps",
    "attention_dropout",
    "embedding_dropout",
    "mlp_dropout",
    "local_attention",
    "layer_types",
    "rope_parameters",
    "cls_token_id",
    "sep_token_id",
    "mask_token_id",
}


@dataclasses.dataclass
class BackboneConfig:
    """The encoder: a family and its size for pretraining from scratch, or a checkpoint ``path``.

    Defaults are a small model (H256, 4 layers) that pretrains on a laptop CPU in minutes; BERT-base is
    ``hidden_size: 768, num_layers: 12, num_heads: 12, intermediate_size: 3072``.
    """

    family: Family = "bert"
    # A local Hugging Face checkpoint directory (config.json + weights) for continued pretraining. Its
    # config decides the architecture; it must be of ``family``.
    path: str | None = None
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 1024
    # Longest input in tokens, [CLS] and [SEP] included. (RoBERTa's position table gets pad_id + 1 more
    # rows, because its position ids start after the padding index: 512 tokens → 514 rows.)
    max_position_embeddings: int = 512
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    # Width of the token embeddings when it differs from hidden_size (ELECTRA's factorised embedding,
    # projected to hidden_size inside the model; DeBERTa likewise). None = hidden_size.
    embedding_size: int | None = None
    layer_norm_eps: float | None = None  # None = the family's default (BERT 1e-12, DeBERTa-V3 1e-7)
    initializer_range: float = 0.02
    # ModernBERT only (None: the family's default, ModernBertConfig's: a 128-token window, every third layer
    # global): the sliding window of its local layers in tokens (``local_attention``, half on each side) and
    # which layers attend globally (every ``global_attention_every``-th, the first included).
    local_attention: int | None = None
    global_attention_every: int | None = None
    # RoPE base (modernbert: of its global layers, default 160k; eurobert: of every layer, default 10k) and
    # ModernBERT's local layers' base (default 10k). None: the family's default.
    rope_theta: float | None = None
    local_rope_theta: float | None = None
    # Any other key of the family's transformers config, applied last (e.g. {"relative_attention": false}
    # for a DeBERTa-V2-style model with absolute positions). Unknown keys are rejected at build time.
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_layers", "num_heads", "intermediate_size", "max_position_embeddings"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of num_heads {self.num_heads}")
        for name in ("hidden_dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1)")
        if self.embedding_size is not None:
            if self.family not in ("electra", "deberta-v2"):
                raise ValueError(
                    f"embedding_size is only supported by the electra and deberta-v2 families, not {self.family}"
                )
            if self.embedding_size < 1:
                raise ValueError("embedding_size must be positive")
        modern = {"local_attention": ("modernbert",), "global_attention_every": ("modernbert",)}
        modern |= {"rope_theta": MODERN_FAMILIES, "local_rope_theta": ("modernbert",)}
        for name, families in modern.items():
            value = getattr(self, name)
            if value is None:
                continue
            if self.family not in families:
                raise ValueError(
                    f"{name} is a setting of the {' and '.join(families)} famil{'ies' if len(families) > 1 else 'y'}; "
                    f"family {self.family} has none"
                )
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        if self.local_attention is not None and self.local_attention % 2:
            raise ValueError(f"local_attention must be even (half a window on each side), got {self.local_attention}")
        reserved = sorted(_RESERVED_EXTRA_KEYS & set(self.extra))
        if reserved:
            raise ValueError(f"extra may not set {', '.join(reserved)} (set by the prepared corpus or a named field)")


def build_backbone(config: BackboneConfig, corpus: PreparedCorpus) -> PreTrainedModel:
    """The bare encoder for ``corpus``: built from ``config``, or loaded from ``config.path`` and checked."""
    if config.path is not None:
        model = _load_checkpoint(config, corpus)
    else:
        from transformers import AutoModel

        model_config = _transformers_config(config, corpus)
        kwargs = {"add_pooling_layer": False} if config.family in _HAS_POOLER else {}
        model = AutoModel.from_config(model_config, attn_implementation=ATTENTION[config.family], **kwargs)
    return model


def _transformers_config(config: BackboneConfig, corpus: PreparedCorpus):
    from transformers import AutoConfig

    special = corpus.special_ids
    max_positions = config.max_position_embeddings
    if config.family == "roberta":
        # RobertaEmbeddings numbers positions padding_idx + 1, padding_idx + 2, ...; the table must hold
        # max_position_embeddings tokens after that offset (the 514 of roberta-base, for pad id 1).
        max_positions += special["pad"] + 1
    values: dict[str, Any] = {
        "vocab_size": corpus.vocab_size,
        "pad_token_id": special["pad"],
        # [CLS] / [SEP] play BOS / EOS (RoBERTa's <s> / </s>); recorded so exported configs are complete.
        "bos_token_id": special["cls"],
        "eos_token_id": special["sep"],
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "intermediate_size": config.intermediate_size,
        "max_position_embeddings": max_positions,
        "hidden_dropout_prob": config.hidden_dropout,
        "attention_probs_dropout_prob": config.attention_dropout,
        "initializer_range": config.initializer_range,
    }
    if config.family == "deberta-v2":
        values.update(DEBERTA_V3_DEFAULTS)
    if config.family == "electra":
        # ElectraConfig defaults to embedding_size 128 (ELECTRA-small); here the embedding has the
        # hidden width unless asked otherwise, like BERT.
        values["embedding_size"] = config.embedding_size or config.hidden_size
    elif config.embedding_size is not None:
        values["embedding_size"] = config.embedding_size
    if config.layer_norm_eps is not None:
        values["layer_norm_eps"] = config.layer_norm_eps
    if config.family in MODERN_FAMILIES:
        values = modern_values(config, values, special)
    _check_extra(config)
    values.update(config.extra)
    return AutoConfig.for_model(config.family, **values)


def _check_extra(config: BackboneConfig) -> None:
    """Reject `extra` keys the family's config does not know (transformers would silently keep them)."""
    if not config.extra:
        return
    from transformers import AutoConfig

    known = set(AutoConfig.for_model(config.family).to_dict())
    if config.family == "deberta-v2":
        known |= _DEBERTA_OPTIONAL_KEYS
    unknown = sorted(set(config.extra) - known)
    if unknown:
        raise ConfigError(f"config key 'model.extra.{unknown[0]}' is not a {config.family} config field")


def _load_checkpoint(config: BackboneConfig, corpus: PreparedCorpus) -> PreTrainedModel:
    from transformers import AutoConfig, AutoModel

    path = Path(config.path)
    if not (path / "config.json").is_file():
        raise InputError(f"{path}: not a Hugging Face checkpoint directory (no config.json)")
    try:
        checkpoint_config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    except Exception as error:  # transformers raises OSError / ValueError / KeyError for bad configs
        raise InputError(
            f"{path}/config.json: cannot be read as a transformers config: {error}".split("\n")[0]
        ) from None
    found = checkpoint_config.model_type
    if found not in ATTENTION:
        raise InputError(f"{path} holds a '{found}' model; spanlm pretrains {', '.join(ATTENTION)}")
    if found != config.family:
        raise InputError(
            f"{path} holds a '{found}' model but model.family is '{config.family}'; set model.family: {found}"
        )
    kwargs = {"add_pooling_layer": False} if config.family in _HAS_POOLER else {}
    checkpoint_config = with_settings_of_no_weight(checkpoint_config, config)
    try:
        with quiet_load_report():
            model, info = AutoModel.from_pretrained(
                str(path),
                config=checkpoint_config,
                local_files_only=True,
                attn_implementation=ATTENTION[config.family],
                output_loading_info=True,
                **kwargs,
            )
    except Exception as error:  # missing / corrupt weights, shape mismatches
        raise InputError(f"{path}: cannot load the checkpoint: {error}".split("\n")[0]) from None
    missing = sorted(info["missing_keys"])
    if missing:
        raise InputError(
            f"{path}: the checkpoint lacks {len(missing)} of the encoder's weights ({', '.join(missing[:3])}"
            f"{', ...' if len(missing) > 3 else ''}); it is not a complete {found} encoder"
        )
    check_vocabulary(model, corpus, path)
    return model


@contextlib.contextmanager
def quiet_load_report():
    """Hide transformers' report of the checkpoint keys a bare encoder does not use.

    Loading the encoder of a task checkpoint (``BertForMaskedLM``, ``ElectraForPreTraining``) makes
    transformers list the head's weights as unexpected; spanlm reads those heads itself and says which
    it loaded, and checks for missing encoder weights through ``output_loading_info``.
    """
    import logging

    # A filter, not a higher level: transformers runs extra checks (and warns) when that logger's level is set.
    logger = logging.getLogger("transformers.modeling_utils")
    report = lambda record: "LOAD REPORT" not in record.getMessage()  # noqa: E731
    logger.addFilter(report)
    try:
        yield
    finally:
        logger.removeFilter(report)


TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "vocab.json",
    "spm.model",
    "sentencepiece.bpe.model",
)


def check_vocabulary(model: PreTrainedModel, corpus: PreparedCorpus, where: str | Path) -> None:
    """Raise :class:`InputError` unless ``model`` (loaded from ``where``) can read ``corpus``'s token ids.

    * When the checkpoint directory has tokenizer files, that tokenizer must be the one the shards were
      made with (same :func:`~spanlm.data.tokenizer.tokenizer_fingerprint`): the same ids must mean the
      same tokens, or continued pretraining silently starts from scrambled embeddings.
    * The embedding must have a row for every id of the prepared tokenizer. More rows are fine
      (checkpoints often pad the vocabulary to a multiple of 8 or 128).
    * The checkpoint's pad id (padding_idx; RoBERTa's position offset) must be the tokenizer's.
    """

    where = Path(where)
    prepared = corpus.directory / "tokenizer"
    rows = input_embeddings(model).num_embeddings
    if any((where / name).is_file() for name in TOKENIZER_FILES):
        theirs = load_tokenizer(where)
        fingerprint = tokenizer_fingerprint(theirs)
        if fingerprint != corpus.meta["tokenizer_fingerprint"]:
            raise InputError(
                f"the tokenizer of checkpoint {where} ({len(theirs)} tokens, fingerprint {fingerprint}) differs "
                f"from the one corpus {corpus.directory} was prepared with ({prepared}: {corpus.vocab_size} "
                f"tokens, fingerprint {corpus.meta['tokenizer_fingerprint']}); token ids would not match the "
                f"checkpoint's embeddings. Prepare the corpus again with tokenizer.path: {where}"
            )
    if rows < corpus.vocab_size:
        raise InputError(
            f"checkpoint {where} has {rows} embedding rows but corpus {corpus.directory} was prepared with a "
            f"tokenizer of {corpus.vocab_size} tokens ({prepared}); ids ≥ {rows} would have no embedding. "
            f"Prepare the corpus with the checkpoint's tokenizer (tokenizer.path: {where})"
        )
    pad = corpus.special_ids["pad"]
    if getattr(model.config, "pad_token_id", None) not in (None, pad):
        raise InputError(
            f"checkpoint {where} has pad_token_id {model.config.pad_token_id} but the tokenizer of corpus "
            f"{corpus.directory} pads with id {pad}; prepare the corpus with the checkpoint's tokenizer"
        )


def input_embeddings(model: PreTrainedModel) -> nn.Embedding:
    """The word-embedding table (vocab, embedding width) that output decoders are tied to."""
    embedding = model.get_input_embeddings()
    if not isinstance(embedding, nn.Embedding):
        raise TypeError(
            f"{type(model).__name__}.get_input_embeddings() is a {type(embedding).__name__}, not nn.Embedding"
        )
    return embedding


def hidden_size(model: PreTrainedModel) -> int:
    """Width of the encoder's output hidden states (may differ from the embedding width)."""
    return int(model.config.hidden_size)


def backbone_layers(backbone) -> list:
    """The encoder's transformer layers (``encoder.layer``; the modern families' ``layers``; else empty)."""
    encoder = getattr(backbone, "encoder", None)
    if encoder is not None:
        return list(getattr(encoder, "layer", []))
    return list(getattr(backbone, "layers", []))


def layer_norm_eps(backbone) -> float:
    """The epsilon of the encoder's layer norms, which spanlm's heads use too."""
    config = backbone.config
    for name in ("layer_norm_eps", "norm_eps", "rms_norm_eps"):
        if hasattr(config, name):
            return float(getattr(config, name))
    return 1e-12


def mlm_head(backbone, initializer_range: float | None = None) -> MLMHead:
    """The MLM head of the backbone's family, over its input embedding: BERT's (dense, GeLU, LayerNorm, tied
    decoder with a bias) for the BERT-like families, ``ModernBertForMaskedLM``'s (the same, biases as its config
    says), ``EuroBertForMaskedLM``'s (the decoder alone, tied only where its config ties it)."""
    config = backbone.config
    std = float(config.initializer_range) if initializer_range is None else initializer_range
    options: dict[str, Any] = {}
    if config.model_type == "modernbert":
        options = {"bias": bool(config.classifier_bias) and bool(config.norm_bias), "decoder_bias": config.decoder_bias}
        if config.classifier_bias != config.norm_bias or config.classifier_activation != "gelu":
            raise InputError(
                f"ModernBERT with classifier_bias {config.classifier_bias}, norm_bias {config.norm_bias}, "
                f"classifier_activation {config.classifier_activation}: spanlm's MLM head takes both biases or "
                "neither and GeLU"
            )
    elif config.model_type == "eurobert":
        options = {"transform": False, "decoder_bias": bool(config.mlp_bias)}
    # a checkpoint whose decoder is untied from its input embedding (tie_word_embeddings: false) keeps its own
    options["tied"] = bool(getattr(config, "tie_word_embeddings", True))
    return MLMHead(
        hidden_size(backbone),
        input_embeddings(backbone),
        layer_norm_eps=layer_norm_eps(backbone),
        initializer_range=std,
        **options,
    )


def shortest_position_table(module: nn.Module) -> int | None:
    """The most tokens every transformers encoder inside ``module`` can number (None when it holds none)."""
    from transformers import PreTrainedModel

    limits = [max_sequence_length(m) for m in module.modules() if isinstance(m, PreTrainedModel)]
    return min(limits) if limits else None


def max_sequence_length(model: PreTrainedModel) -> int:
    """Longest input (in tokens) the model's position table can number; compare with data.max_len."""
    return config_max_sequence_length(model.config.to_dict())


def config_max_sequence_length(config: dict) -> int | None:
    """:func:`max_sequence_length` of a model from its ``config.json`` alone (None where it has no
    ``max_position_embeddings``). RoBERTa numbers its positions after the padding id."""
    if "max_position_embeddings" not in config:
        return None
    if config.get("model_type") == "roberta":
        return int(config["max_position_embeddings"]) - int(config["pad_token_id"]) - 1
    return int(config["max_position_embeddings"])
