"""NER fixtures: a WordPiece tokenizer over a small Chinese + English + full-width vocabulary."""

from __future__ import annotations

from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "ner"


def build_wordpiece(texts: list[str], vocab_size: int = 300):
    """A BERT-style fast tokenizer (lower-casing, accent stripping, CJK split) trained on ``texts``."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=True, handle_chinese_chars=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokenizer.train_from_iterator(
        texts, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials, min_frequency=1)
    )
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )


@pytest.fixture(scope="session")
def zh_en_tokenizer():
    # Latin words appear only as parts of other words in the training text, so most are split into
    # several WordPieces; full-width words and some CJK characters stay out of the vocabulary ([UNK]).
    corpus = [
        "北京大学李明上海中国华为深圳",
        "Par is Lon don Hol mes un believ able nai ve caf e E S B Wat son DOTA 2",
    ] * 20
    return build_wordpiece(corpus, vocab_size=120)
