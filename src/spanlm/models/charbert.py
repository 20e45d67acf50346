"""CharBERT's dual-channel encoder over a BERT, RoBERTa or ELECTRA backbone (Ma et al. 2020; REFERENCE.md §7).

Two channels run through the same transformer layers:

* the **token channel** is the backbone's own: its embeddings, then every layer;
* the **char channel** starts from :class:`CharEncoder` — the whole row's character stream
  (:mod:`spanlm.data.chars`) embedded (256) and read by one BiGRU with H/4 units per direction; a
  token's vector is ``[GRU out at its first char; GRU out at its last char]`` (2 × 2 × H/4 = H).

In every layer the **same layer object** (shared weights) transforms both channels, and
:class:`Fusion` mixes them: each channel's output through its own Linear(H→H, no bias), the two
concatenated and convolved along the sequence (Conv1d 2H→H, kernel 3, padding 1), the result added to
each channel's layer output and layer-normalised per channel. As in the authors' ``CharBertEncoder``
(modeling/modeling_bert.py: ``word_linear1``, ``char_linear1``, ``fusion_layer``, ``word_norm``,
``char_norm``; no activation after the convolution), one fusion module serves every layer; ``per_layer``
gives each layer its own.

The backbone stays a plain Hugging Face model, so its weights (embeddings + layers) export as a
directory ``AutoModel`` loads; the char encoder and the fusion are saved beside it
(:func:`save_charbert`). Fine-tuning reads both channels concatenated (2H) through
:class:`CharBertEncoder`, registered in :data:`spanlm.models.encoder.ENCODER_LOADERS`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import Tensor, nn

from spanlm.errors import InputError
from spanlm.models.encoder import ENCODER_LOADERS, EncoderConfig, load_fast_tokenizer

CONFIG_FILE = "charbert.json"
WEIGHTS_FILE = "charbert.safetensors"
CHAR_KEYS = ("char_ids", "char_lengths", "char_first", "char_last")
FAMILIES = ("bert", "roberta", "electra")


@dataclasses.dataclass
class CharChannelConfig:
    """The char channel's shape; saved as charbert.json beside the backbone."""

    char_vocab_size: int
    hidden_size: int
    char_embedding_size: int = 256
    fusion: Literal["shared", "per_layer"] = "shared"
    num_layers: int = 1
    layer_norm_eps: float = 1e-12

    def __post_init__(self) -> None:
        if self.hidden_size % 4:
            raise ValueError(f"CharBERT needs hidden_size divisible by 4 (BiGRU of H/4 per direction, first + last), got {self.hidden_size}")


