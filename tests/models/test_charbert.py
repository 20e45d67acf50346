"""CharBERT's dual channel: shared layers, char encoder, fusion, backbones, save/load, the fine-tuning encoder."""

from __future__ import annotations

import pytest
import torch

from helpers import tiny_backbone
from spanlm.data.chars import CharFeaturizer, Spelling, build_char_vocab
from spanlm.data.shards import PreparedCorpus
from spanlm.models import BackboneConfig, build_backbone
from spanlm.models.charbert import CharBertEncoder, CharChannelConfig, DualChannel
from spanlm.models.encoder import load_encoder
from spanlm.models.hf_model import EncoderConfig
from spanlm.models.modeling_charbert import CharEncoder, Fusion, char_inputs_to_torch

TEXTS = ["Alice was beginning to get very tired of sitting by her sister.", "Holmes examined the mechanism."]


@pytest.fixture(scope="module")
def corpus(embedded_prepared):
    return PreparedCorpus(embedded_prepared)


@pytest.fixture(scope="module")
def char_vocab(corpus):
    return build_char_vocab(corpus, 100)


def dual(corpus, char_vocab, family="bert", fusion="shared", **extra):
    backbone = tiny_backbone(corpus, family, **extra)
    config = CharChannelConfig(
        char_vocab_size=char_vocab.size, hidden_size=32, char_embedding_size=16, fusion=fusion, num_layers=2
    )
    return DualChannel(backbone, config).eval()


def featurize(tokenizer, char_vocab, texts=TEXTS):
    encoding = tokenizer(texts, padding=True, return_offsets_mapping=True, return_tensors="np")
    featurizer = CharFeaturizer(
        char_vocab,
        Spelling.from_tokenizer(tokenizer, char_vocab),
        tokenizer.pad_token_id,
        tokenizer.unk_token_id,
        tokenizer.backend_tokenizer.normalizer,
    )
    chars = featurizer(encoding["input_ids"], encoding["offset_mapping"], texts)
    return {
        "input_ids": torch.from_numpy(encoding["input_ids"]).long(),
        "attention_mask": torch.from_numpy(encoding["attention_mask"]).long(),
        **char_inputs_to_torch(chars),
    }


def test_the_same_layer_object_serves_both_channels(corpus, char_vocab):
    model = dual(corpus, char_vocab)
    calls = []
    hooks = [
        layer.register_forward_hook(lambda module, args, output, i=i: calls.append((i, id(module))))
        for i, layer in enumerate(model.layers)
    ]
    token, char = model(featurize(corpus.tokenizer, char_vocab))
    for hook in hooks:
        hook.remove()
    # Every layer runs twice per forward (token channel, char channel), and there are no other layers.
    assert [i for i, _ in calls] == [0, 0, 1, 1]
    assert calls[0][1] == calls[1][1] and calls[2][1] == calls[3][1]
    layer_types = {type(m) for m in model.modules() if type(m).__name__.endswith("Layer")}
    assert sum(isinstance(m, tuple(layer_types)) for m in model.modules()) == 2
    assert token.shape == char.shape == (2, token.shape[1], 32)


def test_shared_and_per_layer_fusion(corpus, char_vocab):
    shared = dual(corpus, char_vocab, fusion="shared")
    per_layer = dual(corpus, char_vocab, fusion="per_layer")
    assert len(shared.fusions) == 1 and shared.fusion(0) is shared.fusion(1)
    assert len(per_layer.fusions) == 2 and per_layer.fusion(0) is not per_layer.fusion(1)
    fusion = shared.fusion(0)
    assert fusion.token_linear.bias is None and fusion.char_linear.bias is None
    assert (fusion.conv.in_channels, fusion.conv.out_channels, fusion.conv.kernel_size, fusion.conv.padding) == (
        64,
        32,
        (3,),
        (1,),
    )


def test_fusion_residual_paths_and_kernel_width():
    torch.manual_seed(0)
    fusion = Fusion(8, eps=1e-12).eval()
    token, char = torch.randn(2, 7, 8), torch.randn(2, 7, 8)
    fused_token, fused_char = fusion(token, char)
    assert fused_token.shape == fused_char.shape == (2, 7, 8)
    # The shared conv output is added to each channel before its own LayerNorm.
    joint = torch.cat([fusion.token_linear(token), fusion.char_linear(char)], dim=-1)
    shared = fusion.conv(joint.transpose(1, 2)).transpose(1, 2)
    torch.testing.assert_close(fused_token, fusion.token_norm(token + shared))
    torch.testing.assert_close(fused_char, fusion.char_norm(char + shared))
    # With the mixing path silenced only the residuals remain.
    with torch.no_grad():
        fusion.conv.weight.zero_()
        fusion.conv.bias.zero_()
    silent_token, silent_char = fusion(token, char)
    torch.testing.assert_close(silent_token, fusion.token_norm(token))
    torch.testing.assert_close(silent_char, fusion.char_norm(char))
    # Kernel 3: a change of the char channel at position 3 reaches the token channel at 2, 3, 4 only.
    torch.manual_seed(0)
    fusion = Fusion(8, eps=1e-12).eval()
    changed = char.clone()
    changed[:, 3] += 1.0
    moved = (fusion(token, changed)[0] - fusion(token, char)[0]).abs().sum(dim=(0, 2))
    assert (moved[[2, 3, 4]] > 0).all() and (moved[[0, 1, 5, 6]] == 0).all()


