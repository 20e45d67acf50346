"""MacBERT's similar-word table, built offline by ``spanlm prepare``, and the word types it rests on.

MacBERT replaces a selected word by a *similar word* (80%) instead of [MASK] (Cui et al. 2020, §3.3;
the authors used the Synonyms toolkit, i.e. word2vec nearest neighbours). Here the table is built once
at preparation time from one of three sources (``data.similar_words``):

- ``word2vec``: gensim Word2Vec trained on the prepared corpus's words (the optional ``gensim`` extra);
- ``synonyms``: a TSV file, one ``word<TAB>synonym[<TAB>synonym…]`` per line, best first;
- ``vectors``: a word-vector file in word2vec text format (``.bin``: binary), e.g. fastText vectors.

Whatever the source, a neighbour is kept only if it tokenizes to as many tokens as the word it
replaces (so the replacement is a drop-in at the same positions; the paper leaves different lengths
open), contains no special or unknown token, differs from the word, and is a word
exactly when the source is (has a letter or digit); the best ``data.similar_words_k`` are stored. A word
with none falls back to random tokens at masking time.

Words are identified by their token ids, never by re-tokenising text in the masker: a word's key is
:func:`word_hash` of its ids, which the masker computes for the words of a batch with the same few
array operations. The table file ``similar_words.npz`` in the prepared directory holds::

    hashes         (S,) int64, sorted    word_hash of each source word's ids
    lengths        (S,) int64            its token count (every neighbour has the same)
    offsets        (S+1,) int64          neighbours of source s are entries offsets[s]:offsets[s+1]
    token_offsets  (E,) int64            entry e's ids are tokens[token_offsets[e]:][:lengths[s]]
    tokens         (X,) int64            neighbour ids, concatenated
    words          (S,) str              the source words, for display
    neighbours     (E,) str              the neighbour words, for display
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import zlib
from pathlib import Path

import numpy as np

from spanlm.data.tokenizer import encode_text
from spanlm.errors import InputError, require_file

TABLE_FILE = "similar_words.npz"
MAX_SOURCES = 100_000  # most frequent words that get neighbours (bounds the build on large corpora)
CANDIDATES_PER_WORD = 4  # nearest neighbours examined per kept one (many differ in token count)
CHUNK_TOKENS = 1 << 22  # corpus tokens hashed per step

# Fixed random odd multipliers, one per position in a word: word_hash = Σ (id_j + 1) · M_j (mod 2^64).
# A linear hash with random odd multipliers separates any two different id sequences of one length
# with probability 1 - 2^-64 per pair; lengths are checked beside it. Positions ≥ 64 share M_63.
_MULTIPLIERS = np.random.default_rng(0x5EED_5A17).integers(1, 2**63, size=64, dtype=np.uint64) * np.uint64(
    2
) + np.uint64(1)


def word_hash(tokens: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """int64 hash of every word; word i is ``tokens[starts[i]:][:lengths[i]]``.

    ``starts`` must tile ``tokens`` (each word begins where the previous one ends).
    """
    if len(starts) == 0:
        return np.zeros(0, dtype=np.int64)
    position = np.arange(len(tokens)) - np.repeat(starts, lengths)  # index of each token inside its word
    contribution = (np.asarray(tokens).astype(np.uint64) + np.uint64(1)) * _MULTIPLIERS[np.minimum(position, 63)]
    # uint64 arithmetic wraps (the sum is mod 2^64); the result is viewed as int64 because NumPy's
    # searchsorted is several times faster on signed integers. Tables are sorted in that order.
    return np.add.reduceat(contribution, starts).view(np.int64)


@dataclasses.dataclass
class WordTypes:
    """The distinct words (token-id sequences) of a prepared corpus, sorted by hash."""

    hashes: np.ndarray  # (T,) int64 word_hash, ascending
    counts: np.ndarray  # (T,) int64 occurrences
    first: np.ndarray  # (T,) int64 corpus position of the first occurrence
    lengths: np.ndarray  # (T,) int64 tokens

    def __len__(self) -> int:
        return len(self.hashes)

    def ids(self, corpus_ids: np.ndarray, i: int) -> list[int]:
        return np.asarray(corpus_ids[self.first[i] : self.first[i] + self.lengths[i]]).tolist()


def _word_chunks(word_starts: np.ndarray, sentence_offsets: np.ndarray):
    """Yield ``(begin, end, starts)``: corpus ranges that begin on a sentence (hence word) start."""
    n_tokens = int(sentence_offsets[-1])
    begin = 0
    while begin < n_tokens:
        end = int(
            sentence_offsets[min(np.searchsorted(sentence_offsets, begin + CHUNK_TOKENS), len(sentence_offsets) - 1)]
        )
        end = end if end > begin else n_tokens
        flags = np.asarray(word_starts[begin:end]).copy()
        flags[0] = True
        yield begin, end, np.flatnonzero(flags)
        begin = end


def count_word_types(ids: np.ndarray, word_starts: np.ndarray, sentence_offsets: np.ndarray) -> WordTypes:
    """Count every distinct word of the corpus, chunk by chunk (memory stays bounded)."""
    parts = []
    for begin, end, starts in _word_chunks(word_starts, sentence_offsets):
        lengths = np.diff(np.append(starts, end - begin))
        hashes = word_hash(np.asarray(ids[begin:end]), starts, lengths)
        unique, index, counts = np.unique(hashes, return_index=True, return_counts=True)
        parts.append((unique, counts, begin + starts[index], lengths[index]))
    if not parts:
        empty = np.zeros(0, dtype=np.int64)
        return WordTypes(empty, empty, empty, empty)
    hashes, counts, first, lengths = (np.concatenate(column) for column in zip(*parts))
    order = np.argsort(hashes, kind="stable")  # stable: the earliest chunk's occurrence comes first
    hashes, counts, first, lengths = hashes[order], counts[order], first[order], lengths[order]
    group = np.flatnonzero(np.append(True, hashes[1:] != hashes[:-1]))
    return WordTypes(hashes[group], np.add.reduceat(counts, group), first[group], lengths[group])


def decode_types(tokenizer, ids: np.ndarray, types: WordTypes, special_ids) -> tuple[list[str], list[str], np.ndarray]:
    """Surface form of every word type: ``(keys, prefixes, valid)``.

    ``key`` is the decoded word without whitespace (so a jieba word of several characters reads as one
    string), ``prefix`` the leading whitespace a byte-level BPE word carries (" word"), which its
    replacements must carry too. Types containing a special id ([UNK] …) are not ``valid``.
    """
    sequences = [types.ids(ids, i) for i in range(len(types))]
    texts = tokenizer.backend_tokenizer.decode_batch(sequences, skip_special_tokens=False)
    special = set(int(i) for i in special_ids)
    valid = np.fromiter((not special.intersection(s) for s in sequences), dtype=bool, count=len(sequences))
    keys = ["".join(text.split()) for text in texts]
    prefixes = [text[: len(text) - len(text.lstrip())] for text in texts]
    valid &= np.fromiter((bool(k) for k in keys), dtype=bool, count=len(keys))
    return keys, prefixes, valid


def _normalize(tokenizer, word: str) -> str:
    normalizer = tokenizer.backend_tokenizer.normalizer
    return "".join((normalizer.normalize_str(word) if normalizer else word).split())


def _stable_hash(text: str) -> int:
    """gensim seeds each word vector with hashfxn(word + seed); Python's hash() changes per process."""
    return zlib.crc32(text.encode("utf-8"))