class CharEncoder(nn.Module):
    """Char stream (B, C) → one vector per token (B, L, H) = [BiGRU at first char; BiGRU at last char].

    The BiGRU is two GRUs of H/4 units: one reads each row's stream forwards, the other reads it
    backwards from the row's last character. Rows end with padding (the longest row sets C), and
    the backward GRU must not read that padding, or a token's vector would depend on the batch it is
    in: each row's first ``char_lengths`` characters are reversed in place (padding stays behind them)
    — the result of a packed bidirectional GRU, without PackedSequence, whose CPU path is ~15× slower.
    """

    def __init__(self, config: CharChannelConfig):
        super().__init__()
        self.embedding = nn.Embedding(config.char_vocab_size, config.char_embedding_size, padding_idx=0)
        self.forward_gru = nn.GRU(config.char_embedding_size, config.hidden_size // 4, batch_first=True)
        self.backward_gru = nn.GRU(config.char_embedding_size, config.hidden_size // 4, batch_first=True)

    def forward(self, char_ids: Tensor, char_lengths: Tensor, char_first: Tensor, char_last: Tensor) -> Tensor:
        embedded = self.embedding(char_ids)  # (B, C, E)
        steps = torch.arange(char_ids.shape[1], device=char_ids.device)[None, :]  # (1, C)
        lengths = char_lengths.to(char_ids.device)[:, None]  # (B, 1)
        # Position t of the reversed row holds character length-1-t; padding keeps its place. The
        # permutation is its own inverse, so the same index maps the backward outputs back.
        reverse = torch.where(steps < lengths, lengths - 1 - steps, steps)  # (B, C)
        forward = self.forward_gru(embedded)[0]  # (B, C, H/4)
        backward = self.backward_gru(embedded.gather(1, reverse.unsqueeze(-1).expand_as(embedded)))[0]  # (B, C, H/4)
        backward = backward.gather(1, reverse.unsqueeze(-1).expand_as(backward))
        output = torch.cat([forward, backward], dim=-1)  # (B, C, H/2)
        width = output.shape[-1]
        first = output.gather(1, char_first.unsqueeze(-1).expand(-1, -1, width))  # (B, L, H/2)
        last = output.gather(1, char_last.unsqueeze(-1).expand(-1, -1, width))  # (B, L, H/2)
        return torch.cat([first, last], dim=-1)  # (B, L, H)


class Fusion(nn.Module):
    """CharBERT's heterogeneous interaction: Linear per channel → concat → Conv1d(2H→H, k 3) → residual + LN each."""

    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.token_linear = nn.Linear(hidden_size, hidden_size, bias=False)
        self.char_linear = nn.Linear(hidden_size, hidden_size, bias=False)
        self.conv = nn.Conv1d(2 * hidden_size, hidden_size, kernel_size=3, padding=1)
        self.token_norm = nn.LayerNorm(hidden_size, eps=eps)
        self.char_norm = nn.LayerNorm(hidden_size, eps=eps)

    def forward(self, token: Tensor, char: Tensor, real: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``token``, ``char`` (B, L, H); ``real`` (B, L) marks non-padding positions."""
        joint = torch.cat([self.token_linear(token), self.char_linear(char)], dim=-1)  # (B, L, 2H)
        if real is not None:
            # Padding positions read as the convolution's own zero padding, so the last real tokens of
            # a row do not depend on how much padding follows them (the authors always padded to 512).
            joint = joint * real.unsqueeze(-1).to(joint.dtype)
        shared = self.conv(joint.transpose(1, 2)).transpose(1, 2)  # (B, 2H, L) → (B, H, L) → (B, L, H)
        return self.token_norm(token + shared), self.char_norm(char + shared)


class DualChannel(nn.Module):
    """The backbone's layers run on the token and char channels, fused after every layer."""

    def __init__(self, backbone, config: CharChannelConfig):
        super().__init__()
        family = backbone.config.model_type
        if family not in FAMILIES:
            raise InputError(f"CharBERT runs over {', '.join(FAMILIES)} backbones, not '{family}'")
        self.backbone = backbone
        self.config = config
        self.char_encoder = CharEncoder(config)
        fusions = 1 if config.fusion == "shared" else config.num_layers
        self.fusions = nn.ModuleList(Fusion(config.hidden_size, config.layer_norm_eps) for _ in range(fusions))
        self.reset_parameters()

    @property
    def layers(self) -> nn.ModuleList:
        return self.backbone.encoder.layer

    def fusion(self, index: int) -> Fusion:
        return self.fusions[index if len(self.fusions) > 1 else 0]

    def reset_parameters(self) -> None:
        # As the authors' init_weights leaves them: the char embedding and the fusion linears drawn
        # like BERT's (N(0, initializer_range), the pad row zero); the GRUs and the convolution keep
        # PyTorch's defaults (BERT's _init_weights touches only Linear, Embedding and LayerNorm).
        std = float(self.backbone.config.initializer_range)
        nn.init.normal_(self.char_encoder.embedding.weight, std=std)
        with torch.no_grad():
            self.char_encoder.embedding.weight[0].zero_()
        for fusion in self.fusions:
            nn.init.normal_(fusion.token_linear.weight, std=std)
            nn.init.normal_(fusion.char_linear.weight, std=std)

    def forward(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """Token and char channels' last hidden states, each (B, L, H)."""
        from transformers.masking_utils import create_bidirectional_mask

        backbone = self.backbone
        kwargs = {}
        if "token_type_ids" in batch and getattr(backbone.config, "type_vocab_size", 0) > 0:
            kwargs["token_type_ids"] = batch["token_type_ids"]
        token = backbone.embeddings(input_ids=batch["input_ids"], **kwargs)  # (B, L, E)
        if hasattr(backbone, "embeddings_project"):  # ELECTRA with embedding_size < hidden_size
            token = backbone.embeddings_project(token)  # (B, L, H)
        # The char vectors enter the layers as they are: no position embedding, LayerNorm or dropout
        # (the authors' CharBertEmbeddings returns the GRU concatenation directly).
        char = self.char_encoder(batch["char_ids"], batch["char_lengths"], batch["char_first"], batch["char_last"])  # (B, L, H)
        real = batch["attention_mask"].long()  # (B, L)
        mask = create_bidirectional_mask(config=backbone.config, inputs_embeds=token, attention_mask=real)
        for index, layer in enumerate(self.layers):
            # The same layer object — one set of weights — reads both channels (paper §3.2).
            token, char = self.fusion(index)(layer(token, mask), layer(char, mask), real)
        return token, char

    def shard_units(self) -> list[nn.Module]:
        return list(self.layers)


def charbert_state(model: DualChannel) -> dict[str, Tensor]:
    """The char channel's own weights (char encoder + fusion), for charbert.safetensors."""
    return {name: tensor.detach().contiguous() for name, tensor in model.state_dict().items() if not name.startswith("backbone.")}


def save_charbert(model: DualChannel, directory: Path, char_vocab) -> None:
    """Backbone as a Hugging Face directory (AutoModel loads it), the char channel beside it."""
    from safetensors.torch import save_file

    directory = Path(directory)
    model.backbone.save_pretrained(str(directory))
    save_file(charbert_state(model), str(directory / WEIGHTS_FILE))
    char_vocab.save(directory)
    (directory / CONFIG_FILE).write_text(json.dumps(dataclasses.asdict(model.config), indent=2) + "\n", encoding="utf-8")


def read_charbert_config(directory: Path) -> CharChannelConfig:
    path = Path(directory) / CONFIG_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return CharChannelConfig(**data)
    except (OSError, ValueError, TypeError) as error:
        raise InputError(f"{path}: not a CharBERT config ({error})") from None


def load_dual_channel(directory: Path, backbone) -> DualChannel:
    """A :class:`DualChannel` over ``backbone`` with the char channel saved in ``directory``."""
    model = DualChannel(backbone, read_charbert_config(directory))
    load_char_weights(model, directory)
    return model


def load_char_weights(model: DualChannel, directory: Path) -> None:
    from safetensors.torch import load_file

    path = Path(directory) / WEIGHTS_FILE
    try:
        saved = load_file(str(path))
    except (OSError, ValueError) as error:
        raise InputError(f"{path}: cannot read the char channel's weights ({error})") from None
    expected = charbert_state(model)
    if saved.keys() != expected.keys() or any(saved[k].shape != expected[k].shape for k in saved):
        raise InputError(f"{path}: the char channel's weights do not fit {Path(directory) / CONFIG_FILE}")
    model.load_state_dict(saved, strict=False)


class CharBertEncoder(nn.Module):
    """A fine-tuning encoder: both channels concatenated, ``forward(batch) -> (B, L, 2H)``.

    The batch needs the char inputs that :meth:`featurizer` builds from ids, offsets and texts
    (``char_ids``, ``char_lengths``, ``char_first``, ``char_last``), as the paper fine-tunes on the
    concatenation of the two channels (§3.4).
    """

    def __init__(self, model: DualChannel, tokenizer, char_vocab):
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        self.char_vocab = char_vocab
        self.hidden_size = 2 * model.config.hidden_size

    def forward(self, batch: dict[str, Tensor]) -> Tensor:
        missing = [key for key in CHAR_KEYS if key not in batch]
        if missing:
            raise KeyError(f"a CharBERT encoder needs the featurizer's char inputs; the batch lacks {', '.join(missing)}")
        token, char = self.model(batch)
        return torch.cat([token, char], dim=-1)  # (B, L, 2H)

    def featurizer(self):
        """Picklable ``f(input_ids (B, L), offsets (B, L, 2), texts) -> {char_ids, char_lengths, char_first, char_last}``."""
        from spanlm.data.chars import CharFeaturizer, Spelling

        tokenizer = self.tokenizer
        return CharFeaturizer(self.char_vocab, Spelling.from_tokenizer(tokenizer, self.char_vocab), int(tokenizer.pad_token_id),
                              tokenizer.unk_token_id, tokenizer.backend_tokenizer.normalizer)

    def max_length(self) -> int:
        from spanlm.models.backbone import max_sequence_length

        return max_sequence_length(self.model.backbone)

    def save(self, directory: Path) -> None:
        save_charbert(self.model, Path(directory), self.char_vocab)
        from spanlm.data.tokenizer import save_tokenizer

        save_tokenizer(self.tokenizer, directory)

    def shard_units(self) -> list[nn.Module]:
        return self.model.shard_units()


def is_charbert_directory(directory: Path) -> bool:
    return (Path(directory) / CONFIG_FILE).is_file()


def load_charbert_encoder(directory: Path, config: EncoderConfig) -> CharBertEncoder:
    """The CharBERT export in ``directory`` as a fine-tuning encoder (``init: random`` draws fresh weights)."""
    from spanlm.data.chars import CharVocab
    from spanlm.models.encoder import _load_model

    directory = Path(directory)
    backbone = _load_model(directory, config)
    char_config = read_charbert_config(directory)
    model = DualChannel(backbone, char_config)
    if config.init == "pretrained":
        load_char_weights(model, directory)
    char_vocab = CharVocab.load(directory)
    if char_vocab.size != char_config.char_vocab_size:
        raise InputError(f"{directory}: chars.json has {char_vocab.size} entries but charbert.json says {char_config.char_vocab_size}")
    tokenizer = load_fast_tokenizer(directory)
    rows = backbone.get_input_embeddings().num_embeddings
    if len(tokenizer) > rows:
        raise InputError(f"{directory}: the tokenizer has {len(tokenizer)} tokens but the model's embedding has {rows} rows")
    return CharBertEncoder(model, tokenizer, char_vocab)


def char_inputs_to_torch(inputs: dict[str, np.ndarray]) -> dict[str, Tensor]:
    """The featurizer's arrays as tensors (int64), ready to merge into a batch."""
    return {key: torch.from_numpy(np.ascontiguousarray(inputs[key], dtype=np.int64)) for key in CHAR_KEYS}


ENCODER_LOADERS.append((is_charbert_directory, load_charbert_encoder))
