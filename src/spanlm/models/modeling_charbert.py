"""CharBERT (Ma et al. 2020, arXiv 2011.01513) for transformers: the char inputs and the dual-channel encoder.

This file is spanlm's implementation of CharBERT — spanlm pretrains and fine-tunes with the classes
below — and the modeling file of every CharBERT export. It imports only numpy, torch and transformers,
so transformers runs it without spanlm installed::

    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(export, trust_remote_code=True)  # CharBertModel: both channels
    tokenizer = AutoTokenizer.from_pretrained(export)
    featurize = model.char_featurizer(tokenizer)  # spells the whole vocabulary once
    texts = ["Holmes examined the mechanizm."]
    encoding = tokenizer(texts, padding=True, return_offsets_mapping=True, return_tensors="pt")
    outputs = model(**featurize.model_inputs(encoding, texts))
    outputs.last_hidden_state  # (B, L, 2H) = [token channel; char channel], what spanlm fine-tunes on
    outputs.token_hidden_state, outputs.char_hidden_state  # (B, L, H) each

Without ``trust_remote_code=True`` transformers loads an export as its subword backbone alone
(``BertModel``, ``RobertaModel``, ``ElectraModel``, or a task model over it), and its load report lists
the char channel's weights (``char_encoder.*``, ``fusions.*``) as UNEXPECTED.

**Char inputs.** CharBERT reads each sequence a second time as characters: every token spelt, sub-word
markers stripped, tokens one after another with a pad character after each; a token's char vector is
the char encoder's output at its first and at its last character. A token's spelling comes from its
id — its vocabulary piece without the sub-word marker (:func:`token_surfaces`) — because during
pretraining the noised tokens exist only as ids; the one id without a spelling, [UNK], is spelt from
its surface form in the text (:class:`CharFeaturizer`). Special tokens, and the tokens an MLM head
must predict during pretraining, are spelt as a single pad character.

**Model.** The backbone's embeddings start the token channel, the char encoder (char embedding →
BiGRU of H/4 per direction) the char channel; every backbone layer — the same layer object, one set of
weights — transforms both channels, and a fusion module mixes them after each layer
(:class:`Fusion`). :class:`DualChannelMixin` is that forward pass; :class:`CharBertModel` hosts it as a
transformers model, spanlm's ``DualChannel`` as a pretraining module.

**Export layout.** ``config.json`` is the backbone's config with a ``charbert`` entry (the character
vocabulary, the char embedding size, the fusion mode) and ``auto_map`` naming :class:`CharBertModel`;
``model.safetensors`` holds the backbone's weights under the backbone's own names and the char
channel's beside them.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from typing import Literal

import numpy as np
import torch
from torch import Tensor, nn
from transformers import AutoModel, PreTrainedModel
from transformers.masking_utils import create_bidirectional_mask
from transformers.utils import ModelOutput

PAD_CHAR = 0
FAMILIES = ("bert", "roberta", "electra")
# Byte-level pieces that end inside a multi-byte UTF-8 character decode to U+FFFD.
_REPLACEMENT = "\ufffd"


# ---------------------------------------------------------------------------------------------------
# Char inputs
# ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class CharVocab:
    """Characters → ids: 0 = pad, 1..n = ``chars`` (most frequent first), n + 1 = unk (the authors' layout)."""

    chars: list[str]

    def __post_init__(self) -> None:
        if not isinstance(self.chars, list) or not all(isinstance(c, str) and len(c) == 1 for c in self.chars):
            raise ValueError("a character vocabulary is a list of single characters")

    @property
    def size(self) -> int:
        return len(self.chars) + 2

    @property
    def unk_id(self) -> int:
        return len(self.chars) + 1

    @classmethod
    def build(cls, surfaces: list[str | None], counts: np.ndarray, size: int) -> CharVocab:
        """The ``size - 2`` most frequent characters of ``surfaces`` weighted by ``counts`` (ties by character)."""
        if size < 3:
            raise ValueError("the character vocabulary needs room for pad, unk and one character")
        frequency: Counter[str] = Counter()
        for surface, count in zip(surfaces, np.asarray(counts).tolist()):
            if surface and count:
                for char in surface:
                    frequency[char] += count
        ranked = sorted(frequency, key=lambda char: (-frequency[char], char))
        return cls(chars=ranked[: size - 2])

    @classmethod
    def from_model_config(cls, config) -> CharVocab:
        """The character vocabulary of a CharBERT config: its ``charbert.chars``, the characters as one string."""
        settings = getattr(config, "charbert", None)
        if not isinstance(settings, dict) or not isinstance(settings.get("chars"), str):
            raise ValueError("no 'charbert.chars' string of characters: not a CharBERT config")
        return cls(list(settings["chars"]))

    def lookup(self) -> dict[str, int]:
        return {char: index + 1 for index, char in enumerate(self.chars)}

    def encode(self, text: str) -> list[int]:
        table = self.lookup()
        return [table.get(char, self.unk_id) for char in text]


def token_surfaces(tokenizer) -> list[str | None]:
    """Every id's spelling: its piece without the sub-word marker; "" for special tokens, None when unknown.

    WordPiece ``##`` (the model's continuing-subword prefix) is stripped; byte-level BPE ``Ġ`` and
    SentencePiece ``▁`` pieces go through the tokenizer's own decoder. None marks a piece that is not
    text on its own (a byte-level fragment of a UTF-8 character).
    """
    backend = json.loads(tokenizer.backend_tokenizer.to_str())
    model = backend["model"]
    prefix = model.get("continuing_subword_prefix") or ""
    suffix = model.get("end_of_word_suffix") or ""
    decoder_kind = (backend.get("decoder") or {}).get("type")
    # Byte-level and Metaspace pieces are not text as they stand (Ġ = a space byte, bytes as symbols,
    # ▁ = a space): the tokenizer's own decoder turns one piece back into its text.
    decoder = tokenizer.backend_tokenizer.decoder if decoder_kind in ("ByteLevel", "Metaspace") else None
    special = set(tokenizer.all_special_ids)
    pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    surfaces: list[str | None] = []
    for index, piece in enumerate(pieces):  # once per vocabulary entry
        if index in special or piece is None:
            surfaces.append("")
            continue
        if prefix and piece.startswith(prefix) and len(piece) > len(prefix):
            piece = piece[len(prefix) :]
        if suffix and piece.endswith(suffix) and len(piece) > len(suffix):
            piece = piece[: -len(suffix)]
        if decoder is not None:
            piece = decoder.decode([piece])
            if _REPLACEMENT in piece:
                surfaces.append(None)
                continue
        surfaces.append(piece.strip())
    return surfaces


@dataclasses.dataclass
class Spelling:
    """Every token id's character ids, flat: id ``t`` is ``chars[offsets[t]:offsets[t + 1]]``.

    Special tokens have an empty spelling; the stream gives them (and every blank token) one pad char.
    """

    offsets: np.ndarray  # (V+1,) int64
    chars: np.ndarray  # (S,) int64 character ids

    @classmethod
    def from_tokenizer(cls, tokenizer, vocab: CharVocab) -> Spelling:
        table = vocab.lookup()
        encoded = [
            [vocab.unk_id] if surface is None else [table.get(c, vocab.unk_id) for c in surface]
            for surface in token_surfaces(tokenizer)
        ]
        lengths = np.fromiter((len(e) for e in encoded), dtype=np.int64, count=len(encoded))
        chars = np.fromiter((c for e in encoded for c in e), dtype=np.int64, count=int(lengths.sum()))
        return cls(offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64), chars=chars)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)