def test_char_encoder_reads_first_and_last_char_and_ignores_padding():
    torch.manual_seed(0)
    encoder = CharEncoder(CharChannelConfig(char_vocab_size=20, hidden_size=16, char_embedding_size=6)).eval()
    ids = torch.tensor([[5, 6, 0, 7, 0, 0, 0], [8, 9, 10, 0, 11, 0, 0]])
    lengths = torch.tensor([5, 6])
    first = torch.tensor([[0, 3], [0, 4]])
    last = torch.tensor([[1, 3], [2, 4]])
    vectors = encoder(ids, lengths, first, last)
    assert vectors.shape == (2, 2, 16)
    # Reference: each row alone, without padding, read forwards and backwards.
    for row in range(2):
        embedded = encoder.embedding(ids[row : row + 1, : lengths[row]])  # (1, C, 6)
        backward = encoder.backward_gru(embedded.flip(1))[0].flip(1)
        output = torch.cat([encoder.forward_gru(embedded)[0], backward], dim=-1)  # (1, C, 8)
        for token in range(2):
            expected = torch.cat([output[0, first[row, token]], output[0, last[row, token]]])
            torch.testing.assert_close(vectors[row, token], expected)
    # Extra padding after a row's stream changes nothing (the backward direction never sees it).
    padded = torch.cat([ids, torch.zeros(2, 9, dtype=torch.long)], dim=1)
    torch.testing.assert_close(encoder(padded, lengths, first, last), vectors)


@pytest.mark.parametrize("family", ["roberta", "electra"])
def test_runs_over_roberta_and_electra(corpus, char_vocab, family):
    extra = {"embedding_size": 16} if family == "electra" else {}
    model = dual(corpus, char_vocab, family, **extra)
    token, char = model(featurize(corpus.tokenizer, char_vocab))
    assert token.shape == char.shape and token.shape[-1] == 32
    assert torch.isfinite(token).all() and torch.isfinite(char).all()


def test_padding_does_not_change_a_row(corpus, char_vocab):
    model = dual(corpus, char_vocab)
    both = model(featurize(corpus.tokenizer, char_vocab))
    alone = model(featurize(corpus.tokenizer, char_vocab, TEXTS[1:]))
    length = alone[0].shape[1]
    torch.testing.assert_close(both[0][1, :length], alone[0][0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(both[1][1, :length], alone[1][0], atol=1e-5, rtol=1e-5)


def test_save_load_gives_identical_outputs_and_an_automodel_backbone(corpus, char_vocab, tmp_path):
    from transformers import AutoModel

    model = dual(corpus, char_vocab)
    encoder = CharBertEncoder(model, corpus.tokenizer, char_vocab)
    encoder.save(tmp_path)
    loaded = load_encoder(EncoderConfig(path=str(tmp_path))).eval()
    assert isinstance(loaded, CharBertEncoder) and loaded.hidden_size == 64 == 2 * model.config.hidden_size
    batch = featurize(loaded.tokenizer, loaded.char_vocab)
    torch.testing.assert_close(loaded(batch), encoder(batch), atol=0, rtol=0)
    # The featurizer is built from the directory alone and spells as the original did.
    again = loaded.featurizer()
    encoding = corpus.tokenizer(TEXTS, padding=True, return_offsets_mapping=True, return_tensors="np")
    ours = char_inputs_to_torch(again(encoding["input_ids"], encoding["offset_mapping"], TEXTS))
    for key, value in ours.items():
        assert torch.equal(value, batch[key])
    # The subword backbone alone is a plain Hugging Face model.
    plain = AutoModel.from_pretrained(str(tmp_path))
    for name, tensor in model.backbone.state_dict().items():
        assert torch.equal(plain.state_dict()[name], tensor), name
    # init: random keeps the architecture, not the weights.
    torch.manual_seed(1)
    fresh = load_encoder(EncoderConfig(path=str(tmp_path), init="random"))
    assert not torch.equal(fresh.model.fusion(0).conv.weight, model.fusion(0).conv.weight)


def test_forward_without_char_inputs_is_a_clear_error(corpus, char_vocab):
    encoder = CharBertEncoder(dual(corpus, char_vocab), corpus.tokenizer, char_vocab)
    ids = torch.tensor([corpus.tokenizer("Alice")["input_ids"]])
    with pytest.raises(KeyError, match="char_ids"):
        encoder({"input_ids": ids, "attention_mask": torch.ones_like(ids)})


def test_rejects_a_backbone_it_cannot_pair(corpus, char_vocab):
    from spanlm.errors import InputError

    backbone = build_backbone(
        BackboneConfig(
            family="deberta-v2",
            hidden_size=32,
            num_layers=1,
            num_heads=2,
            intermediate_size=64,
            max_position_embeddings=64,
        ),
        corpus,
    )
    with pytest.raises(InputError, match="deberta-v2"):
        DualChannel(backbone, CharChannelConfig(char_vocab_size=10, hidden_size=32))
