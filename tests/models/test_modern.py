"""The modern families (ModernBERT, EuroBERT): built from scratch with their own settings, continued from tiny
checkpoints made with transformers itself (the stand-in for a hub download), exported back to transformers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file

from helpers import EMBEDDED_CORPUS
from spanlm.config import from_dict, to_dict
from spanlm.data.blocks import BlockDataset, collate_blocks
from spanlm.data.prepare import prepare
from spanlm.data.shards import PreparedCorpus
from spanlm.errors import ConfigError, InputError
from spanlm.models import BackboneConfig, build_backbone
from spanlm.objectives import build_objective
from spanlm.pretrain.export import export_checkpoint
from spanlm.pretrain.recipe import Recipe
from spanlm.pretrain.run import pretrain
from spanlm.train import checkpoint as ckpt
from spanlm.train.metrics import read_metrics
from toy_objective import losses, toy_recipe

QUIET = {"log": lambda *_: None}
TINY = {"hidden_size": 32, "num_layers": 3, "num_heads": 2, "intermediate_size": 48, "max_position_embeddings": 64}


def similar_words(prepared: Path) -> dict:
    """MacBERT's similar-word table from a few synonyms (the data settings every recipe here repeats)."""
    synonyms = prepared.parent / "synonyms.tsv"
    return {"similar_words": "synonyms", "similar_words_file": str(synonyms), "similar_words_min_count": 1}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("modern") / "prepared"
    (out.parent / "synonyms.tsv").write_text("said\treplied\nqueen\tking\nlittle\tsmall\n", encoding="utf-8")
    data = {"inputs": [str(EMBEDDED_CORPUS / "alice_in_wonderland.txt")], "prepared_dir": str(out)}
    recipe = from_dict(Recipe, {"data": {**data, **similar_words(out)}, "tokenizer": {"vocab_size": 500}})
    return prepare(recipe, **QUIET)


def stock_masked_lm(family: str, corpus: PreparedCorpus, directory: Path, seed: int = 0) -> Path:
    """A tiny ``*ForMaskedLM`` of ``family`` built by transformers, saved with the corpus's tokenizer beside it."""
    import transformers

    special = corpus.special_ids
    common = dict(
        vocab_size=corpus.vocab_size,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=2,
        intermediate_size=48,
        max_position_embeddings=64,
        pad_token_id=special["pad"],
        bos_token_id=special["cls"],
        eos_token_id=special["sep"],
    )
    torch.manual_seed(seed)
    if family == "modernbert":
        config = transformers.ModernBertConfig(
            **common, cls_token_id=special["cls"], sep_token_id=special["sep"], local_attention=8
        )
        model = transformers.ModernBertForMaskedLM(config)
    else:
        config = transformers.EuroBertConfig(**common, mask_token_id=special["mask"])
        model = transformers.EuroBertForMaskedLM(config)
    with torch.no_grad():  # a head that is not at its initial values, so "kept, not re-initialised" is visible
        for name, parameter in model.named_parameters():
            if "head" in name or "decoder" in name:
                parameter.add_(torch.randn_like(parameter) * 0.05)
    model.save_pretrained(directory)
    corpus.tokenizer.save_pretrained(directory)
    return directory


def recipe_for(
    prepared: Path, out: Path, family: str, objective: str = "mlm", path: str | None = None, packing=False, **train
):
    model = {"family": family, **TINY, "hidden_dropout": 0.0, "attention_dropout": 0.0}
    if family == "modernbert":
        model["local_attention"] = 8  # blocks of 32 tokens: the local layers see part of the block
    if path is not None:
        model["path"] = path
    data = {"packing": packing, **similar_words(prepared)}
    recipe = toy_recipe(prepared, out, data, model, objective=objective, batch_size=8, lr=1e-3, **train)
    recipe.masking.scheme = {"spanbert": "span", "macbert": "ngram"}.get(objective, recipe.masking.scheme)
    if objective == "electra":
        recipe.objective.electra.generator_width, recipe.objective.electra.generator_depth = 1.0, 0.5
        recipe.objective.electra.sharing = "gdes"
    return recipe


def masked_batch(objective, corpus: PreparedCorpus, seed: int = 0) -> dict:
    blocks = BlockDataset(corpus, 32)
    batch = collate_blocks([blocks[i] for i in range(6)], corpus.special_ids["pad"])
    return objective.masker(batch, np.random.default_rng(seed)).to_torch()


