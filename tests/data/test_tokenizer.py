"""Saved tokenizers load back unchanged in transformers 5 and in a real transformers 4.x install."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from helpers import EMBEDDED_CORPUS, kept_venv
from spanlm.data.tokenizer import TokenizerConfig, save_tokenizer, tokenizer_fingerprint, train_tokenizer

KINDS = {"wordpiece": "BertTokenizer", "bpe": "PreTrainedTokenizerFast", "unigram": "PreTrainedTokenizerFast"}
SAMPLES = [
    ["Alice was beginning to get VERY tired", "naïve café, 北京 and <ent> [MASK] <s>"],
    ["The Queen!", "Off with her head."],
]


def trained(kind: str, lowercase: bool = True):
    lines = (EMBEDDED_CORPUS / "alice_in_wonderland.txt").read_text(encoding="utf-8").splitlines()
    return train_tokenizer(
        lines, TokenizerConfig(kind=kind, vocab_size=400, lowercase=lowercase, extra_special_tokens=["<ent>"])
    )


def encodings(tokenizer) -> list[dict]:
    """Ids and offsets of sentence pairs: what NER / QA read from a tokenizer."""
    out = []
    for first, second in SAMPLES:
        encoded = tokenizer(first, second, return_offsets_mapping=True)
        out.append(
            {
                key: [list(v) if isinstance(v, tuple) else v for v in encoded[key]]
                for key in ("input_ids", "offset_mapping")
            }
        )
    return out


@pytest.mark.parametrize("lowercase", [True, False])
@pytest.mark.parametrize("kind", list(KINDS))
def test_saved_tokenizer_names_a_portable_class_and_reloads_unchanged(tmp_path, kind, lowercase):
    from transformers import AutoTokenizer

    tokenizer = trained(kind, lowercase)
    save_tokenizer(tokenizer, tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["tokenizer_class"] == KINDS[kind]
    assert config["additional_special_tokens"] == ["<ent>"] and "extra_special_tokens" not in config
    reloaded = AutoTokenizer.from_pretrained(str(tmp_path))
    assert tokenizer_fingerprint(reloaded) == tokenizer_fingerprint(tokenizer)
    assert encodings(reloaded) == encodings(tokenizer)
    assert "<ent>" in reloaded.all_special_tokens


@pytest.fixture(scope="session")
def transformers4() -> Path:
    """A virtual environment with transformers 4.x (and its own tokenizers); torch borrowed from this one. Kept
    in the user's cache (helpers.kept_venv), one per Python and borrowed environment."""
    borrowed = sysconfig.get_paths()["purelib"]

    def build(venv: Path) -> None:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
        python = venv / "bin" / "python"
        install = subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "transformers>=4.40,<5"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if install.returncode != 0:  # no package index reachable: nothing to check against
            pytest.skip(f"cannot install transformers 4.x: {install.stderr.strip().splitlines()[-1:]}")
        site = subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        # After the venv's own packages on sys.path, so transformers 4 and its tokenizers win over ours.
        (Path(site) / "borrowed_torch.pth").write_text(borrowed + "\n", encoding="utf-8")

    python_version = f"{sys.version_info.major}.{sys.version_info.minor}"
    name = f"transformers4-py{python_version}-{hashlib.sha256(borrowed.encode()).hexdigest()[:12]}"
    answers = "import transformers, tokenizers, torch; assert transformers.__version__.startswith('4.')"
    return kept_venv(name, answers, build)


READ_WITH_TRANSFORMERS_4 = """
import json, sys, torch, transformers
from transformers import AutoModelForMaskedLM, AutoTokenizer
assert transformers.__version__.startswith("4."), transformers.__version__
samples, directories, model_dir = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
out = {"tokenizers": {}}
for name, directory in directories.items():
    tokenizer = AutoTokenizer.from_pretrained(directory)
    encodings = [tokenizer(a, b, return_offsets_mapping=True) for a, b in samples]
    out["tokenizers"][name] = [{key: [list(v) if isinstance(v, tuple) else v for v in encoding[key]]
                                for key in ("input_ids", "offset_mapping")} for encoding in encodings]
model = AutoModelForMaskedLM.from_pretrained(model_dir).eval()
tokenizer = AutoTokenizer.from_pretrained(model_dir)
with torch.no_grad():
    out["logits"] = model(**tokenizer(samples[0][0], return_tensors="pt")).logits[0].tolist()
out["class"] = type(model).__name__
print(json.dumps(out))
"""


@pytest.mark.slow
def test_transformers_4_loads_the_tokenizers_and_a_masked_lm_export(transformers4, tmp_path):
    """A user pinned to transformers 4.x loads every tokenizer kind and an export with its MLM head."""
    import torch
    from transformers import AutoModelForMaskedLM

    from spanlm.models.backbone import BackboneConfig
    from spanlm.objectives.pretrained_heads import export_with_heads

    directories, expected = {}, {}
    for kind in KINDS:
        tokenizer = trained(kind)
        save_tokenizer(tokenizer, tmp_path / kind)
        directories[kind], expected[kind] = str(tmp_path / kind), encodings(tokenizer)

    # A spanlm MLM export (BertForMaskedLM) over the WordPiece tokenizer.
    model_dir = tmp_path / "export"
    objective = _tiny_mlm(
        tmp_path / "wordpiece", BackboneConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    )
    export_with_heads(objective, model_dir)
    save_tokenizer(trained("wordpiece"), model_dir)
    theirs = subprocess.run(
        [
            str(transformers4),
            "-c",
            READ_WITH_TRANSFORMERS_4,
            json.dumps(SAMPLES),
            json.dumps(directories),
            str(model_dir),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert theirs.returncode == 0, theirs.stderr[-2000:]
    got = json.loads(theirs.stdout.strip().splitlines()[-1])
    assert got["tokenizers"] == expected
    assert got["class"] == "BertForMaskedLM"
    ours = AutoModelForMaskedLM.from_pretrained(str(model_dir)).eval()
    with torch.no_grad():
        logits = ours(**ours_tokenizer(model_dir)(SAMPLES[0][0], return_tensors="pt")).logits[0]
    assert torch.allclose(torch.tensor(got["logits"]), logits, atol=1e-5)


def ours_tokenizer(directory: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(directory))


def _tiny_mlm(tokenizer_dir: Path, model):
    """spanlm's MLM objective (backbone + MLM head) over the tokenizer in ``tokenizer_dir``, weights moved off
    their init."""
    import torch
    from transformers import AutoModel

    from spanlm.models.backbone import _transformers_config
    from spanlm.objectives.masked_lm import MaskedLM

    class Corpus:  # the two things the config builder reads from a prepared corpus
        tokenizer = ours_tokenizer(tokenizer_dir)
        vocab_size = len(tokenizer)
        special_ids = {"pad": tokenizer.pad_token_id, "cls": tokenizer.cls_token_id, "sep": tokenizer.sep_token_id}

    torch.manual_seed(0)
    backbone = AutoModel.from_config(_transformers_config(model, Corpus()), add_pooling_layer=False)
    objective = MaskedLM("mlm", backbone, masker=None, layer_norm_eps=1e-12)
    with torch.no_grad():
        for parameter in objective.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    return objective.eval()
