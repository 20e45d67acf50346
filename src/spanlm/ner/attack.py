"""Character-level attacks on NER evaluation text: ``spanlm ner eval --noise RATE`` (CharBERT §5.3).

CharBERT (Ma et al. 2020, arXiv 2011.01513) reports robustness as F1 on a copy of the test set whose
words are misspelt by the attacks of Pruthi et al. (2019): **drop** a character, **add** one, **swap**
two adjacent ones, **keyboard** (replace a character by a neighbouring QWERTY key). The kinds and
indices follow spanlm's CharBERT noise (:mod:`spanlm.objectives.charbert.masker`, the authors' ``create_adv_word``)
so that the attack is the noise the model was pretrained against, plus the keyboard typo:

* a word of fewer than ``SHORT_WORD`` (4) characters gets **add** (a letter inserted before an index
  in [0, len-1], as the NLM noise does) or **keyboard** (at an index in [0, len-1]), 50/50;
* a longer word gets one of **drop**, **add**, **swap**, **keyboard** uniformly; drop, swap and
  keyboard act at an index in [1, len-2] (the NLM noise's range: the first character stays), swap
  exchanges (i, i+1) and only at an index whose two characters differ, so every attack changes the
  word. A word whose adjacent pairs are all equal ("aaaa") takes a keyboard typo instead.

**Which words.** Words are whitespace-separated tokens made only of ASCII letters, at least 2 long:
CharBERT and its attacks are English, the keyboard map is QWERTY, and punctuation, numbers, @user
handles and URLs are left alone. Text without spaces (Chinese) has no such words and is unchanged. Each
such word is attacked with probability ``rate`` (one coin per word, like the NLM noise's
``word_prob``), except a word that an entity boundary cuts (a span starting or ending inside it):
editing it could move a character across the boundary and there would be no exact gold span.

**Offsets.** Every edit stays inside its word, so a character position that is not inside an attacked
word moves by the total length change of the attacked words before it; entity starts and ends are
such positions, and ``attacked_text[start':end']`` is exactly the attacked surface of the entity
(one ``np.searchsorted`` over the words' ends). Entities keep their labels: a misspelt "Lndon" is
still the location.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

import numpy as np

from spanlm.errors import InputError
from spanlm.ner.data import Entity, NerDocument

DROP, ADD, SWAP, KEYBOARD = 0, 1, 2, 3
KINDS: tuple[str, ...] = ("drop", "add", "swap", "keyboard")
SHORT_WORD = 4  # as masking.noise.short_word: shorter words only get insertions (and keyboard typos)
ALPHABET = "abcdefghijklmnopqrstuvwxyz"  # inserted letters

# Keys next to each letter on a QWERTY keyboard (same row and the rows above and below), the keyboard
# typo of Pruthi et al. (2019).
_QWERTY_ROWS = ("qwertyuiop", "asdfghjkl", "zxcvbnm")
_ROW_SHIFT = (0.0, 0.25, 0.75)  # horizontal stagger of the rows, in keys


def _keyboard_neighbours() -> dict[str, str]:
    position = {
        ch: (row, col + _ROW_SHIFT[row]) for row, keys in enumerate(_QWERTY_ROWS) for col, ch in enumerate(keys)
    }
    return {
        ch: "".join(
            other for other, (r2, c2) in position.items() if other != ch and abs(r2 - r) <= 1 and abs(c2 - c) <= 1.0
        )
        for ch, (r, c) in position.items()
    }


NEIGHBOURS: dict[str, str] = _keyboard_neighbours()
_WORD = re.compile(r"\S+")
_ATTACKABLE = re.compile(r"[A-Za-z]{2,}")


@dataclasses.dataclass
class AttackedText:
    """One attacked text and what was done: word spans in the *original* text and the edit per word."""

    text: str
    word_start: np.ndarray  # (W,) int64 attacked words' original starts, ascending
    word_end: np.ndarray  # (W,) int64 original ends (exclusive)
    kind: np.ndarray  # (W,) int64 DROP / ADD / SWAP / KEYBOARD
    delta: np.ndarray  # (W,) int64 length change of each word (-1, +1 or 0)
    candidates: int  # words that could be attacked

    def moved(self, positions: np.ndarray) -> np.ndarray:
        """Where original ``positions`` (none strictly inside an attacked word) are in the attacked text."""
        shift = np.concatenate([[0], np.cumsum(self.delta)])  # (W+1,) change before the i-th word's end
        return positions + shift[np.searchsorted(self.word_end, positions, side="right")]


@dataclasses.dataclass
class AttackCounts:
    """Totals over a set of documents, written into ``ner eval``'s metrics JSON."""

    candidates: int = 0
    attacked: int = 0
    per_kind: dict[str, int] = dataclasses.field(default_factory=lambda: {k: 0 for k in KINDS})

    def add(self, result: AttackedText) -> None:
        self.candidates += result.candidates
        self.attacked += len(result.kind)
        for kind, count in zip(KINDS, np.bincount(result.kind, minlength=len(KINDS)).tolist()):
            self.per_kind[kind] += count

    def summary(self) -> dict:
        share = self.attacked / self.candidates if self.candidates else 0.0
        return {
            "candidate_words": self.candidates,
            "attacked_words": self.attacked,
            "attacked_share": share,
            **self.per_kind,
        }


