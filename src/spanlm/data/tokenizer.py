"""Train a tokenizer on the corpus with `tokenizers`, or load an existing Hugging Face tokenizer.

Either way the result is a fast tokenizer saved beside the prepared shards, so every later step
(pretraining, export, NER) loads exactly the same one, and `AutoTokenizer` loads it too.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from spanlm.errors import InputError
from spanlm.files import check_tokenizer_files

# Special tokens per family, in id order, named after the models that use each family:
# WordPiece like BERT/ELECTRA, byte-level BPE like RoBERTa, Unigram like DeBERTa-V3 (SentencePiece).
SPECIAL_TOKENS = {
    "wordpiece": {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"},
    "bpe": {"cls": "<s>", "pad": "<pad>", "sep": "</s>", "unk": "<unk>", "mask": "<mask>"},
    "unigram": {"pad": "[PAD]", "cls": "[CLS]", "sep": "[SEP]", "unk": "[UNK]", "mask": "[MASK]"},
}


@dataclasses.dataclass
class TokenizerConfig:
    """Load a Hugging Face tokenizer directory (``path``) or train one of ``kind`` on the corpus."""

    path: str | None = None  # an existing tokenizer / checkpoint directory; None trains a new one
    kind: Literal["wordpiece", "bpe", "unigram"] = "wordpiece"
    vocab_size: int = 8000
    lowercase: bool = True
    min_frequency: int = 2
    extra_special_tokens: list[str] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        if self.vocab_size < 100:
            raise ValueError("vocab_size must be at least 100")


def settings_key(config: TokenizerConfig) -> str:
    """A short name for the tokenizer ``config`` gives, for keying prepared directories by it
    (``data.prepared_dir: runs/prepared/english-{tokenizer}`` → ``runs/prepared/english-wordpiece-8000``).

    A trained tokenizer: its kind and size, and each setting that differs from the default. A loaded
    one (``path``): the directory's name and a hash of its files' bytes, so another tokenizer under
    the same path gets another directory.
    """
    if config.path:
        path = Path(config.path)
        digest = hashlib.sha256()
        for file in sorted(path.iterdir()) if path.is_dir() else []:  # a missing directory fails later, clearly
            if file.is_file():
                digest.update(file.name.encode() + b"\0" + file.read_bytes())
        return f"{path.name}-{digest.hexdigest()[:8]}"
    default = TokenizerConfig()
    key = f"{config.kind}-{config.vocab_size}"
    if config.lowercase != default.lowercase:
        key += "-cased"
    if config.min_frequency != default.min_frequency:
        key += f"-min{config.min_frequency}"
    if config.extra_special_tokens:
        key += "-extra" + hashlib.sha256("\n".join(config.extra_special_tokens).encode()).hexdigest()[:6]
    return key


def train_tokenizer(texts: Iterable[str], config: TokenizerConfig):
    """Train a fast tokenizer of ``config.kind`` on ``texts`` and wrap it for transformers."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    names = SPECIAL_TOKENS[config.kind]
    specials = list(names.values()) + list(config.extra_special_tokens)
    if config.kind == "wordpiece":
        tokenizer = Tokenizer(models.WordPiece(unk_token=names["unk"]))
        tokenizer.normalizer = normalizers.BertNormalizer(lowercase=config.lowercase, strip_accents=config.lowercase)
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tokenizer.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(
            vocab_size=config.vocab_size,
            min_frequency=config.min_frequency,
            special_tokens=specials,
            show_progress=False,
        )
    elif config.kind == "bpe":
        tokenizer = Tokenizer(models.BPE())
        tokenizer.normalizer = normalizers.Lowercase() if config.lowercase else None
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=config.vocab_size,
            min_frequency=config.min_frequency,
            special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
    else:
        tokenizer = Tokenizer(models.Unigram())
        steps = [normalizers.NFKC()] + ([normalizers.Lowercase()] if config.lowercase else [])
        tokenizer.normalizer = normalizers.Sequence(steps)
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
        tokenizer.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(
            vocab_size=config.vocab_size, special_tokens=specials, unk_token=names["unk"], show_progress=False
        )
    tokenizer.train_from_iterator(texts, trainer)
    cls_id, sep_id = tokenizer.token_to_id(names["cls"]), tokenizer.token_to_id(names["sep"])
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{names['cls']} $A {names['sep']}",
        pair=f"{names['cls']} $A {names['sep']} $B:1 {names['sep']}:1",
        special_tokens=[(names["cls"], cls_id), (names["sep"], sep_id)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        **{f"{role}_token": token for role, token in names.items()},
        additional_special_tokens=list(config.extra_special_tokens) or None,
    )


