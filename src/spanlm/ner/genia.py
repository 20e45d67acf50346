"""GENIA 3.02 term corpus (GPML XML) → nested jsonlines in yhcc/CNN_Nested_NER's format: ``spanlm ner genia``.

The official archive (``GENIAcorpus3.02.tgz``, annotations CC BY 3.0, "Corpus annotations (c) GENIA
Project") holds ``GENIA_term_3.02/GENIAcorpus3.02.xml``: ``<article>``\\ s with a MEDLINE id in
``<articleinfo><bibliomisc>`` and ``<title>`` / ``<abstract>`` made of ``<sentence>``\\ s, whose untokenised
text carries nested ``<cons lex=".." sem="G#protein_molecule">`` term markup. This module turns it, with a
file of document ids (yhcc's ``splits/{train,dev,test}.txt``), into one JSON line per sentence::

    {"tokens": [...], "doc_id": "MEDLINE:..", "sent_id": "MEDLINE:..-0",
     "entity_mentions": [{"start", "end" (exclusive), "entity_type", "text"}]}

which is what :mod:`spanlm.ner.data` reads as ``nested_jsonl``. The rules are those of yhcc's
``preprocess/process_genia.py`` (itself after Muis & Lu 2017's GENIA script), restated here:

* **Types** (the Finkel & Manning 2009 collapse): a ``cons`` whose ``sem`` starts with ``G#DNA``,
  ``G#RNA`` or ``G#protein`` becomes DNA / RNA / protein (``G#DNA_domain_or_region`` → DNA, …);
  ``G#cell_line`` and ``G#cell_type`` stay; every other type is dropped.
* **Coordination**: a ``cons`` whose ``sem`` is a coordination, ``(AND G#.. G#..)`` / ``(OR ..)`` / ``(BUT_NOT
  ..)``, is dropped whole, and so are the discontinuous terms it stands for ("c-fos, c-jun and jun B
  proto-oncogenes"); its ``cons`` children without ``sem`` (the "c-fos*" fragments) are no terms either;
  children that carry a plain ``sem`` of their own are kept like any other.
* **Order**: mentions are listed inner before outer (a ``cons``'s children, then the ``cons``), in text
  order; a second mention with the same (start, end, type) is dropped.
* **Sentences**: every ``<sentence>`` of an article, title first; ``sent_id`` is ``doc_id-i`` with i the
  sentence's index in the article. One article, MEDLINE:97218353, is in the XML twice with different
  annotation; the later copy wins (yhcc's readme). Sentences come out in the order of the split file
  (yhcc's split files list the ids in archive order, so this is also yhcc's order).

**Tokens.** yhcc tokenised with the ``<w>`` tokens of the POS-tagged 3.02p release (PTB-like, split
further at every term boundary), which is not in the 3.02 archive. :func:`tokenize` approximates it:
whitespace, then PTB-style punctuation rules (brackets, quotes, trailing , ; : ? ! % and the
sentence-final period, 's, n't, can|not, -- ; : inside a word) that were checked against yhcc's dev and
test files, then a cut at every ``cons`` boundary inside a word ("PHA-activated" with the term "PHA" →
"PHA" "-activated", as in yhcc's files). It reproduces the tokens of almost every yhcc dev and test
sentence (a test keeps the share from falling). The rest are
3.02p quirks: tokens with a space inside ("protein - RNA"), "p50" "/p65" where 3.02p has
a term boundary that 3.02 lacks, "PDGF(B)" one token but "NF(P)" four, "23:00" split but
"04:00-08:00" not. Every sentence still has exactly yhcc's mentions (types and texts), and the mention
token offsets are yhcc's wherever the tokens are.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import tarfile
import xml.etree.ElementTree as ET
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from spanlm.errors import InputError, read_text, require_file

XML_NAME = "GENIAcorpus3.02.xml"
# yhcc's filter_annotations: re.match('G#(DNA|RNA|cell_line|cell_type|protein).*'), then everything
# from the first "_" on cut off, except for the two cell types.
_TYPE = re.compile(r"G#(DNA|RNA|protein|cell_line|cell_type)")


@dataclasses.dataclass(frozen=True)
class Term:
    """One ``<cons>``: characters [start, end) of its sentence's text, its ``sem`` ("" when absent)."""

    start: int
    end: int
    sem: str


@dataclasses.dataclass(frozen=True)
class Sentence:
    text: str
    terms: tuple[Term, ...]  # children before parents, in text order (post-order), as yhcc lists them


Corpus = Mapping[str, list[Sentence]]  # MEDLINE id → the article's sentences