def _import_gensim():
    try:
        import gensim  # noqa: F401
    except ImportError:
        raise InputError("data.similar_words needs gensim: pip install 'spanlm[gensim]'") from None
    import gensim

    return gensim


def nearest(
    sources: np.ndarray, candidates: np.ndarray, k: int, exclude: np.ndarray | None = None, chunk: int = 1024
) -> np.ndarray:
    """Indices of the ``k`` most cosine-similar ``candidates`` rows for every ``sources`` row, best first.

    ``exclude[i]`` (a candidate index or -1) is left out for source i (the word itself).
    """

    def unit(matrix):
        matrix = np.asarray(matrix, dtype=np.float32)
        return matrix / np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12)

    sources, candidates = unit(sources), unit(candidates)
    k = min(k, len(candidates) - 1 if exclude is not None else len(candidates))
    out = np.zeros((len(sources), max(k, 0)), dtype=np.int64)
    if k <= 0:
        return out
    for begin in range(0, len(sources), chunk):
        scores = sources[begin : begin + chunk] @ candidates.T  # (chunk, C)
        if exclude is not None:
            rows = np.flatnonzero(exclude[begin : begin + chunk] >= 0)
            scores[rows, exclude[begin : begin + chunk][rows]] = -np.inf
        top = np.argpartition(-scores, k - 1, axis=1)[:, :k]  # (chunk, k) unordered
        order = np.argsort(-np.take_along_axis(scores, top, axis=1), axis=1, kind="stable")
        out[begin : begin + chunk] = np.take_along_axis(top, order, axis=1)
    return out


