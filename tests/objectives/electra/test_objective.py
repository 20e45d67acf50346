"""ELECTRA / DeBERTa-V3 RTD: sizes, gradient routing per sharing mode, labels, learning, and
pretrain → export → AutoModel."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers import EMBEDDED_MAX_LEN, REPO, embedded_recipe
from spanlm.data.blocks import BlockDataset, collate_blocks
from spanlm.data.shards import PreparedCorpus
from spanlm.errors import ConfigError, InputError
from spanlm.objectives import build_objective
from spanlm.objectives.electra.objective import GENERATOR_DIR, Electra, generator_config

RECIPES = ["electra", "deberta_v3_gdes"]


def recipe(name: str, prepared, output_dir, *overrides: str, tiny: bool = True):
    """A recipe of configs/pretrain/ on the session's embedded corpus, evaluated and saved every two steps."""
    return embedded_recipe(
        name,
        prepared,
        output_dir,
        "train.eval_every=2",
        "train.save_every=2",
        "train.log_every=1",
        *overrides,
        tiny=tiny,
    )


@pytest.fixture(scope="module")
def corpus(embedded_prepared) -> PreparedCorpus:
    return PreparedCorpus(embedded_prepared)


def build(corpus, tmp_path, name: str = "electra", *overrides: str, seed: int = 0) -> Electra:
    torch.manual_seed(seed)
    return build_objective(recipe(name, corpus.directory, tmp_path / "run", *overrides), corpus)


def masked_batch(objective, corpus, first: int = 0, size: int = 8, seed: int = 0) -> dict[str, torch.Tensor]:
    blocks = BlockDataset(corpus, EMBEDDED_MAX_LEN)
    batch = collate_blocks([blocks[i] for i in range(first, first + size)], corpus.special_ids["pad"])
    return objective.masker(batch, np.random.default_rng(seed)).to_torch()


def embedding_weight(module) -> torch.Tensor:
    return module.embeddings.word_embeddings.weight


# --- sizes and configuration -------------------------------------------------------------------------


def test_generator_sizes_follow_the_recipes(embedded_prepared, tmp_path):
    electra = recipe("electra", embedded_prepared, tmp_path, tiny=False)
    g = generator_config(electra.model, electra.objective.electra)
    # ELECTRA: a quarter of the width (heads and FFN alike), same depth, the discriminator's embedding width.
    assert (g.hidden_size, g.num_heads, g.intermediate_size, g.num_layers, g.embedding_size) == (32, 1, 128, 2, 128)
    deberta = recipe("deberta_v3_gdes", embedded_prepared, tmp_path, tiny=False)
    g = generator_config(deberta.model, deberta.objective.electra)
    # DeBERTa-V3: same width, half the layers.
    assert (g.hidden_size, g.num_heads, g.intermediate_size, g.num_layers) == (128, 2, 512, 1)
    assert deberta.objective.electra.rtd_weight == 10.0 and electra.objective.electra.rtd_weight == 50.0


def test_built_models_have_those_sizes_and_shard_both_backbones(corpus, tmp_path):
    objective = build(corpus, tmp_path)  # tiny electra: D hidden 32, G 8
    assert objective.generator.config.hidden_size == 8 and objective.discriminator.config.hidden_size == 32
    assert objective.generator.config.embedding_size == objective.discriminator.config.embedding_size == 32
    units = objective.shard_units()
    assert len(units) == 4
    assert {id(u) for u in units} == {
        id(layer) for model in (objective.generator, objective.discriminator) for layer in model.encoder.layer
    }


def test_configuration_mistakes_are_clear_errors(corpus, tmp_path):
    with pytest.raises(ConfigError, match="no embedding projection"):
        build(corpus, tmp_path, "electra", "model.family=bert")
    with pytest.raises(
        ConfigError, match=r"electra. needs masking.scheme span \(for its objective.electra.generator_head\)"
    ):
        build(corpus, tmp_path, "electra", "objective.electra.generator_head=sbo")
    with pytest.raises(ConfigError, match="generator_width"):
        build(corpus, tmp_path, "electra", "objective.electra.generator_width=0")
    with pytest.raises(InputError, match="needs a spanlm electra export"):
        build(corpus, tmp_path, "electra", f"model.path={REPO}")


def test_the_masker_only_adds_a_sampling_seed(corpus, tmp_path):
    objective = build(corpus, tmp_path)
    blocks = BlockDataset(corpus, EMBEDDED_MAX_LEN)
    batch = collate_blocks([blocks[i] for i in range(4)], corpus.special_ids["pad"])
    plain = objective.masker.masker(batch, np.random.default_rng(5))
    sampled = objective.masker(batch, np.random.default_rng(5))
    assert np.array_equal(plain.input_ids, sampled.input_ids) and np.array_equal(
        plain.target_index, sampled.target_index
    )
    assert (
        sampled.sample_seed.shape == (1,)
        and sampled.sample_seed[0] != objective.masker(batch, np.random.default_rng(6)).sample_seed[0]
    )