def attack_text(text: str, rate: float, rng: np.random.Generator, protected: Sequence[int] = ()) -> AttackedText:
    """Misspell each ASCII word of ``text`` with probability ``rate``; words with a ``protected``
    position strictly inside them (entity boundaries) are left alone. Words are edited one by one (a
    string edit each, only the attacked ones); the draws and the offset map are vectorised."""
    if not 0.0 <= rate <= 1.0:
        raise InputError(f"noise rate {rate}: must be in [0, 1]")
    spans = [(m.start(), m.end()) for m in _WORD.finditer(text) if _ATTACKABLE.fullmatch(m.group())]
    bounds = np.asarray(spans, dtype=np.int64).reshape(-1, 2)  # (C, 2) candidate words
    cuts = np.unique(np.asarray(protected, dtype=np.int64))
    inside = np.searchsorted(cuts, bounds[:, 1], side="left") - np.searchsorted(cuts, bounds[:, 0], side="right")
    bounds = bounds[inside == 0]
    # One coin and one uniform draw per kind choice / index / letter for every candidate, so the
    # stream consumed does not depend on which words are hit (same seed, same draws per position).
    n = len(bounds)
    coin, kind_u, index_u, letter_u = (rng.random(n) for _ in range(4))
    chosen = np.flatnonzero(coin < rate)
    start, end = bounds[chosen, 0], bounds[chosen, 1]
    length = end - start
    short = length < SHORT_WORD
    kind = np.where(short, np.where(kind_u[chosen] < 0.5, ADD, KEYBOARD), (kind_u[chosen] * 4).astype(np.int64))
    words = [text[s:e] for s, e in zip(start.tolist(), end.tolist())]
    edited = [
        _edit(w, k, u, v)
        for w, k, u, v in zip(words, kind.tolist(), index_u[chosen].tolist(), letter_u[chosen].tolist())
    ]
    kind = np.asarray([k for k, _ in edited], dtype=np.int64)  # a swap of "aaaa" became a keyboard typo
    new_words = [w for _, w in edited]
    delta = np.asarray([len(w) for w in new_words], dtype=np.int64) - length
    # Rebuild: the untouched stretches between attacked words, then each attacked word.
    cut = np.stack([start, end], axis=1).reshape(-1).tolist()  # (2W,) s0, e0, s1, e1, …
    gaps = [text[a:b] for a, b in zip([0] + cut[1::2], cut[0::2] + [len(text)])]  # W+1 stretches
    pieces = [gaps[0]]
    for word, gap in zip(new_words, gaps[1:]):
        pieces += [word, gap]
    return AttackedText("".join(pieces), start, end, kind, delta, n)


