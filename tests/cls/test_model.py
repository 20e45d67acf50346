"""The export is each family's stock *ForSequenceClassification where the stock class pools as the head does:
transformers' own class loads it with the labels and computes the logits spanlm's objective computes (no mocks: the
real classes); a mean-pooled head of a [CLS] family is the stock modules over the mean, in spanlm's layout."""

from __future__ import annotations

import pytest
import torch

from spanlm.cls.data import Example
from spanlm.cls.features import make_features
from spanlm.cls.model import ClsObjective, head_state
from spanlm.models.encoder import load_encoder
from spanlm.models.hf_model import EncoderConfig

EXAMPLES = [
    Example("A plane is taking off.", "An air plane is taking off.", None, "a"),
    Example("A man is playing a large flute in the park.", "A man plays.", None, "b"),
    Example("it 's a charming and often affecting journey .", "no", None, "c"),
]


STOCK = [(family, "cls") for family in ("bert", "roberta", "electra", "deberta-v2", "modernbert", "eurobert")]


@pytest.mark.parametrize("family, pooling", [*STOCK, ("modernbert", "mean"), ("eurobert", "mean")])
@pytest.mark.parametrize("labels", [["neg", "neutral", "pos"], None], ids=["classes", "regression"])
def test_the_export_is_the_stock_class(family, pooling, labels, make_cls_encoder, tmp_path):
    from transformers import AutoModelForSequenceClassification

    encoder = load_encoder(EncoderConfig(path=str(make_cls_encoder(family, tmp_path / "encoder"))))
    torch.manual_seed(1)
    objective = ClsObjective(encoder, labels, pooling).eval()
    assert objective.stock
    with torch.no_grad():  # a head that is not all zeros, so a misplaced weight shows
        for parameter in objective.head.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
    features = make_features(encoder.tokenizer, EXAMPLES, 64, None)
    with torch.no_grad():
        ours = objective(features.batch(range(len(EXAMPLES)), targets=False))["logits"]
    out = tmp_path / "model"
    out.mkdir()
    objective.export(out)

    stock = AutoModelForSequenceClassification.from_pretrained(str(out)).eval()
    assert type(stock).__name__.endswith("ForSequenceClassification")
    first_token = "bos" if family == "eurobert" else "cls"  # EuroBERT's name for it
    assert getattr(stock.config, "classifier_pooling", None) in (None, first_token if pooling == "cls" else pooling)
    if labels is None:
        assert stock.config.problem_type == "regression" and stock.config.num_labels == 1
    else:
        assert stock.config.id2label == dict(enumerate(labels)) and stock.config.label2id["pos"] == 2
    inputs = encoder.tokenizer(
        [e.text for e in EXAMPLES], [e.text_pair for e in EXAMPLES], padding=True, return_tensors="pt"
    )
    with torch.no_grad():
        theirs = stock(**inputs).logits
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)

    # And back: spanlm's loader reads the head from the stock names.
    again = ClsObjective(load_encoder(EncoderConfig(path=str(out))), labels, pooling)
    again.head.load_state_dict(head_state(out, again))
    for name, tensor in objective.head.state_dict().items():
        torch.testing.assert_close(again.head.state_dict()[name], tensor)


@pytest.mark.parametrize("family", ["bert", "roberta", "electra", "deberta-v2"])
def test_a_mean_pooled_head_reads_the_tokens_mean_and_exports_in_spanlms_layout(family, make_cls_encoder, tmp_path):
    """cls.pooling: mean on a family whose stock head reads [CLS]: the stock class's own head modules applied to the
    mean of the real tokens' final states (padding excluded), exported with the head in spanlm's file and loaded
    back to the same logits."""
    from transformers import AutoModelForSequenceClassification

    encoder = load_encoder(EncoderConfig(path=str(make_cls_encoder(family, tmp_path / "encoder"))))
    torch.manual_seed(1)
    objective = ClsObjective(encoder, ["0", "1"], "mean").eval()
    assert not objective.stock
    with torch.no_grad():
        for parameter in objective.head.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
    features = make_features(encoder.tokenizer, EXAMPLES, 64, None)
    batch = features.batch(range(len(EXAMPLES)), targets=False)
    with torch.no_grad():
        ours = objective(batch)["logits"]
        # the stock class with spanlm's weights, its head fed the mean in place of the first token
        stock = AutoModelForSequenceClassification.from_config(objective.encoder.model.config).eval()
        stock.base_model.load_state_dict(objective.encoder.model.state_dict(), strict=False)  # BERT: pooler below
        names = objective.head.export_names()
        stock.load_state_dict({names[k]: v for k, v in objective.head.state_dict().items()}, strict=False)
        inputs = encoder.tokenizer(
            [e.text for e in EXAMPLES], [e.text_pair for e in EXAMPLES], padding=True, return_tensors="pt"
        )
        hidden = stock.base_model(**inputs).last_hidden_state
        weights = inputs["attention_mask"].unsqueeze(-1).float()
        mean = ((hidden * weights).sum(1) / weights.sum(1)).unsqueeze(1)  # (B, 1, H)
        if family in ("roberta", "electra"):
            theirs = stock.classifier(mean)
        else:
            pooler = stock.bert.pooler if family == "bert" else stock.pooler
            theirs = stock.classifier(pooler(mean))
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)
    out = tmp_path / "model"
    out.mkdir()
    objective.export(out)
    again = ClsObjective(load_encoder(EncoderConfig(path=str(out))), ["0", "1"], "mean").eval()
    again.head.load_state_dict(head_state(out, again))
    with torch.no_grad():
        torch.testing.assert_close(again(batch)["logits"], ours, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_packed_and_padded_batches_give_the_same_logits(cls_encoder_dir, pooling):
    encoder = load_encoder(EncoderConfig(path=str(cls_encoder_dir)))
    objective = ClsObjective(encoder, ["0", "1"], pooling).eval()
    features = make_features(encoder.tokenizer, EXAMPLES, 64, None)
    with torch.no_grad():
        padded = objective(features.batch(range(3), targets=False))["logits"]
        features.packed = True
        packed = objective(features.batch(range(3), targets=False))["logits"]
    torch.testing.assert_close(packed, padded, atol=1e-5, rtol=1e-4)
