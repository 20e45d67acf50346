"""spanlm's heads under the names transformers' own task models give them, in both directions.

spanlm's MLM head is BERT's (dense → GeLU → LayerNorm → decoder tied to the word embedding, plus a
bias): the same functions and shapes as ``BertForMaskedLM``'s ``cls.predictions``, ``RobertaForMaskedLM``'s
``lm_head`` and ``ElectraForMaskedLM``'s ``generator_predictions`` — only the names differ. An objective whose
own head transformers also has (ELECTRA's RTD head is ``ElectraForPreTraining``'s
``discriminator_predictions``) names it with :func:`register_task_head`. So an export is written as that task model
(``AutoModelForMaskedLM`` / ``pipeline("fill-mask")`` / ``ElectraForPreTraining`` load it with the
trained head), and continued pretraining from any such checkpoint, a hub one included, starts from its
head instead of a random one.

Heads without a transformers class (SpanBERT's SBO, CharBERT's NLM, DeBERTa-V3's RTD head) are not
named: they travel in ``heads.safetensors`` under spanlm's own names.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from torch import nn

from spanlm.errors import InputError
from spanlm.files import refused_pickle
from spanlm.heads.mlm import MLMHead


@dataclasses.dataclass(frozen=True)
class TaskHead:
    """Where one spanlm head lives in a transformers task model."""

    task_class: str  # the transformers class whose checkpoint holds the head, e.g. "BertForMaskedLM"
    names: dict[str, str]  # spanlm parameter name inside the head module → key in that checkpoint

    def to_checkpoint(self, head_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {self.names[name]: tensor for name, tensor in head_state.items()}


HEADS_FILE = "heads.safetensors"  # beside an export: the heads without a transformers class, under spanlm's names


def head_state(name: str, module: nn.Module) -> dict[str, torch.Tensor]:
    """``module``'s own weights under ``name.`` (a tied decoder's weight belongs to the backbone and is not here)."""
    return {f"{name}.{key}": tensor.detach().contiguous() for key, tensor in module.state_dict().items()}


def _mlm(task_class: str, transform: str, norm: str, bias: str, decoder: str) -> TaskHead:
    return TaskHead(
        task_class,
        {
            "dense.weight": f"{transform}.weight",
            "dense.bias": f"{transform}.bias",
            "layer_norm.weight": f"{norm}.weight",
            "layer_norm.bias": f"{norm}.bias",
            "decoder.weight": decoder,  # only a decoder untied from the input embedding has its own
            "decoder.bias": bias,
        },
    )


# The MLM head of each family's *ForMaskedLM (transformers 5; these names are also those of the hub's
# BERT / RoBERTa / DeBERTa / ELECTRA-generator checkpoints).
MLM_HEADS = {
    "bert": _mlm(
        "BertForMaskedLM",
        "cls.predictions.transform.dense",
        "cls.predictions.transform.LayerNorm",
        "cls.predictions.bias",
        "cls.predictions.decoder.weight",
    ),
    "roberta": _mlm(
        "RobertaForMaskedLM", "lm_head.dense", "lm_head.layer_norm", "lm_head.bias", "lm_head.decoder.weight"
    ),
    "electra": _mlm(
        "ElectraForMaskedLM",
        "generator_predictions.dense",
        "generator_predictions.LayerNorm",
        "generator_lm_head.bias",
        "generator_lm_head.weight",
    ),
    # DeBERTa-V2/V3's "legacy" head (DebertaV2Config.legacy, true by default and in microsoft's checkpoints)
    # is BERT's, under BERT's names.
    "deberta-v2": _mlm(
        "DebertaV2ForMaskedLM",
        "cls.predictions.transform.dense",
        "cls.predictions.transform.LayerNorm",
        "cls.predictions.bias",
        "cls.predictions.decoder.weight",
    ),
    # ModernBertPredictionHead (dense, GeLU, LayerNorm; biases only where its config has them) and the decoder;
    # EuroBERT's lm_head alone (its weight only when untied from the input embedding, a bias only with mlp_bias).
    "modernbert": TaskHead(
        "ModernBertForMaskedLM",
        {
            "dense.weight": "head.dense.weight",
            "dense.bias": "head.dense.bias",
            "layer_norm.weight": "head.norm.weight",
            "layer_norm.bias": "head.norm.bias",
            "decoder.weight": "decoder.weight",
            "decoder.bias": "decoder.bias",
        },
    ),
    "eurobert": TaskHead("EuroBertForMaskedLM", {"decoder.weight": "lm_head.weight", "decoder.bias": "lm_head.bias"}),
}
_DEBERTA_NON_LEGACY = _mlm(
    "DebertaV2ForMaskedLM",
    "lm_predictions.lm_head.dense",
    "lm_predictions.lm_head.LayerNorm",
    "lm_predictions.lm_head.bias",
    "lm_predictions.lm_head.decoder.weight",  # unused: this head's decoder is the input embedding, always
)

# kind → (the spanlm head class, its names in each family's transformers task model): the heads that objectives
# register beside the MLM head above (ELECTRA's RTD head as ElectraForPreTraining's).
TASK_HEADS: dict[str, tuple[type, dict[str, TaskHead]]] = {}


def register_task_head(kind: str, head_class: type, by_family: dict[str, TaskHead]) -> None:
    """Name a head of kind ``kind`` in transformers: an exact ``head_class`` is written and read as
    ``by_family[config.model_type]`` (a family missing there keeps it in ``heads.safetensors``)."""
    if kind == "mlm" or (kind in TASK_HEADS and TASK_HEADS[kind] != (head_class, by_family)):
        raise ValueError(f"task head kind {kind!r} is already registered")
    TASK_HEADS[kind] = (head_class, by_family)


# Other names transformers' loader accepts for the same tensors (old TF-converted checkpoints, and the
# decoder bias that BERT-style heads also store under the decoder).
_ALIASES = {".weight": (".gamma",), ".bias": (".beta",)}
_BIAS_ALIASES = {"cls.predictions.bias": "cls.predictions.decoder.bias", "lm_head.bias": "lm_head.decoder.bias"}


def task_head(kind: str, head: nn.Module, config) -> TaskHead | None:
    """The transformers head that ``head`` (spanlm's ``kind`` head: "mlm" or a registered kind) is, for a backbone of
    ``config``.

    None when transformers has no such head for the family, or ``head`` is not the plain spanlm head of
    that kind (e.g. DeBERTa-V3's RTD head, which adds a LayerNorm over h_[CLS] + h_i).
    """

    model_type = config.model_type
    if kind == "mlm" and type(head) is MLMHead:
        if model_type == "deberta-v2" and not getattr(config, "legacy", True):
            return _DEBERTA_NON_LEGACY
        spec = MLM_HEADS.get(model_type)
        if spec is None:
            return None
        own = head.state_dict()  # the modern families' heads leave out the tensors their config lacks
        return TaskHead(spec.task_class, {ours: theirs for ours, theirs in spec.names.items() if ours in own})
    if kind in TASK_HEADS and type(head) is TASK_HEADS[kind][0]:
        return TASK_HEADS[kind][1].get(model_type)
    return None


def save_task_model(
    backbone,
    directory: Path,
    head: nn.Module | None = None,
    spec: TaskHead | None = None,
    state_dict: dict[str, torch.Tensor] | None = None,
) -> None:
    """``backbone`` (with ``head`` as transformers task model ``spec``) as a Hugging Face directory.

    ``state_dict``: the backbone's weights when they are not its own state (ELECTRA's materialised
    shared embedding). BERT and RoBERTa also get a pooler: spanlm pretrains without next-sentence
    prediction, so it is BERT's initialisation, untrained — stored so that ``AutoModel`` (which builds
    one) loads the directory without reporting freshly initialised weights, as it does for the hub's
    BERT and RoBERTa checkpoints. Fine-tuning trains it like a new one.
    """
    import transformers

    state = dict(state_dict if state_dict is not None else backbone.state_dict())
    state.update(_untrained_pooler(backbone.config, state))
    if head is None or spec is None:
        backbone.save_pretrained(str(directory), state_dict=state)
        return
    config = backbone.config.__class__.from_dict(backbone.config.to_dict())
    task = getattr(transformers, spec.task_class)(config)
    prefix = task.base_model_prefix
    full = {f"{prefix}.{name}": tensor for name, tensor in state.items()}
    full.update(spec.to_checkpoint({name: tensor.detach() for name, tensor in head.state_dict().items()}))
    for bias, decoder_bias in _BIAS_ALIASES.items():  # the decoder's own copy, which an untied config does not fill
        if bias in full and decoder_bias not in full:
            full[decoder_bias] = full[bias]
    # Loading into the task model checks every name and shape against transformers' own class.
    missing, unexpected = task.load_state_dict(full, strict=False)
    tied = {name for name in missing if _is_tied(task, name)}
    pooler = {name for name in unexpected if ".pooler." in name}
    if set(missing) - tied or set(unexpected) - pooler:
        raise RuntimeError(
            f"{spec.task_class}: the export's names do not match transformers' "
            f"(missing {sorted(set(missing) - tied)[:3]}, unexpected {sorted(set(unexpected) - pooler)[:3]})"
        )
    task.save_pretrained(str(directory), state_dict={**task.state_dict(), **{name: full[name] for name in pooler}})


def _is_tied(task, name: str) -> bool:
    """Whether ``name`` is a tied copy (the decoder weight / bias) that transformers fills from another key: never
    under ``tie_word_embeddings: false``, where a missing decoder would be saved as initialised."""
    tied = getattr(task, "_tied_weights_keys", None) or {}
    return name in tied and bool(getattr(task.config, "tie_word_embeddings", True))


def _untrained_pooler(config, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """BERT's pooler at its initialisation (N(0, initializer_range) weight, zero bias), for bert / roberta."""
    if config.model_type not in ("bert", "roberta") or any(name.startswith("pooler.") for name in state):
        return {}
    width = int(config.hidden_size)
    generator = torch.Generator().manual_seed(0)  # the same pooler for the same shape: exports are reproducible
    weight = torch.empty(width, width).normal_(0.0, float(config.initializer_range), generator=generator)
    reference = next(iter(state.values()))
    return {
        "pooler.dense.weight": weight.to(reference.dtype),
        "pooler.dense.bias": torch.zeros(width, dtype=reference.dtype),
    }


