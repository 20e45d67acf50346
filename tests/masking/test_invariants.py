"""Invariants every masker keeps: targets, corruption kinds, specials, determinism — on a real corpus."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from spanlm.data.blocks import BlockBatch
from spanlm.masking.base import FLAT, KEPT, MASK, RANDOM, SIMILAR, MaskedBatch, MaskingConfig, build_masker, make_rng

SCHEMES = ["mlm", "wwm", "span", "ngram", "noise"]


@pytest.fixture(scope="module")
def maskers(english):
    return {scheme: build_masker(MaskingConfig(scheme=scheme), english) for scheme in SCHEMES}


@pytest.fixture(scope="module")
def english_batches(english):
    from spanlm.data.blocks import BlockDataset, collate_blocks

    dataset = BlockDataset(english, 128)
    order = np.random.default_rng(0).permutation(len(dataset))
    return [
        collate_blocks([dataset[int(i)] for i in order[b * 32 : (b + 1) * 32]], english.special_ids["pad"])
        for b in range(4)
    ]


def assert_same(a: MaskedBatch, b: MaskedBatch) -> None:
    assert a.array_names() == b.array_names() and a.packing() == b.packing()
    for name in a.array_names():
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    assert a.counters == b.counters


@pytest.mark.parametrize("scheme", SCHEMES)
def test_targets_and_kinds(scheme, maskers, english_batches, english):
    special_ids = np.array(english.meta["all_special_ids"])
    mask_id = english.special_ids["mask"]
    n_targets = 0
    kinds = np.zeros(4, dtype=np.int64)
    for batch in english_batches:
        masked = maskers[scheme](batch, np.random.default_rng(1))
        ids = masked.input_ids.reshape(-1)
        index = masked.target_index
        assert np.all(np.diff(index) > 0), "targets are unique and ascending"
        assert masked.attention_mask.reshape(-1)[index].all(), "no pad position is a target"
        # No special token ([CLS], [SEP], pad) is ever a target, and none is ever produced.
        assert not np.isin(masked.target_labels, special_ids).any()
        assert not np.isin(ids[index[masked.target_kind != MASK]], special_ids).any()
        width = masked.input_ids.shape[1]
        assert not np.isin(index % width, [0]).any(), "[CLS] is never a target"
        row_end = masked.attention_mask.sum(axis=1) - 1
        assert not np.any(index == index // width * width + row_end[index // width]), "[SEP] is never a target"
        # Each kind does what it says.
        kind = masked.target_kind
        assert np.all(ids[index[kind == MASK]] == mask_id)
        assert np.all(ids[index[kind == KEPT]] == masked.target_labels[kind == KEPT])
        if scheme != "ngram":
            assert not np.any(kind == SIMILAR)
        if scheme != "noise":  # the noise masker rebuilds the layout; elsewhere non-targets are untouched
            untouched = np.ones(ids.size, dtype=bool)
            untouched[index] = False
            np.testing.assert_array_equal(ids[untouched], batch.input_ids.reshape(-1)[untouched])
            np.testing.assert_array_equal(batch.input_ids.reshape(-1)[index], masked.target_labels)
            np.testing.assert_array_equal(masked.attention_mask, batch.attention_mask)
        n_targets += len(index)
        kinds += np.bincount(kind, minlength=4)
    assert n_targets > 1000
    assert kinds[MASK] + kinds[SIMILAR] > 0 and kinds[RANDOM] > 0 and kinds[KEPT] > 0


@pytest.mark.parametrize("scheme", SCHEMES)
def test_same_seed_same_batch_and_streams_differ(scheme, maskers, english_batches):
    masker, batch = maskers[scheme], english_batches[0]
    for seed in (0, 1234):
        assert_same(masker(batch, np.random.default_rng(seed)), masker(batch, np.random.default_rng(seed)))
    seed0 = masker(batch, np.random.default_rng(0))
    assert not np.array_equal(seed0.target_index, masker(batch, np.random.default_rng(1)).target_index)
    # Workers (and ranks, epochs) get distinct streams from one seed.
    worker0 = masker(batch, make_rng(0, 0, 0))
    worker1 = masker(batch, make_rng(0, 0, 1))
    assert not np.array_equal(worker0.target_index, worker1.target_index)
    assert_same(worker1, masker(batch, make_rng(0, 0, 1)))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_the_input_batch_is_not_modified(scheme, maskers, english_batches):
    batch = english_batches[1]
    before = dataclasses.replace(batch, **{f.name: getattr(batch, f.name).copy() for f in dataclasses.fields(batch)})
    maskers[scheme](batch, np.random.default_rng(0))
    for field in dataclasses.fields(batch):
        np.testing.assert_array_equal(getattr(batch, field.name), getattr(before, field.name))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_blocks_without_content_give_empty_targets(scheme, maskers, english):
    cls, sep, pad = (english.special_ids[k] for k in ("cls", "sep", "pad"))
    ids = np.array([[cls, sep, pad], [cls, sep, pad]])
    attention = ids != pad
    batch = BlockBatch(
        input_ids=ids, word_starts=attention.copy(), attention_mask=attention, special_mask=np.ones_like(attention)
    )
    masked = maskers[scheme](batch, np.random.default_rng(0))
    positions = [name for name, packing in masked.packing().items() if packing == FLAT]
    assert {"target_index", "span_start"} <= set(positions)  # and each scheme's own: sbo_*, nlm_index
    assert all(len(getattr(masked, name)) == 0 for name in positions)
    assert masked.to_torch()["target_labels"].shape == (0,)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_maskers_pickle_for_dataloader_workers(scheme, maskers, english_batches):
    import pickle

    copy = pickle.loads(pickle.dumps(maskers[scheme]))
    assert_same(
        copy(english_batches[0], np.random.default_rng(5)),
        maskers[scheme](english_batches[0], np.random.default_rng(5)),
    )
