"""Word-start flags come from the tokenizer's own word segmentation (or jieba), for every family."""

import jieba
import numpy as np
import pytest

from helpers import EMBEDDED_CORPUS
from spanlm.data.tokenizer import TokenizerConfig, train_tokenizer
from spanlm.data.words import encode_sentences, jieba_word_starts

# ASCII text so that character offsets in the normalised and the original string coincide.
SENTENCES = ["unbelievably backhanded compliments, extraordinarily intricate mechanisms!", "the  cat sat"]
# The sentences are in the training text once (so every character is known); with a vocabulary of 100
# their long words are still split into several pieces.
TRAINING = ["the cat sat on the mat", "a dog and a cat", "hello there, general kenobi"] * 20 + SENTENCES


def word_groups(text, word_starts, offsets):
    """The text covered by each run of tokens that starts with a word-start flag."""
    starts = list(np.flatnonzero(word_starts)) + [len(word_starts)]
    return [text[offsets[a][0] : offsets[b - 1][1]].strip() for a, b in zip(starts[:-1], starts[1:])]


@pytest.mark.parametrize("kind", ["wordpiece", "bpe", "unigram"])
def test_word_starts_match_the_pre_tokenizer_words(kind):
    tokenizer = train_tokenizer(TRAINING, TokenizerConfig(kind=kind, vocab_size=100, min_frequency=1))
    ids, word_starts, lengths = encode_sentences(tokenizer, SENTENCES, "none")
    assert len(ids) == len(word_starts) == lengths.sum()
    backend = tokenizer.backend_tokenizer
    assert len(word_starts) - word_starts.sum() >= 10  # meaningful only if words really have several pieces
    position = 0
    for text, length in zip(SENTENCES, lengths):
        encoding = backend.encode(text, add_special_tokens=False)
        assert list(ids[position : position + length]) == encoding.ids
        flags = word_starts[position : position + length]
        position += length
        normalized = backend.normalizer.normalize_str(text)
        expected = [normalized[a:b].strip() for _, (a, b) in backend.pre_tokenizer.pre_tokenize_str(normalized)]
        assert word_groups(normalized, flags, encoding.offsets) == expected


@pytest.mark.parametrize("kind", ["wordpiece", "bpe", "unigram"])
def test_the_text_of_a_special_token_is_ordinary_text(kind):
    # A literal "[MASK]" or "<s>" (an HTML tag in web text) must not become a special id inside a block:
    # the maskers know specials by position and would take it as a target, and the model would see a
    # mask or separator that is not one.
    tokenizer = train_tokenizer(
        TRAINING + ["[ ] < > / mask sep pad cls s"] * 5, TokenizerConfig(kind=kind, vocab_size=100, min_frequency=1)
    )
    text = "the cat [MASK] sat <s> on [SEP] the </s> mat [PAD] <mask> [CLS] <pad>"
    ids, word_starts, lengths = encode_sentences(tokenizer, [text], "none")
    assert not set(ids.tolist()) & set(tokenizer.all_special_ids)
    assert lengths.sum() == len(ids) > 13
    assert not tokenizer.backend_tokenizer.encode_special_tokens  # the tokenizer is left as it was
    assert (
        tokenizer.mask_token_id
        in tokenizer.backend_tokenizer.encode(f"a {tokenizer.mask_token}", add_special_tokens=False).ids
    )


def test_added_tokens_are_words_of_their_own():
    tokenizer = train_tokenizer(TRAINING, TokenizerConfig(vocab_size=100, min_frequency=1))
    tokenizer.add_tokens(["<zorp>"])  # a non-special added token, as a loaded checkpoint may have
    added = tokenizer.convert_tokens_to_ids("<zorp>")
    ids, word_starts, _ = encode_sentences(tokenizer, ["cat<zorp>mat"], "none")
    at = list(ids).index(added)
    assert word_starts[at] and word_starts[at + 1]


