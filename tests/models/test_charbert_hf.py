"""CharBERT exports in transformers: both channels with trust_remote_code=True and without spanlm, equal to
spanlm's own encoder; a load report naming the char channel when transformers loads the subword half."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import EMBEDDED_INPUTS, REPO, doc_section, tiny_backbone
from spanlm.data.chars import build_char_vocab
from spanlm.data.shards import PreparedCorpus
from spanlm.errors import InputError
from spanlm.models.charbert import CharBertEncoder, CharChannelConfig, DualChannel
from spanlm.models.encoder import load_encoder
from spanlm.models.hf_model import EncoderConfig
from spanlm.models.modeling_charbert import char_inputs_to_torch
from spanlm.pretrain.recipe import load_recipe

UNK_TEXTS = ["Holmes smiled \u2603 at Watson."]  # the snowman is no piece of the tiny vocabulary: [UNK]

# Run after docs/huggingface.md's snippet, in the same interpreter: where the class came from, no spanlm module
# loaded, the [UNK] path of the char inputs, and save_pretrained; the outputs go back to the test.
AFTER_SNIPPET = """
import sys

import torch

assert type(model).__module__.startswith("transformers_modules."), type(model).__module__  # the export's own file
loaded = sorted(name for name, module in sys.modules.items() if name.split(".")[0] == "spanlm" and module is not None)
assert not loaded, loaded
unk_texts = {unk_texts!r}
unk_encoding = tokenizer(unk_texts, padding=True, return_offsets_mapping=True, return_tensors="pt")
with torch.no_grad():
    unk = model(**featurize.model_inputs(unk_encoding, unk_texts))
model.save_pretrained("resaved")
tokenizer.save_pretrained("resaved")
torch.save({{"texts": texts, "unk_texts": unk_texts, "last": outputs.last_hidden_state.detach(),
            "token": outputs.token_hidden_state.detach(), "char": outputs.char_hidden_state.detach(),
            "unk": unk.last_hidden_state}}, "outputs.pt")
"""


def run_without_spanlm(code: str, cwd: Path) -> str:
    """Run ``code`` in a fresh interpreter in ``cwd`` where importing spanlm fails, as for a transformers user."""
    script = "import sys\nsys.modules['spanlm'] = None  # any import of spanlm now raises ImportError\n" + code
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(HF_MODULES_CACHE=str(cwd / "hf_modules"), HF_HUB_OFFLINE="1")
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stdout


def spanlm_hidden(directory: Path, texts: list[str]) -> torch.Tensor:
    """spanlm's fine-tuning features (B, L, 2H) of ``texts`` from the encoder ``load_encoder`` reads in
    ``directory``."""
    encoder = load_encoder(EncoderConfig(path=str(directory))).eval()
    assert isinstance(encoder, CharBertEncoder)
    encoding = encoder.tokenizer(texts, padding=True, return_offsets_mapping=True, return_tensors="np")
    batch = {
        "input_ids": torch.from_numpy(encoding["input_ids"]).long(),
        "attention_mask": torch.from_numpy(encoding["attention_mask"]).long(),
        **char_inputs_to_torch(encoder.featurizer()(encoding["input_ids"], encoding["offset_mapping"], texts)),
    }
    with torch.no_grad():
        return encoder(batch)


@contextlib.contextmanager
def transformers_warnings():
    """The messages transformers logs at warning level (or above) inside the block."""
    messages: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    logger = logging.getLogger("transformers")
    handler, level = Collect(logging.WARNING), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@pytest.fixture(scope="module")
def workdir(embedded_prepared, tmp_path_factory) -> Path:
    """A directory outside the checkout with a tiny pretrained CharBERT exported to runs/export/charbert."""
    from spanlm.pretrain.export import export_checkpoint
    from spanlm.pretrain.run import pretrain

    root = tmp_path_factory.mktemp("charbert_hf")
    recipe = load_recipe(
        REPO / "configs" / "pretrain" / "charbert.yaml",
        [
            f"data.inputs={EMBEDDED_INPUTS}",
            f"data.prepared_dir={embedded_prepared}",
            "data.max_len=24",
            "tokenizer.vocab_size=2000",
            "model.hidden_size=32",
            "model.num_layers=2",
            "model.intermediate_size=64",
            "model.max_position_embeddings=32",
            "masking.noise.max_len=32",
            "masking.noise.term_vocab_size=100",
            "objective.charbert.char_embedding_size=16",
            f"train.output_dir={root / 'runs/pretrain/charbert'}",
            "train.max_steps=2",
            "train.batch_size=4",
            "train.eval_every=0",
            "train.save_every=2",
            "train.num_workers=0",
            "train.device=cpu",
            "logging.report_to=[]",
            "logging.progress=false",
        ],
    )
    torch.manual_seed(0)
    export_checkpoint(pretrain(recipe, log=lambda *_: None), root / "runs/export/charbert")
    return root


def test_documented_snippet_runs_both_channels_without_spanlm_as_spanlm_does(workdir):
    export = workdir / "runs/export/charbert"
    (snippet,) = doc_section("docs/huggingface.md", "CharBERT in transformers")
    printed = run_without_spanlm(snippet + AFTER_SNIPPET.format(unk_texts=UNK_TEXTS), workdir)
    assert "torch.Size([2, " in printed and ", 64])" in printed and ", 32]) torch.Size([2, " in printed
    hf = torch.load(workdir / "outputs.pt")

    ours = spanlm_hidden(export, hf["texts"])
    torch.testing.assert_close(hf["last"], ours, atol=1e-5, rtol=0)
    torch.testing.assert_close(hf["last"], torch.cat([hf["token"], hf["char"]], dim=-1), atol=0, rtol=0)
    # The [UNK] token is spelt from its characters in the text, by transformers' copy as by spanlm.
    tokenizer = load_encoder(EncoderConfig(path=str(export))).tokenizer
    assert tokenizer.unk_token_id in tokenizer(UNK_TEXTS[0])["input_ids"]
    torch.testing.assert_close(hf["unk"], spanlm_hidden(export, UNK_TEXTS), atol=1e-5, rtol=0)
    # What transformers saves back (backbone weights under "backbone.") is still a CharBERT directory for spanlm.
    torch.testing.assert_close(spanlm_hidden(workdir / "resaved", hf["texts"]), ours, atol=0, rtol=0)


@pytest.mark.parametrize("family, fusion", [("roberta", "per_layer"), ("electra", "shared")])
@pytest.mark.slow
def test_every_backbone_and_fusion_mode_loads_in_transformers(embedded_prepared, tmp_path, family, fusion):
    corpus = PreparedCorpus(embedded_prepared)
    char_vocab = build_char_vocab(corpus, 60)
    extra = {"embedding_size": 16} if family == "electra" else {}  # ELECTRA with embeddings_project
    backbone = tiny_backbone(corpus, family, **extra)
    model = DualChannel(
        backbone,
        CharChannelConfig(
            char_vocab_size=char_vocab.size, hidden_size=32, char_embedding_size=16, fusion=fusion, num_layers=2
        ),
    )
    CharBertEncoder(model, corpus.tokenizer, char_vocab).save(tmp_path / "export")
    texts = ["Alice was beginning to get very tierd.", "Holmes smiled \u2603."]
    run_without_spanlm(
        f"""