def char_stream(
    input_ids: np.ndarray,
    blank: np.ndarray,
    spelling: Spelling,
    pad_id: int,
    override: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """The char inputs of a batch: each row's tokens spelt one after another, a pad char after each.

    ``input_ids`` (B, L); ``blank`` (B, L) bool: tokens spelt as a single pad char (MLM targets);
    special tokens (empty spelling) get one pad char too, and padding (``pad_id``) no characters at all.
    ``override``: (flat positions, their char counts, their chars concatenated) replacing the spelling
    of those tokens (the featurizer's [UNK] tokens).

    Returns ``char_ids`` (B, C) int64 (0 = pad), ``char_lengths`` (B,) int64 (characters per row, the
    last separator included), and ``char_first`` / ``char_last`` (B, L) int64: where each token's
    characters begin and end in its row (0 for padding).
    """
    batch_size, width = input_ids.shape
    flat_ids = input_ids.reshape(-1).astype(np.int64)
    padding = flat_ids == pad_id
    spelled = ~blank.reshape(-1) & ~padding
    source_start = spelling.offsets[flat_ids]  # (B·L,) where each token's chars are in the table
    length = np.where(spelled, spelling.lengths[flat_ids], 0)
    source_chars = spelling.chars
    if override is not None:
        positions, counts, chars = override
        source_start = source_start.copy()
        source_start[positions] = len(source_chars) + np.cumsum(counts) - counts
        length[positions] = counts
        source_chars = np.concatenate([source_chars, chars])
    # Every real token takes at least one character slot (a blank or special token: the pad char),
    # then one separator; padding takes none.
    slots = np.where(padding, 0, np.maximum(length, 1) + 1).reshape(batch_size, width)  # (B, L)
    start = np.cumsum(slots, axis=1) - slots  # (B, L) offset of each token's first char in its row
    row_length = slots.sum(axis=1)  # (B,)
    stream_width = max(int(row_length.max(initial=0)), 1)
    row = np.repeat(np.arange(batch_size, dtype=np.int64), width)
    destination = row * stream_width + start.reshape(-1)  # (B·L,) flat position of each token's first char
    # Every spelt character: the token it belongs to and its place in that token's spelling.
    token = np.repeat(np.arange(batch_size * width, dtype=np.int64), length)  # (S,)
    within = np.arange(len(token), dtype=np.int64) - np.repeat(np.cumsum(length) - length, length)  # (S,)
    char_ids = np.zeros(batch_size * stream_width, dtype=np.int64)
    char_ids[destination[token] + within] = source_chars[source_start[token] + within]
    first = np.where(padding.reshape(batch_size, width), 0, start)
    last = np.where(padding.reshape(batch_size, width), 0, start + np.maximum(length, 1).reshape(batch_size, width) - 1)
    return {
        "char_ids": char_ids.reshape(batch_size, stream_width),
        "char_lengths": np.maximum(row_length, 1),  # a row of padding only still gets one (pad) step
        "char_first": first,
        "char_last": last,
    }


CHAR_KEYS = ("char_ids", "char_lengths", "char_first", "char_last")
TOKEN_KEYS = ("input_ids", "attention_mask", "token_type_ids")


def char_inputs_to_torch(inputs: dict[str, np.ndarray]) -> dict[str, Tensor]:
    """The char inputs' arrays as int64 tensors, ready to merge into a batch."""
    return {key: torch.from_numpy(np.ascontiguousarray(inputs[key], dtype=np.int64)) for key in CHAR_KEYS}


class CharFeaturizer:
    """Picklable ``f(input_ids (B, L), offsets (B, L, 2), texts) -> char inputs`` for fine-tuning batches.

    Tokens are spelt as in pretraining (:class:`Spelling`), except [UNK] tokens, which are spelt from
    their characters in ``texts[b][start:end]`` (after the tokenizer's normaliser, so an uncased model
    sees them lower-cased as it saw everything else). ``offsets`` are the fast tokenizer's character
    offsets of each token in its text; rows are right-padded with the pad id.
    """

    # Windows with char inputs are packed one pad apart: the fusion convolution reads a token to each side.
    packing_gap = 1

    def __init__(self, vocab: CharVocab, spelling: Spelling, pad_id: int, unk_id: int | None, normalizer=None):
        self.vocab, self.spelling, self.pad_id, self.unk_id = vocab, spelling, pad_id, unk_id
        self.normalizer = normalizer

    @classmethod
    def from_tokenizer(cls, tokenizer, vocab: CharVocab) -> CharFeaturizer:
        """The featurizer of a fast tokenizer (its vocabulary spelt once, its pad and unk ids, its normaliser)."""
        return cls(
            vocab,
            Spelling.from_tokenizer(tokenizer, vocab),
            int(tokenizer.pad_token_id),
            tokenizer.unk_token_id,
            tokenizer.backend_tokenizer.normalizer,
        )

    def __call__(self, input_ids: np.ndarray, offsets: np.ndarray, texts: list[str]) -> dict[str, np.ndarray]:
        input_ids = np.asarray(input_ids)
        override = None
        if self.unk_id is not None:
            rows, columns = np.nonzero(input_ids == self.unk_id)
            if len(rows):
                # [UNK] is rare, so spelling those few tokens one by one costs nothing next to the batch.
                surfaces = [
                    self._normalize(texts[r][int(offsets[r, c, 0]) : int(offsets[r, c, 1])]).strip()
                    for r, c in zip(rows.tolist(), columns.tolist())
                ]
                encoded = [self.vocab.encode(s) for s in surfaces]
                counts = np.fromiter((len(e) for e in encoded), dtype=np.int64, count=len(encoded))
                chars = np.fromiter((c for e in encoded for c in e), dtype=np.int64, count=int(counts.sum()))
                override = (rows * input_ids.shape[1] + columns, counts, chars)
        return char_stream(input_ids, np.zeros(input_ids.shape, dtype=bool), self.spelling, self.pad_id, override)

    def model_inputs(self, encoding, texts: list[str]) -> dict[str, Tensor]:
        """:class:`CharBertModel`'s inputs for ``texts``: from the tokenizer's ``encoding`` of them (made with
        ``padding=True, return_offsets_mapping=True``) its ids and masks, plus the char inputs."""
        if "offset_mapping" not in encoding:
            raise ValueError(
                "the char inputs need the tokens' character offsets: tokenize with return_offsets_mapping=True"
            )
        inputs = {key: torch.as_tensor(np.asarray(encoding[key])) for key in TOKEN_KEYS if key in encoding}
        chars = self(np.asarray(encoding["input_ids"]), np.asarray(encoding["offset_mapping"]), texts)
        return {**inputs, **char_inputs_to_torch(chars)}

    def _normalize(self, text: str) -> str:
        return self.normalizer.normalize_str(text) if self.normalizer is not None else text


# ---------------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class CharChannelConfig:
    """The char channel's shape: the character vocabulary's size, the backbone's sizes, the fusion mode."""

    char_vocab_size: int
    hidden_size: int
    char_embedding_size: int = 256
    fusion: Literal["shared", "per_layer"] = "shared"
    num_layers: int = 1
    layer_norm_eps: float = 1e-12

    def __post_init__(self) -> None:
        if self.hidden_size % 4:
            raise ValueError(
                "CharBERT needs hidden_size divisible by 4 (BiGRU of H/4 per direction, first + last), got "
                f"{self.hidden_size}"
            )
        if self.fusion not in ("shared", "per_layer"):
            raise ValueError(f"the fusion mode is 'shared' or 'per_layer', not '{self.fusion}'")

    @classmethod
    def from_model_config(cls, config) -> CharChannelConfig:
        """The char channel of a CharBERT ``config.json``: its ``charbert`` entry over the backbone's sizes."""
        vocab = CharVocab.from_model_config(config)
        settings = config.charbert
        try:
            return cls(
                char_vocab_size=vocab.size,
                hidden_size=int(config.hidden_size),
                char_embedding_size=int(settings["char_embedding_size"]),
                fusion=settings["fusion"],
                num_layers=int(config.num_hidden_layers),
                layer_norm_eps=float(config.layer_norm_eps),
            )
        except KeyError as error:
            raise ValueError(f"the 'charbert' entry lacks {error}") from None

    def model_config_entry(self, vocab: CharVocab) -> dict:
        """The ``charbert`` entry of ``config.json`` that :meth:`from_model_config` reads back."""
        if vocab.size != self.char_vocab_size:
            raise ValueError(
                f"the character vocabulary has {vocab.size} ids but the char channel {self.char_vocab_size}"
            )
        return {"chars": "".join(vocab.chars), "char_embedding_size": self.char_embedding_size, "fusion": self.fusion}


class CharEncoder(nn.Module):
    """Char stream (B, C) → one vector per token (B, L, H) = [BiGRU at first char; BiGRU at last char].

    The BiGRU is two GRUs of H/4 units: one reads each row's stream forwards, the other reads it
    backwards from the row's last character. Rows end with padding (the longest row sets C), and
    the backward GRU must not read that padding, or a token's vector would depend on the batch it is
    in: each row's first ``char_lengths`` characters are reversed in place (padding stays behind them)
    — the result of a packed bidirectional GRU, without PackedSequence and its slow CPU path.
    """

    def __init__(self, config: CharChannelConfig):
        super().__init__()
        self.embedding = nn.Embedding(config.char_vocab_size, config.char_embedding_size, padding_idx=PAD_CHAR)
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
    """CharBERT's heterogeneous interaction: Linear per channel → concat → Conv1d(2H→H, k 3) → residual + LN each.

    As in the authors' ``CharBertEncoder`` (``word_linear1``, ``char_linear1``, ``fusion_layer``,
    ``word_norm``, ``char_norm``; no activation after the convolution).
    """

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


# Attention implementations that take a packed stream's block boundaries (spanlm.models.packed registers the last).
VARLEN_IMPLEMENTATIONS = ("flash_attention_2", "flash_attention_3", "spanlm_varlen")


def segment_bounds(position_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """(S + 1,) int32 bounds of a packed stream's segments: a segment starts at each block's position 0, at the
    first padding after a real token and at the stream's start. spanlm.models.packed uses it too (here because this
    file imports no spanlm: it travels with every CharBERT export)."""
    positions, real = position_ids.flatten(), attention_mask.flatten().bool()
    follows_real = torch.cat([real.new_ones(1), real[:-1]])  # (T,) the token before is real (or none is)
    starts = (real & (positions == 0)) | (~real & follows_real)
    starts[0] = True
    bounds = torch.cat([starts.nonzero().flatten(), starts.new_full((1,), starts.numel(), dtype=torch.long)])
    return bounds.to(torch.int32)


def varlen_arguments(
    position_ids: Tensor, attention_mask: Tensor, cu_seq_lens: Tensor | None = None, max_seq_len: int | None = None
) -> dict:
    """A packed stream's block boundaries as transformers' FlashAttention keyword arguments: the batch's own
    ``cu_seq_lens`` (the cumulative lengths of its segments) and ``max_seq_len`` (the longest, an int) when it
    carries them — spanlm's packed batches do, computed with the batch — else derived from the positions
    (:func:`segment_bounds`), which on a GPU waits for the device twice."""
    if cu_seq_lens is None or cu_seq_lens.numel() == 0 or not max_seq_len:
        cu_seq_lens = segment_bounds(position_ids, attention_mask)
        max_seq_len = int((cu_seq_lens[1:] - cu_seq_lens[:-1]).max())
    return {
        "cu_seq_lens_q": cu_seq_lens,
        "cu_seq_lens_k": cu_seq_lens,
        "max_length_q": max_seq_len,
        "max_length_k": max_seq_len,
    }


def init_char_weights(module: nn.Module, std: float) -> None:
    """The char channel's init, as the authors' ``init_weights`` leaves it: the char embedding and the fusion
    linears drawn like BERT's (N(0, std), the pad row zero); GRUs, convolution and norms keep PyTorch's
    defaults (BERT's ``_init_weights`` touches only Linear, Embedding and LayerNorm)."""
    if isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, std=std)
        with torch.no_grad():
            module.weight[module.padding_idx].zero_()
    elif isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, std=std)


