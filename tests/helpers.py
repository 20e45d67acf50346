"""Test helpers (importable as `helpers`: tests/ is on pytest's pythonpath)."""

from __future__ import annotations

import contextlib
import json
import math
import os
from pathlib import Path

from spanlm.config import from_dict
from spanlm.pretrain.recipe import Recipe

REPO = Path(__file__).resolve().parents[1]
EMBEDDED_CORPUS = REPO / "data" / "corpus"
# The embedded English texts (the `embedded_prepared` fixture's inputs)
EMBEDDED_INPUTS = [str(p) for p in sorted(EMBEDDED_CORPUS.glob("*.txt")) if "hongloumeng" not in p.name]
EMBEDDED_MAX_LEN = 32
# A tiny encoder without dropout, for a recipe of configs/pretrain/
TINY_ENCODER = [
    "model.hidden_size=32",
    "model.num_heads=2",
    "model.intermediate_size=64",
    "model.num_layers=2",
    f"model.max_position_embeddings={EMBEDDED_MAX_LEN}",
    "model.hidden_dropout=0.0",
    "model.attention_dropout=0.0",
]


# Appended to a command of the docs or a recipe of configs/: a one-layer encoder, two steps, no evaluation
TINY_RUN = [
    "model.hidden_size=32",
    "model.num_layers=1",
    "model.num_heads=2",
    "model.intermediate_size=64",
    "tokenizer.vocab_size=2000",
    "train.max_steps=2",
    "train.eval_every=0",
    "train.num_workers=0",
    "logging.progress=false",
]
# What the guides' `spanlm ner train` commands get appended in the tests: two steps on short windows.
TINY_NER_TRAIN = [
    "data.max_len=32",
    "data.stride=8",
    "ner.head.head_size=16",
    "train.max_steps=2",
    "train.batch_size=8",
    "train.eval_every=0",
    "train.save_every=2",
    "train.num_workers=0",
    "logging.progress=false",
    "logging.report_to=[]",
]


def copy_of(directory: Path, into: Path) -> Path:
    """``directory`` copied to ``into`` (links kept as links), for a test that writes where a shared fixture is."""
    import shutil

    shutil.copytree(directory, into, symlinks=True)
    return into


def kept_venv(name: str, answers: str, build) -> Path:
    """The python of a virtual environment the tests keep in the user's cache (``~/.cache/spanlm-tests/NAME``):
    built once per machine by ``build(venv)`` (which creates it and installs into it; pip's install is most of
    a test's time), built again when its python cannot run ``answers``. Tests only read with it."""
    import shutil
    import subprocess

    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "spanlm-tests"
    venv = cache / name
    python, ready = venv / "bin" / "python", venv / "ready"
    if (
        ready.is_file()
        and subprocess.run([str(python), "-c", answers], capture_output=True, timeout=120).returncode == 0
    ):
        return python
    shutil.rmtree(venv, ignore_errors=True)
    build(venv)
    ready.touch()
    return python


def external_data(name: str) -> Path:
    """A dataset the repository does not ship, from ``external/`` (data/README.md); the project's developers
    keep one copy beside their checkouts (``../shared/data``), used when ``external/`` lacks it."""
    local = REPO / "external" / name
    return local if local.exists() else REPO.parent / "shared" / "data" / name


def measured(value) -> bool:
    """A measured figure (a timing, a rate, a ratio or an MFU) as a bench script prints it: computed and
    well-formed, a finite number >= 0. Never more: on a busy machine a timing may round to 0.0, and a test
    must not depend on how fast it ran."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


NER_FIXTURES = REPO / "tests" / "fixtures" / "ner"

ENGLISH = (
    "The unbelievable backhanded compliment surprised everyone at the Bohemian embassy.\n"
    "Holmes examined the extraordinarily intricate mechanism without saying a word.\n"
    "\n"
    "Watson wrote everything down, although the handwriting was nearly unreadable.\n"
    "Dr. Frankenstein's laboratory smelled of ozone and impossibility.\n"
    "It's 3.14159 o'clock — naïve café owners don't care!\n"
)


def write_wnut_recipe(encoder_dir: Path, out: Path, steps: int) -> Path:
    """A `ner train` recipe of ``steps`` steps on the WNUT-17 fixtures into ``out``; written beside it."""
    recipe = out.parent / "recipe.yaml"
    recipe.write_text(
        f"""
