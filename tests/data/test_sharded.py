"""Sharded corpora: `spanlm prepare --shard i/n` per part of the inputs, read back as one corpus."""

import json

import numpy as np
import pytest

from helpers import EMBEDDED_CORPUS
from spanlm.cli import main
from spanlm.config import from_dict
from spanlm.data.blocks import BlockDataset
from spanlm.data.prepare import prepare
from spanlm.data.shards import PreparedCorpus, ShardedCorpus, resolve_shards, shard_directory
from spanlm.errors import InputError
from spanlm.pretrain.recipe import Recipe

QUIET = {"log": lambda *_: None}
BOOKS = [str(p) for p in sorted(EMBEDDED_CORPUS.glob("*.txt")) if "hongloumeng" not in p.name]


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """The English books prepared whole, and in two shards through the CLI with the whole one's tokenizer."""
    root = tmp_path_factory.mktemp("sharded")
    whole = prepare(
        from_dict(
            Recipe,
            {
                "data": {"inputs": BOOKS, "prepared_dir": str(root / "whole"), "max_len": 64},
                "tokenizer": {"vocab_size": 600},
            },
        ),
        **QUIET,
    )
    recipe = root / "recipe.yaml"
    recipe.write_text(
        json.dumps(
            {
                "data": {"inputs": BOOKS, "prepared_dir": str(root / "shards"), "max_len": 64},
                "tokenizer": {"path": str(whole / "tokenizer")},
            }
        )
    )
    for index in range(2):
        assert main(["prepare", str(recipe), "--shard", f"{index}/2"]) == 0
    return root, whole


def test_shards_split_the_inputs_in_order_and_read_back_as_the_whole_corpus(sharded):
    root, whole = sharded
    directories = resolve_shards([str(root / "shards" / "shard-*")])
    assert directories == [shard_directory(root / "shards", i, 2) for i in range(2)]
    assert [PreparedCorpus(d).meta["inputs"] for d in directories] == [BOOKS[:1], BOOKS[1:]]
    corpus, reference = ShardedCorpus(directories), PreparedCorpus(whole)
    assert corpus.meta["n_tokens"] == reference.meta["n_tokens"] and corpus.n_documents == reference.n_documents
    assert np.array_equal(corpus.token_counts, reference.token_counts)
    blocks, reference_blocks = BlockDataset(corpus, 64), BlockDataset(reference, 64)
    assert len(blocks) == len(reference_blocks)
    assert np.array_equal(np.asarray(blocks.index), np.asarray(reference_blocks.index))
    for i in range(len(blocks)):  # every block: the same tokens and word starts, across the shard edge too
        block, expected = blocks[i], reference_blocks[i]
        assert np.array_equal(block.ids, expected.ids) and np.array_equal(block.word_starts, expected.word_starts)
        assert tuple(blocks.index[i]) == tuple(reference_blocks.index[i])
    assert corpus.tokenizer.get_vocab() == reference.tokenizer.get_vocab()


def test_a_missing_shard_is_named(sharded):
    root, _ = sharded
    with pytest.raises(InputError, match=r"shard-00001-of-00002: shard 1/2 is missing .*--shard 1/2"):
        resolve_shards([str(root / "shards" / "shard-00000-of-00002")])
    with pytest.raises(InputError, match="no prepared directory matches"):
        resolve_shards([str(root / "nothing-*")])


def test_a_shard_prepared_with_another_tokenizer_is_refused(sharded, tmp_path):
    root, _ = sharded
    other = prepare(
        from_dict(
            Recipe,
            {"data": {"inputs": BOOKS[:1], "prepared_dir": str(tmp_path / "other")}, "tokenizer": {"vocab_size": 400}},
        ),
        **QUIET,
    )
    with pytest.raises(
        InputError, match=rf"{other}: prepared with tokenizer \w+, but .*shard-00000-of-00002 with tokenizer"
    ):
        ShardedCorpus([shard_directory(root / "shards", 0, 2), other])


@pytest.mark.parametrize(
    "shard, tokenizer, fragment",
    [
        ("1/2", False, "--shard 1/2: the shards of one corpus must share one tokenizer: set tokenizer.path"),
        ("2/2", True, "--shard 2/2: expected I/N with 0 <= I < N"),
        ("a/b", True, "--shard a/b: expected I/N"),
        ("0/4", True, "--shard 0/4: 3 input(s) leave shard 0 without any"),
    ],
)
def test_bad_shard_arguments_are_one_line_errors(sharded, tmp_path, capsys, shard, tokenizer, fragment):
    root, whole = sharded
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        json.dumps(
            {
                "data": {"inputs": BOOKS, "prepared_dir": str(tmp_path / "out")},
                "tokenizer": {"path": str(whole / "tokenizer")} if tokenizer else {},
            }
        )
    )
    assert main(["prepare", str(recipe), "--shard", shard]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("spanlm prepare: error:") and fragment in err[0]
    assert not (tmp_path / "out").exists()


def test_the_documented_job_array_commands(tmp_path, monkeypatch):
    import gzip
    import shlex

    from helpers import REPO, doc_section
    from spanlm.pretrain.recipe import load_recipe

    lines = (
        "\n".join(doc_section("docs/prepare.md", "Corpora in shards (a job array)", "bash"))
        .replace("\\\n", " ")
        .splitlines()
    )
    commands = [shlex.split(line) for line in lines if line.startswith("spanlm ")]
    assert [command[1] for command in commands] == ["prepare", "prepare", "pretrain"]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").symlink_to(REPO / "configs")
    (tmp_path / "corpus").mkdir()
    for number, book in enumerate(BOOKS):
        with gzip.open(tmp_path / "corpus" / f"part-{number:04d}.txt.gz", "wt", encoding="utf-8") as handle:
            handle.write((EMBEDDED_CORPUS / book).read_text(encoding="utf-8")[:20_000])
    sample, job, run = commands
    assert main(sample[1:] + ["tokenizer.vocab_size=500"]) == 0
    shard = job.index("--shard")
    assert job[shard + 1] == "$SLURM_ARRAY_TASK_ID/64"
    for task in range(3):  # the array, with 3 shards here: one per file
        assert main(job[1 : shard + 1] + [f"{task}/3"] + job[shard + 2 :]) == 0
    recipe = load_recipe(run[2], run[3:])
    corpus = ShardedCorpus(resolve_shards(recipe.data.prepared_shards))
    assert [len(PreparedCorpus(d).meta["inputs"]) for d in corpus.meta["shards"]] == [1, 1, 1]
    assert corpus.n_documents == 3 and len(BlockDataset(corpus, recipe.data.max_len)) > 0


def test_a_damaged_shard_is_named(sharded, tmp_path):
    import shutil

    root, _ = sharded
    copies = [
        shutil.copytree(shard_directory(root / "shards", i, 2), shard_directory(tmp_path, i, 2)) for i in range(2)
    ]
    with open(copies[1] / "ids.npy", "r+b") as handle:  # cut short, as by a full disk or a failed copy
        handle.truncate(handle.seek(0, 2) // 2)
    with pytest.raises(InputError, match=r"shard-00001-of-00002/ids\.npy: unreadable"):
        ShardedCorpus(copies)
    corpus = PreparedCorpus(copies[0])
    index = next(copies[0].glob("block_index-*.npy"))
    np.save(index, np.zeros((3, 2), dtype=np.int64))  # another corpus's index, say
    with pytest.raises(InputError, match=rf"{index.name}: not the block index of this corpus"):
        BlockDataset(corpus, int(index.stem.split("-")[1]))
