"""The export is each family's stock *ForSequenceClassification: transformers' own class loads it with the labels
and computes the logits spanlm's objective computes (no mocks: the real classes)."""

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


@pytest.mark.parametrize("family", ["bert", "roberta", "electra", "deberta-v2", "modernbert", "eurobert"])
@pytest.mark.parametrize("labels", [["neg", "neutral", "pos"], None], ids=["classes", "regression"])
def test_the_export_is_the_stock_class(family, labels, make_cls_encoder, tmp_path):
    from transformers import AutoModelForSequenceClassification

    encoder = load_encoder(EncoderConfig(path=str(make_cls_encoder(family, tmp_path / "encoder"))))
    torch.manual_seed(1)
    objective = ClsObjective(encoder, labels).eval()
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
    again = ClsObjective(load_encoder(EncoderConfig(path=str(out))), labels)
    again.head.load_state_dict(head_state(out, again))
    for name, tensor in objective.head.state_dict().items():
        torch.testing.assert_close(again.head.state_dict()[name], tensor)


def test_packed_and_padded_batches_give_the_same_logits(cls_encoder_dir):
    encoder = load_encoder(EncoderConfig(path=str(cls_encoder_dir)))
    objective = ClsObjective(encoder, ["0", "1"]).eval()
    features = make_features(encoder.tokenizer, EXAMPLES, 64, None)
    with torch.no_grad():
        padded = objective(features.batch(range(3), targets=False))["logits"]
        features.packed = True
        packed = objective(features.batch(range(3), targets=False))["logits"]
    torch.testing.assert_close(packed, padded, atol=1e-5, rtol=1e-4)