def _edit(word: str, kind: int, index_u: float, letter_u: float) -> tuple[int, str]:
    """(kind actually applied, the misspelt word) for one word; ``index_u``, ``letter_u`` in [0, 1)."""
    n = len(word)
    if kind == ADD:  # before an index in [0, len-1], as masking.noise's insertion
        p = int(index_u * n)
        letter = ALPHABET[int(letter_u * len(ALPHABET))]
        return ADD, word[:p] + (letter.upper() if word[p].isupper() else letter) + word[p:]
    # Short words: keyboard anywhere; longer words: an inner index in [1, len-2].
    positions = np.arange(n) if n < SHORT_WORD else np.arange(1, n - 1)
    if kind == SWAP:
        positions = positions[[word[i] != word[i + 1] for i in positions.tolist()]]  # a change, always
        if len(positions) == 0:
            positions, kind = np.arange(1, n - 1), KEYBOARD
        else:
            i = int(positions[int(index_u * len(positions))])
            return SWAP, word[:i] + word[i + 1] + word[i] + word[i + 2 :]
    i = int(positions[int(index_u * len(positions))])
    if kind == DROP:
        return DROP, word[:i] + word[i + 1 :]
    keys = NEIGHBOURS[word[i].lower()]
    key = keys[int(letter_u * len(keys))]
    return KEYBOARD, word[:i] + (key.upper() if word[i].isupper() else key) + word[i + 1 :]


def attack(document: NerDocument, rate: float, rng: np.random.Generator) -> NerDocument:
    """``document`` with a ``rate`` share of its words misspelt and every entity moved onto its
    attacked surface (labels unchanged)."""
    return attack_with_counts(document, rate, rng)[0]


def attack_with_counts(
    document: NerDocument, rate: float, rng: np.random.Generator
) -> tuple[NerDocument, AttackedText]:
    """:func:`attack` and the record of its edits."""
    starts = np.fromiter((e.start for e in document.entities), dtype=np.int64, count=len(document.entities))
    ends = np.fromiter((e.end for e in document.entities), dtype=np.int64, count=len(document.entities))
    result = attack_text(document.text, rate, rng, protected=np.concatenate([starts, ends]))
    new_starts, new_ends = result.moved(starts).tolist(), result.moved(ends).tolist()
    entities = [Entity(s, e, entity.label) for s, e, entity in zip(new_starts, new_ends, document.entities)]
    return NerDocument(document.id, result.text, entities), result


def attack_documents(
    documents: Sequence[NerDocument], rate: float, seed: int
) -> tuple[list[NerDocument], AttackCounts]:
    """Attack every document in order from one generator seeded with ``seed``; totals of the edits."""
    rng = np.random.default_rng(seed)
    counts = AttackCounts()
    attacked = []
    for document in documents:  # one text per step: the edits inside a text are vectorised
        new, result = attack_with_counts(document, rate, rng)
        attacked.append(new)
        counts.add(result)
    return attacked, counts


def format_comparison(clean: dict, attacked: dict, rate: float) -> str:
    """Clean and attacked P/R/F1 per type and micro, side by side (percent), then one summary line."""
    rows = [(label, clean["per_type"][label], attacked["per_type"].get(label)) for label in clean["per_type"]]
    rows.append(("micro", clean["micro"], attacked["micro"]))
    width = max([len(str(label)) for label, _, _ in rows] + [5])
    header = f"{'type':<{width}}  {'P':>6}  {'R':>6}  {'F1':>6}  |  {'P*':>6}  {'R*':>6}  {'F1*':>6}  {'gold':>6}"
    lines = [f"clean | attacked (*, noise rate {rate:g})", header, "-" * len(header)]
    for index, (label, c, a) in enumerate(rows):
        if index == len(rows) - 1:
            lines.append("-" * len(header))
        a = a or {"precision": 0.0, "recall": 0.0, "f1": 0.0}
        lines.append(
            f"{str(label):<{width}}  {c['precision']:6.2f}  {c['recall']:6.2f}  {c['f1']:6.2f}  |  "
            f"{a['precision']:6.2f}  {a['recall']:6.2f}  {a['f1']:6.2f}  {c['n_gold']:6d}"
        )
    lines.append(f"clean F1 {clean['micro']['f1']:.2f} / attacked F1 {attacked['micro']['f1']:.2f}")
    return "\n".join(lines)
