"""The classification head of each encoder family, in the layout of its transformers ``*ForSequenceClassification``.

The head's modules are transformers' own (``BertPooler``, ``RobertaClassificationHead``, …) under the names the stock
class gives them, and :meth:`StockHead.forward` applies them as the stock class's forward does (which token or mean
it pools, which activation, where dropout goes), so the exported directory *is* that class's checkpoint and
``AutoModelForSequenceClassification`` computes the same logits. ``EXPORT_PREFIX`` maps the head's own state names to
the stock class's (BERT's pooler lives inside its base model, ``bert.pooler``).

An encoder of another kind (CharBERT's two channels, 2H wide) gets :class:`PoolerHead`: BERT's pooler and classifier
over the [CLS] vector, exported in spanlm's own file.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

# family → {head state prefix: the stock class's name for it}
EXPORT_PREFIX = {
    "bert": {"pooler.": "bert.pooler.", "classifier.": "classifier."},
    "roberta": {"classifier.": "classifier."},
    "electra": {"classifier.": "classifier."},
    "deberta-v2": {"pooler.": "pooler.", "classifier.": "classifier."},
    "modernbert": {"head.": "head.", "classifier.": "classifier."},
    "eurobert": {"dense.": "dense.", "classifier.": "classifier."},
}


def _dropout(config, *names: str) -> float:
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return float(value)
    return 0.0


# The families whose stock head reads the first token only: a mean-pooled head of theirs is fed the mean as that token
FIRST_TOKEN_FAMILIES = ("bert", "roberta", "electra", "deberta-v2")


class StockHead(nn.Module):
    """The stock ``*ForSequenceClassification`` head of ``family`` for ``config`` (``num_labels`` set), reading
    ``pooling`` ("cls": the first token; "mean": the real tokens' mean). ``stock``: whether the stock class pools
    that way, so that its checkpoint is this head's export (ModernBERT and EuroBERT pool either way by their
    ``classifier_pooling``; the first-token families only by the first token)."""

    def __init__(self, family: str, config, pooling: str = "cls"):
        super().__init__()
        self.family = family
        self.pooling = pooling
        self.stock = pooling == "cls" or family not in FIRST_TOKEN_FAMILIES
        labels = config.num_labels
        if family == "bert":
            from transformers.models.bert.modeling_bert import BertPooler

            self.pooler = BertPooler(config)
            self.dropout = nn.Dropout(_dropout(config, "classifier_dropout", "hidden_dropout_prob"))
            self.classifier = nn.Linear(config.hidden_size, labels)
        elif family == "roberta":
            from transformers.models.roberta.modeling_roberta import RobertaClassificationHead

            self.classifier = RobertaClassificationHead(config)
        elif family == "electra":
            from transformers.models.electra.modeling_electra import ElectraClassificationHead

            self.classifier = ElectraClassificationHead(config)
        elif family == "deberta-v2":
            from transformers.models.deberta_v2.modeling_deberta_v2 import ContextPooler

            self.pooler = ContextPooler(config)
            self.dropout = nn.Dropout(_dropout(config, "cls_dropout", "hidden_dropout_prob"))
            self.classifier = nn.Linear(self.pooler.output_dim, labels)
        elif family == "modernbert":
            from transformers.models.modernbert.modeling_modernbert import ModernBertPredictionHead

            self.pooling = config.classifier_pooling
            self.head = ModernBertPredictionHead(config)
            self.dropout = nn.Dropout(_dropout(config, "classifier_dropout"))
            self.classifier = nn.Linear(config.hidden_size, labels)
        elif family == "eurobert":
            self.pooling = config.classifier_pooling
            self.dense = nn.Linear(config.hidden_size, config.hidden_size)
            self.activation = nn.GELU()
            self.classifier = nn.Linear(config.hidden_size, labels)
        else:
            raise ValueError(f"no stock head for {family}")

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(B, L, H) states and (B, L) mask of the real tokens → (B, labels) logits."""
        family = self.family
        if family in FIRST_TOKEN_FAMILIES and self.pooling == "mean":
            hidden = _mean(hidden, mask).unsqueeze(1)  # (B, 1, H): the stock modules read position 0
        if family in ("roberta", "electra"):
            return self.classifier(hidden)
        if family in ("bert", "deberta-v2"):
            return self.classifier(self.dropout(self.pooler(hidden)))
        pooled = hidden[:, 0] if self.pooling in ("cls", "bos") else _mean(hidden, mask)
        if family == "modernbert":
            return self.classifier(self.dropout(self.head(pooled)))
        return self.classifier(self.activation(self.dense(pooled)))  # eurobert

    def export_names(self) -> dict[str, str]:
        """The head's state names → the stock class's."""
        prefixes = EXPORT_PREFIX[self.family]
        out = {}
        for name in self.state_dict():
            prefix = next(p for p in prefixes if name.startswith(p))
            out[name] = prefixes[prefix] + name[len(prefix) :]
        return out