@pytest.mark.parametrize("family", ["modernbert", "eurobert"])
def test_from_scratch_takes_the_family_settings(prepared, family):
    corpus = PreparedCorpus(prepared)
    settings = {"rope_theta": 20000.0}
    if family == "modernbert":
        settings |= {"local_attention": 16, "global_attention_every": 2, "local_rope_theta": 500.0}
    model = build_backbone(BackboneConfig(family=family, **TINY, **settings), corpus)
    config = model.config
    assert config.model_type == family and config.vocab_size == corpus.vocab_size
    assert config.pad_token_id == corpus.special_ids["pad"]
    if family == "modernbert":
        assert config.local_attention == 16 and config.sliding_window == 8
        assert config.layer_types == ["full_attention", "sliding_attention", "full_attention"]
        assert config.rope_parameters["full_attention"]["rope_theta"] == 20000.0
        assert config.rope_parameters["sliding_attention"]["rope_theta"] == 500.0
        assert config.tie_word_embeddings and config.embedding_dropout == 0.1
    else:
        assert config.rope_parameters["rope_theta"] == 20000.0 and config.mask_token_id == corpus.special_ids["mask"]
        assert not config.tie_word_embeddings  # EuroBERT's own: an output embedding of its own
    default = build_backbone(BackboneConfig(family=family, **TINY), corpus).config
    if family == "modernbert":  # ModernBertConfig's defaults: window 128, every third layer global, 160k / 10k
        assert default.local_attention == 128 and default.layer_types[0] == "full_attention"
        assert default.rope_parameters["full_attention"]["rope_theta"] == 160000.0


@pytest.mark.parametrize(
    "model, message",
    [
        ({"family": "bert", "local_attention": 64}, "local_attention is a setting of the modernbert family"),
        ({"family": "eurobert", "global_attention_every": 3}, "global_attention_every is a setting of the modernbert"),
        ({"family": "roberta", "rope_theta": 10000.0}, "rope_theta is a setting of the modernbert and eurobert"),
        ({"family": "modernbert", "local_attention": 7}, "local_attention must be even"),
        ({"family": "modernbert", "rope_theta": -1.0}, "rope_theta must be positive"),
        ({"family": "modernbert2"}, "model.family"),
    ],
)
def test_a_setting_the_family_lacks_is_a_one_line_config_error(model, message):
    with pytest.raises(ConfigError, match=message) as error:
        from_dict(Recipe, {"model": model})
    assert "\n" not in str(error.value)


def test_a_directory_of_the_other_family_is_refused_naming_both(prepared, tmp_path):
    corpus = PreparedCorpus(prepared)
    path = stock_masked_lm("modernbert", corpus, tmp_path / "modernbert")
    with pytest.raises(InputError, match="holds a 'modernbert' model but model.family is 'eurobert'"):
        build_backbone(BackboneConfig(family="eurobert", path=str(path)), corpus)