class DualChannelMixin:
    """CharBERT's forward pass over ``self.backbone`` (a BERT, RoBERTa or ELECTRA model) and the char channel.

    The host module sets ``self.backbone`` and calls :meth:`add_char_channel`; the char channel is
    ``self.char_encoder`` and ``self.fusions`` (one fusion module serving every layer, the authors'
    code, or one per layer).
    """

    backbone: nn.Module
    char_encoder: CharEncoder
    fusions: nn.ModuleList

    def add_char_channel(self, config: CharChannelConfig) -> None:
        self.char_encoder = CharEncoder(config)
        count = 1 if config.fusion == "shared" else config.num_layers
        self.fusions = nn.ModuleList(Fusion(config.hidden_size, config.layer_norm_eps) for _ in range(count))

    @property
    def layers(self) -> nn.ModuleList:
        return self.backbone.encoder.layer

    def fusion(self, index: int) -> Fusion:
        return self.fusions[index if len(self.fusions) > 1 else 0]

    def channels(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        char_ids: Tensor,
        char_lengths: Tensor,
        char_first: Tensor,
        char_last: Tensor,
        token_type_ids: Tensor | None = None,
        position_ids: Tensor | None = None,
        source_index: Tensor | None = None,
        cu_seq_lens: Tensor | None = None,
        max_seq_len: int | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Token and char channels' last hidden states, each (B, L, H).

        A packed batch (its blocks one after another in one stream, spanlm.data.packing) gives ``position_ids``
        (1, T) restarting at 0 per block and ``source_index`` (1, T): each token's flat position in the char
        inputs' one block per row layout (past its end for padding), and, when the batch carries them, its
        segments' bounds ``cu_seq_lens`` and longest segment ``max_seq_len``. Its blocks are one pad apart, so
        the fusion convolution sees padding at every block edge, as in an unpacked row. Each block attends only
        to itself through the backbone's variable-length attention (:func:`varlen_arguments`), which must
        take them: ``flash_attention_2`` / ``_3`` or spanlm's ``spanlm_varlen``.
        """
        backbone = self.backbone
        packed = position_ids is not None and position_ids.numel() > 0
        kwargs = {}
        if token_type_ids is not None and getattr(backbone.config, "type_vocab_size", 0) > 0:
            kwargs["token_type_ids"] = token_type_ids
        if packed:
            kwargs["position_ids"] = position_ids + (
                backbone.config.pad_token_id + 1 if backbone.config.model_type == "roberta" else 0
            )
        token = backbone.embeddings(input_ids=input_ids, **kwargs)  # (B, L, E)
        if hasattr(backbone, "embeddings_project"):  # ELECTRA with embedding_size < hidden_size
            token = backbone.embeddings_project(token)  # (B, L, H)
        # The char vectors enter the layers as they are: no position embedding, LayerNorm or dropout
        # (the authors' CharBertEmbeddings returns the GRU concatenation directly).
        char = self.char_encoder(char_ids, char_lengths, char_first, char_last)  # (blocks, block length, H)
        real = attention_mask.long()  # (B, L)
        if packed:
            rows = torch.cat(
                [char.flatten(0, 1), char.new_zeros(1, char.shape[-1])]
            )  # (blocks·length + 1, H): a zero row for padding
            char = rows.index_select(0, source_index.flatten()).view(*input_ids.shape, -1)  # (B, L, H)
            if backbone.config._attn_implementation not in VARLEN_IMPLEMENTATIONS:
                raise ValueError(
                    f"a packed batch needs a variable-length attention ({', '.join(VARLEN_IMPLEMENTATIONS)}), "
                    f"not {backbone.config._attn_implementation!r}"
                )
            mask, varlen = None, varlen_arguments(position_ids, attention_mask, cu_seq_lens, max_seq_len)
        else:
            mask, varlen = (
                create_bidirectional_mask(config=backbone.config, inputs_embeds=token, attention_mask=real),
                {},
            )
        for index, layer in enumerate(self.layers):
            # The same layer object — one set of weights — reads both channels (paper §3.2).
            token, char = self.fusion(index)(layer(token, mask, **varlen), layer(char, mask, **varlen), real)
        return token, char


@dataclasses.dataclass
class CharBertModelOutput(ModelOutput):
    """``last_hidden_state`` (B, L, 2H) = [token channel; char channel], the features CharBERT fine-tunes
    on (paper §3.4); ``token_hidden_state`` and ``char_hidden_state`` (B, L, H) are the two channels."""

    last_hidden_state: torch.FloatTensor | None = None
    token_hidden_state: torch.FloatTensor | None = None
    char_hidden_state: torch.FloatTensor | None = None


class CharBertModel(DualChannelMixin, PreTrainedModel):
    """A CharBERT export as a transformers model: the backbone of ``config.model_type`` and the char channel.

    ``forward`` takes the tokenizer's inputs and the char inputs (:meth:`char_featurizer`) and returns
    :class:`CharBertModelOutput`. The backbone's weights may be saved under its own names (spanlm's
    exports, which the plain backbone class also loads) or under ``backbone.`` (``save_pretrained``).
    """

    base_model_prefix = "backbone"
    _supports_sdpa = True

    def __init__(self, config):
        super().__init__(config)
        if config.model_type not in FAMILIES:
            raise ValueError(f"CharBERT runs over {', '.join(FAMILIES)} backbones, not '{config.model_type}'")
        # The pooler is no part of CharBERT. trust_remote_code=False: config.auto_map names this class, and
        # the backbone is the library's own model of config.model_type.
        pooler = {"add_pooling_layer": False} if config.model_type in ("bert", "roberta") else {}
        self.backbone = AutoModel.from_config(config, trust_remote_code=False, **pooler)
        self.add_char_channel(CharChannelConfig.from_model_config(config))
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        # transformers gives the backbone's modules the backbone's own init; these are the char channel's.
        init_char_weights(module, float(self.config.initializer_range))
        if isinstance(module, (nn.GRU, nn.Conv1d, nn.LayerNorm)):
            # PyTorch's defaults, drawn again: transformers may have built the model on the meta device.
            module.reset_parameters()

    def char_featurizer(self, tokenizer) -> CharFeaturizer:
        """The char inputs' featurizer for this model's (fast) tokenizer:
        ``featurizer.model_inputs(encoding, texts)``."""
        return CharFeaturizer.from_tokenizer(tokenizer, CharVocab.from_model_config(self.config))

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        char_ids: Tensor | None = None,
        char_lengths: Tensor | None = None,
        char_first: Tensor | None = None,
        char_last: Tensor | None = None,
    ) -> CharBertModelOutput:
        if char_ids is None or char_lengths is None or char_first is None or char_last is None:
            raise ValueError(
                "CharBertModel needs the char inputs (char_ids, char_lengths, char_first, char_last): "
                "model.char_featurizer(tokenizer).model_inputs(encoding, texts) builds them with the rest"
            )
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        token, char = self.channels(
            input_ids, attention_mask, char_ids, char_lengths, char_first, char_last, token_type_ids
        )
        return CharBertModelOutput(
            last_hidden_state=torch.cat([token, char], dim=-1),  # (B, L, 2H)
            token_hidden_state=token,
            char_hidden_state=char,
        )
