"""Blocks: packing invariants, seeded order (seed 0 included), exact resume, disjoint ranks."""

import math

import numpy as np
import pytest

from spanlm.data.blocks import BlockDataset, BlockSampler, KeyedPermutation, build_block_index, collate_blocks
from spanlm.data.shards import PreparedCorpus


def random_layout(rng, n_documents=40, capacity=30):
    """Sentence and document offsets with some sentences longer than a block."""
    sentences_per_document = rng.integers(1, 8, n_documents)
    lengths = rng.integers(1, 2 * capacity, sentences_per_document.sum())
    sentence_offsets = np.concatenate([[0], np.cumsum(lengths)])
    document_offsets = np.concatenate([[0], np.cumsum(sentences_per_document)])
    return sentence_offsets, document_offsets


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_block_invariants(seed):
    capacity = 30
    sentence_offsets, document_offsets = random_layout(np.random.default_rng(seed), capacity=capacity)
    blocks = build_block_index(sentence_offsets, document_offsets, capacity)
    lengths = blocks[:, 1] - blocks[:, 0]
    assert (lengths >= 1).all() and (lengths <= capacity).all()
    # no token lost or repeated: the blocks tile the corpus in order
    assert blocks[0, 0] == 0 and blocks[-1, 1] == sentence_offsets[-1] and (blocks[1:, 0] == blocks[:-1, 1]).all()
    # no block crosses a document boundary
    document_starts = sentence_offsets[document_offsets[:-1]]
    for start, end in blocks:
        assert not ((document_starts > start) & (document_starts < end)).any()
    # a block boundary is a sentence boundary unless it cuts an over-long sentence into capacity pieces
    sentence_of = np.searchsorted(sentence_offsets, blocks[:, 0], side="right") - 1
    inside = blocks[:, 0] != sentence_offsets[sentence_of]
    assert ((blocks[inside, 0] - sentence_offsets[sentence_of[inside]]) % capacity == 0).all()
    assert inside.any()  # the layout really has over-long sentences
    # greedy: a block could not have taken the first unit of the next block when both share a document
    document_of = np.searchsorted(document_starts, blocks[:, 0], side="right") - 1
    same_document = document_of[1:] == document_of[:-1]
    first_unit = np.minimum(capacity, sentence_offsets[sentence_of + 1] - blocks[:, 0])
    assert (lengths[:-1][same_document] + first_unit[1:][same_document] > capacity).all()


def test_greedy_packing_by_hand():
    # sentences of 3, 4, 2 tokens in one document, then a 9-token sentence in a second; capacity 7
    sentence_offsets = np.array([0, 3, 7, 9, 18])
    document_offsets = np.array([0, 3, 4])
    assert build_block_index(sentence_offsets, document_offsets, 7).tolist() == [[0, 7], [7, 9], [9, 16], [16, 18]]