import torch
from transformers import AutoModel, AutoTokenizer

model = AutoModel.from_pretrained("export", trust_remote_code=True)
assert len(model.fusions) == {2 if fusion == "per_layer" else 1}
tokenizer = AutoTokenizer.from_pretrained("export")
texts = {texts!r}
encoding = tokenizer(texts, padding=True, return_offsets_mapping=True, return_tensors="pt")
with torch.no_grad():
    torch.save(model(**model.char_featurizer(tokenizer).model_inputs(encoding, texts)).last_hidden_state, "last.pt")
""",
        tmp_path,
    )
    torch.testing.assert_close(
        torch.load(tmp_path / "last.pt"), spanlm_hidden(tmp_path / "export", texts), atol=1e-5, rtol=0
    )


def test_loaded_without_remote_code_the_report_names_the_char_channel(workdir):
    from transformers import AutoModel, AutoModelForMaskedLM, AutoModelForTokenClassification

    export = workdir / "runs/export/charbert"
    for auto in (AutoModel, AutoModelForMaskedLM, AutoModelForTokenClassification):
        with transformers_warnings() as messages:
            model = auto.from_pretrained(str(export))
        assert type(model).__module__.startswith("transformers.models.bert."), type(model)  # the subword half
        report = "\n".join(messages)
        assert f"{type(model).__name__} LOAD REPORT" in report, report
        unexpected = [line.split("|")[0].strip() for line in report.splitlines() if "| UNEXPECTED" in line]
        assert {key.split(".")[0] for key in unexpected} == {"char_encoder", "fusions"}, report
        assert "char_encoder.embedding.weight" in unexpected and "fusions.0.conv.weight" in unexpected
    # spanlm's own loader reads both channels, and transformers has nothing to report.
    with transformers_warnings() as messages:
        encoder = load_encoder(EncoderConfig(path=str(export)))
    assert isinstance(encoder, CharBertEncoder) and not any("LOAD REPORT" in message for message in messages), messages


def test_the_documented_subword_half_is_a_plain_encoder(workdir, monkeypatch):
    from spanlm.models.encoder import Encoder

    docs = (REPO / "docs" / "charbert.md").read_text(encoding="utf-8")
    (snippet,) = re.findall(r"```python\n(.*?)```", docs.split("## Robustness")[1].split("\n## ")[0], flags=re.S)
    monkeypatch.chdir(workdir)
    exec(compile(snippet, "docs/charbert.md", "exec"), {})
    plain = load_encoder(EncoderConfig(path="runs/export/charbert-subword"))
    charbert = load_encoder(EncoderConfig(path="runs/export/charbert"))
    assert type(plain) is Encoder and plain.hidden_size == charbert.hidden_size // 2
    for name, tensor in charbert.model.backbone.state_dict().items():
        assert torch.equal(plain.model.state_dict()[name], tensor), name


def test_an_export_whose_parts_disagree_is_a_one_line_error(workdir, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(workdir / "runs/export/charbert", broken)
    config = json.loads((broken / "config.json").read_text(encoding="utf-8"))
    config["charbert"]["chars"] = config["charbert"]["chars"][:-1]  # one character fewer than the embedding has rows
    (broken / "config.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(InputError, match=r"model\.safetensors: 'char_encoder\.embedding\.weight' has shape"):
        load_encoder(EncoderConfig(path=str(broken)))
    config["charbert"]["chars"] = ["a", "b"]  # not a string of characters
    (broken / "config.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(InputError, match=r"config\.json: .*charbert\.chars"):
        load_encoder(EncoderConfig(path=str(broken)))
