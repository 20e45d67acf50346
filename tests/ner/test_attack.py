"""Character attacks for `ner eval --noise`: exact entity offsets, rate, edit kinds, determinism, CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import write_wnut_recipe
from spanlm.cli import main
from spanlm.ner.attack import (
    ADD,
    DROP,
    KEYBOARD,
    KINDS,
    NEIGHBOURS,
    SWAP,
    attack,
    attack_documents,
    attack_text,
    attack_with_counts,
)
from spanlm.ner.data import Entity, NerDocument

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "ner"


def classify(old: str, new: str) -> int:
    """Which single edit turns ``old`` into ``new`` (independent of the implementation)."""
    if len(new) == len(old) - 1:
        assert any(old[:i] + old[i + 1 :] == new for i in range(len(old)))
        return DROP
    if len(new) == len(old) + 1:
        assert any(new[:i] + new[i + 1 :] == old for i in range(len(new)))
        return ADD
    diff = [i for i in range(len(old)) if old[i] != new[i]]
    if len(diff) == 2 and diff[1] == diff[0] + 1 and old[diff[0]] == new[diff[1]] and old[diff[1]] == new[diff[0]]:
        return SWAP
    (i,) = diff
    assert new[i].lower() in NEIGHBOURS[old[i].lower()] and new[i].isupper() == old[i].isupper()
    return KEYBOARD


def check(document: NerDocument, attacked: NerDocument) -> None:
    """Entities keep label and order, their new span holds their attacked surface, and the text
    outside attacked words is unchanged (same whitespace-separated tokens, edits only to ASCII words)."""
    assert [e.label for e in attacked.entities] == [e.label for e in document.entities]
    old_tokens, new_tokens = document.text.split(), attacked.text.split()
    assert len(old_tokens) == len(new_tokens)
    assert [m for m in document.text if m.isspace()] == [m for m in attacked.text if m.isspace()]
    for old, new in zip(old_tokens, new_tokens):
        if old != new:
            assert old.isascii() and old.isalpha() and len(old) >= 2
            classify(old, new)
    for old, new in zip(document.entities, attacked.entities):
        surface = attacked.text[new.start : new.end]
        # The entity's words, attacked or not, are the words at the same places in the new text.
        assert surface.split() == new_tokens[len(document.text[: old.start].split()) :][: len(surface.split())]
        assert len(surface.split()) == len(document.text[old.start : old.end].split())
        assert 0 <= new.start <= new.end <= len(attacked.text)


def test_hand_cases():
    text = "Holmes met Watson , Lestrade and Mycroft at Baker Street in London"
    entities = [
        Entity(0, 6, "person"),
        Entity(11, 17, "person"),
        Entity(20, 28, "person"),
        Entity(33, 40, "person"),
        Entity(44, 56, "location"),
        Entity(60, 66, "location"),
    ]
    document = NerDocument("d", text, entities)
    assert [text[e.start : e.end] for e in entities] == [
        "Holmes",
        "Watson",
        "Lestrade",
        "Mycroft",
        "Baker Street",
        "London",
    ]
    attacked = attack(document, 1.0, np.random.default_rng(0))
    check(document, attacked)
    assert all(a != b for a, b in zip(text.split(), attacked.text.split()) if a != ",")  # rate 1: every word changed
    # Entity at 0 and at the very end moved exactly.
    first, last = attacked.entities[0], attacked.entities[-1]
    assert first.start == 0 and attacked.text[first.start : first.end] == attacked.text.split()[0]
    assert last.end == len(attacked.text) and attacked.text[last.start : last.end] == attacked.text.split()[-1]


def test_adjacent_entities_and_punctuation():
    # Adjacent entities with no space between them ("New" + "York") and one ending before a comma:
    # those words are cut by a boundary and left alone; the others are attacked.
    text = "NewYork,Paris and Berlin."
    document = NerDocument("d", text, [Entity(0, 3, "a"), Entity(3, 7, "b"), Entity(8, 13, "c"), Entity(18, 24, "d")])
    attacked = attack(document, 1.0, np.random.default_rng(1))
    # "NewYork,Paris" and "Berlin." are not all-letter words; only "and" is attacked.
    assert (
        attacked.text.split()[0] == "NewYork,Paris"
        and attacked.text.split()[2] == "Berlin."
        and attacked.text.split()[1] != "and"
    )
    assert [attacked.text[e.start : e.end] for e in attacked.entities] == ["New", "York", "Paris", "Berlin"]

    text = "ab Alpha Beta cd"
    document = NerDocument("d", text, [Entity(3, 8, "x"), Entity(9, 13, "y"), Entity(3, 13, "z")])  # nested, adjacent
    for seed in range(20):
        attacked = attack(document, 1.0, np.random.default_rng(seed))
        check(document, attacked)
        words = attacked.text.split()
        assert [attacked.text[e.start : e.end] for e in attacked.entities] == [
            words[1],
            words[2],
            f"{words[1]} {words[2]}",
        ]

    # A boundary inside a word protects that word: "Londoners" with the entity "London".
    document = NerDocument("d", "Londoners love London", [Entity(0, 6, "loc"), Entity(15, 21, "loc")])
    attacked = attack(document, 1.0, np.random.default_rng(0))
    assert attacked.text.startswith("Londoners ") and attacked.text[:6] == "London"
    assert (
        attacked.text.split()[1] != "love"
        and attacked.text[attacked.entities[1].start : attacked.entities[1].end] == attacked.text.split()[2]
    )


words = st.one_of(
    st.text("abcdefghijklmnopqrstuvwxyzABCXYZ", min_size=1, max_size=9),
    st.sampled_from([",", ".", "@user", "2017", "ok!", "é", "北京", "#tag", "x"]),
)


@st.composite
def documents(draw):
    tokens = draw(st.lists(words, min_size=1, max_size=14))
    seps = draw(
        st.lists(st.sampled_from([" ", "  ", "\t", " \n "]), min_size=len(tokens) - 1, max_size=len(tokens) - 1)
    )
    text = tokens[0] + "".join(s + t for s, t in zip(seps, tokens[1:]))
    starts = np.cumsum([0] + [len(t) + len(s) for t, s in zip(tokens[:-1], seps)]).tolist()
    spans = draw(st.lists(st.tuples(st.integers(0, len(tokens) - 1), st.integers(1, 3)), max_size=5))
    entities = [
        Entity(starts[i], starts[min(i + k, len(tokens)) - 1] + len(tokens[min(i + k, len(tokens)) - 1]), f"t{k}")
        for i, k in spans
    ]
    return NerDocument("h", text, entities)


@settings(max_examples=150, deadline=None)
@given(documents(), st.floats(0, 1), st.integers(0, 2**31))
def test_offsets_survive_the_attack(document, rate, seed):
    attacked = attack(document, rate, np.random.default_rng(seed))
    check(document, attacked)


@settings(max_examples=60, deadline=None)
@given(documents(), st.integers(0, 2**31))
def test_rate_zero_is_identity(document, seed):
    assert attack(document, 0.0, np.random.default_rng(seed)) == document


def test_share_of_attacked_words_and_every_kind():
    rng = np.random.default_rng(7)
    vocabulary = ["a", "an", "the", "cat", "dog", "house", "running", "London", "Sherlock", "aaaa", "book", "ok"]
    text = " ".join(rng.choice(vocabulary, size=4000).tolist())
    for rate in (0.1, 0.3):
        result = attack_text(text, rate, np.random.default_rng(3))
        assert result.candidates == 4000 - text.split().count("a")  # one-letter words are never candidates
        share = len(result.kind) / result.candidates
        assert abs(share - rate) < 4 * np.sqrt(rate * (1 - rate) / result.candidates)  # within 4 sigma
    result = attack_text(text, 0.3, np.random.default_rng(3))
    counts = np.bincount(result.kind, minlength=4)
    assert (counts > 0).all()
    # Each recorded kind is what really happened to the word.
    new_words, old_words = result.text.split(), text.split()
    changed = [(o, n) for o, n in zip(old_words, new_words) if o != n]
    assert len(changed) == len(result.kind) and [classify(o, n) for o, n in changed] == result.kind.tolist()
    # Short words only get add or keyboard; swaps never leave a word unchanged ("aaaa" becomes a keyboard typo).
    assert {classify(o, n) for o, n in changed if len(o) < 4} <= {ADD, KEYBOARD}
    assert {classify(o, n) for o, n in changed if o == "aaaa"} <= {DROP, ADD, KEYBOARD}


def test_deterministic_given_the_seed():
    docs = [
        NerDocument(str(i), f"Holmes met Watson in London number {i} today", [Entity(0, 6, "person")])
        for i in range(30)
    ]
    a, counts_a = attack_documents(docs, 0.5, seed=11)
    b, counts_b = attack_documents(docs, 0.5, seed=11)
    c, _ = attack_documents(docs, 0.5, seed=12)
    assert a == b and counts_a == counts_b and a != c
    summary = counts_a.summary()
    assert (
        summary["attacked_words"] == sum(summary[k] for k in KINDS) and summary["candidate_words"] == 30 * 7
    )  # all 7 words


def test_rate_out_of_range():
    from spanlm.errors import InputError

    with pytest.raises(InputError, match="noise rate"):
        attack_text("a b", 1.5, np.random.default_rng(0))
    doc = NerDocument("0", "hello world", [])
    assert attack_with_counts(doc, 0.0, np.random.default_rng(0))[1].candidates == 2


@pytest.fixture(scope="module")
def tiny_model(tiny_encoder_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("ner_attack") / "run"
    recipe = write_wnut_recipe(tiny_encoder_dir, out, steps=3)
    assert main(["ner", "train", str(recipe)]) == 0
    return out / "model"


def test_cli_eval_noise(tiny_model, capsys, tmp_path):
    metrics = tmp_path / "m.json"
    data = str(FIXTURES / "wnut_dev_mini.conll")
    capsys.readouterr()
    assert (
        main(
            [
                "ner",
                "eval",
                str(tiny_model),
                "--data",
                data,
                "--output",
                str(metrics),
                "--noise",
                "0.3",
                "--noise-seed",
                "5",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    scores = json.loads(metrics.read_text())
    clean, attacked = scores["micro"], scores["attacked"]["micro"]
    assert f"clean F1 {clean['f1']:.2f} / attacked F1 {attacked['f1']:.2f}" in out
    assert "F1*" in out and "person" in out
    assert scores["attacked"]["noise"] == 0.3 and scores["attacked"]["noise_seed"] == 5
    assert attacked["n_gold"] == clean["n_gold"] == 39 and scores["attacked"]["attacked_words"] > 0
    # Without --noise: the plain table and no attacked section.
    assert main(["ner", "eval", str(tiny_model), "--data", data, "--output", str(metrics)]) == 0
    assert "attacked" not in capsys.readouterr().out and "attacked" not in json.loads(metrics.read_text())
    with pytest.raises(SystemExit) as error:
        main(["ner", "eval", str(tiny_model), "--data", data, "--noise", "2"])
    assert error.value.code == 2 and "argument --noise: 2 must be in [0, 1]" in capsys.readouterr().err
