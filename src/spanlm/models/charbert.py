"""CharBERT's dual-channel encoder over a BERT, RoBERTa or ELECTRA backbone (Ma et al. 2020, arXiv 2011.01513).

Two channels run through the same transformer layers:

* the **token channel** is the backbone's own: its embeddings, then every layer;
* the **char channel** starts from the char encoder — the whole row's character stream
  (:mod:`spanlm.data.chars`) embedded (256) and read by one BiGRU with H/4 units per direction; a
  token's vector is ``[GRU out at its first char; GRU out at its last char]`` (2 × 2 × H/4 = H).

In every layer the **same layer object** (shared weights) transforms both channels, and
the fusion mixes them: each channel's output through its own Linear(H→H, no bias), the two
concatenated and convolved along the sequence (Conv1d 2H→H, kernel 3, padding 1), the result added to
each channel's layer output and layer-normalised per channel. As in the authors' ``CharBertEncoder``
(modeling/modeling_bert.py), one fusion module serves every layer; ``per_layer`` gives each layer its own.

The modules and the forward pass are defined in :mod:`spanlm.models.modeling_charbert`, the modeling
file every export ships: :class:`DualChannel` here hosts them over spanlm's backbone for pretraining,
``CharBertModel`` there is what ``AutoModel.from_pretrained(export, trust_remote_code=True)`` builds.

An export (:func:`save_charbert`) is a directory transformers loads: config.json (the backbone's config
plus a ``charbert`` entry with the character vocabulary, and ``auto_map``), model.safetensors (the
backbone's weights under its own names and the char channel's beside them) and the modeling file.
Fine-tuning reads both channels concatenated (2H) through :class:`CharBertEncoder`, which
:func:`spanlm.models.encoder.load_encoder` returns for such a directory.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil
from pathlib import Path

import torch
from torch import Tensor, nn

from spanlm.data.tokenizer import save_tokenizer
from spanlm.errors import InputError
from spanlm.models import modeling_charbert
from spanlm.models.backbone import max_sequence_length
from spanlm.models.hf_model import EncoderConfig, load_fast_tokenizer, load_hf_model
from spanlm.models.modeling_charbert import (
    CHAR_KEYS,
    FAMILIES,
    CharBertModel,
    CharChannelConfig,
    CharFeaturizer,
    CharVocab,
    DualChannelMixin,
    init_char_weights,
)
from spanlm.models.packed import unpack_rows, use_varlen_attention

MODELING_FILE = Path(modeling_charbert.__file__)
WEIGHTS_FILE = "model.safetensors"
# Names of the char channel's weights (DualChannelMixin's modules); everything else belongs to the backbone.
CHAR_CHANNEL = ("char_encoder.", "fusions.")


class DualChannel(DualChannelMixin, nn.Module):
    """The backbone's layers run on the token and char channels, fused after every layer."""

    def __init__(self, backbone, config: CharChannelConfig):
        super().__init__()
        family = backbone.config.model_type
        if family not in FAMILIES:
            raise InputError(f"CharBERT runs over {', '.join(FAMILIES)} backbones, not '{family}'")
        self.backbone = backbone
        self.config = config
        self.add_char_channel(config)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        std = float(self.backbone.config.initializer_range)
        for module in (*self.char_encoder.modules(), *self.fusions.modules()):
            init_char_weights(module, std)

    def forward(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """Token and char channels' last hidden states, each (B, L, H)."""
        if batch.get("position_ids") is not None and batch["position_ids"].numel():  # a packed stream
            use_varlen_attention(self.backbone)
        return self.channels(
            batch["input_ids"],
            batch["attention_mask"],
            batch["char_ids"],
            batch["char_lengths"],
            batch["char_first"],
            batch["char_last"],
            batch.get("token_type_ids"),
            batch.get("position_ids"),
            batch.get("source_index"),
            batch.get("cu_seq_lens"),
            batch.get("max_seq_len"),
        )

    def shard_units(self) -> list[nn.Module]:
        return list(self.layers)


def charbert_state(model: DualChannel) -> dict[str, Tensor]:
    """The char channel's own weights (char encoder + fusion)."""
    return {
        name: tensor.detach().contiguous()
        for name, tensor in model.state_dict().items()
        if name.startswith(CHAR_CHANNEL)
    }


def save_charbert(model: DualChannel, directory: Path, char_vocab: CharVocab) -> None:
    """Both channels as a directory ``AutoModel`` loads: with ``trust_remote_code=True`` as ``CharBertModel``,
    without it as the plain backbone (its load report then lists the char channel's weights as unexpected)."""
    directory = Path(directory)
    backbone = model.backbone
    # The backbone's weights keep their own names, so the backbone's class (and its task models) load them.
    backbone.save_pretrained(str(directory), state_dict={**backbone.state_dict(), **charbert_state(model)})
    config = copy.deepcopy(backbone.config)
    config.architectures = [CharBertModel.__name__]
    config.auto_map = {"AutoModel": f"{MODELING_FILE.stem}.{CharBertModel.__name__}"}
    config.charbert = model.config.model_config_entry(char_vocab)
    config.save_pretrained(str(directory))
    shutil.copyfile(MODELING_FILE, directory / MODELING_FILE.name)


def is_charbert_directory(directory: Path) -> bool:
    """A directory whose config.json has a ``charbert`` entry (an export of :func:`save_charbert`)."""
    try:
        return "charbert" in json.loads((Path(directory) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False


def _model_config(directory: Path):
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError, KeyError) as error:
        raise InputError(
            f"{Path(directory) / 'config.json'}: cannot be read as a transformers config: {error}".split("\n")[0]
        ) from None


def read_charbert_config(directory: Path) -> CharChannelConfig:
    """The char channel's shape from an export's config.json."""
    try:
        return CharChannelConfig.from_model_config(_model_config(directory))
    except (ValueError, TypeError) as error:
        raise InputError(f"{Path(directory) / 'config.json'}: not a CharBERT config ({error})") from None


def read_char_vocab(directory: Path) -> CharVocab:
    """The character vocabulary from an export's config.json (``charbert.chars``)."""
    try:
        return CharVocab.from_model_config(_model_config(directory))
    except ValueError as error:
        raise InputError(f"{Path(directory) / 'config.json'}: {error}") from None


def load_weights(model: DualChannel, directory: Path, char_channel_only: bool = False) -> None:
    """An export's model.safetensors into ``model``: both channels, or the char channel alone.

    The backbone's weights may be stored under its own names (spanlm's exports) or under ``backbone.``
    (``CharBertModel.save_pretrained``); weights ``model`` has no place for are left out.
    """
    from safetensors import SafetensorError, safe_open

    path = Path(directory) / WEIGHTS_FILE
    expected = charbert_state(model) if char_channel_only else model.state_dict()
    try:
        with safe_open(str(path), framework="pt") as weights:
            stored = {
                key if key.startswith((*CHAR_CHANNEL, "backbone.")) else f"backbone.{key}": key
                for key in weights.keys()
            }
            missing = sorted(set(expected) - set(stored))
            if missing:
                raise InputError(
                    f"{path}: no weight for '{missing[0]}' ({len(missing)} missing); "
                    f"the weights do not fit {Path(directory) / 'config.json'}"
                )
            saved = {name: weights.get_tensor(stored[name]) for name in expected}
    except (OSError, SafetensorError) as error:
        raise InputError(f"{path}: cannot read the CharBERT weights ({error})") from None
    for name, tensor in saved.items():
        if tensor.shape != expected[name].shape:
            raise InputError(
                f"{path}: '{stored[name]}' has shape {tuple(tensor.shape)}, the model expects "
                f"{tuple(expected[name].shape)} (from {Path(directory) / 'config.json'})"
            )
    model.load_state_dict(saved, strict=False)


def load_char_weights(model: DualChannel, directory: Path) -> None:
    """The char channel's weights of an export into ``model`` (its backbone is loaded already)."""
    load_weights(model, directory, char_channel_only=True)


class CharBertEncoder(nn.Module):
    """A fine-tuning encoder: both channels concatenated, ``forward(batch) -> (B, L, 2H)``.

    The batch needs the char inputs that :meth:`featurizer` builds from ids, offsets and texts
    (``char_ids``, ``char_lengths``, ``char_first``, ``char_last``), as the paper fine-tunes on the
    concatenation of the two channels (§3.4).
    """

    def __init__(self, model: DualChannel, tokenizer, char_vocab: CharVocab):
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        self.char_vocab = char_vocab
        self.hidden_size = 2 * model.config.hidden_size

    def forward(self, batch: dict[str, Tensor]) -> Tensor:
        missing = [key for key in CHAR_KEYS if key not in batch]
        if missing:
            raise KeyError(
                f"a CharBERT encoder needs the featurizer's char inputs; the batch lacks {', '.join(missing)}"
            )
        token, char = self.model(batch)
        hidden = torch.cat([token, char], dim=-1)  # (B, L, 2H)
        if "unpack_index" in batch:  # packed windows (spanlm.data.packing): back to one window per row
            hidden = unpack_rows(hidden, batch["unpack_index"])
        return hidden

    def featurizer(self) -> CharFeaturizer:
        """Picklable ``f(input_ids (B, L), offsets (B, L, 2), texts)``
        ``-> {char_ids, char_lengths, char_first, char_last}``."""
        return CharFeaturizer.from_tokenizer(self.tokenizer, self.char_vocab)

    def max_length(self) -> int:

        return max_sequence_length(self.model.backbone)

    def save(self, directory: Path) -> None:
        save_charbert(self.model, Path(directory), self.char_vocab)

        save_tokenizer(self.tokenizer, directory)

    def shard_units(self) -> list[nn.Module]:
        return self.model.shard_units()


def load_charbert_encoder(directory: Path, config: EncoderConfig) -> CharBertEncoder:
    """The CharBERT export in ``directory`` as a fine-tuning encoder (``init: random`` draws fresh weights)."""
    directory = Path(directory)
    char_config = read_charbert_config(directory)
    char_vocab = read_char_vocab(directory)
    # The backbone's architecture only: its own loader would report the char channel's weights as
    # unexpected, so both channels are loaded together below.
    model = DualChannel(load_hf_model(directory, dataclasses.replace(config, init="random")), char_config)
    if config.init == "pretrained":
        load_weights(model, directory)
    tokenizer = load_fast_tokenizer(directory)
    rows = model.backbone.get_input_embeddings().num_embeddings
    if len(tokenizer) > rows:
        raise InputError(
            f"{directory}: the tokenizer has {len(tokenizer)} tokens but the model's embedding has {rows} rows"
        )
    return CharBertEncoder(model, tokenizer, char_vocab)
