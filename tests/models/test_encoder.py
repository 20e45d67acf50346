"""Fine-tuning encoders load from any Hugging Face directory; random init keeps the architecture only."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from spanlm.errors import ConfigError, InputError
from spanlm.models.encoder import load_encoder
from spanlm.models.hf_model import EncoderConfig


def test_loads_saved_weights_and_runs(tiny_encoder_dir):
    from transformers import AutoModel

    encoder = load_encoder(EncoderConfig(path=str(tiny_encoder_dir)))
    reference = AutoModel.from_pretrained(str(tiny_encoder_dir)).eval()
    encoder.eval()
    ids = torch.tensor([encoder.tokenizer("Alice was beginning to get very tired")["input_ids"]])
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    hidden = encoder(batch)
    assert hidden.shape == (1, ids.shape[1], encoder.hidden_size) == (1, ids.shape[1], 32)
    torch.testing.assert_close(hidden, reference(**batch).last_hidden_state, atol=1e-5, rtol=1e-5)


def test_random_init_keeps_architecture_not_weights(tiny_encoder_dir):
    pretrained = load_encoder(EncoderConfig(path=str(tiny_encoder_dir)))
    torch.manual_seed(1)
    random = load_encoder(EncoderConfig(path=str(tiny_encoder_dir), init="random"))
    shapes = {k: v.shape for k, v in pretrained.state_dict().items()}
    assert shapes == {k: v.shape for k, v in random.state_dict().items()}
    weight = "model.embeddings.word_embeddings.weight"
    assert not torch.equal(pretrained.state_dict()[weight], random.state_dict()[weight])


def test_a_frozen_encoder_leaves_only_the_head_to_train(tiny_encoder_dir):
    from spanlm.ner.config import NerConfig
    from spanlm.ner.model import NerObjective
    from spanlm.train.config import TrainConfig
    from spanlm.train.optim import build_optimizer

    objective = NerObjective(load_encoder(EncoderConfig(path=str(tiny_encoder_dir), frozen=True)), 3, NerConfig())
    trained = {id(p) for group in build_optimizer(objective, TrainConfig()).param_groups for p in group["params"]}
    assert trained == {id(p) for p in objective.head.parameters()}
    assert not any(p.requires_grad for p in objective.encoder.parameters())
    ids = torch.tensor([objective.encoder.tokenizer("Alice was beginning to get very tired")["input_ids"]])
    mask = torch.ones_like(ids, dtype=torch.bool)
    loss = objective(
        {"input_ids": ids, "attention_mask": mask, "token_mask": mask, "entity_spans": torch.tensor([[[0, 1, 1]]])}
    )["loss"]
    loss.backward()
    assert all(p.grad is None for p in objective.encoder.parameters())
    assert all(p.grad is not None for p in objective.head.parameters())


def test_dropout_override(tiny_encoder_dir):
    encoder = load_encoder(EncoderConfig(path=str(tiny_encoder_dir), dropout=0.0))
    assert encoder.model.config.hidden_dropout_prob == 0.0


def test_errors_name_the_directory(tiny_encoder_dir, tmp_path):
    with pytest.raises(ConfigError, match="model.path is required"):
        load_encoder(EncoderConfig())
    with pytest.raises(InputError, match="no config.json"):
        load_encoder(EncoderConfig(path=str(tmp_path)))
    # A tokenizer with more tokens than the embedding has rows belongs to another checkpoint.
    broken = tmp_path / "mismatch"
    shutil.copytree(tiny_encoder_dir, broken)
    config = json.loads((broken / "config.json").read_text())
    config["vocab_size"] = 100
    (broken / "config.json").write_text(json.dumps(config))
    from transformers import AutoConfig, AutoModel

    AutoModel.from_config(AutoConfig.from_pretrained(str(broken))).save_pretrained(str(broken))
    with pytest.raises(
        InputError, match=r"mismatch: the tokenizer has \d+ tokens but the model's embedding has 100 rows"
    ):
        load_encoder(EncoderConfig(path=str(broken)))


def test_reinit_layers_draws_the_top_layers_afresh_and_keeps_the_rest(tiny_encoder_dir):
    """Zhang et al. 2021's re-initialisation: the top layer's weights drawn by the model's own initialiser (another
    draw than the checkpoint's, the same for the same seed), every other weight as pretrained."""
    import pytest
    import torch
    from safetensors.torch import load_file

    from spanlm.errors import ConfigError
    from spanlm.models.encoder import load_encoder
    from spanlm.models.hf_model import EncoderConfig

    pretrained = {k.removeprefix("bert."): v for k, v in load_file(str(tiny_encoder_dir / "model.safetensors")).items()}
    torch.manual_seed(0)
    encoder = load_encoder(EncoderConfig(path=str(tiny_encoder_dir), reinit_layers=1))
    top = "encoder.layer.1."
    for name, value in encoder.model.state_dict().items():
        if name not in pretrained:
            continue
        if name.startswith(top) and name.endswith("weight") and "LayerNorm" not in name:
            assert not torch.equal(value, pretrained[name]), name
        elif not name.startswith(top):
            assert torch.equal(value, pretrained[name]), name
    assert torch.equal(encoder.model.state_dict()[top + "output.LayerNorm.weight"], torch.ones(32))  # its init
    torch.manual_seed(0)
    again = load_encoder(EncoderConfig(path=str(tiny_encoder_dir), reinit_layers=1))
    assert all(torch.equal(a, b) for a, b in zip(encoder.state_dict().values(), again.state_dict().values()))
    with pytest.raises(ConfigError, match="3 is more than the encoder's 2 layers"):
        load_encoder(EncoderConfig(path=str(tiny_encoder_dir), reinit_layers=3))
