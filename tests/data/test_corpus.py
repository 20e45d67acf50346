"""Reading raw corpora: units, documents, and every kind of bad input, named by file and line."""

import gzip
import json

import pytest

from helpers import make_recipe
from spanlm.data.corpus import CorpusReader, DataConfig, resolve_inputs, split_long_line
from spanlm.errors import InputError


def read(tmp_path, files, **data):
    recipe = make_recipe(tmp_path, files, data=data)
    reader = CorpusReader(resolve_inputs(recipe.data), recipe.data)
    return list(reader), reader.stats


def test_txt_lines_are_sentences_and_blank_lines_end_documents(tmp_path):
    units, _ = read(tmp_path, {"a.txt": "\ufeffone\r\ntwo\r\n\r\n\r\nthree\n", "b.txt": "four\n"})
    assert units == [(0, "one"), (0, "two"), (1, "three"), (2, "four")]


def test_jsonl_records_are_documents(tmp_path):
    lines = [json.dumps({"text": "a\nb"}), "", json.dumps({"text": "c", "id": 3})]
    units, _ = read(tmp_path, {"c.jsonl": "\n".join(lines)})
    assert units == [(0, "a"), (0, "b"), (1, "c")]


def test_gzip_and_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"body": ["x y", "z"]}), tmp_path / "in" / "d.parquet")
    recipe = make_recipe(tmp_path, {"g.txt.gz": gzip.compress(b"alpha\n\nbeta\n")}, data={"text_field": "body"})
    recipe.data.inputs.append(str(tmp_path / "in" / "d.parquet"))
    units = list(CorpusReader(resolve_inputs(recipe.data), recipe.data))
    assert units == [(0, "alpha"), (1, "beta"), (2, "x y"), (3, "z")]


def test_long_lines_are_split_at_whitespace_and_counted(tmp_path):
    line = " ".join(["word"] * 100)  # 499 characters
    units, stats = read(tmp_path, {"a.txt": line + "\nshort\n"}, max_line_chars=100)
    pieces = [text for _, text in units[:-1]]
    assert all(len(p) <= 100 for p in pieces) and " ".join(pieces) == line
    assert stats["lines_split"] == 1 and units[-1] == (0, "short")
    assert split_long_line("x" * 250, 100) == ["x" * 100, "x" * 100, "x" * 50]  # no whitespace: hard cut
    # any whitespace, not only a space: a tab-separated or ideographic-space line is cut between words
    assert split_long_line("alpha\tbravo\tcharlie\tdelta", 12) == ["alpha\tbravo", "charlie", "delta"]
    assert split_long_line("一二三四五\u3000六七八九十\u3000甲乙丙丁", 8) == ["一二三四五", "六七八九十", "甲乙丙丁"]


def test_invalid_utf8_names_file_and_line(tmp_path):
    with pytest.raises(InputError, match=r"bad\.txt:3: invalid UTF-8"):
        read(tmp_path, {"bad.txt": b"ok\nfine\nbro\xffken\nlast\n"})


def test_invalid_utf8_can_be_skipped_and_counted(tmp_path):
    units, stats = read(tmp_path, {"bad.txt": b"ok\nbro\xffken\nlast\n"}, on_bad_line="skip")
    assert [t for _, t in units] == ["ok", "last"] and stats["bad_lines_skipped"] == 1


def test_broken_json_and_missing_field(tmp_path):
    with pytest.raises(InputError, match=r"c\.jsonl:2: invalid JSON"):
        read(tmp_path, {"c.jsonl": '{"text": "a"}\n{"text": \n'})
    with pytest.raises(InputError, match=r"d\.jsonl:1: record has no string field 'text' \(has: body\)"):
        read(tmp_path, {"d.jsonl": '{"body": "a"}\n'})


@pytest.mark.parametrize(
    "files, fragment",
    [
        ({"empty.txt": ""}, "empty.txt: file is empty"),
        ({"bin.txt": b"abc\x00\x01\x02"}, "bin.txt: looks like a binary file"),
        ({"x.csv": "a,b\n"}, "x.csv: unsupported file type"),
        ({"empty.txt.gz": gzip.compress(b"")}, "empty.txt.gz: file is empty"),
    ],
)
def test_bad_files(tmp_path, files, fragment):
    with pytest.raises(InputError) as error:
        read(tmp_path, files)
    assert fragment in str(error.value)


def test_missing_inputs(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        resolve_inputs(DataConfig(inputs=[str(tmp_path / "nope.txt")]))
    with pytest.raises(InputError, match="no file matches"):
        resolve_inputs(DataConfig(inputs=[str(tmp_path / "*.txt")]))
    with pytest.raises(InputError, match="no input files"):
        resolve_inputs(DataConfig(inputs=[]))
    with pytest.raises(InputError, match="a directory, but not a dataset written by datasets' save_to_disk"):
        resolve_inputs(DataConfig(inputs=[str(tmp_path)]))


@pytest.mark.parametrize("lines", [10000, 100])  # cut off after, and within, the first 8 KiB checked up front
def test_truncated_gzip(tmp_path, lines):
    blob = gzip.compress(b"line\n" * lines)
    with pytest.raises(InputError, match="cut.txt.gz: cannot read"):
        read(tmp_path, {"cut.txt.gz": blob[: len(blob) // 2]})
