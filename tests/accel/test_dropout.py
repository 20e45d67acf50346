"""FastDropout: Bernoulli(p) to 2⁻¹⁶, the expectation kept, reproducible; its SDPA attention equals PyTorch's."""

import json

import pytest
import torch
from torch.nn import functional as F

from spanlm.accel.dropout import (
    ATTENTION_NAME,
    FastDropout,
    fast_dropout,
    fast_dropout_sdpa_attention,
    use_fast_dropout,
)


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_drop_rate_and_scale_match_bernoulli_dropout(p):
    torch.manual_seed(0)
    x = torch.ones(1_000_000, requires_grad=True)
    out = fast_dropout(x, p)
    dropped = out == 0
    # Binomial(10⁶, p): 4 standard deviations are below 0.0021 for every p here.
    assert abs(dropped.float().mean().item() - p) < 4 * (p * (1 - p) / 1e6) ** 0.5
    levels = round(p * 65536)
    torch.testing.assert_close(out[~dropped], torch.full_like(out[~dropped], 65536 / (65536 - levels)))
    assert abs(out.mean().item() - 1.0) < 0.004  # inverted dropout keeps the expectation
    out.backward(torch.full_like(out, 2.0))
    assert torch.equal(x.grad, 2.0 * out.detach())  # the gradient goes through the same multiplier


def test_eval_zero_p_and_odd_shapes():
    x = torch.randn(3, 5, 7)
    assert fast_dropout(x, 0.1, training=False) is x
    assert fast_dropout(x, 0.0) is x
    assert torch.equal(fast_dropout(x, 1.0), torch.zeros_like(x))  # F.dropout's p = 1
    nearly_one = 1 - 2**-18  # rounds to all 2¹⁶ levels dropped: no finite scale, F.dropout's job
    torch.manual_seed(2)
    expected = F.dropout(x, nearly_one)
    torch.manual_seed(2)
    assert torch.equal(fast_dropout(x, nearly_one), expected)
    torch.manual_seed(1)
    out = fast_dropout(x, 0.5)  # 105 elements: not a multiple of the four masks per random word
    assert out.shape == x.shape and ((out == 0) | torch.isclose(out, 2 * x)).all()


def test_reproducible_from_the_torch_seed_and_different_per_call():
    x = torch.ones(4096)
    torch.manual_seed(7)
    first, second = fast_dropout(x, 0.2), fast_dropout(x, 0.2)
    torch.manual_seed(7)
    assert torch.equal(fast_dropout(x, 0.2), first)
    assert not torch.equal(first, second)


def test_module_follows_train_and_eval():
    module = FastDropout(0.25)
    x = torch.ones(10_000)
    assert (module(x) == 0).any()
    module.eval()
    assert torch.equal(module(x), x)


def _attention_inputs(seed=0):
    generator = torch.Generator().manual_seed(seed)
    query, key, value = (torch.randn(2, 3, 9, 4, generator=generator, requires_grad=True) for _ in range(3))
    allowed = torch.ones(2, 1, 9, 9, dtype=torch.bool)
    allowed[1, :, :, 6:] = False  # the second sequence has 3 padding positions
    return query, key, value, allowed


def test_attention_math_path_equals_pytorch_sdpa_when_nothing_is_dropped():
    module = torch.nn.Module()
    query, key, value, allowed = _attention_inputs()
    # p below 2⁻¹⁷ drops nothing but still takes the training (math) path.
    output, weights = fast_dropout_sdpa_attention(module, query, key, value, allowed, dropout=1e-9, scaling=0.3)
    output.sum().backward()
    ours = [output.detach(), query.grad, key.grad, value.grad]
    assert weights is None and output.shape == (2, 9, 3, 4)  # (B, L, heads, head_dim), as transformers expects
    query, key, value, _ = _attention_inputs()
    expected = F.scaled_dot_product_attention(query, key, value, attn_mask=allowed, scale=0.3).transpose(1, 2)
    expected.sum().backward()
    for got, want in zip(ours, [expected.detach(), query.grad, key.grad, value.grad]):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_attention_drops_probabilities_in_training():
    module = torch.nn.Module()
    query, key, value, _ = _attention_inputs()
    value = torch.eye(9).expand(2, 3, 9, 9)  # the output rows are then the attention probabilities
    torch.manual_seed(3)
    probabilities, _ = fast_dropout_sdpa_attention(module, query, key, value, None, dropout=0.5, scaling=0.3)
    reference = torch.softmax(0.3 * query @ key.transpose(-1, -2), dim=-1).transpose(1, 2)
    kept = probabilities != 0
    assert 0.35 < kept.float().mean().item() < 0.65
    torch.testing.assert_close(probabilities[kept], 2 * reference[kept].detach())


def _tiny_bert():
    from transformers import AutoConfig, AutoModel

    config = AutoConfig.for_model(
        "bert",
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
    )
    torch.manual_seed(0)
    return AutoModel.from_config(config, attn_implementation="sdpa", add_pooling_layer=False)


def test_use_fast_dropout_changes_no_weight_and_no_saved_config(tmp_path):
    from transformers import AutoModel

    stock = _tiny_bert()
    model = use_fast_dropout(_tiny_bert())
    assert model.config._attn_implementation == ATTENTION_NAME
    assert not any(type(m) is torch.nn.Dropout for m in model.modules())
    assert model.state_dict().keys() == stock.state_dict().keys()
    ids = torch.randint(0, 50, (2, 10), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, 7:] = 0
    stock.eval(), model.eval()
    with torch.no_grad():
        expected = stock(input_ids=ids, attention_mask=mask).last_hidden_state
        torch.testing.assert_close(model(input_ids=ids, attention_mask=mask).last_hidden_state, expected)
    model.train()
    with torch.no_grad():
        assert not torch.equal(model(input_ids=ids, attention_mask=mask).last_hidden_state, expected)  # dropout is on
    model.save_pretrained(tmp_path)
    assert ATTENTION_NAME not in (tmp_path / "config.json").read_text()
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "bert"
    reloaded = AutoModel.from_pretrained(tmp_path).eval()  # stock transformers, stock attention
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=ids, attention_mask=mask).last_hidden_state, expected)


def test_compiled_graphs_use_pytorch_dropout_without_breaks():
    def layer(x, q, k, v):
        probabilities = fast_dropout_sdpa_attention(torch.nn.Module(), q, k, v, None, dropout=0.1)[0]
        return fast_dropout(x, 0.1) + probabilities.sum()

    x, q = torch.randn(4, 8), torch.randn(1, 2, 4, 8)
    explanation = torch._dynamo.explain(layer)(x, q, q, q)
    assert explanation.graph_break_count == 0
    assert "dropout" in str(explanation.graphs[0].code)