def test_block_dataset_items(embedded_prepared):
    corpus = PreparedCorpus(embedded_prepared)
    dataset = BlockDataset(corpus, max_len=64)
    special = corpus.special_ids
    for i in [0, 1, len(dataset) // 2, len(dataset) - 1]:
        block = dataset[i]
        assert len(block.ids) <= 64 and block.ids[0] == special["cls"] and block.ids[-1] == special["sep"]
        assert block.word_starts[[0, 1, -1]].all()
        start, end = dataset.index[i]
        assert np.array_equal(block.ids[1:-1], corpus.ids[start:end])
    assert sum(len(dataset[i].ids) - 2 for i in range(len(dataset))) == len(corpus.ids)


def test_collate_pads_and_marks_specials(embedded_prepared):
    corpus = PreparedCorpus(embedded_prepared)
    dataset = BlockDataset(corpus, max_len=64)
    short = int(np.argmin(dataset.index[:, 1] - dataset.index[:, 0]))
    blocks = [dataset[0], dataset[short]]
    batch = collate_blocks(blocks, pad_id=corpus.special_ids["pad"])
    assert batch.input_ids.shape == (2, len(blocks[0].ids))
    n = len(blocks[1].ids)
    assert (batch.input_ids[1, n:] == corpus.special_ids["pad"]).all() and not batch.attention_mask[1, n:].any()
    assert batch.special_mask[1, [0, n - 1]].all() and batch.special_mask[1, n:].all()
    assert not batch.special_mask[1, 1 : n - 1].any()


def test_same_seed_same_order_and_seed_zero_shuffles():
    a, b = list(BlockSampler(100, seed=0)), list(BlockSampler(100, seed=0))
    assert a == b and a != list(range(100)) and sorted(a) == list(range(100))
    assert a != list(BlockSampler(100, seed=1))
    sampler = BlockSampler(100, seed=0)
    sampler.set_epoch(1)
    assert list(sampler) != a


def test_resume_continues_exactly():
    uninterrupted = BlockSampler(50, seed=3)
    uninterrupted.set_epoch(2)
    expected = list(uninterrupted)
    sampler = BlockSampler(50, seed=3)
    sampler.set_epoch(2)
    iterator = iter(sampler)
    seen = [next(iterator) for _ in range(17)]
    state = sampler.state_dict()
    restored = BlockSampler(50, seed=3)
    restored.load_state_dict(state)
    assert seen + list(restored) == expected
    with pytest.raises(ValueError):
        BlockSampler(50, seed=4).load_state_dict(state)


def test_ranks_read_disjoint_equal_parts():
    parts = [list(BlockSampler(103, seed=0, rank=r, world_size=4)) for r in range(4)]
    assert len({len(p) for p in parts}) == 1 and len(parts[0]) == 25
    flat = [i for p in parts for i in p]
    assert len(set(flat)) == len(flat) == 100
    with pytest.raises(ValueError):
        BlockSampler(3, world_size=4)


def greedy_walk(sentence_offsets, document_offsets, capacity):
    """The packing spelled out as a walk over sentences: the reference the vectorised index must equal."""
    blocks, current, current_document = [], None, None
    for document in range(len(document_offsets) - 1):
        for sentence in range(document_offsets[document], document_offsets[document + 1]):
            start, end = int(sentence_offsets[sentence]), int(sentence_offsets[sentence + 1])
            pieces = [(piece, min(piece + capacity, end)) for piece in range(start, end, capacity)] or [(start, start)]
            for piece_start, piece_end in pieces:
                if current is not None and current_document == document and piece_end - current[0] <= capacity:
                    current[1] = piece_end
                else:
                    if current is not None:
                        blocks.append(tuple(current))
                    current, current_document = [piece_start, piece_end], document
    blocks.append(tuple(current))
    return blocks


@pytest.mark.parametrize("seed", range(6))
def test_vectorised_index_equals_the_greedy_walk_on_edge_cases(seed):
    rng = np.random.default_rng(seed)
    capacity = int(rng.integers(3, 40))
    # one-sentence documents, empty documents, long documents, sentences of exactly the capacity, over-long
    # ones (several capacities) and empty sentences
    sentences_per_document = rng.choice([0, 1, 1, 2, 5, 40], size=60)
    sentences_per_document[0] = max(sentences_per_document[0], 1)
    lengths = rng.choice(
        [0, 1, 2, capacity - 1, capacity, capacity + 1, 3 * capacity + 2, int(rng.integers(1, capacity))],
        size=int(sentences_per_document.sum()),
    )
    lengths[0] = max(lengths[0], 1)
    sentence_offsets = np.concatenate([[0], np.cumsum(lengths)])
    document_offsets = np.concatenate([[0], np.cumsum(sentences_per_document)])
    expected = greedy_walk(sentence_offsets, document_offsets, capacity)
    assert [
        tuple(block) for block in build_block_index(sentence_offsets, document_offsets, capacity).tolist()
    ] == expected


def test_one_long_document_of_small_sentences():
    # thousands of blocks in one document: many doubling rounds
    lengths = np.random.default_rng(3).integers(1, 9, 20_000)
    sentence_offsets, document_offsets = np.concatenate([[0], np.cumsum(lengths)]), np.array([0, len(lengths)])
    expected = greedy_walk(sentence_offsets, document_offsets, 30)
    assert [tuple(block) for block in build_block_index(sentence_offsets, document_offsets, 30).tolist()] == expected


def test_the_index_is_written_at_prepare_time_and_memory_mapped(embedded_prepared, tmp_path, monkeypatch):
    from spanlm.data import block_index as blocks_module
    from spanlm.data.block_index import load_block_index, share_block_index
    from spanlm.data.shards import block_index_file

    corpus = PreparedCorpus(embedded_prepared)
    reference = build_block_index(np.asarray(corpus.sentence_offsets), np.asarray(corpus.document_offsets), 126)
    index = BlockDataset(corpus, max_len=128).index  # data.max_len's default: written by prepare
    assert isinstance(index, np.memmap) and np.array_equal(index, reference)
    # another max_len: built in memory in document runs (small runs here) until shared, then mapped; in a copy of
    # the session's corpus without the indexes other tests' runs shared into it
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in embedded_prepared.iterdir():
        if name.is_file() and (not name.name.startswith("block_index-") or name.name == block_index_file(128)):
            (copy / name.name).symlink_to(name)
    corpus_copy = PreparedCorpus(copy)
    monkeypatch.setattr(blocks_module, "INDEX_CHUNK_SENTENCES", 7)
    in_memory = load_block_index(corpus_copy, 40)
    assert not isinstance(in_memory, np.memmap)
    assert np.array_equal(
        in_memory, build_block_index(np.asarray(corpus.sentence_offsets), np.asarray(corpus.document_offsets), 38)
    )
    share_block_index(corpus_copy, 40, log=print)
    assert np.array_equal(np.load(copy / block_index_file(40), mmap_mode="r"), in_memory)
    assert [p.name for p in copy.iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize("n", [1, 2, 3, 10, 97, 2**16, 2**16 + 1, 123457])
def test_a_keyed_permutation_is_a_bijection(n):
    permutation = KeyedPermutation(n, np.random.default_rng(n))
    assert (permutation.listed is None) == (n > KeyedPermutation.LISTED)
    assert np.array_equal(np.sort(permutation(np.arange(n))), np.arange(n))
    positions = np.random.default_rng(0).integers(0, n, size=50)
    assert (permutation(positions) == permutation(np.arange(n))[positions]).all()  # any positions, any order


def chi_square_is_uniform(counts: np.ndarray) -> bool:
    """Whether ``counts`` pass a chi-square test of uniformity at p = 0.001 (Wilson–Hilferty's critical value)."""
    expected = counts.sum() / len(counts)
    statistic = float(((counts - expected) ** 2 / expected).sum())
    freedom = len(counts) - 1
    critical = freedom * (1 - 2 / (9 * freedom) + 3.09 * (2 / (9 * freedom)) ** 0.5) ** 3
    return statistic < critical


def test_chi_square_check_rejects_a_biased_order():
    counts = np.full(50, 80)
    counts[:5] += 40  # blocks that come first a little more often than the rest
    assert not chi_square_is_uniform(counts) and chi_square_is_uniform(np.full(50, 80))


@pytest.mark.parametrize("n", [7, 1000, 2**16 + 1, 10**6, 3 * 10**9])
def test_keyed_orders_are_uniform_over_seeds(n):
    """Over many seeds, the blocks at a few positions and the gaps between them are uniform (chi-square),
    as in a uniformly drawn permutation; listed and Feistel orders alike. Positions 0 and ⌈n / ⌈√n⌉⌉ share
    their low Feistel digit: a network of too few rounds shows there."""
    draws, bins, gap_bins = 4000, min(n, 50), min(n - 1, 50)  # cells of ≥ 80 expected draws
    same_low_digit = -(-n // (math.isqrt(n - 1) + 1))
    positions = np.array([0, 1, n // 2, same_low_digit]) % n
    items = np.array([KeyedPermutation(n, np.random.default_rng([seed, 0]))(positions) for seed in range(draws)])
    assert chi_square_is_uniform(np.bincount(items[:, 0] * bins // n, minlength=bins))
    assert chi_square_is_uniform(np.bincount(items[:, 2] * bins // n, minlength=bins))
    for other in (1, 2, 3):
        gaps = (items[:, other] - items[:, 0]) % n  # 1 … n-1 when the positions differ
        if positions[other] != 0:
            assert chi_square_is_uniform(np.bincount((gaps - 1) * gap_bins // (n - 1), minlength=gap_bins))