# --- gradients -----------------------------------------------------------------------------------


def gradients(objective, batch, rtd_weight: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(E_G grad, E_Δ grad) of the objective's loss with λ = rtd_weight."""
    objective.settings.rtd_weight = rtd_weight
    objective.zero_grad(set_to_none=True)
    objective(batch)["loss"].backward()
    delta = getattr(objective.discriminator.embeddings.word_embeddings, "delta", None)
    return embedding_weight(
        objective.generator
    ).grad.clone(), None if delta is None or delta.grad is None else delta.grad.clone()


def test_gdes_at_init_and_where_each_loss_goes(corpus, tmp_path):
    objective = build(corpus, tmp_path, "electra", "objective.electra.sharing=gdes")
    assert torch.equal(embedding_weight(objective.discriminator), embedding_weight(objective.generator))
    assert id(embedding_weight(objective.generator)) not in {id(p) for p in objective.discriminator.parameters()}
    batch = masked_batch(objective, corpus)
    with_rtd, delta = gradients(objective, batch, 50.0)
    mlm_only, delta_without_rtd = gradients(objective, batch, 0.0)
    # E_G's gradient is the MLM loss's alone; E_Δ is trained by the RTD loss alone.
    assert torch.allclose(with_rtd, mlm_only, rtol=1e-6, atol=1e-9)
    assert delta is not None and delta.abs().sum() > 0
    assert delta_without_rtd is None or not delta_without_rtd.any()


def test_es_rtd_loss_pulls_on_the_generator_embedding(corpus, tmp_path):
    objective = build(corpus, tmp_path, "electra", "objective.electra.sharing=es")
    batch = masked_batch(objective, corpus)
    with_rtd, _ = gradients(objective, batch, 50.0)
    mlm_only, _ = gradients(objective, batch, 0.0)
    assert (with_rtd - mlm_only).abs().sum() > 1e-3 * mlm_only.abs().sum()


def test_no_sharing_keeps_the_tables_apart(corpus, tmp_path):
    objective = build(corpus, tmp_path, "electra", "objective.electra.sharing=none")
    batch = masked_batch(objective, corpus)
    mlm_only, _ = gradients(objective, batch, 0.0)
    with_rtd, _ = gradients(objective, batch, 50.0)
    assert torch.allclose(with_rtd, mlm_only, rtol=1e-6, atol=1e-9)
    assert embedding_weight(objective.discriminator).grad.abs().sum() > 0


# --- labels, pads, sampling ----------------------------------------------------------------------


def test_pad_tokens_never_count(corpus, tmp_path):
    objective = build(corpus, tmp_path).eval()
    batch = masked_batch(objective, corpus, size=16)
    assert not batch["attention_mask"].all(), "the test needs a padded batch"
    with torch.no_grad():
        output = objective(batch)
    assert int(output["n_rtd"]) == int(batch["attention_mask"].sum())


def test_sampling_is_a_function_of_the_batch_seed(corpus, tmp_path):
    objective = build(corpus, tmp_path).eval()
    batch = masked_batch(objective, corpus)
    with torch.no_grad():
        first = objective(batch)
        torch.manual_seed(999)  # the global RNG plays no part
        again = objective(batch)
        other = objective({**batch, "sample_seed": batch["sample_seed"] + 1})
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not torch.equal(first["rtd_loss"], other["rtd_loss"])


@pytest.mark.parametrize("name", RECIPES)
@pytest.mark.slow
def test_a_tiny_run_detects_replaced_tokens_well_above_the_all_original_baseline(corpus, tmp_path, name):
    objective = build(corpus, tmp_path, name)
    batches = [masked_batch(objective, corpus, first=8 * k, seed=k) for k in range(2)]
    optimizer = torch.optim.AdamW(objective.parameters(), lr=3e-3)
    history = []
    for step in range(80):
        batch = {**batches[step % 2], "sample_seed": torch.tensor([step])}  # fresh replacements every step
        output = objective(batch)
        optimizer.zero_grad()
        output["loss"].backward()
        optimizer.step()
        history.append({k: float(v.detach()) for k, v in output.items()})
        # A sample equal to the original is labelled original: replaced = targets − correct samples.
        assert output["n_replaced"] == round(float(output["n_mlm"]) * (1 - float(output["sample_accuracy"])))
    last = history[-20:]
    recall = sum(h["n_true_replaced"] for h in last) / sum(h["n_replaced"] for h in last)
    accuracy = sum(h["rtd_accuracy"] * h["n_rtd"] for h in last) / sum(h["n_rtd"] for h in last)
    baseline = 1 - sum(h["n_replaced"] for h in last) / sum(h["n_rtd"] for h in last)  # "everything is original"
    assert recall > 0.4 and accuracy > baseline + 0.03, (recall, accuracy, baseline)
    assert any(h["sample_accuracy"] > 0 for h in last)  # so some samples were originals (and labelled so)


def test_an_sbo_generator_trains_both_heads(corpus, tmp_path):
    objective = build(corpus, tmp_path, "electra", "objective.electra.generator_head=sbo", "masking.scheme=span")
    output = objective(masked_batch(objective, corpus))
    assert int(output["n_sbo"]) > 0 and float(output["sbo_loss"]) > 0
    output["loss"].backward()
    assert objective.sbo_head.dense1.weight.grad.abs().sum() > 0


# --- the engine, export, continued pretraining --------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", RECIPES)
def test_pretrain_export_and_autoload(corpus, tmp_path, name):
    from transformers import AutoModel, AutoTokenizer

    from spanlm.pretrain.export import export_checkpoint
    from spanlm.pretrain.run import pretrain
    from spanlm.train.checkpoint import latest_checkpoint, load_objective_weights
    from spanlm.train.metrics import read_metrics

    run = pretrain(recipe(name, corpus.directory, tmp_path / "run", "model.hidden_dropout=0.1"), log=lambda *_: None)
    records = read_metrics(run)
    assert {"mlm_loss", "rtd_loss", "rtd_accuracy", "rtd_precision", "rtd_recall", "n_replaced"} <= set(records[-1])
    assert any(r["kind"] == "eval" for r in records)
    out = export_checkpoint(run, tmp_path / "hf")

    trained = build(corpus, tmp_path, name, seed=1)
    load_objective_weights(trained, latest_checkpoint(run) / "model.safetensors")
    trained.eval()
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    encoded = tokenizer(["Alice was beginning to get very tired.", "The Queen!"], padding=True, return_tensors="pt")
    discriminator = AutoModel.from_pretrained(str(out)).eval()
    generator = AutoModel.from_pretrained(str(out / GENERATOR_DIR)).eval()
    with torch.no_grad():
        assert torch.allclose(
            discriminator(**encoded).last_hidden_state, trained.discriminator(**encoded).last_hidden_state, atol=1e-5
        )
        assert torch.allclose(
            generator(**encoded).last_hidden_state, trained.generator(**encoded).last_hidden_state, atol=1e-5
        )
    # The export holds the materialised E_D: E_G + E_Δ under GDES, E_G under ES.
    shared = trained.discriminator.embeddings.word_embeddings
    expected = embedding_weight(trained.generator) + (shared.delta if name == "deberta_v3_gdes" else 0)
    assert torch.equal(discriminator.get_input_embeddings().weight, expected.detach())
    if name == "deberta_v3_gdes":
        assert shared.delta.abs().sum() > 0  # trained: the materialised table really is a sum
    # Heads transformers has a class for are in the weights (tests/objectives/test_hf_heads.py); DeBERTa-V3's
    # RTD head has none and stays in heads.safetensors.
    assert (out / "heads.safetensors").is_file() == (name == "deberta_v3_gdes")


@pytest.mark.parametrize("sharing", ["gdes", "es"])
def test_continued_pretraining_starts_from_the_export(corpus, tmp_path, sharing):
    objective = build(corpus, tmp_path, "electra", f"objective.electra.sharing={sharing}").eval()
    with torch.no_grad():  # move every weight (E_Δ included) away from its initialisation
        for parameter in objective.parameters():
            parameter.add_(0.01 * torch.randn_like(parameter))
    objective.export(tmp_path / "export", corpus.tokenizer)
    reloaded = build(
        corpus,
        tmp_path,
        "electra",
        f"objective.electra.sharing={sharing}",
        f"model.path={tmp_path / 'export'}",
        seed=123,
    ).eval()
    batch = masked_batch(objective, corpus)
    with torch.no_grad():
        expected, got = objective(batch), reloaded(batch)
    assert torch.allclose(expected["loss"], got["loss"], atol=1e-4), (float(expected["loss"]), float(got["loss"]))
    assert torch.allclose(
        embedding_weight(reloaded.discriminator), embedding_weight(objective.discriminator), atol=1e-6
    )


@pytest.mark.slow
def test_resume_is_bit_exact(corpus, tmp_path):
    """2N steps == N + resume + N under GDES with dropout: sampling seeds and E_Δ survive the checkpoint."""
    from safetensors.torch import load_file

    from spanlm.pretrain.run import pretrain
    from spanlm.train import checkpoint as ckpt
    from toy_objective import losses

    def run(name, **kwargs):
        return pretrain(
            recipe(
                "deberta_v3_gdes", corpus.directory, tmp_path / name, "model.hidden_dropout=0.1", "train.eval_every=0"
            ),
            log=lambda *_: None,
            **kwargs,
        )

    full = run("full")
    resumed = run("resumed", resume=str(ckpt.step_dir(full, 2)))
    assert {s: v for s, v in losses(full).items() if s > 2} == losses(resumed)
    a = load_file(str(ckpt.step_dir(full, 4) / "model.safetensors"))
    b = load_file(str(ckpt.step_dir(resumed, 4) / "model.safetensors"))
    assert a.keys() == b.keys() and any(k.endswith("word_embeddings.delta") for k in a)
    assert all(torch.equal(a[k], b[k]) for k in a)