def _word2vec_neighbours(
    directory: Path, types: WordTypes, key_of_type: np.ndarray, keys: list[str], config, m: int
) -> dict[int, list[str]]:
    """Train Word2Vec on the corpus (words as key ids) and return each frequent key's neighbours."""
    gensim = _import_gensim()
    ids = np.load(directory / "ids.npy", mmap_mode="r")
    word_starts = np.load(directory / "word_starts.npy", mmap_mode="r")
    sentence_offsets = np.load(directory / "sentence_offsets.npy", mmap_mode="r")
    # One line per sentence, each word written as the id of its key; gensim's corpus_file mode reads it
    # without holding the corpus in Python lists.
    handle, corpus_path = tempfile.mkstemp(prefix=".word2vec-", suffix=".txt", dir=directory)
    try:
        with os.fdopen(handle, "w", encoding="ascii") as out:
            for begin, end, starts in _word_chunks(word_starts, sentence_offsets):
                lengths = np.diff(np.append(starts, end - begin))
                hashes = word_hash(np.asarray(ids[begin:end]), starts, lengths)
                word_key = key_of_type[np.searchsorted(types.hashes, hashes)]  # (W,) -1 for invalid words
                chunk_sentences = (
                    np.asarray(
                        sentence_offsets[
                            np.searchsorted(sentence_offsets, begin) : np.searchsorted(
                                sentence_offsets, end, side="right"
                            )
                        ]
                    )
                    - begin
                )
                sentence_of_word = np.searchsorted(chunk_sentences, starts, side="right") - 1
                breaks = np.flatnonzero(np.diff(sentence_of_word)) + 1
                for sentence in np.split(word_key, breaks):  # one step per sentence, not per token
                    out.write(" ".join(map(str, sentence[sentence >= 0].tolist())) + "\n")
        model = gensim.models.Word2Vec(
            corpus_file=corpus_path,
            vector_size=100,
            window=5,
            min_count=config.similar_words_min_count,
            workers=config.processes(),
            epochs=5,
            seed=1,
            hashfxn=_stable_hash,
        )
    finally:
        os.unlink(corpus_path)
    vocab_keys = np.array([int(k) for k in model.wv.index_to_key], dtype=np.int64)  # model row -> key id
    if len(vocab_keys) < 2:
        return {}
    sources = np.arange(min(len(vocab_keys), MAX_SOURCES))  # gensim sorts its vocabulary by frequency
    top = nearest(model.wv.vectors[sources], model.wv.vectors, m, exclude=sources)
    return {int(vocab_keys[s]): [keys[vocab_keys[j]] for j in row] for s, row in zip(sources, top)}


def _vector_neighbours(path: Path, tokenizer, wanted: set[str], m: int) -> dict[str, list[str]]:
    """Neighbours of the corpus words found in a word2vec-format vector file."""
    gensim = _import_gensim()
    try:
        vectors = gensim.models.KeyedVectors.load_word2vec_format(
            str(path), binary=path.suffix == ".bin", limit=4 * MAX_SOURCES
        )
    except (OSError, ValueError, UnicodeDecodeError) as error:
        raise InputError(f"{path}: not a word2vec-format vector file: {error}") from None
    words = [_normalize(tokenizer, w) for w in vectors.index_to_key]
    first = {}
    for row, word in enumerate(words):  # a normalised spelling keeps its most frequent vector
        first.setdefault(word, row)
    rows = np.array(sorted(first.values()), dtype=np.int64)
    names = [words[r] for r in rows]
    sources = np.array([i for i, w in enumerate(names) if w in wanted], dtype=np.int64)
    if len(sources) == 0 or len(rows) < 2:
        return {}
    top = nearest(vectors.vectors[rows[sources]], vectors.vectors[rows], m, exclude=sources)
    return {names[s]: [names[j] for j in row] for s, row in zip(sources, top)}