model: {{path: {encoder_dir}}}
data:
  train: {NER_FIXTURES / "wnut_train_mini.conll"}
  dev: {NER_FIXTURES / "wnut_dev_mini.conll"}
  format: conll
  max_len: 32
  stride: 8
ner: {{head: {{head_size: 16}}}}
train: {{output_dir: {out}, max_steps: {steps}, batch_size: 8, lr: 0.001, warmup_steps: 0, eval_every: 3,
         save_every: {steps}, log_every: 3, num_workers: 0, device: cpu}}
logging: {{report_to: [], progress: false}}
""",
        encoding="utf-8",
    )
    return recipe


def make_recipe(tmp_path: Path, files: dict[str, str | bytes], **sections) -> Recipe:
    """Write ``files`` into ``tmp_path/in`` and return a recipe preparing them into ``tmp_path/prepared``."""
    inputs = []
    for name, content in files.items():
        path = tmp_path / "in" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
        inputs.append(str(path))
    data = {"inputs": inputs, "prepared_dir": str(tmp_path / "prepared"), **sections.pop("data", {})}
    tokenizer = {"vocab_size": 300, "min_frequency": 1, **sections.pop("tokenizer", {})}
    return from_dict(Recipe, {"data": data, "tokenizer": tokenizer, **sections})


def embedded_recipe(name: str, prepared: Path, output_dir: Path, *overrides: str, tiny: bool = True) -> Recipe:
    """configs/pretrain/NAME.yaml on the embedded corpus as ``prepared`` holds it (the same inputs and tokenizer,
    so nothing is prepared again): four steps of four blocks, a tiny encoder unless ``tiny`` is false."""
    from spanlm.pretrain.recipe import load_recipe

    return load_recipe(
        REPO / "configs" / "pretrain" / f"{name}.yaml",
        [
            f"data.inputs={json.dumps(EMBEDDED_INPUTS)}",
            f"data.prepared_dir={prepared}",
            f"data.max_len={EMBEDDED_MAX_LEN}",
            "tokenizer.vocab_size=2000",
            *(TINY_ENCODER if tiny else []),
            f"train.output_dir={output_dir}",
            "train.max_steps=4",
            "train.batch_size=4",
            "train.num_workers=0",
            "train.eval_blocks=4",
            "train.log_every=100",
            "train.warmup_steps=1",
            "logging.report_to=[]",
            "logging.progress=false",
            *overrides,
        ],
    )


def doc_section(page: str, title: str, language: str = "python") -> list[str]:
    """The ``language`` code blocks under the heading ``title`` of the Markdown file ``page`` (relative to the
    repository: ``README.md``, ``docs/pretrain.md``), up to the next heading of its level or above."""
    import re

    lines = (REPO / page).read_text(encoding="utf-8").splitlines(keepends=True)
    heading = next((i for i, line in enumerate(lines) if re.fullmatch(rf"#+ {re.escape(title)}\n", line)), None)
    if heading is None:
        raise AssertionError(f"{page} has no heading '{title}'")
    level = len(lines[heading]) - len(lines[heading].lstrip("#"))
    body, fenced = [], False
    for line in lines[heading + 1 :]:
        fenced ^= line.startswith("```")
        if not fenced and re.match(rf"#{{1,{level}}} ", line):
            break
        body.append(line)
    return re.findall(rf"```{language}\n(.*?)```", "".join(body), flags=re.S)


# The ClassLabel names of the Hub's wnut_17 ner_tags, in its order.
WNUT_TAGS = [
    "O",
    "B-corporation",
    "I-corporation",
    "B-creative-work",
    "I-creative-work",
    "B-group",
    "I-group",
    "B-location",
    "I-location",
    "B-person",
    "I-person",
    "B-product",
    "I-product",
]


def conll_dataset(path: Path, tag_names: list[str]):
    """A ``token<TAB>tag`` CoNLL file as a `datasets.Dataset` in the Hub's conll2003 / wnut_17 layout: ``id``,
    ``tokens``, integer ``ner_tags`` with ClassLabel names; one row per sentence (blank, whitespace-only or
    -DOCSTART- lines end one)."""
    import datasets

    rows: dict[str, list] = {"id": [], "tokens": [], "ner_tags": []}
    tokens: list[str] = []
    tags: list[str] = []
    for line in [*path.read_text(encoding="utf-8").splitlines(), ""]:
        columns = line.split()
        if columns and columns[0] != "-DOCSTART-":
            tokens.append(columns[0])
            tags.append(columns[-1])
        elif tokens:
            rows["id"].append(str(len(rows["id"])))
            rows["tokens"].append(tokens)
            rows["ner_tags"].append([tag_names.index(tag) for tag in tags])
            tokens, tags = [], []
    features = datasets.Features(
        {
            "id": datasets.Value("string"),
            "tokens": datasets.List(datasets.Value("string")),
            "ner_tags": datasets.List(datasets.ClassLabel(names=tag_names)),
        }
    )
    return datasets.Dataset.from_dict(rows, features=features)


def cache_like_the_hub(root: Path, name: str, splits: dict, config: str | None = None) -> Path:
    """Put dataset ``name`` into the `datasets` cache as an online ``load_dataset(name[, config])`` leaves it.

    The splits (`datasets.Dataset`s) are written as a local dataset repository in the Hub's layout —
    ``root/<dataset>/data/<split>-00000-of-00001.parquet``, or ``root/<dataset>/<config>/…`` with a README
    naming the configuration — and loaded once from there (parquet keeps the features, ClassLabel names
    included, as on the Hub). A Hub load of ``namespace/dataset`` is cached under ``namespace___dataset``
    (datasets' ``DatasetBuilder._relative_data_dir``); a local repository has no namespace, so its cache
    entry is moved there. Returns the repository directory.
    """
    import datasets

    namespace, _, dataset_name = name.rpartition("/")
    repo = root / dataset_name
    folder = config or "data"
    (repo / folder).mkdir(parents=True, exist_ok=True)
    for split, dataset in splits.items():
        dataset.to_parquet(str(repo / folder / f"{split}-00000-of-00001.parquet"))
    if config:
        files = "".join(f"  - split: {split}\n    path: {config}/{split}-*\n" for split in splits)
        (repo / "README.md").write_text(
            f"---\nconfigs:\n- config_name: {config}\n  data_files:\n{files}---\n", encoding="utf-8"
        )
    datasets.load_dataset(str(repo), config)
    if namespace:
        cache = Path(datasets.config.HF_DATASETS_CACHE)
        (cache / dataset_name).rename(cache / f"{namespace}___{dataset_name}")
    return repo


def splitmix64_words(seed: int, count: int):
    """The first ``count`` outputs of SplitMix64 from ``seed`` (Steele, Lea & Flood 2014) as a uint64 array:
    output j is mix(seed + (j + 1)·γ mod 2⁶⁴), the reference spanlm's dropout kernel and ELECTRA's Gumbel
    noise are checked against. NumPy's uint64 arithmetic wraps modulo 2⁶⁴ as the C code's does."""
    import numpy as np

    z = np.uint64(seed) + np.arange(1, count + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def dropout_multiplier(shape, key: int, threshold: int, kept: float = 1.0):
    """Dropout's float32 multiplier for the stream (key, threshold, kept): element i (row-major) is kept when
    the i-th 16-bit quarter of the SplitMix64 words, read as int16, is at least ``threshold``."""
    import math

    import numpy as np
    import torch

    n = math.prod(shape)
    quarters = torch.from_numpy(splitmix64_words(key, (n + 3) // 4).view(np.int16)[:n].copy()).view(shape)
    return (quarters >= threshold).float() * kept


def tiny_backbone(corpus, family: str = "bert", **extra):
    """A tiny encoder of ``family`` (hidden 32, two layers, 64 positions) for ``corpus``, seeded."""
    import torch

    from spanlm.models import BackboneConfig, build_backbone

    torch.manual_seed(0)
    config = BackboneConfig(
        family=family,
        hidden_size=32,
        num_layers=2,
        num_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        **extra,
    )
    return build_backbone(config, corpus)


def tiny_charbert_export(prepared: Path, out: Path) -> Path:
    """A tiny CharBERT export (hidden 32, 2 layers; both channels) for ``prepared``'s tokenizer, in ``out``."""

    from spanlm.data.chars import build_char_vocab
    from spanlm.data.shards import PreparedCorpus
    from spanlm.models.charbert import CharBertEncoder, CharChannelConfig, DualChannel

    corpus = PreparedCorpus(prepared)
    char_vocab = build_char_vocab(corpus, 100)
    dual = DualChannel(
        tiny_backbone(corpus),
        CharChannelConfig(char_vocab_size=char_vocab.size, hidden_size=32, char_embedding_size=16, num_layers=2),
    )
    CharBertEncoder(dual, corpus.tokenizer, char_vocab).save(out)
    return out


def forbid_deriving_segment_bounds(monkeypatch) -> None:
    """Make the model's fallback for a packed stream given by its positions alone — deriving the segment bounds
    on the device, a host sync on a GPU — fail: spanlm's packed batches carry their bounds."""
    from spanlm.models import modeling_charbert  # the one copy of the derivation (spanlm.models.packed uses it)

    def derived(*_):
        raise AssertionError("a packed batch's segment bounds were derived from its positions, not carried with it")

    monkeypatch.setattr(modeling_charbert, "segment_bounds", derived)


# DeBERTa-V3's layout (spanlm.models.backbone.DEBERTA_V3_DEFAULTS) with few buckets, so that a 40-token row reaches
# the log buckets (|i − j| ≥ 4) and the clamp at the largest distance
DEBERTA_V3 = {
    "relative_attention": True,
    "position_buckets": 8,
    "max_relative_positions": 32,
    "pos_att_type": ["p2c", "c2p"],
    "position_biased_input": False,
    "norm_rel_ebd": "layer_norm",
    "share_att_key": True,
}
# DeBERTa-V2's: absolute positions in the input too, separate position projections, no buckets (distance clamped
# at 16); one relative term, or both
DEBERTA_V2_C2P = {
    "relative_attention": True,
    "max_relative_positions": 16,
    "pos_att_type": ["c2p"],
    "share_att_key": False,
}
DEBERTA_V2 = {**DEBERTA_V2_C2P, "pos_att_type": ["c2p", "p2c"]}


def tiny_deberta(layout: dict):
    """A transformers ``DebertaV2Model``: hidden 32, 2 layers, 4 heads, no dropout, ``layout``'s relative terms."""
    import torch
    from transformers import DebertaV2Config, DebertaV2Model

    config = DebertaV2Config(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        **layout,
    )
    torch.manual_seed(0)
    return DebertaV2Model(config)


def assert_same_gradients(theirs, ours, rtol: float = 1e-4, atol: float = 1e-5) -> None:
    """Every parameter gradient of ``theirs`` equals ``ours``' (the same module tree, name by name)."""
    import torch

    for (name, a), (_, b) in zip(theirs.named_parameters(), ours.named_parameters()):
        if a.grad is not None:
            torch.testing.assert_close(b.grad, a.grad, atol=atol, rtol=rtol, msg=name)


@contextlib.contextmanager
def transformers_bars_on():
    """transformers' progress bars on, as in a fresh process (an earlier in-process run of this test session turned
    them off), and back as they were after."""
    from transformers.utils import logging as transformers_logging

    was_enabled = transformers_logging.is_progress_bar_enabled()
    transformers_logging.enable_progress_bar()
    try:
        yield
    finally:
        (transformers_logging.enable_progress_bar if was_enabled else transformers_logging.disable_progress_bar)()
