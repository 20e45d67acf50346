"""Reading a Hugging Face model directory safely: the model (pretrained or randomly initialised), its fast
tokenizer, and checks that refuse, naming the file, weights or tokenizers that would load wrong."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Literal

from torch import nn

from spanlm.errors import InputError
from spanlm.files import check_safetensors, check_tokenizer_files
from spanlm.models.backbone import ATTENTION, quiet_load_report


@dataclasses.dataclass
class EncoderConfig:
    path: str = ""  # a Hugging Face checkpoint directory or a spanlm export
    init: Literal["pretrained", "random"] = "pretrained"  # random: same architecture, fresh weights (baseline)
    dropout: float | None = None  # overrides hidden/attention dropout of the checkpoint's config when set
    # true: only the task head trains and the encoder keeps the weights it was loaded with — a probe of
    # what its pretraining learnt (pretrained vs random init), and a cheaper backward pass
    frozen: bool = False
    # Re-initialise the top this many transformer layers of a pretrained encoder before fine-tuning (Zhang et al.
    # 2021, "Revisiting Few-sample BERT Fine-tuning", §5.3: the top layers specialise in the pretraining task and
    # transfer worst); the rest keep their pretrained weights. 0: none.
    reinit_layers: int = 0

    def __post_init__(self) -> None:
        if self.dropout is not None and not 0 <= self.dropout < 1:
            raise ValueError("dropout must be in [0, 1)")
        if self.reinit_layers < 0:
            raise ValueError(f"reinit_layers must not be negative, got {self.reinit_layers}")


# The config fields of every dropout of the families whose names are not BERT's (EuroBERT has only its attention's).
DROPOUTS = {
    "modernbert": ("embedding_dropout", "mlp_dropout", "attention_dropout"),
    "eurobert": ("attention_dropout",),
}


def load_hf_model(directory: Path, config: EncoderConfig):
    from transformers import AutoConfig, AutoModel

    model_config = AutoConfig.from_pretrained(str(directory), local_files_only=True)
    if config.dropout is not None:
        for name in DROPOUTS.get(model_config.model_type, ("hidden_dropout_prob", "attention_probs_dropout_prob")):
            setattr(model_config, name, config.dropout)
    attention = ATTENTION.get(model_config.model_type, "eager")
    kwargs = {"add_pooling_layer": False} if model_config.model_type in ("bert", "roberta") else {}
    try:
        if config.init == "random":
            model = AutoModel.from_config(model_config, attn_implementation=attention, **kwargs)
        else:
            with quiet_load_report():  # its load report would list what is checked just below, in many lines
                model, loading = AutoModel.from_pretrained(
                    str(directory),
                    config=model_config,
                    local_files_only=True,
                    attn_implementation=attention,
                    output_loading_info=True,
                    **kwargs,
                )
            if loading["missing_keys"]:  # transformers would start them from random values, without a word
                missing = sorted(loading["missing_keys"])
                raise InputError(
                    f"{directory}: the weights lack {len(missing)} of the model's tensors (e.g. {missing[0]}); "
                    "they are not this config.json's model"
                )
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
        raise InputError(
            f"{directory}: holds only pickled weights ({', '.join(pickled)}), which spanlm does not load "
            "(unpickling can run code); convert them to model.safetensors where you trust their source"
        )
    for path in files:
        check_safetensors(path)


# The files that hold a tokenizer's vocabulary, in the forms transformers reads (fast, WordPiece, BPE, SentencePiece)
VOCABULARY_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "*.model")


def load_fast_tokenizer(directory: Path):
    """The directory's tokenizer; it must be a fast one (character offsets come from it)."""
    from transformers import AutoTokenizer

    check_tokenizer_files(Path(directory))
    if not any(any(Path(directory).glob(pattern)) for pattern in VOCABULARY_FILES):
        # transformers builds an empty tokenizer from a config alone, which reads every word as [UNK]
        raise InputError(
            f"{directory}: no tokenizer files (tokenizer.json, vocab.txt, vocab.json or a SentencePiece model); "
            "save the checkpoint's tokenizer beside it (tokenizer.save_pretrained)"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError, json.JSONDecodeError) as error:
        raise InputError(f"{directory}: no usable tokenizer files: {error}".replace("\n", " ")) from None
    if not tokenizer.is_fast:
        raise InputError(
            f"{directory}: the tokenizer is not a fast (Rust) tokenizer; spanlm needs its character offsets"
        )
    return tokenizer


def check_tokenizer_fits(encoder: nn.Module, directory: Path) -> None:
    """Every id the tokenizer can produce must be a row of the encoder's embedding."""
    rows = encoder.model.get_input_embeddings().num_embeddings
    if len(encoder.tokenizer) > rows:
        raise InputError(
            f"{directory}: the tokenizer has {len(encoder.tokenizer)} tokens but the model's embedding "
            f"has {rows} rows; the tokenizer files do not belong to this checkpoint"
        )
