"""`spanlm ner genia`: GENIA 3.02 XML (.tgz) + a split file → yhcc/CNN_Nested_NER's nested jsonlines."""

from __future__ import annotations

import collections
import io
import json
import tarfile
from pathlib import Path

import pytest

from helpers import external_data
from spanlm.cli import main
from spanlm.errors import InputError
from spanlm.ner.data import ReadOptions, read_documents
from spanlm.ner.genia import convert_genia, read_genia, tokenize, write_genia_split

GENIA = external_data("genia")

# Hand-written GPML in GENIA's shape (not corpus text): nested terms, a coordination whose fragments have
# no sem, a coordination with a child term of its own, types outside the five, an article listed twice.
XML = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE set SYSTEM "gpml.dtd">
<set>
<import resource="GENIAontology.daml" prefix="G"></import>
<article>
<articleinfo><bibliomisc>MEDLINE:1</bibliomisc></articleinfo>
<title>
<sentence><cons lex="IL-2_gene_expression" sem="G#other_name"><cons lex="IL-2_gene" sem="G#DNA_domain_or_region">IL-2 gene</cons> expression</cons> in <cons lex="PHA-activated_T_cell" sem="G#cell_type"><cons lex="PHA" sem="G#protein_molecule">PHA</cons>-activated T cells</cons>.</sentence>
</title>
<abstract>
<sentence>Both <cons lex="(AND c-fos_gene c-jun_gene)" sem="(AND G#DNA_domain_or_region G#DNA_domain_or_region)"><cons lex="c-fos*">c-fos</cons> and <cons lex="c-jun*">c-jun</cons> <cons lex="*gene">genes</cons></cons> need <cons lex="NF-kappa_B" sem="G#protein_molecule">NF-kappa B</cons> (<cons lex="calcium" sem="G#atom">calcium</cons>), in <cons lex="(AND B_cell T_cell)" sem="(AND G#cell_type G#cell_type)"><cons lex="B*">B</cons> and <cons lex="T_cell" sem="G#cell_type">T cells</cons></cons>.</sentence>
<sentence><cons lex="IL-2_mRNA" sem="G#RNA_molecule">IL-2 mRNA</cons> was not found in <cons lex="Jurkat_cell" sem="G#cell_line">Jurkat cells</cons>.</sentence>
</abstract>
</article>
<article>
<articleinfo><bibliomisc>MEDLINE:2</bibliomisc></articleinfo>
<title><sentence>An earlier copy of <cons lex="p50" sem="G#protein_molecule">p50</cons>.</sentence></title>
<abstract></abstract>
</article>
<article>
<articleinfo><bibliomisc>MEDLINE:3</bibliomisc></articleinfo>
<title><sentence>Not in the split.</sentence></title>
<abstract></abstract>
</article>
<article>
<articleinfo><bibliomisc>MEDLINE:2</bibliomisc></articleinfo>
<title><sentence>The later copy of <cons lex="p50_subunit" sem="G#protein_subunit">p50 subunits</cons> wins.</sentence></title>
<abstract></abstract>
</article>
</set>
"""

EXPECTED = [
    {
        "tokens": ["The", "later", "copy", "of", "p50", "subunits", "wins", "."],
        "doc_id": "MEDLINE:2",
        "sent_id": "MEDLINE:2-0",
        "entity_mentions": [{"start": 4, "end": 6, "entity_type": "protein", "text": "p50 subunits"}],
    },
    {
        "tokens": ["IL-2", "gene", "expression", "in", "PHA", "-activated", "T", "cells", "."],
        "doc_id": "MEDLINE:1",
        "sent_id": "MEDLINE:1-0",
        "entity_mentions": [
            {"start": 0, "end": 2, "entity_type": "DNA", "text": "IL-2 gene"},  # inner before outer
            {"start": 4, "end": 5, "entity_type": "protein", "text": "PHA"},
            {"start": 4, "end": 8, "entity_type": "cell_type", "text": "PHA -activated T cells"},
        ],
    },
    {
        "tokens": [
            "Both",
            "c-fos",
            "and",
            "c-jun",
            "genes",
            "need",
            "NF-kappa",
            "B",
            "(",
            "calcium",
            ")",
            ",",
            "in",
            "B",
            "and",
            "T",
            "cells",
            ".",
        ],
        "doc_id": "MEDLINE:1",
        "sent_id": "MEDLINE:1-1",
        "entity_mentions": [
            {"start": 6, "end": 8, "entity_type": "protein", "text": "NF-kappa B"},
            {"start": 15, "end": 17, "entity_type": "cell_type", "text": "T cells"},
        ],
    },
    {
        "tokens": ["IL-2", "mRNA", "was", "not", "found", "in", "Jurkat", "cells", "."],
        "doc_id": "MEDLINE:1",
        "sent_id": "MEDLINE:1-2",
        "entity_mentions": [
            {"start": 0, "end": 2, "entity_type": "RNA", "text": "IL-2 mRNA"},
            {"start": 6, "end": 8, "entity_type": "cell_line", "text": "Jurkat cells"},
        ],
    },
]


def make_archive(path: Path, xml: str = XML, name: str = "GENIA_term_3.02/GENIAcorpus3.02.xml") -> Path:
    data = xml.encode("utf-8")
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture
def genia(tmp_path) -> tuple[Path, Path]:
    """(archive, splits directory with dev.txt listing MEDLINE:2 then MEDLINE:1)."""
    splits = tmp_path / "splits"
    splits.mkdir()
    (splits / "dev.txt").write_text("MEDLINE:2\nMEDLINE:1\n\n")
    return make_archive(tmp_path / "GENIAcorpus3.02.tgz"), splits


def test_converts_the_archive(genia, tmp_path):
    archive, splits = genia
    assert list(convert_genia(archive, splits / "dev.txt")) == EXPECTED
    out = tmp_path / "out" / "dev.jsonlines"
    summary = write_genia_split(archive, splits / "dev.txt", out)
    assert out.read_text().splitlines() == [json.dumps(record) for record in EXPECTED]
    assert (summary.sentences, summary.entities, summary.nested) == (4, 8, 2)  # PHA inside the cell_type
    assert [p.name for p in out.parent.iterdir()] == ["dev.jsonlines"]  # no temporary file left behind
    # spanlm reads it back as nested_jsonl: the text is the tokens joined by spaces
    documents, report = read_documents(out, ReadOptions(format="nested_jsonl", on_bad_record="error"))
    assert report.records == 4 and not report.skipped
    assert [d.id for d in documents] == [r["sent_id"] for r in EXPECTED]
    assert sorted((e.label, documents[1].text[e.start : e.end]) for e in documents[1].entities) == [
        ("DNA", "IL-2 gene"),
        ("cell_type", "PHA -activated T cells"),
        ("protein", "PHA"),
    ]


@pytest.mark.parametrize(
    "text, terms, tokens",
    [
        ("PHA-activated cells.", [(0, 3)], ["PHA", "-activated", "cells", "."]),  # cut at a term boundary
        ("post-dexamethasone levels", [(5, 18)], ["post-", "dexamethasone", "levels"]),
        (
            "(PHA), (PHA)-induced (PIH, protein(s) and 10(-9)",
            [],
            [
                "(",
                "PHA",
                ")",
                ",",
                "(",
                "PHA",
                ")",
                "-induced",
                "(",
                "PIH",
                ",",
                "protein",
                "(",
                "s",
                ")",
                "and",
                "10",
                "(",
                "-9",
                ")",
            ],
        ),
        ("PDGF(B) mRNA", [(0, 7)], ["PDGF(B)", "mRNA"]),  # a whole term keeps its brackets
        (
            "dexamethasone(dex)-resistant Ca(2+)-dependent 1,25(OH)2D3",
            [],
            ["dexamethasone", "(", "dex", ")", "-resistant", "Ca(2+)-dependent", "1,25(OH)2D3"],
        ),
        (
            "Marek's disease cannot 5% \"pure\" 5' end",
            [],
            ["Marek", "'s", "disease", "can", "not", "5", "%", '"', "pure", '"', "5'", "end"],
        ),
        (
            "[3H]thymidine (3H)-E2 [3H] at 23:00; cells--did",
            [],
            ["[3H]thymidine", "(3H)-E2", "[3H]", "at", "23", ":", "00", ";", "cells", "--", "did"],
        ),
        (
            "IL-2 -and PRL-induced, and -independent",
            [],
            ["IL-2", "-", "and", "PRL-induced", ",", "and", "-independent"],
        ),
        (
            "et al. (1990) and i.e., in activation. Next (P < 0.01).",
            [],
            [
                "et",
                "al.",
                "(",
                "1990",
                ")",
                "and",
                "i.e.",
                ",",
                "in",
                "activation",
                ".",
                "Next",
                "(",
                "P",
                "<",
                "0.01",
                ")",
                ".",
            ],
        ),
    ],
)
def test_tokenize(text, terms, tokens):
    assert [text[a:b] for a, b in tokenize(text, terms)] == tokens


def test_bad_inputs_name_the_file(genia, tmp_path):
    archive, splits = genia
    not_tar = tmp_path / "notes.tgz"
    not_tar.write_text("hello")
    with pytest.raises(InputError, match=r"notes\.tgz: not a readable \.tgz"):
        read_genia(not_tar)
    other = make_archive(tmp_path / "other.tgz", name="README")
    with pytest.raises(InputError, match=r"other\.tgz: no GENIAcorpus3\.02\.xml inside"):
        read_genia(other)
    broken = make_archive(tmp_path / "broken.tgz", xml=XML[:-20])
    with pytest.raises(InputError, match=r"broken\.tgz:GENIA_term_3\.02/GENIAcorpus3\.02\.xml: not well-formed XML"):
        read_genia(broken)
    with pytest.raises(InputError, match=r"missing\.tgz: no such file"):
        read_genia(tmp_path / "missing.tgz")
    unknown = splits / "test.txt"
    unknown.write_text("MEDLINE:1\nMEDLINE:99\n")
    with pytest.raises(
        InputError, match=r"test\.txt: 1 document id\(s\) not in .*GENIAcorpus3\.02\.tgz, e\.g\. MEDLINE:99"
    ):
        convert_genia(archive, unknown)
    twice = splits / "twice.txt"
    twice.write_text("MEDLINE:1\nMEDLINE:1\n")
    with pytest.raises(InputError, match=r"twice\.txt:2: document MEDLINE:1 is listed twice"):
        convert_genia(archive, twice)
    out = tmp_path / "out" / "test.jsonlines"
    with pytest.raises(InputError):
        write_genia_split(archive, unknown, out)
    assert not out.exists() and not any(out.parent.glob(".*tmp*"))


def test_cli(genia, tmp_path, capsys):
    archive, splits = genia
    out = tmp_path / "data"
    assert main(["ner", "genia", str(archive), "--splits", str(splits), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {"dev": {"sentences": 4, "entities": 8, "nested": 2}}
    assert "wrote 4 sentences" in captured.err
    assert [json.loads(line) for line in (out / "dev.jsonlines").read_text().splitlines()] == EXPECTED

    assert main(["ner", "genia", str(archive), "--splits", str(tmp_path / "out"), "--out", str(out)]) == 2
    assert "no train.txt, dev.txt or test.txt" in capsys.readouterr().err
    assert main(["ner", "genia", str(splits / "dev.txt"), "--splits", str(splits), "--out", str(out)]) == 2
    assert "dev.txt: not a readable .tgz archive" in capsys.readouterr().err


# What the converter achieves on the real data (measured; see src/spanlm/ner/genia.py): the same
# sentences and ids in the same order, and in every sentence the same mentions (type and surface); the
# tokens, hence the mention indices, differ in a few sentences, each of which is byte-identical otherwise.
AGREEMENT = {
    "dev": (1765, 1745, 1751),
    "test": (1732, 1694, 1703),
}  # sentences, identical lines, identical mention sets


@pytest.mark.skipif(not (GENIA / "GENIAcorpus3.02.tgz").is_file(), reason="needs external/genia (data/README.md)")
@pytest.mark.slow
def test_reproduces_yhcc_dev_and_test(tmp_path):
    yhcc = GENIA / "yhcc_CNN_Nested_NER"
    corpus = read_genia(GENIA / "GENIAcorpus3.02.tgz")
    for split, (sentences, identical_lines, identical_sets) in AGREEMENT.items():
        out = tmp_path / f"{split}.jsonlines"
        write_genia_split(corpus, yhcc / "splits" / f"{split}.txt", out)
        mine, theirs = out.read_text().splitlines(), (yhcc / f"{split}.jsonlines").read_text().splitlines()
        assert len(mine) == len(theirs) == sentences
        same_lines = same_sets = 0
        for line, reference in zip(mine, theirs):
            a, b = json.loads(line), json.loads(reference)
            assert (a["doc_id"], a["sent_id"]) == (b["doc_id"], b["sent_id"])
            assert "".join(a["tokens"]).replace(" ", "") == "".join(b["tokens"]).replace(" ", "")  # same characters

            def surfaces(record):
                return collections.Counter(
                    (m["entity_type"], m["text"].replace(" ", "")) for m in record["entity_mentions"]
                )

            assert surfaces(a) == surfaces(b), a["sent_id"]
            same_lines += line == reference
            same_sets += {(m["start"], m["end"], m["entity_type"]) for m in a["entity_mentions"]} == {
                (m["start"], m["end"], m["entity_type"]) for m in b["entity_mentions"]
            }
            assert (line == reference) == (a["tokens"] == b["tokens"])  # the tokens are the only difference
        assert same_lines >= identical_lines and same_sets >= identical_sets, (split, same_lines, same_sets)
    # train: yhcc's published statistics (preprocess/readme.md: 15,038 sentences, 46,203 entities)
    summary = write_genia_split(corpus, yhcc / "splits" / "train.txt", tmp_path / "train.jsonlines")
    assert (summary.sentences, summary.entities) == (15038, 46203)
