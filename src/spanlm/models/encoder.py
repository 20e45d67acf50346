"""The encoder a fine-tuning task (NER, QA) runs on: any Hugging Face checkpoint directory.

Fine-tuning reads the encoder from a directory, whichever produced it:

* a Hugging Face checkpoint (``bert-base-chinese`` downloaded beforehand, or any local directory with
  config.json + weights + fast tokenizer files);
* a spanlm pretraining export (``spanlm export RUN --out DIR``): the same layout, heads beside it;
* a CharBERT export (the character channel's files beside the subword backbone) — registered by
  the CharBERT module through :data:`ENCODER_LOADERS`.

``init: random`` keeps the directory's architecture and tokenizer but draws fresh weights — the
"same encoder from random initialisation" baseline every results table compares against.

Every encoder is wrapped as :class:`Encoder`: ``forward(batch) -> (B, L, hidden_size)``, so task heads
never depend on which kind it is.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from spanlm.errors import ConfigError, InputError


@dataclasses.dataclass
class EncoderConfig:
    path: str = ""  # a Hugging Face checkpoint directory or a spanlm export
    init: Literal["pretrained", "random"] = "pretrained"  # random: same architecture, fresh weights (baseline)
    dropout: float | None = None  # overrides hidden/attention dropout of the checkpoint's config when set

    def __post_init__(self) -> None:
        if self.dropout is not None and not 0 <= self.dropout < 1:
            raise ValueError("dropout must be in [0, 1)")


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
        from spanlm.models.packed import encoder_states, unpack_rows

        token_types = batch["token_type_ids"] if "token_type_ids" in batch and getattr(self.model.config, "type_vocab_size", 0) > 0 else None
        if "unpack_index" not in batch:
            inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
            if token_types is not None:
                inputs["token_type_ids"] = token_types
            return self.model(**inputs).last_hidden_state  # (B, L, H)
        hidden = encoder_states(self.model, batch["input_ids"], batch["attention_mask"], batch["position_ids"], token_types)  # (R, W, H)
        return unpack_rows(hidden, batch["unpack_index"])

    def max_length(self) -> int:
        from spanlm.models.backbone import max_sequence_length

        return max_sequence_length(self.model)

    def save(self, directory: Path) -> None:
        """A directory :func:`load_encoder` (and ``AutoModel``) loads back."""
        self.model.save_pretrained(str(directory))
        from spanlm.data.tokenizer import save_tokenizer

        save_tokenizer(self.tokenizer, directory)

    def shard_units(self) -> list[nn.Module]:
        encoder = getattr(self.model, "encoder", None)
        return list(getattr(encoder, "layer", []))


# Loaders of special encoder directories: (is_mine(directory) -> bool, load(directory, config) -> Encoder).
# Checked in order before the plain Hugging Face loader.
ENCODER_LOADERS: list[tuple[Callable[[Path], bool], Callable[[Path, EncoderConfig], nn.Module]]] = []


def load_encoder(config: EncoderConfig) -> nn.Module:
    """The encoder (with ``.tokenizer``, ``.hidden_size``, ``forward(batch)``) in ``config.path``."""
    if not config.path:
        raise ConfigError("model.path is required: a Hugging Face checkpoint directory or a spanlm export")
    directory = Path(config.path)
    if not (directory / "config.json").is_file():
        raise InputError(f"{directory}: not a model directory (no config.json); pass a Hugging Face checkpoint "
                         "directory or the output of `spanlm export`")
    if config.init == "pretrained":
        check_weights(directory)
    import spanlm.models.charbert  # noqa: F401  (registers the CharBERT loader; it imports this module)

    for is_mine, load in ENCODER_LOADERS:
        if is_mine(directory):
            return load(directory, config)
    encoder = Encoder(_load_model(directory, config), load_fast_tokenizer(directory))
    check_tokenizer_fits(encoder, directory)
    return encoder


def _load_model(directory: Path, config: EncoderConfig):
    from transformers import AutoConfig, AutoModel

    from spanlm.models.backbone import ATTENTION, quiet_load_report
    
    model_config = AutoConfig.from_pretrained(str(directory), local_files_only=True)
    if config.dropout is not None:
        model_config.hidden_dropout_prob = model_config.attention_probs_dropout_prob = config.dropout
    attention = ATTENTION.get(model_config.model_type, "eager")
    kwargs = {"add_pooling_layer": False} if model_config.model_type in ("bert", "roberta") else {}
    try:
        if config.init == "random":
            model = AutoModel.from_config(model_config, attn_implementation=attention, **kwargs)
        else:
            with quiet_load_report():  # its load report would list what is checked just below, in many lines
                model, loading = AutoModel.from_pretrained(str(directory), config=model_config, local_files_only=True,
                                                           attn_implementation=attention, output_loading_info=True, **kwargs)
            if loading["missing_keys"]:  # transformers would start them from random values, without a word
                missing = sorted(loading["missing_keys"])
                raise InputError(f"{directory}: the weights lack {len(missing)} of the model's tensors (e.g. {missing[0]}); "
                                 "they are not this config.json's model")
    except (OSError, ValueError) as error:
        raise InputError(f"{directory}: cannot load the encoder: {error}".replace("\n", " ")) from None
    return model


def check_weights(directory: Path) -> None:
    """Refuse, naming the file (and tensor), weights that would load wrong: a directory holding only pickled
    weights (unpickling can run any code, so spanlm reads safetensors only), a truncated or corrupt
    safetensors file, a tensor with NaN or infinite values."""
    files = sorted(directory.glob("*.safetensors"))
    pickled = sorted(path.name for pattern in ("*.bin", "*.pt", "*.pth", "*.ckpt") for path in directory.glob(pattern))
    if pickled and not any(path.name.startswith("model") for path in files):  # heads' files lie beside the encoder's
        raise InputError(f"{directory}: holds only pickled weights ({', '.join(pickled)}), which spanlm does not load "
                         "(unpickling can run code); convert them to model.safetensors where you trust their source")
    for path in files:
        check_safetensors(path)


def check_safetensors(path: Path) -> None:
    """``path`` is a whole safetensors file whose floating-point tensors are all finite."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():
                tensor = handle.get_tensor(name)
                if tensor.is_floating_point() and not torch.isfinite(tensor).all():
                    raise InputError(f"{path}: tensor {name} holds non-finite values (NaN or infinity)")
    except SafetensorError as error:
        raise InputError(f"{path}: not a whole safetensors file (truncated or corrupt: {error})") from None



def load_fast_tokenizer(directory: Path):
    """The directory's tokenizer; it must be a fast one (character offsets come from it)."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError, json.JSONDecodeError) as error:
        raise InputError(f"{directory}: no usable tokenizer files: {error}".replace("\n", " ")) from None
    if not tokenizer.is_fast:
        raise InputError(f"{directory}: the tokenizer is not a fast (Rust) tokenizer; spanlm needs its character offsets")
    return tokenizer


def check_tokenizer_fits(encoder: nn.Module, directory: Path) -> None:
    """Every id the tokenizer can produce must be a row of the encoder's embedding."""
    rows = encoder.model.get_input_embeddings().num_embeddings
    if len(encoder.tokenizer) > rows:
        raise InputError(f"{directory}: the tokenizer has {len(encoder.tokenizer)} tokens but the model's embedding "
                         f"has {rows} rows; the tokenizer files do not belong to this checkpoint")
