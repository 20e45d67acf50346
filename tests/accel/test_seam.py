"""The speed backend's seam: models, heads, objectives (and the rest of the model code) import nothing from
spanlm.accel; the trainer applies it in one place, as train.accel says, and `off` gives the same losses."""

import ast
from pathlib import Path

import pytest
import torch

import spanlm
from spanlm import accel
from spanlm.accel import native

PACKAGE = Path(spanlm.__file__).parent
# Device-independent code: it never imports the speed backend (the engine, train/, is what applies it).
INDEPENDENT = ["models", "heads", "objectives", "masking", "data", "ner", "qa"]


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


@pytest.mark.parametrize("folder", INDEPENDENT)
def test_device_independent_code_imports_nothing_from_the_speed_backend(folder):
    offenders = {
        str(path.relative_to(PACKAGE)): sorted(
            name for name in imported_modules(path) if name.startswith("spanlm.accel")
        )
        for path in sorted((PACKAGE / folder).rglob("*.py"))
    }
    assert not {path: names for path, names in offenders.items() if names}


def test_the_trainer_is_where_the_backend_is_applied():
    users = sorted(
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if "accel" not in path.parts and any(name.startswith("spanlm.accel") for name in imported_modules(path))
    )
    assert users == ["train/loop.py"]


@pytest.mark.skipif(native.kernels() is None, reason="spanlm's native kernels cannot be built here")
def test_apply_switches_a_backbone_to_the_cpu_path_and_keeps_its_state_dict(tmp_path):
    from transformers import AutoConfig, AutoModel

    from spanlm.accel.dropout import ATTENTION_NAME, FastDropout

    config = AutoConfig.for_model(
        "bert",
        vocab_size=60,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=40,
    )
    model = AutoModel.from_config(config, attn_implementation="sdpa")
    keys = list(model.state_dict())
    assert accel.apply(model, torch.device("cpu"), "off") == "off" and model.config._attn_implementation == "sdpa"
    assert accel.apply(model, torch.device("cpu")) == "cpu"
    assert model.config._attn_implementation == ATTENTION_NAME
    assert not any(type(m) is torch.nn.Dropout for m in model.modules()) and any(
        isinstance(m, FastDropout) for m in model.modules()
    )
    assert list(model.state_dict()) == keys
    model.save_pretrained(tmp_path)
    assert ATTENTION_NAME not in (tmp_path / "config.json").read_text()