def _mean(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    weights = mask.to(hidden.dtype).unsqueeze(-1)
    return (hidden * weights).sum(1) / weights.sum(1)


class PoolerHead(nn.Module):
    """BERT's head over any width: tanh(dense(pooled)), dropout, a linear classifier (Devlin et al. 2019, §4.1),
    ``pooled`` the [CLS] state or the real tokens' mean."""

    stock = False

    def __init__(self, hidden_size: int, labels: int, dropout: float, initializer_range: float, pooling: str = "cls"):
        super().__init__()
        self.pooling = pooling
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(hidden_size, labels)
        for layer in (self.dense, self.classifier):
            nn.init.normal_(layer.weight, std=initializer_range)
            nn.init.zeros_(layer.bias)

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        pooled = hidden[:, 0] if self.pooling == "cls" else _mean(hidden, mask)
        return self.classifier(self.dropout(torch.tanh(self.dense(pooled))))


def classification_config(model_config, labels: list[str] | None, pooling: str = "cls"):
    """A copy of the encoder's config for the classification model: ``num_labels``, ``id2label`` / ``label2id``
    and ``problem_type`` (``labels`` None: regression, one output), and for the families whose stock head pools
    either way, its ``classifier_pooling`` (EuroBERT names the first token "bos")."""
    config = copy.deepcopy(model_config)
    if getattr(config, "model_type", None) == "modernbert":
        config.classifier_pooling = pooling
    elif getattr(config, "model_type", None) == "eurobert":
        config.classifier_pooling = "bos" if pooling == "cls" else pooling
    if labels is None:
        config.num_labels = 1
        config.problem_type = "regression"
    else:
        config.id2label = dict(enumerate(labels))
        config.label2id = {label: i for i, label in enumerate(labels)}
        config.problem_type = "single_label_classification"
    return config


def build_head(encoder, labels: list[str] | None, pooling: str = "cls") -> nn.Module:
    """The head for ``encoder`` reading ``pooling``: its family's stock head where spanlm's encoder is the stock
    model, else :class:`PoolerHead`. Initialised as the stock class initialises it (the encoder model's
    ``_init_weights``)."""
    model = getattr(encoder, "model", None)
    config = getattr(model, "config", None)
    family = getattr(config, "model_type", None)
    if family in EXPORT_PREFIX and encoder.hidden_size == config.hidden_size:
        head = StockHead(family, classification_config(config, labels, pooling), pooling)
        for module in head.modules():
            model._init_weights(module)
        return head
    backbone = getattr(model, "backbone", model)
    dropout = _dropout(getattr(backbone, "config", None), "classifier_dropout", "hidden_dropout_prob")
    initializer_range = getattr(getattr(backbone, "config", None), "initializer_range", 0.02)
    return PoolerHead(encoder.hidden_size, 1 if labels is None else len(labels), dropout, initializer_range, pooling)
