"""Character ↔ token alignment: property-based round trips (Chinese, mixed Latin/CJK, full-width, repeated
entity strings, entities at position 0 and at the end) and snapping of spans off token boundaries."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spanlm.models.hf_model import load_fast_tokenizer
from spanlm.ner.align import char_to_token, token_to_char, tokenize_documents
from spanlm.ner.data import Entity, NerDocument
from spanlm.ner.windows import make_windows

# Units the texts are built from: CJK characters (some outside the vocabulary), Latin words (split into
# several WordPieces by the small vocabulary), full-width Latin words and digits, ASCII and CJK punctuation.
CJK = list("北京大学李明上海中国华为深圳发布了新手机今天天气")
LATIN = ["Paris", "London", "Holmes", "unbelievable", "naïve", "café", "ESB", "x", "Watson", "DOTA2"]
FULL_WIDTH = ["ＡＢＣ", "Ｘ", "１２３", "ｈｅｌｌｏ"]
PUNCT = ["，", "。", "《", "》", ",", ".", "!", "(", ")"]
WORDS = set(LATIN) | set(FULL_WIDTH)
UNITS = st.sampled_from(CJK + LATIN + FULL_WIDTH + PUNCT)


@st.composite
def documents(draw):
    """A text made of units, and unit-aligned entity spans (always one at position 0 and one at the end)."""
    units = draw(st.lists(UNITS, min_size=1, max_size=30))
    text, bounds = "", []
    for i, unit in enumerate(units):
        # Two word units must be apart or they would be one word; elsewhere a space is optional.
        if i and ((units[i - 1] in WORDS and unit in WORDS) or draw(st.booleans())):
            text += " " * draw(st.integers(1, 2))
        bounds.append((len(text), len(text) + len(unit)))
        text += unit
    n = len(units)
    pairs = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=6))
    spans = {(0, draw(st.integers(0, n - 1))), (draw(st.integers(0, n - 1)), n - 1)} | {
        (min(a, b), max(a, b)) for a, b in pairs
    }
    # A repeated entity string: the same units again, labelled again.
    entities = [Entity(bounds[a][0], bounds[b][1], "X") for a, b in sorted(spans) if a <= b]
    return text, entities


def round_trip(tokenizer, docs):
    texts = [text for text, _ in docs]
    tokens = tokenize_documents(tokenizer, texts)
    flat = [(d, e.start, e.end) for d, (_, entities) in enumerate(docs) for e in entities]
    doc, start, end = (np.array(c, dtype=np.int64) for c in zip(*flat))
    first, last, exact, aligned = char_to_token(tokens, doc, start, end, np.array([len(t) for t in texts]))
    assert aligned.all() and exact.all()
    base = tokens.token_starts[doc]
    back_start, back_end = token_to_char(tokens.offsets, base + first, base + last)
    np.testing.assert_array_equal(back_start, start)
    np.testing.assert_array_equal(back_end, end)
    assert ((first >= 0) & (last < tokens.lengths[doc])).all()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(documents(), min_size=1, max_size=4))
def test_char_token_char_round_trip_chinese_latin_fullwidth(zh_en_tokenizer, docs):
    round_trip(zh_en_tokenizer, docs)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(documents(), min_size=1, max_size=4))
def test_round_trip_with_tiny_encoder_tokenizer(tiny_encoder_dir, docs):
    round_trip(load_fast_tokenizer(tiny_encoder_dir), docs)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents(), st.integers(1, 6), st.integers(0, 3), st.data())
def test_windows_carry_exact_spans_back_to_characters(zh_en_tokenizer, doc, max_content, stride, data):
    """Through windows of any size: every entity fitting a window is in every window holding it, and maps back."""
    text, entities = doc
    stride = min(stride, max_content - 1)
    windows, report = make_windows(zh_en_tokenizer, [NerDocument("d", text, entities)], ["X"], max_content + 2, stride)
    assert report.alignment.exact == len(entities) and report.alignment.snapped == 0
    found = set()
    rows = np.argwhere(windows.entity_spans[..., 0] >= 0)  # (P, 2) window, slot
    for w, slot in rows:
        _, s, e = windows.entity_spans[w, slot]
        assert windows.token_mask[w, s] and windows.token_mask[w, e] and s <= e
        found.add((int(windows.offsets[w, s, 0]), int(windows.offsets[w, e, 1])))
    expected = {(e.start, e.end) for e in entities}
    assert found <= expected and len(expected - found) == report.too_long


@settings(max_examples=80, deadline=None)
@given(documents(), st.data())
def test_spans_off_token_boundaries_are_snapped_and_counted(zh_en_tokenizer, doc, data):
    text, _ = doc
    start = data.draw(st.integers(0, len(text) - 1))
    end = data.draw(st.integers(start + 1, len(text)))
    tokens = tokenize_documents(zh_en_tokenizer, [text])
    first, last, exact, aligned = char_to_token(
        tokens, np.array([0]), np.array([start]), np.array([end]), np.array([len(text)])
    )
    if not aligned[0]:
        assert text[start:end].strip() == ""  # only whitespace: no token to snap to
        return
    s, e = token_to_char(tokens.offsets, first, last)
    inner_start = start + len(text[start:end]) - len(text[start:end].lstrip())
    inner_end = end - len(text[start:end]) + len(text[start:end].rstrip())
    assert s[0] <= inner_start and inner_end <= e[0]  # the covering tokens contain the span (bar outer whitespace)
    assert bool(exact[0]) == (s[0] == start and e[0] == end)
    # and they are the tightest: the next token inwards would not cover it
    assert tokens.offsets[first[0], 1] > start and tokens.offsets[last[0], 0] < end
    windows, report = make_windows(zh_en_tokenizer, [NerDocument("d", text, [Entity(start, end, "X")])], ["X"], 64, 8)
    assert (report.alignment.snapped, report.alignment.exact) == ((0, 1) if exact[0] else (1, 0))
    assert (windows.entity_spans[0, 0, 1:] == [first[0] + 1, last[0] + 1]).all()  # never dropped; +1 for [CLS]


def test_snapping_report_names_examples(zh_en_tokenizer):
    text = "ＡＢＣ ESB"  # ＡＢＣ is one [UNK] token: "ＡＢ" cannot be cut out of it
    windows, report = make_windows(
        zh_en_tokenizer, [NerDocument("doc7", text, [Entity(0, 2, "X"), Entity(4, 7, "X")])], ["X"], 32, 4
    )
    assert report.alignment.summary() == {"entities": 2, "exact": 1, "snapped": 1, "unaligned": 0}
    assert report.alignment.examples == [("doc7", "ＡＢ", "ＡＢＣ")]
    assert "snapped" in report.lines("train.jsonl")[0]


def test_whitespace_span_is_unaligned(zh_en_tokenizer):
    windows, report = make_windows(zh_en_tokenizer, [NerDocument("d", "ESB   ESB", [Entity(4, 5, "X")])], ["X"], 32, 4)
    assert report.alignment.unaligned == 1 and (windows.entity_spans[..., 0] == -1).all()
    assert "cover no token" in report.lines("f")[0]


def test_the_text_of_a_special_token_in_a_document_is_text(zh_en_tokenizer):
    text = "Par is [SEP] Lon don [MASK] caf e [PAD]"
    tokens = tokenize_documents(zh_en_tokenizer, [text])
    structural = set(zh_en_tokenizer.all_special_ids) - {
        zh_en_tokenizer.unk_token_id
    }  # unknown characters may well be [UNK]
    assert not set(tokens.input_ids.tolist()) & structural
    assert "[SEP]" not in zh_en_tokenizer.convert_ids_to_tokens(tokens.input_ids.tolist())
    # Every character of the literal specials is covered by some token's offsets.
    at = text.index("[SEP]")
    assert ((tokens.offsets[:, 0] <= at) & (tokens.offsets[:, 1] > at)).any()