@dataclasses.dataclass
class SplitSummary:
    sentences: int = 0
    entities: int = 0
    nested: int = 0  # mentions that contain, or sit inside, another mention with a different span


# ---------------------------------------------------------------------------------------------------
# Reading the archive


def read_genia(archive: str | Path) -> dict[str, list[Sentence]]:
    """Every article of the GENIA 3.02 archive (a .tgz, or the bare XML) as MEDLINE id → sentences."""
    archive = Path(archive)
    require_file(archive)
    if archive.suffix.lower() == ".xml":
        with open(archive, "rb") as handle:
            return _parse_xml(handle, str(archive))
    try:
        with tarfile.open(archive, "r:*") as tar:
            member = next((m for m in tar.getmembers() if m.isfile() and Path(m.name).name == XML_NAME), None)
            if member is None:
                raise InputError(
                    f"{archive}: no {XML_NAME} inside; not the GENIA 3.02 term archive (GENIAcorpus3.02.tgz)"
                )
            handle = tar.extractfile(member)
            assert handle is not None  # a regular file
            return _parse_xml(handle, f"{archive}:{member.name}")
    except (tarfile.TarError, EOFError, OSError) as error:  # gzip and truncation errors are OSError / EOFError
        raise InputError(f"{archive}: not a readable .tgz archive ({error})") from None


def _parse_xml(handle, where: str) -> dict[str, list[Sentence]]:
    try:
        root = ET.parse(handle).getroot()  # expat does not fetch the external gpml.dtd
    except ET.ParseError as error:
        raise InputError(f"{where}: not well-formed XML ({error})") from None
    articles: dict[str, list[Sentence]] = {}
    for number, article in enumerate(root.iter("article"), 1):
        medline = (article.findtext("articleinfo/bibliomisc") or "").strip()
        if not medline:
            raise InputError(f"{where}: article {number} has no <articleinfo><bibliomisc> MEDLINE id")
        # A repeated id replaces the earlier copy: MEDLINE:97218353 is in the XML twice, and yhcc kept
        # the later one (yhcc/CNN_Nested_NER preprocess/readme.md).
        articles[medline] = [_sentence(element) for element in article.iter("sentence")]
    if not articles:
        raise InputError(f"{where}: no <article> elements; not GENIA GPML")
    return articles


def _sentence(element: ET.Element) -> Sentence:
    parts: list[str] = []
    terms: list[Term] = []

    def walk(node: ET.Element, position: int) -> int:
        if node.text:
            parts.append(node.text)
            position += len(node.text)
        for child in node:
            start = position
            position = walk(child, position)
            if child.tag == "cons":  # appended after its children: inner mentions first
                terms.append(Term(start, position, child.get("sem", "")))
            if child.tail:
                parts.append(child.tail)
                position += len(child.tail)
        return position

    walk(element, 0)
    return Sentence("".join(parts), tuple(terms))


def read_split_ids(path: str | Path) -> list[str]:
    """The document ids of a split file, one per line (blank lines ignored)."""
    path = Path(path)
    lines = read_text(path).splitlines()
    ids, seen = [], {}
    for lineno, line in enumerate(lines, 1):
        doc_id = line.strip()
        if not doc_id:
            continue
        if doc_id in seen:
            raise InputError(f"{path}:{lineno}: document {doc_id} is listed twice (first on line {seen[doc_id]})")
        seen[doc_id] = lineno
        ids.append(doc_id)
    if not ids:
        raise InputError(f"{path}: no document ids")
    return ids


# ---------------------------------------------------------------------------------------------------
# Tokens


def tokenize(text: str, terms: Iterable[tuple[int, int]] = ()) -> list[tuple[int, int]]:
    """Character spans [start, end) of the tokens of ``text``, cut where a term (start, end) begins or ends."""
    term_spans = set(terms)
    boundaries = sorted({x for term in term_spans for x in term})
    spans: list[tuple[int, int]] = []
    words = list(re.finditer(r"\S+", text))
    previous = ""
    for index, word in enumerate(words):
        splitter = _WordSplitter(
            text, last=index == len(words) - 1, after_conjunction=previous in _CONJUNCTIONS, terms=term_spans
        )
        previous = word.group()
        for start, end in splitter.split(word.start(), word.end()):
            # A term boundary inside a token cuts it: 3.02p's tokens were split wherever a <cons>
            # began or ended inside a <w> ("PHA-activated" → "PHA" "-activated").
            cuts = boundaries[bisect_right(boundaries, start) : bisect_left(boundaries, end)]
            points = [start, *cuts, end]
            spans.extend(zip(points, points[1:]))
    return spans