def _synonym_neighbours(path: Path, tokenizer) -> dict[str, list[str]]:
    """``word<TAB>synonym…`` lines; repeated words add to their list in file order."""
    table: dict[str, list[str]] = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(f"{path}: cannot read the synonym file: {error}") from None
    for lineno, line in enumerate(lines, 1):
        if not line.strip() or line.startswith("#"):
            continue
        fields = [_normalize(tokenizer, f) for f in line.split("\t")]
        if len(fields) < 2 or not fields[0]:
            raise InputError(f"{path}:{lineno}: expected word<TAB>synonym[<TAB>synonym...]")
        table.setdefault(fields[0], []).extend(f for f in fields[1:] if f and f != fields[0])
    return table


def build_similar_words(directory: Path, tokenizer, config, log=print) -> dict:
    """Write ``similar_words.npz`` into the prepared ``directory``; returns a summary for meta.json."""
    if config.similar_words == "none":
        return {}
    directory = Path(directory)
    ids = np.load(directory / "ids.npy", mmap_mode="r")
    types = count_word_types(
        ids,
        np.load(directory / "word_starts.npy", mmap_mode="r"),
        np.load(directory / "sentence_offsets.npy", mmap_mode="r"),
    )
    keys, prefixes, valid = decode_types(tokenizer, ids, types, tokenizer.all_special_ids)
    key_index: dict[str, int] = {}
    key_of_type = np.array(
        [key_index.setdefault(k, len(key_index)) if v else -1 for k, v in zip(keys, valid)], dtype=np.int64
    )
    unique_keys = list(key_index)
    k = config.similar_words_k
    log(f"building the similar-word table ({config.similar_words}, {k} per word) over {len(types)} word types")

    # Candidate neighbour strings per source type, best first.
    frequent = valid & (types.counts >= config.similar_words_min_count)
    if config.similar_words == "word2vec":
        by_key = _word2vec_neighbours(directory, types, key_of_type, unique_keys, config, CANDIDATES_PER_WORD * k)
        neighbours_of = lambda t: by_key.get(int(key_of_type[t]), [])  # noqa: E731
    else:
        path = Path(config.similar_words_file)
        require_file(path, "data.similar_words_file")
        if config.similar_words == "synonyms":
            by_word = _synonym_neighbours(path, tokenizer)
        else:
            by_word = _vector_neighbours(
                path, tokenizer, {keys[t] for t in np.flatnonzero(frequent)}, CANDIDATES_PER_WORD * k
            )
        neighbours_of = lambda t: by_word.get(keys[t], [])  # noqa: E731
    sources = np.flatnonzero(frequent)
    sources = sources[np.argsort(-types.counts[sources], kind="stable")][:MAX_SOURCES]
    table = _assemble(tokenizer, ids, types, sources, keys, prefixes, neighbours_of, k)
    np.savez(directory / TABLE_FILE, **table)
    n_sources = int((np.diff(table["offsets"]) > 0).sum())
    log(f"similar words: {n_sources} of {len(sources)} frequent words have a same-length neighbour")
    return {
        "similar_words": {
            "source": config.similar_words,
            "k": k,
            "words": n_sources,
            "entries": len(table["token_offsets"]),
        }
    }


