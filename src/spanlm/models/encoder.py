"""The encoder a fine-tuning task (NER, QA) runs on: any Hugging Face checkpoint directory.

Fine-tuning reads the encoder from a directory, whichever produced it:

* a Hugging Face checkpoint (``bert-base-chinese`` downloaded beforehand, or any local directory with
  config.json + weights + fast tokenizer files);
* a spanlm pretraining export (``spanlm export RUN --out DIR``): the same layout, heads beside it;
* a CharBERT export (the character channel's files beside the subword backbone), read by
  :mod:`spanlm.models.charbert`.

``init: random`` keeps the directory's architecture and tokenizer but draws fresh weights — the
"same encoder from random initialisation" baseline every results table compares against.

Every encoder is wrapped as :class:`Encoder`: ``forward(batch) -> (B, L, hidden_size)``, so task heads
never depend on which kind it is.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from spanlm.data.tokenizer import save_tokenizer
from spanlm.errors import ConfigError, InputError, require_directory
from spanlm.models.backbone import backbone_layers, max_sequence_length
from spanlm.models.charbert import is_charbert_directory, load_charbert_encoder
from spanlm.models.hf_model import (
    EncoderConfig,
    check_tokenizer_fits,
    check_weights,
    load_fast_tokenizer,
    load_hf_model,
)
from spanlm.models.packed import encoder_states, unpack_rows


class Encoder(nn.Module):
    """A bare transformers encoder: token ids (+ mask) → last hidden states."""

    def __init__(self, model, tokenizer):
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        self.hidden_size = int(model.config.hidden_size)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """(B, L, H) states of the batch's windows; a packed batch (``unpack_index``, spanlm.data.packing) runs
        the encoder on its packed rows and returns them one window per row."""

        token_types = (
            batch["token_type_ids"]
            if "token_type_ids" in batch and getattr(self.model.config, "type_vocab_size", 0) > 0
            else None
        )
        if "unpack_index" not in batch:
            inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
            if token_types is not None:
                inputs["token_type_ids"] = token_types
            return self.model(**inputs).last_hidden_state  # (B, L, H)
        hidden = encoder_states(
            self.model,
            batch["input_ids"],
            batch["attention_mask"],
            batch["position_ids"],
            token_types,
            batch.get("cu_seq_lens"),
            batch.get("max_seq_len"),
        )  # (R, W, H)
        return unpack_rows(hidden, batch["unpack_index"])

    def max_length(self) -> int:

        return max_sequence_length(self.model)

    def save(self, directory: Path) -> None:
        """A directory :func:`load_encoder` (and ``AutoModel``) loads back."""
        self.model.save_pretrained(str(directory))

        save_tokenizer(self.tokenizer, directory)

    def shard_units(self) -> list[nn.Module]:
        encoder = getattr(self.model, "encoder", None)
        return list(getattr(encoder, "layer", []))


def describe_start(config: EncoderConfig) -> str:
    """The line a fine-tuning run logs about its encoder: its weights loaded or drawn afresh, and frozen or not."""
    start = (
        f"encoder: pretrained weights loaded from {config.path}"
        if config.init == "pretrained"
        else f"encoder: randomly initialised (model.init=random; the architecture and tokenizer of {config.path})"
    )
    return start + (", frozen (model.frozen: only the head trains)" if config.frozen else ", fine-tuned")


def reinitialise_top_layers(encoder: nn.Module, count: int) -> None:
    """The top ``count`` transformer layers of ``encoder``'s model drawn afresh by the model's own initialiser
    (``_init_weights``: its config's ``initializer_range``), from torch's generator as seeded by the run."""
    model = getattr(encoder, "model", None)
    layers = backbone_layers(model) if model is not None else []
    if not layers:
        raise ConfigError(f"model.reinit_layers: {type(encoder).__name__} has no transformer layers spanlm can reach")
    if count > len(layers):
        raise ConfigError(f"model.reinit_layers: {count} is more than the encoder's {len(layers)} layers")
    for layer in layers[-count:]:
        # transformers' initialisers pass over a tensor it marked as loaded from the checkpoint: unmark them first
        for tensor in [*layer.parameters(), *layer.buffers()]:
            tensor._is_hf_initialized = False
        layer.apply(model._init_weights)


def load_encoder(config: EncoderConfig) -> nn.Module:
    """The encoder (with ``.tokenizer``, ``.hidden_size``, ``forward(batch)``) in ``config.path``.

    Loading draws from a copy of torch's generator and leaves the generator as it found it: a random init (or
    re-initialised layers) draws its weights and a pretrained load draws nothing that a task's head would then miss,
    so for a seed a pretrained encoder and its random init get the same head (`spanlm eval`'s paired comparison)."""
    with torch.random.fork_rng(devices=[]):
        return _load_encoder(config)


def _load_encoder(config: EncoderConfig) -> nn.Module:
    if not config.path:
        raise ConfigError("model.path is required: a Hugging Face checkpoint directory or a spanlm export")
    directory = Path(config.path)
    require_directory(directory, "model.path")  # a missing path, or a file, named as what it is
    if not (directory / "config.json").is_file():
        raise InputError(
            f"{directory}: not a model directory (no config.json); pass a Hugging Face checkpoint "
            "directory or the output of `spanlm export`"
        )
    if config.init == "pretrained":
        check_weights(directory)
    if is_charbert_directory(directory):
        encoder = load_charbert_encoder(directory, config)
    else:
        encoder = Encoder(load_hf_model(directory, config), load_fast_tokenizer(directory))
        check_tokenizer_fits(encoder, directory)
    if config.reinit_layers:
        reinitialise_top_layers(encoder, config.reinit_layers)
    if config.frozen:
        encoder.requires_grad_(False)  # the optimiser takes trainable parameters only (parameter_groups)
    return encoder