_CONJUNCTIONS = {"and", "or", "nor", "but"}
# A radioactive label ("[3H]thymidine", "[125I]-labeled", "(3H)-E2") is one token with what it labels.
_ISOTOPE = re.compile(r"\[\d+[A-Z][a-z]?\]|\(\d+[A-Z][a-z]?\)(?=.)")
# "dexamethasone(dex)-resistant" → dexamethasone ( dex ) -resistant; "Ca(2+)-dependent" stays whole.
_INNER_ABBREVIATION = re.compile(r"(?<=[A-Za-z])\(([A-Za-z]+)\)(?=-)")
# "activation." in mid-sentence: a period after a plain lower-case word (not "al." "vs." "e.g.") ends a
# clause that GENIA did not split into a sentence of its own; 3.02p splits the period off.
_WORD_PERIOD = re.compile(r"[a-z]{4,}\.")


@dataclasses.dataclass
class _WordSplitter:
    """PTB-style punctuation rules for one whitespace-separated word, as in GENIA 3.02p's tokens.

    Each rule was checked on yhcc's dev and test tokens; the examples are from there.
    """

    text: str
    last: bool  # the sentence's last word: its final period is a token
    after_conjunction: bool  # "and -independent" keeps the hyphen; "IL-2 -and" does not
    terms: set[tuple[int, int]]  # term spans: "PDGF(B)" that is a whole term keeps its brackets

    def split(self, start: int, end: int) -> list[tuple[int, int]]:
        if self.last and end - start > 1 and self.text[end - 1] == ".":
            return self._split(start, end - 1, word_start=True) + [(end - 1, end)]
        return self._split(start, end, word_start=True)

    def _split(self, start: int, end: int, word_start: bool = False) -> list[tuple[int, int]]:
        if end - start <= 1:
            return [(start, end)] if end > start else []
        word = self.text[start:end]
        first, final = word[0], word[-1]
        # Leading brackets and quotes.
        if not _ISOTOPE.match(word):
            if first == "(":
                close = _matching_close(word)
                if close == -1:  # "(PIH," → ( PIH ,
                    return [(start, start + 1)] + self._split(start + 1, end)
                # "(PHA)" "(PHA)-induced" "(NF)-kappa" "(proto)oncogenes" → ( X ) rest
                return (
                    [(start, start + 1)]
                    + self._split(start + 1, start + close)
                    + [(start + close, start + close + 1)]
                    + self._split(start + close + 1, end)
                )
            if first in '[{"' or (first == "'" and word != "'s"):
                return [(start, start + 1)] + self._split(start + 1, end)
        if first == "-" and word_start and word[1].isalpha() and not self.after_conjunction:
            return [(start, start + 1)] + self._split(start + 1, end)  # "ER -tumors" → - tumors
        # Trailing punctuation.
        if final in ',;:?!"%' or (final == "'" and not word[-2].isdigit()):  # "5'" is a DNA end, not a quote
            return self._split(start, end - 1) + [(end - 1, end)]
        if final == "." and (word[-2] in ")]" or _WORD_PERIOD.fullmatch(word)):
            return self._split(start, end - 1) + [(end - 1, end)]
        if final in ")]":
            open_ = _matching_open(word)
            if open_ == -1:  # its opening bracket is in an earlier token: "cells)" → cells )
                return self._split(start, end - 1) + [(end - 1, end)]
            if final == ")" and open_ > 0 and (start, end) not in self.terms:
                # "protein(s)" "10(-9)" "NF(P)" → X ( Y ); a term "PDGF(B)" or "Ro(SSA)" stays one token
                return (
                    self._split(start, start + open_)
                    + [(start + open_, start + open_ + 1)]
                    + self._split(start + open_ + 1, end - 1)
                    + [(end - 1, end)]
                )
            return [(start, end)]  # "[3H]", "t(14;14)"-like wholes
        # Inside the word.
        if word.endswith("'s") and len(word) > 2:  # "Marek's" → Marek 's
            return [(start, end - 2), (end - 2, end)]
        if word.endswith("n't") and len(word) > 3:  # "didn't" → did n't
            return [(start, end - 3), (end - 3, end)]
        if word.lower() == "cannot":
            return [(start, start + 3), (start + 3, end)]
        inner = _INNER_ABBREVIATION.search(word)
        if inner:
            a, b = start + inner.start(), start + inner.end()
            return self._split(start, a) + [(a, a + 1), (a + 1, b - 1), (b - 1, b)] + self._split(b, end)
        # "--", and ";" ":" outside brackets, are tokens: "cells--did", "23:00", "12;259(5101):1523]"
        cuts = [
            m.span()
            for m in re.finditer(r"--|[;:]", word)
            if word[: m.start()].count("(") == word[: m.start()].count(")")
        ]
        if cuts:
            pieces, position = [], start
            for a, b in cuts:
                pieces += self._split(position, start + a) + [(start + a, start + b)]
                position = start + b
            return pieces + self._split(position, end)
        return [(start, end)]