@pytest.mark.parametrize("family", ["modernbert", "eurobert"])
@pytest.mark.slow
def test_the_first_loss_on_a_continued_checkpoint_is_the_stock_masked_lm_loss(prepared, tmp_path, family):
    """The checkpoint's MLM head is kept, not re-initialised: spanlm's loss on a masked batch is what the stock
    ``*ForMaskedLM`` computes on the same batch."""
    import transformers

    corpus = PreparedCorpus(prepared)
    path = stock_masked_lm(family, corpus, tmp_path / family)
    for objective_name in ("mlm", "spanbert", "macbert"):
        objective = build_objective(recipe_for(prepared, tmp_path / "run", family, objective_name, str(path)), corpus)
        assert objective.head_report["mlm_head"].startswith("loaded")
        if objective_name == "spanbert":
            assert objective.head_report["sbo_head"] == "fresh (not in the checkpoint)"
        batch = masked_batch(objective, corpus)
        objective.eval()
        with torch.no_grad():
            ours = objective(batch)["mlm_loss"]
        stock = transformers.AutoModelForMaskedLM.from_pretrained(path).eval()
        labels = torch.full_like(batch["input_ids"], -100)
        labels.view(-1)[batch["target_index"]] = batch["target_labels"]
        with torch.no_grad():
            theirs = stock(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"].long(), labels=labels
            ).loss
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family, objective", [("modernbert", "spanbert"), ("eurobert", "electra")])
@pytest.mark.slow
def test_resume_is_bit_exact_and_the_export_is_the_family_task_model(prepared, tmp_path, family, objective):
    """2N = N + resume + N, on packed batches; the export loads in ``AutoModelForMaskedLM`` (ELECTRA: its
    generator) with the logits spanlm computes at the masked positions, and in the token-classification / QA
    classes transformers has."""
    import transformers

    full = pretrain(
        recipe_for(prepared, tmp_path / "full", family, objective, packing=True, max_steps=4, save_every=2), **QUIET
    )
    resumed = pretrain(
        recipe_for(
            prepared, tmp_path / "resumed", family, objective, packing=True, max_steps=4, save_every=2, num_workers=1
        ),
        resume=str(ckpt.step_dir(full, 2)),
        **QUIET,
    )
    assert {s: v for s, v in losses(full).items() if s > 2} == losses(resumed)
    assert yaml.safe_load((full / "config.yaml").read_text(encoding="utf-8"))["data"]["packing"] is True
    final_full = load_file(str(ckpt.step_dir(full, 4) / "model.safetensors"))
    final_resumed = load_file(str(ckpt.step_dir(resumed, 4) / "model.safetensors"))
    assert all(torch.equal(final_full[k], final_resumed[k]) for k in final_full)

    out = export_checkpoint(ckpt.step_dir(full, 4), tmp_path / "export")
    corpus = PreparedCorpus(prepared)
    spanlm_objective = build_objective(recipe_for(prepared, tmp_path / "again", family, objective, str(out)), corpus)
    spanlm_objective.eval()
    batch = masked_batch(spanlm_objective, corpus, seed=1)
    masked_lm_dir = out / "generator" if objective == "electra" else out
    backbone = spanlm_objective.generator if objective == "electra" else spanlm_objective.backbone
    stock = transformers.AutoModelForMaskedLM.from_pretrained(masked_lm_dir).eval()
    assert type(stock).__name__ == {"modernbert": "ModernBertForMaskedLM", "eurobert": "EuroBertForMaskedLM"}[family]
    with torch.no_grad():
        hidden = backbone(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"].long()).last_hidden_state
        ours = spanlm_objective.mlm_head(hidden.flatten(0, 1)[batch["target_index"]])
        theirs = stock(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"].long()).logits
    torch.testing.assert_close(ours, theirs.flatten(0, 1)[batch["target_index"]], rtol=1e-5, atol=1e-5)
    tokenizer = transformers.AutoTokenizer.from_pretrained(masked_lm_dir)  # fill-mask gives spanlm's guesses
    fill = transformers.pipeline("fill-mask", model=stock, tokenizer=tokenizer, top_k=3)
    text = f"alice was not a {tokenizer.mask_token} surprised"
    encoded = tokenizer(text, return_tensors="pt")
    at = int((encoded["input_ids"][0] == tokenizer.mask_token_id).nonzero())
    with torch.no_grad():
        hidden = backbone(**encoded).last_hidden_state[0, at : at + 1]
        ours = spanlm_objective.mlm_head(hidden)[0].topk(3).indices.tolist()
    assert [guess["token"] for guess in fill(text)] == ours
    token_classes = transformers.AutoModelForTokenClassification.from_pretrained(out, num_labels=3)
    assert type(token_classes).__name__.startswith({"modernbert": "ModernBert", "eurobert": "EuroBert"}[family])
    if family == "modernbert":  # transformers has no EuroBertForQuestionAnswering
        transformers.AutoModelForQuestionAnswering.from_pretrained(out)


@pytest.mark.parametrize("family", ["modernbert", "eurobert"])
@pytest.mark.slow
def test_ner_and_qa_fine_tune_and_predict_from_the_export(prepared, tmp_path, family, capsys):
    import json

    from helpers import REPO, write_wnut_recipe
    from spanlm.cli import main

    run = pretrain(recipe_for(prepared, tmp_path / "pretrain", family, max_steps=2), **QUIET)
    export = export_checkpoint(ckpt.step_dir(run, 2), tmp_path / "export")
    (tmp_path / "ner").mkdir()
    ner = write_wnut_recipe(export, tmp_path / "ner" / "run", steps=2)
    assert main(["ner", "train", str(ner)]) == 0, capsys.readouterr().err
    model = tmp_path / "ner" / "run" / "model"
    assert main(["ner", "predict", str(model), "--text", "Holmes met Watson in London .", "--threshold=-1e9"]) == 0
    (line,) = [json.loads(x) for x in capsys.readouterr().out.splitlines()[-1:]]
    assert line["entities"]
    from spanlm.models.hf_model import EncoderConfig, load_hf_model

    tuned = load_hf_model(export, EncoderConfig(path=str(export), dropout=0.2)).config  # the family's own dropouts
    names = {
        "modernbert": ("embedding_dropout", "mlp_dropout", "attention_dropout"),
        "eurobert": ("attention_dropout",),
    }
    assert all(getattr(tuned, name) == 0.2 for name in names[family])
    squad = REPO / "tests" / "fixtures" / "qa" / "squad_v2_sample.json"
    qa = tmp_path / "qa.yaml"
    qa.write_text(
        yaml.safe_dump(
            {
                "model": {"path": str(export)},
                "data": {
                    "train": str(squad),
                    "dev": str(squad),
                    "max_length": 48,
                    "doc_stride": 16,
                    "max_query_length": 16,
                },
                "qa": {"metric": "squad", "no_answer": True},
                "train": {
                    "output_dir": str(tmp_path / "qa"),
                    "max_steps": 2,
                    "batch_size": 4,
                    "warmup_steps": 0,
                    "eval_every": 2,
                    "num_workers": 0,
                    "device": "cpu",
                },
                "logging": {"report_to": [], "progress": False},
            }
        )
    )
    assert main(["qa", "train", str(qa)]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["questions"] == 6


def test_charbert_refuses_a_modern_backbone_in_one_line(prepared):
    from spanlm.models.charbert import CharChannelConfig, DualChannel

    corpus = PreparedCorpus(prepared)
    backbone = build_backbone(BackboneConfig(family="modernbert", **TINY), corpus)
    with pytest.raises(InputError, match="CharBERT runs over bert, roberta, electra backbones, not 'modernbert'"):
        DualChannel(backbone, CharChannelConfig(char_vocab_size=50, hidden_size=32))


@pytest.mark.parametrize("family", ["modernbert", "eurobert"])
@pytest.mark.slow
def test_the_cpu_backend_computes_the_same_losses_padded_and_packed(prepared, tmp_path, family):
    """``spanlm.accel`` as the Trainer applies it (FastDropout's SDPA, the fused cross-entropy, the tied gradient)
    keeps ModernBERT's window and EuroBERT's untied decoder: the same losses as the model as built."""
    import copy

    from spanlm import accel
    from spanlm.data.packing import pack_masked

    corpus = PreparedCorpus(prepared)
    plain = build_objective(recipe_for(prepared, tmp_path / "run", family, "spanbert"), corpus)
    fast = copy.deepcopy(plain)
    accel.apply(fast, torch.device("cpu"))
    plain.eval(), fast.eval()
    blocks = BlockDataset(corpus, 32)
    masked = plain.masker(collate_blocks([blocks[i] for i in range(6)], 0), np.random.default_rng(3))
    for batch in (masked.to_torch(), pack_masked(masked, corpus.special_ids["pad"]).to_torch()):
        with torch.no_grad():
            ours, theirs = fast(batch), plain(batch)
        for part in ("mlm_loss", "sbo_loss"):
            torch.testing.assert_close(ours[part], theirs[part], rtol=1e-5, atol=1e-5)


def inverse_frequencies(theta: float, head_dim: int) -> torch.Tensor:
    """RoPE's rotary frequencies for base ``theta`` (Su et al. 2021): theta^(−2i/d)."""
    return 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim)


@pytest.mark.parametrize("family", ["modernbert", "eurobert"])
def test_a_released_checkpoint_continues_with_the_rope_bases_the_recipe_states(prepared, tmp_path, family):
    """A context extension of a released model: its config's RoPE bases (ModernBERT's global and local) and positions
    replaced by the recipe's, its rotary tables built from them, every weight as released; unstated, its own."""
    corpus = PreparedCorpus(prepared)
    stock = stock_masked_lm(family, corpus, tmp_path / "stock")
    settings = {"rope_theta": 160000.0, "max_position_embeddings": 256}
    if family == "modernbert":
        settings |= {"local_rope_theta": 20000.0}
    extended = build_backbone(BackboneConfig(family=family, path=str(stock), **settings), corpus)
    kept = build_backbone(BackboneConfig(family=family, path=str(stock)), corpus)
    head_dim = 32 // 2
    tables = dict(extended.rotary_emb.named_buffers())
    if family == "modernbert":
        assert extended.config.rope_parameters["full_attention"]["rope_theta"] == 160000.0
        assert torch.allclose(tables["full_attention_inv_freq"], inverse_frequencies(160000.0, head_dim))
        assert torch.allclose(tables["sliding_attention_inv_freq"], inverse_frequencies(20000.0, head_dim))
        assert extended.config.sliding_window == kept.config.sliding_window  # the window as released
    else:
        assert extended.config.rope_parameters["rope_theta"] == 160000.0
        assert torch.allclose(tables["inv_freq"], inverse_frequencies(160000.0, head_dim))
    assert extended.config.max_position_embeddings == 256 and kept.config.max_position_embeddings == 64
    assert kept.config.rope_parameters != extended.config.rope_parameters
    released, loaded = kept.state_dict(), extended.state_dict()
    assert all(torch.equal(released[k], loaded[k]) for k in released if "inv_freq" not in k)


def test_a_released_modernbert_runs_only_the_extension_and_decay_phases(prepared, tmp_path):
    """The curriculum's later phases from a stock ModernBertForMaskedLM (written by transformers) and the tokenizer
    it came with: the extension at a longer block and a 160k global base, the decay at a lower masking rate; each
    phase's export is a transformers directory whose config and rotary tables carry the extended base."""
    from transformers import AutoModel

    corpus = PreparedCorpus(prepared)
    stock = stock_masked_lm("modernbert", corpus, tmp_path / "stock")
    recipe = recipe_for(
        prepared, tmp_path / "run", "modernbert", path=str(stock), schedule="wsd", warmup_steps=0, max_steps=5
    )
    recipe.tokenizer.path = str(stock)
    recipe.data.prepared_dir = str(tmp_path / "prepared")
    recipe = from_dict(
        Recipe,
        {
            **to_dict(recipe),
            "phases": [
                {"name": "extend", "steps": 3, "set": {"data.max_len": 48, "model.rope_theta": 160000.0}},
                {"name": "decay", "steps": 2, "decay": True, "set": {"masking.mlm.rate": 0.1}},
            ],
        },
    )
    run = pretrain(recipe, **QUIET)
    for phase in ("extend", "decay"):
        export = run / f"phase-{phase}"
        config = json.loads((export / "config.json").read_text(encoding="utf-8"))
        assert config["rope_parameters"]["full_attention"]["rope_theta"] == 160000.0
        model = AutoModel.from_pretrained(str(export))
        assert torch.allclose(model.rotary_emb.full_attention_inv_freq, inverse_frequencies(160000.0, 16))
    assert [r["phase"] for r in read_metrics(run) if r["kind"] == "train"] == ["extend"] * 3 + ["decay"] * 2


def test_a_continued_modernbert_says_which_of_its_settings_the_recipe_replaces(prepared, tmp_path):
    """A shipped ModernBERT recipe states a window; continuing a checkpoint with another, the run says it replaces
    the checkpoint's (it changed the model's outputs without a word)."""
    corpus = PreparedCorpus(prepared)
    stock = stock_masked_lm("modernbert", corpus, tmp_path / "stock")  # a window of 8
    lines = []
    for window, name in ((16, "other"), (8, "same")):
        recipe = recipe_for(prepared, tmp_path / name, "modernbert", path=str(stock), max_steps=1)
        recipe.model.local_attention = window
        recipe.tokenizer.path = str(stock)
        recipe.data.prepared_dir = str(tmp_path / "prepared")
        pretrain(recipe, log=lines.append)
    said = [line for line in lines if "the recipe's settings replace the checkpoint's" in line]
    assert said == [f"{stock}: the recipe's settings replace the checkpoint's: local_attention 8 → 16"]