def load_tokenizer(path: str | Path):
    """Load a fast tokenizer from a local directory, with a clear error when it cannot serve pretraining."""
    from transformers import AutoTokenizer

    path = Path(path)
    if not path.is_dir():
        raise InputError(f"{path}: tokenizer directory does not exist")
    check_tokenizer_files(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as error:  # transformers raises OSError/ValueError/... for unusable directories
        raise InputError(f"{path}: cannot load a tokenizer: {error}".split("\n")[0]) from None
    check_tokenizer(tokenizer, str(path))
    return tokenizer


def check_tokenizer(tokenizer, where: str) -> None:
    if not getattr(tokenizer, "is_fast", False) or not hasattr(tokenizer, "backend_tokenizer"):
        raise InputError(f"{where}: spanlm needs a fast (tokenizers-backed) tokenizer for word ids and offsets")
    missing = [role for role in ("cls", "sep", "pad", "mask") if getattr(tokenizer, f"{role}_token_id") is None]
    if missing:
        raise InputError(f"{where}: tokenizer has no {', '.join(missing)} token")


def encode_text(tokenizer, texts: list[str]) -> list:
    """The backend's encodings of ``texts`` (``tokenizer``: a transformers fast tokenizer or its
    ``tokenizers.Tokenizer`` backend): no special tokens added, and the *text* of a special token
    ("[MASK]", "<s>", "[PAD]") tokenized as ordinary text rather than turned into that token's id.

    Why: a corpus is text. Web text is full of "<s>" (an HTML tag) and "[SEP]"-like strings; read as
    special ids they would pose as real masks, separators or padding inside a block, and the maskers,
    which know the specials by position, would pick them as targets. Calls through the transformers
    wrapper (NER, QA) get the same with ``split_special_tokens=True``.
    """
    if not texts:
        return []
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    before = backend.encode_special_tokens
    backend.encode_special_tokens = True
    try:
        return backend.encode_batch(texts, add_special_tokens=False)
    finally:
        backend.encode_special_tokens = before


def save_tokenizer(tokenizer, directory: str | Path) -> None:
    """``save_pretrained`` with a ``tokenizer_class`` that transformers 4.x and 5.x both load as this very tokenizer.

    transformers 5 names a tokenizer built from a ``tokenizers`` object "TokenizersBackend", a class
    transformers 4.x does not have. A WordPiece tokenizer of BERT's pipeline (the ones spanlm trains) is
    written as ``BertTokenizer`` with its normalisation settings, which both versions rebuild exactly;
    any other (spanlm's byte-level BPE and Unigram ones, whose lower-casing the RoBERTa and DeBERTa
    classes would drop) as ``PreTrainedTokenizerFast``, which both versions load from tokenizer.json
    verbatim. A tokenizer that already has its model's class (loaded from a checkpoint) keeps it.
    """
    import json

    directory = Path(directory)
    tokenizer.save_pretrained(str(directory))
    path = directory / "tokenizer_config.json"
    saved = json.loads(path.read_text(encoding="utf-8"))
    if isinstance(saved.get("extra_special_tokens"), list):
        # transformers 5 writes the extra special tokens as a list under a key that 4.x reads as a dict
        # (and fails on); both read the list under its 4.x name.
        saved["additional_special_tokens"] = saved.pop("extra_special_tokens")
    if saved.get("tokenizer_class") not in ("TokenizersBackend", "PreTrainedTokenizerFast"):
        path.write_text(json.dumps(saved, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        return
    fingerprint = tokenizer_fingerprint(tokenizer)
    for settings in (_bert_settings(tokenizer), {"tokenizer_class": "PreTrainedTokenizerFast"}):
        if settings is None:
            continue
        path.write_text(json.dumps({**saved, **settings}, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        # Kept only when transformers rebuilds the same tokenizer from it (a future BertTokenizer could differ).
        if tokenizer_fingerprint(_reload(directory)) == fingerprint:
            return
    raise InputError(f"{directory}: transformers does not load this tokenizer back unchanged")


def _bert_settings(tokenizer) -> dict | None:
    """``BertTokenizer``'s settings that rebuild ``tokenizer``, when it has BERT's pipeline."""
    import json

    backend = json.loads(tokenizer.backend_tokenizer.to_str())
    normalizer, pre_tokenizer = backend.get("normalizer") or {}, backend.get("pre_tokenizer") or {}
    if (
        backend["model"]["type"] != "WordPiece"
        or normalizer.get("type") != "BertNormalizer"
        or pre_tokenizer.get("type") != "BertPreTokenizer"
    ):
        return None
    return {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": normalizer["lowercase"],
        "strip_accents": normalizer["strip_accents"],
        "tokenize_chinese_chars": normalizer["handle_chinese_chars"],
    }


def _reload(directory: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(directory), local_files_only=True)


def tokenizer_fingerprint(tokenizer) -> str:
    """A hash of everything that decides token ids, stored in meta.json to detect vocab mismatches."""
    digest = hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode("utf-8"))
    digest.update(repr(sorted(tokenizer.all_special_ids)).encode())
    return digest.hexdigest()[:16]