def test_jieba_words_are_whole_units():
    texts = ["我们在北京大学学习自然语言处理。", "他来到了网易杭研大厦"]
    tokenizer = train_tokenizer(texts * 5, TokenizerConfig(vocab_size=100, min_frequency=1))
    ids, word_starts, lengths = encode_sentences(tokenizer, texts, "jieba")
    tokens = tokenizer.convert_ids_to_tokens(ids.tolist())
    assert all(len(t) == 1 for t in tokens)  # BERT-style: one token per Chinese character
    boundaries = np.cumsum(lengths)[:-1]
    groups = []
    for sentence_tokens, sentence_starts in zip(
        np.split(np.array(tokens), boundaries), np.split(word_starts, boundaries)
    ):
        cuts = np.flatnonzero(sentence_starts)[1:]
        groups += ["".join(g) for g in np.split(sentence_tokens, cuts)]
    expected = [w for text in texts for w in jieba.lcut(text)]
    assert groups == expected
    assert "北京大学" in groups or "北京" in groups
    assert any(len(g) >= 2 for g in groups)


def test_tokenizer_words_for_chinese_are_characters():
    texts = ["北京大学"]
    tokenizer = train_tokenizer(texts * 5, TokenizerConfig(vocab_size=100, min_frequency=1))
    _, word_starts, _ = encode_sentences(tokenizer, texts, "none")
    assert word_starts.all()


def reference_jieba_word_starts(tokenizer, texts):
    """The per-sentence implementation spanlm used before its segmentation went to rjieba: jieba.tokenize
    on each sentence, a token starting a word where its first character opens a jieba word."""
    ids, word_starts = [], []
    for text in texts:
        encoding = tokenizer.backend_tokenizer.encode(text, add_special_tokens=False)
        opens = {start for _, start, _ in jieba.tokenize(text)}
        words = np.cumsum([a in opens for a, _ in encoding.offsets])
        ids += encoding.ids
        word_starts += [True] + list(words[1:] != words[:-1]) if len(words) else []
    return np.array(ids), np.array(word_starts, dtype=bool)


# Blocks jieba cuts by its own rules, beside the ideographs: ASCII mixed in, numbers, a URL, a run of
# single characters that jieba-rs's HMM would cut otherwise (a near-tie), one whose HMM path opens in M
# (characters jieba's tables know only inside words), spaces and full-width text.
MIXED_SENTENCES = [
    "苹果发布了iPhone12和C++编译器，售价3.5%上涨",
    "请访问www.horou.com或者 example_site 了解",
    "常在较陡峭的礁岸可发现它们成群的洄游",
    "Ｂｅｒｔ模型  在２０２０年……“北京”",
    "12345",
    "纯English sentence with 数字 42.",
    "…",
    "a",
    "鿕鿖㐀𠀀中文",
    "说：嬿懨！",
]


def test_jieba_word_starts_are_those_of_jieba_sentence_by_sentence():
    texts = [
        line.strip()
        for line in (EMBEDDED_CORPUS / "hongloumeng_ch1-5.txt").read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]
    texts += MIXED_SENTENCES
    tokenizer = train_tokenizer(texts, TokenizerConfig(vocab_size=3000, min_frequency=1))
    ids, word_starts, lengths = encode_sentences(tokenizer, texts, "jieba")
    expected_ids, expected_starts = reference_jieba_word_starts(tokenizer, texts)
    assert np.array_equal(ids, expected_ids)
    assert len(word_starts) > 30_000 and 0.4 < word_starts.mean() < 0.9  # multi-character words, not one per character
    assert np.array_equal(word_starts, expected_starts)


@pytest.mark.parametrize("text", MIXED_SENTENCES + ["", "的", "这是一个没有标点的很长很长很长的句子" * 50])
def test_jieba_word_starts_of_one_text(text):
    expected = [start for _, start, _ in jieba.tokenize(text)] if text else []
    assert jieba_word_starts(text).tolist() == expected