def read_task_head(directory: Path, spec: TaskHead) -> dict[str, torch.Tensor] | None:
    """The head ``spec`` from the weights in ``directory``, under spanlm's names; None when it has none.

    A checkpoint holding only part of the head is damaged: an :class:`InputError` names it.
    """
    wanted = {}
    for ours, theirs in spec.names.items():
        candidates = [theirs] + [
            theirs[: -len(suffix)] + alias
            for suffix, aliases in _ALIASES.items()
            if theirs.endswith(suffix)
            for alias in aliases
        ]
        if theirs in _BIAS_ALIASES:  # the bias the decoder adds first: untied from the head's, it is the one used
            candidates.insert(0, _BIAS_ALIASES[theirs])
        wanted[ours] = candidates
    found = checkpoint_tensors(directory, [name for names in wanted.values() for name in names])
    state = {
        ours: found[next(name for name in names if name in found)]
        for ours, names in wanted.items()
        if any(name in found for name in names)
    }
    if not state:
        return None
    if state.keys() != wanted.keys():
        missing = [spec.names[name] for name in wanted if name not in state]
        raise InputError(
            f"{directory}: its {spec.task_class} head is incomplete (no {', '.join(missing)}); "
            "the checkpoint is damaged"
        )
    return state


def checkpoint_tensors(directory: Path, names: list[str]) -> dict[str, torch.Tensor]:
    """The tensors of ``names`` that the checkpoint in ``directory`` holds (safetensors, sharded or not, or a
    PyTorch ``.bin`` read with ``weights_only``)."""
    from safetensors import SafetensorError, safe_open

    single, index = directory / "model.safetensors", directory / "model.safetensors.index.json"
    if single.is_file():
        files = {single: names}
    elif index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (ValueError, KeyError) as error:
            raise InputError(f"{index}: not a safetensors index ({error})") from None
        files = {}
        for name in names:
            if name in weight_map:
                files.setdefault(directory / weight_map[name], []).append(name)
    elif (directory / "pytorch_model.bin").is_file():
        try:
            state = torch.load(directory / "pytorch_model.bin", map_location="cpu", weights_only=True, mmap=True)
        except Exception as error:  # a pickle with code in it, or a damaged file
            raise InputError(
                f"{directory / 'pytorch_model.bin'}: damaged or not a weights file ({refused_pickle(error)})"
            ) from None
        return {name: state[name] for name in names if name in state}
    else:
        return {}
    out = {}
    for path, keys in files.items():
        try:
            with safe_open(str(path), framework="pt") as handle:
                present = set(handle.keys())
                out.update({name: handle.get_tensor(name) for name in keys if name in present})
        except (SafetensorError, OSError) as error:
            raise InputError(f"{path}: cannot read its weights ({error})".split("\n")[0]) from None
    return out
