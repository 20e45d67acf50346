"""Sliding windows: nothing past max_len is lost, entities go to every window holding them whole,
special tokens never start or end an entity, overlapping windows' predictions merge in characters."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spanlm.errors import ConfigError
from spanlm.ner.align import tokenize_documents
from spanlm.ner.data import Entity, NerDocument
from spanlm.ner.predict import Spans, flat_select, merge, window_spans
from spanlm.ner.windows import make_windows, special_template

LONG = " ".join(["北京", "ESB", "Paris", "，", "上海", "Holmes"] * 12)  # ≈ 100 tokens


def test_special_template(zh_en_tokenizer):
    assert special_template(zh_en_tokenizer) == ([zh_en_tokenizer.cls_token_id], [zh_en_tokenizer.sep_token_id])


@pytest.mark.parametrize("max_len, stride", [(8, 0), (8, 3), (16, 5), (512, 10)])
def test_nothing_beyond_max_len_is_lost(zh_en_tokenizer, max_len, stride):
    documents = [NerDocument("a", LONG, []), NerDocument("b", "上海", []), NerDocument("c", "", [])]
    tokens = tokenize_documents(zh_en_tokenizer, [d.text for d in documents])
    windows, report = make_windows(zh_en_tokenizer, documents, ["X"], max_len, stride)
    capacity, step = max_len - 2, max_len - 2 - stride
    assert windows.input_ids.shape[1] <= max_len
    for d in range(3):
        ids = tokens.input_ids[tokens.token_starts[d] : tokens.token_starts[d + 1]]
        rows = np.flatnonzero(windows.document == d)
        covered = np.zeros(len(ids), dtype=bool)
        for k, w in enumerate(rows):
            content = windows.input_ids[w][windows.token_mask[w]]
            np.testing.assert_array_equal(content, ids[k * step : k * step + capacity])  # the slice at k·step
            covered[k * step : k * step + len(content)] = True
            # [CLS] content [SEP] then padding; specials and padding never start or end an entity
            assert windows.input_ids[w, 0] == zh_en_tokenizer.cls_token_id
            assert windows.input_ids[w, windows.attention_mask[w].sum() - 1] == zh_en_tokenizer.sep_token_id
            assert not windows.token_mask[w, 0] and not (windows.token_mask[w] & ~windows.attention_mask[w]).any()
        assert covered.all()
        assert len(rows) == (1 if len(ids) <= capacity else 1 + -(-(len(ids) - capacity) // step))
    assert report.split_documents == (1 if max_len < 100 else 0)


def test_entity_in_every_window_holding_it_whole(zh_en_tokenizer):
    text = LONG
    start = text.index("Paris", 200)
    documents = [
        NerDocument(
            "a", text, [Entity(start, start + 5, "LOC"), Entity(0, 2, "LOC"), Entity(len(text) - 6, len(text), "PER")]
        )
    ]
    windows, report = make_windows(zh_en_tokenizer, documents, ["LOC", "PER"], 12, 6)
    assert report.alignment.exact == 3 and report.too_long == 0
    homes = {}
    for w, slot in np.argwhere(windows.entity_spans[..., 0] >= 0):
        kind, s, e = windows.entity_spans[w, slot]
        homes.setdefault((int(windows.offsets[w, s, 0]), int(windows.offsets[w, e, 1]), int(kind)), []).append(int(w))
    assert set(homes) == {(start, start + 5, 0), (0, 2, 0), (len(text) - 6, len(text), 1)}
    # Every window whose character range holds the entity has it; no other window does.
    for (s, e, _), found in homes.items():
        holding = [
            w
            for w in range(len(windows))
            if windows.offsets[w][windows.token_mask[w]][:, 0].min() <= s
            and e <= windows.offsets[w][windows.token_mask[w]][:, 1].max()
        ]
        assert found == holding
    assert len(homes[(start, start + 5, 0)]) >= 2  # stride 6 over ≤ 10 content tokens: overlapping windows share it


def test_entity_longer_than_a_window_is_counted(zh_en_tokenizer):
    documents = [NerDocument("a", LONG, [Entity(0, len(LONG), "X")])]
    windows, report = make_windows(zh_en_tokenizer, documents, ["X"], 10, 2)
    assert report.too_long == 1 and (windows.entity_spans[..., 0] == -1).all()
    assert "longer than a window" in report.lines("f")[0]


def test_bad_window_settings(zh_en_tokenizer):
    with pytest.raises(ConfigError, match="stride"):
        make_windows(zh_en_tokenizer, [NerDocument("a", "x", [])], ["X"], 8, 6)
    with pytest.raises(ConfigError, match="no room"):
        make_windows(zh_en_tokenizer, [NerDocument("a", "x", [])], ["X"], 2, 0)


def test_batch_cuts_to_the_longest_window_and_calls_the_featurizer(zh_en_tokenizer):
    seen = {}

    def featurizer(input_ids, offsets, texts):
        seen.update(shape=input_ids.shape, offsets=offsets.shape, texts=texts)
        return {"char_ids": (offsets[..., 1] - offsets[..., 0]).astype(np.int64)}

    documents = [NerDocument("a", LONG, [Entity(0, 2, "X")]), NerDocument("b", "上海", [Entity(0, 2, "X")])]
    windows, _ = make_windows(zh_en_tokenizer, documents, ["X"], 32, 4, featurizer)
    last = len(windows) - 1
    batch = windows.batch([0, last])
    assert batch["input_ids"].shape == (2, 32) and batch["entity_spans"].shape == (2, 1, 3)
    only_short = windows.batch([last])
    assert only_short["input_ids"].shape == (1, 4)  # [CLS] 上 海 [SEP]
    assert only_short["entity_spans"].tolist() == [[[0, 1, 2]]]
    assert seen == {"shape": (1, 4), "offsets": (1, 4, 2), "texts": ["上海"]}
    assert only_short["char_ids"].tolist() == [[0, 1, 1, 0]]
    assert "entity_spans" not in windows.batch([last], targets=False)


def test_merge_keeps_the_best_score_per_span_and_flat_picks_non_overlapping():
    spans = Spans(
        document=np.array([0, 0, 0, 0, 1, 0]),
        type=np.array([0, 0, 1, 0, 0, 0]),
        start=np.array([0, 0, 0, 3, 0, 2]),
        end=np.array([5, 5, 5, 9, 5, 4]),
        score=np.array([1.0, 3.0, 2.0, 0.5, 0.1, 2.5]),
    )
    merged = merge(spans)
    assert sorted(
        zip(
            merged.document.tolist(),
            merged.type.tolist(),
            merged.start.tolist(),
            merged.end.tolist(),
            merged.score.tolist(),
        )
    ) == [(0, 0, 0, 5, 3.0), (0, 0, 2, 4, 2.5), (0, 0, 3, 9, 0.5), (0, 1, 0, 5, 2.0), (1, 0, 0, 5, 0.1)]
    flat = flat_select(merged)
    kept = sorted(zip(flat.document.tolist(), flat.start.tolist(), flat.end.tolist(), flat.type.tolist()))
    assert kept == [(0, 0, 5, 0), (1, 0, 5, 0)]  # (0,5) best; (2,4), (0,5,type 1) and (3,9) overlap it


class DiagonalModel(torch.nn.Module):
    """Marks every single-token span of token ``target`` as an entity, scored by its window position."""

    def __init__(self, target: int):
        super().__init__()
        self.target = target

    def forward(self, batch):
        ids = batch["input_ids"]
        batch_size, length = ids.shape
        logits = torch.full((batch_size, 1, length, length), -5.0)
        hit = (ids == self.target) & batch["token_mask"]
        positions = torch.arange(length, dtype=torch.float32).expand(batch_size, length)
        logits[:, 0].diagonal(dim1=-2, dim2=-1).copy_(torch.where(hit, 1.0 + positions, -5.0))
        return {"logits": logits}


def test_overlapping_window_predictions_merge_in_characters(zh_en_tokenizer):
    documents = [NerDocument("a", LONG, []), NerDocument("b", "北 上海", [])]
    windows, _ = make_windows(zh_en_tokenizer, documents, ["X"], 10, 4)
    target = zh_en_tokenizer.convert_tokens_to_ids("北")
    spans = window_spans(DiagonalModel(target), windows, np.arange(len(windows)), 0.0, 3, torch.device("cpu"))
    merged = merge(spans)
    expected = [(0, i) for i in range(len(LONG)) if LONG[i] == "北"] + [(1, 0)]
    assert sorted(zip(merged.document.tolist(), merged.start.tolist())) == expected  # every occurrence, once
    assert len(spans.start) > len(merged.start)  # overlapping windows found some twice
    assert (merged.end - merged.start == 1).all()
    # the kept score is the best window's: the occurrence's largest position over the windows holding it
    for d, s, score in zip(merged.document, merged.start, merged.score):
        same = (spans.document == d) & (spans.start == s)
        assert score == spans.score[same].max()