def _matching_close(word: str) -> int:
    """Index of the ")" that closes the "(" at index 0, or -1."""
    depth = 0
    for i, char in enumerate(word):
        depth += (char == "(") - (char == ")")
        if depth == 0:
            return i
    return -1


def _matching_open(word: str) -> int:
    """Index of the bracket that opens the ")" or "]" at the end of ``word``, or -1."""
    close = word[-1]
    open_ = "(" if close == ")" else "["
    depth = 0
    for i in range(len(word) - 1, -1, -1):
        depth += (word[i] == close) - (word[i] == open_)
        if depth == 0:
            return i
    return -1


# ---------------------------------------------------------------------------------------------------
# Records


def sentence_record(doc_id: str, index: int, sentence: Sentence) -> dict:
    """The JSON line of one sentence, in yhcc's format (token ``end`` exclusive)."""
    spans = tokenize(sentence.text, [(term.start, term.end) for term in sentence.terms])
    tokens = [sentence.text[a:b] for a, b in spans]
    ends = [b for _, b in spans]
    mentions, seen = [], set()
    for term in sentence.terms:
        kind = _TYPE.match(term.sem)  # "(AND G#.. G#..)" and a missing sem do not match
        if kind is None:
            continue
        # The tokens inside the term's characters (term boundaries are token boundaries, see tokenize).
        first, stop = bisect_right(ends, term.start), bisect_right(ends, term.end)
        key = (first, stop, kind.group(1))
        if first >= stop or key in seen:
            continue
        seen.add(key)
        mentions.append(
            {"start": first, "end": stop, "entity_type": kind.group(1), "text": " ".join(tokens[first:stop])}
        )
    return {"tokens": tokens, "doc_id": doc_id, "sent_id": f"{doc_id}-{index}", "entity_mentions": mentions}


def convert_genia(archive: str | Path | Corpus, split_ids: str | Path) -> Iterator[dict]:
    """The sentence records of the documents listed in ``split_ids``, in that order.

    ``archive`` is the GENIA 3.02 .tgz (or its XML), or what :func:`read_genia` returned for it (to read
    the archive once for several splits). Bad input raises :class:`InputError` here, before any record.
    """
    ids = read_split_ids(split_ids)
    corpus = archive if isinstance(archive, Mapping) else read_genia(archive)
    missing = [doc_id for doc_id in ids if doc_id not in corpus]
    if missing:
        source = "the GENIA archive" if isinstance(archive, Mapping) else str(archive)
        raise InputError(f"{split_ids}: {len(missing)} document id(s) not in {source}, e.g. {', '.join(missing[:3])}")
    return (sentence_record(doc_id, index, sentence) for doc_id in ids for index, sentence in enumerate(corpus[doc_id]))


def nested_count(mentions: list[dict]) -> int:
    """How many mentions contain, or sit inside, a mention with another span (the count in SOURCES.md).

    yhcc's statistics.py also counts two mentions with the same span and different types as nested.
    """
    spans = [(m["start"], m["end"]) for m in mentions]
    return sum(
        any((a <= s and e <= b) or (s <= a and b <= e) for a, b in set(spans) if (a, b) != (s, e)) for s, e in spans
    )


def write_genia_split(archive: str | Path | Corpus, split_ids: str | Path, out_path: str | Path) -> SplitSummary:
    """Write the split's jsonlines to ``out_path`` atomically (a temporary file, then a rename)."""
    out_path = Path(out_path)
    summary = SplitSummary()
    records = convert_genia(archive, split_ids)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(f".{out_path.name}.tmp-{os.getpid()}")  # same directory: os.replace is atomic
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            for record in records:
                handle.write(json.dumps(record) + "\n")  # json.dumps' defaults, as yhcc wrote its files
                summary.sentences += 1
                summary.entities += len(record["entity_mentions"])
                summary.nested += nested_count(record["entity_mentions"])
        os.replace(tmp, out_path)
    finally:
        tmp.unlink(missing_ok=True)  # after an error; a no-op after the rename
    return summary