def _assemble(tokenizer, ids, types: WordTypes, sources: np.ndarray, keys, prefixes, neighbours_of, k: int) -> dict:
    """Tokenize the candidates and keep, per source, the first ``k`` usable same-length ones."""
    owner, texts, names = [], [], []
    for s in sources.tolist():  # one step per word type, at preparation time
        for name in neighbours_of(s):
            owner.append(s)
            names.append(name)
            texts.append(prefixes[s] + name)  # " word" -> " synonym" for byte-level BPE
    encodings = encode_text(tokenizer, texts)
    lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(encodings))  # (C,)
    tokens = np.fromiter((i for e in encodings for i in e.ids), dtype=np.int64, count=int(lengths.sum()))
    starts = np.cumsum(lengths) - lengths  # (C,) where each candidate's ids begin in `tokens`
    owner = np.asarray(owner, dtype=np.int64)  # (C,) source type; candidates of a source are consecutive

    special = np.zeros(len(tokenizer), dtype=bool)
    special[[i for i in tokenizer.all_special_ids if i < len(tokenizer)]] = True
    candidate_of_token = np.repeat(np.arange(len(owner)), lengths)
    has_special = np.bincount(candidate_of_token, weights=special[tokens], minlength=len(owner)) > 0
    usable = (lengths == types.lengths[owner]) & ~has_special
    # A word never becomes punctuation (nor punctuation a word): small corpora put quotes next to names.
    wordlike = lambda text: any(ch.isalnum() for ch in text)  # noqa: E731
    usable &= np.fromiter(
        (wordlike(n) == wordlike(keys[o]) for n, o in zip(names, owner.tolist())), dtype=bool, count=len(names)
    )
    # Not the word itself: a neighbour can normalise or tokenize back to the very same ids.
    hashes = np.zeros(len(owner), dtype=np.int64)
    nonempty = lengths > 0
    hashes[nonempty] = word_hash(tokens, starts[nonempty], lengths[nonempty])
    usable &= hashes != types.hashes[owner]

    # The first k usable candidates of every source, in rank order.
    group_begin = (
        np.flatnonzero(np.append(True, owner[1:] != owner[:-1])) if len(owner) else np.zeros(0, dtype=np.int64)
    )
    group = np.repeat(np.arange(len(group_begin)), np.diff(np.append(group_begin, len(owner))))
    usable_before = np.cumsum(usable) - usable  # usable candidates before each one, overall
    rank = usable_before - usable_before[group_begin][group]  # ... and within its source
    chosen = np.flatnonzero(usable & (rank < k))
    chosen = chosen[np.argsort(owner[chosen], kind="stable")]  # type index order = hash order
    table_sources, counts = np.unique(owner[chosen], return_counts=True)
    kept_lengths = lengths[chosen]
    kept_offsets = np.cumsum(kept_lengths) - kept_lengths
    kept_tokens = tokens[np.repeat(starts[chosen] - kept_offsets, kept_lengths) + np.arange(int(kept_lengths.sum()))]
    return {
        "hashes": types.hashes[table_sources],
        "lengths": types.lengths[table_sources],
        "offsets": np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
        "token_offsets": kept_offsets,
        "tokens": kept_tokens,
        "words": np.array([keys[s] for s in table_sources.tolist()], dtype=str),
        "neighbours": np.array([names[c] for c in chosen.tolist()], dtype=str),
    }


class SimilarWords:
    """The similar-word table of a prepared corpus, with vectorised look-up for the n-gram masker."""

    def __init__(self, hashes, lengths, offsets, token_offsets, tokens, words=None, neighbours=None):
        self.hashes = np.asarray(hashes, dtype=np.int64)
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.offsets = np.asarray(offsets, dtype=np.int64)
        self.token_offsets = np.asarray(token_offsets, dtype=np.int64)
        self.tokens = np.asarray(tokens, dtype=np.int64)
        self.words = words
        self.neighbours = neighbours

    @classmethod
    def load(cls, directory: str | Path) -> SimilarWords:
        path = Path(directory) / TABLE_FILE
        if not path.is_file():
            raise InputError(
                f"{directory}: no similar-word table; MacBERT masking needs one: prepare with "
                "data.similar_words=word2vec (or synonyms / vectors with data.similar_words_file)"
            )
        with np.load(path, allow_pickle=False) as data:
            return cls(**{name: data[name] for name in data.files})

    def __len__(self) -> int:
        return len(self.hashes)

    def lookup(self, hashes: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """Table row of every word (its hash and token count), -1 where it has no neighbour."""
        if len(self.hashes) == 0:
            return np.full(len(hashes), -1, dtype=np.int64)
        row = np.minimum(np.searchsorted(self.hashes, hashes), len(self.hashes) - 1)
        found = (
            (self.hashes[row] == hashes) & (self.lengths[row] == lengths) & (self.offsets[row + 1] > self.offsets[row])
        )
        return np.where(found, row, -1)

    def pick(self, row: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """A uniformly chosen neighbour entry of every table ``row`` (all ≥ 0)."""
        count = self.offsets[row + 1] - self.offsets[row]
        return self.offsets[row] + (rng.random(len(row)) * count).astype(np.int64)
