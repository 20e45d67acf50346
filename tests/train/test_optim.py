"""Gradient clipping folded into fused AdamW's own pass equals clip_grad_norm_ followed by the step; the total norm."""

import pytest
import torch

from spanlm import accel
from spanlm.accel import native
from spanlm.train.config import TrainConfig
from spanlm.train.optim import Lamb, build_optimizer, clip_gradients, total_norm


def _model_with_gradients(scale: float, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.LayerNorm(5), torch.nn.Linear(5, 3))
    for p in model.parameters():
        p.grad = torch.randn_like(p) * scale
    return model


@pytest.mark.parametrize("optimizer", ["adamw", "lamb"])
@pytest.mark.parametrize("scale, max_norm", [(10.0, 1.0), (0.01, 1.0), (10.0, 0.0)])  # clipped, below the norm, off
def test_clip_gradients_equals_clip_grad_norm_then_step(optimizer, scale, max_norm):
    config = TrainConfig(optimizer=optimizer, lr=0.1, max_grad_norm=max_norm)
    results = []
    for folded in (False, True):
        model = _model_with_gradients(scale)
        opt = build_optimizer(model, config)
        for _ in range(2):  # the second step reuses the optimiser: no factor left over from the first
            if folded:
                norm = clip_gradients(opt, model.parameters(), max_norm)
            else:
                norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm if max_norm > 0 else float("inf"))
            opt.step()
        results.append(
            (norm, [p.detach().clone() for p in model.parameters()], [p.grad.clone() for p in model.parameters()])
        )
    (norm_ref, params_ref, grads_ref), (norm, params, grads) = results
    torch.testing.assert_close(norm, norm_ref)
    for got, expected in zip(params + grads, params_ref + grads_ref):
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-7)


def test_fused_adamw_takes_the_clip_factor_instead_of_a_pass_over_the_gradients():
    model = _model_with_gradients(10.0)
    opt = build_optimizer(model, TrainConfig(lr=0.1, max_grad_norm=1.0))
    before = [p.grad.clone() for p in model.parameters()]
    norm = clip_gradients(opt, model.parameters(), 1.0)
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), before))  # untouched until the step
    assert opt.grad_scale.item() == pytest.approx(norm.item() + 1e-6)
    opt.step()
    clipped = torch.sqrt(sum(p.grad.pow(2).sum() for p in model.parameters()))
    assert clipped.item() == pytest.approx(
        1.0, rel=1e-5
    )  # the step leaves the clipped gradients, as clip_grad_norm_ does


@pytest.mark.parametrize("path", ["cpu backend", "plain"])
def test_total_norm_of_a_large_table_is_the_float64_norm(path):
    if path == "cpu backend" and native.kernels() is None:
        pytest.skip("spanlm's native kernels cannot be built on this machine")
    norm = accel.gradient_norm("cpu" if path == "cpu backend" else "off", total_norm)
    generator = torch.Generator().manual_seed(0)
    table = torch.randn(8192, 256, generator=generator) * 1e-3  # 2²¹ elements: the row-wise path
    small = [torch.randn(256, 256, generator=generator) * 1e-3, torch.randn(256, generator=generator) * 1e-3]
    exact = torch.sqrt(sum(g.double().pow(2).sum() for g in [table, *small]))
    got = norm([table, *small])
    assert got.dtype == torch.float32 and got.dim() == 0
    assert abs(got.double() - exact) / exact < 1e-6  # get_total_norm: 3·10⁻⁵ here
    # The same quantity as get_total_norm, whose float32 accumulation is the less precise of the two.
    plain = torch.nn.utils.get_total_norm([table, *small])
    torch.testing.assert_close(got, plain, rtol=1e-3, atol=0.0)
    assert abs(got.double() - exact) <= abs(plain.double() - exact)
    if path == "plain":  # small gradients alone: get_total_norm itself
        assert norm is total_norm and torch.equal(total_norm(small), torch.nn.utils.get_total_norm(small))
    else:
        small_exact = torch.sqrt(sum(g.double().pow(2).sum() for g in small))
        assert abs(norm(small).double() - small_exact) / small_exact < 1e-6
        assert norm([]).item() == 0.0
    assert torch.isnan(norm([table.clone().fill_(float("nan")), *small]))  # non-finite stays visible
    assert torch.isinf(norm([torch.full((1024, 1024), float("inf")), *small]))
    transposed = table.t()  # a non-contiguous gradient: the same norm
    assert abs(norm([transposed, *small]).double() - exact) / exact < 1e-6


def test_a_lamb_step_reads_no_value_on_the_host(monkeypatch):
    model = _model_with_gradients(1.0)
    optimizer = Lamb(model.parameters(), lr=0.01)
    optimizer.step()  # state created
    reads = []
    for name in ("item", "__bool__", "__float__", "__int__", "tolist"):
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(
            torch.Tensor, name, lambda t, *a, _o=original, _n=name, **k: reads.append(_n) or _o(t, *a, **k)
        )
    optimizer.step()
    monkeypatch.undo()
    assert reads == []


class _EncoderAndHead(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.LayerNorm(5))
        self.head = torch.nn.Linear(5, 3)


def test_encoder_lr_gives_the_encoder_its_own_peak_rate_under_the_same_schedule():
    from spanlm.errors import ConfigError
    from spanlm.train.optim import build_scheduler

    model = _EncoderAndHead()
    config = TrainConfig(lr=1e-3, encoder_lr=1e-4, warmup_steps=2, max_steps=10)
    optimizer = build_optimizer(model, config)
    scheduler = build_scheduler(optimizer, config)
    lr_of = {id(p): group["lr"] for group in optimizer.param_groups for p in group["params"]}
    assert sorted(map(id, model.parameters())) == sorted(lr_of)  # every parameter in exactly one group
    assert {lr_of[id(p)] for p in model.encoder.parameters()} == {0.5e-4}  # warmup step 0 of 2: half the peak
    assert {lr_of[id(p)] for p in model.head.parameters()} == {0.5e-3}
    decays = {id(p): group["weight_decay"] for group in optimizer.param_groups for p in group["params"]}
    assert decays[id(model.encoder[1].weight)] == 0.0 and decays[id(model.encoder[0].weight)] == config.weight_decay
    optimizer.step()
    scheduler.step()
    assert sorted({group["lr"] for group in optimizer.param_groups}) == [1e-4, 1e-3]  # the peak, each its own
    with pytest.raises(ConfigError, match="train.encoder_lr"):
        build_optimizer(_model_with_gradients(1.0), config)
    with pytest.raises(ValueError, match="encoder_lr"):
        TrainConfig(encoder_lr=0.0)


@pytest.mark.parametrize("shape", ["linear", "cosine", "1-sqrt"])
def test_wsd_is_warmup_then_the_peak_then_the_decay_shape_to_zero(shape):
    """Warmup-stable-decay (Hu et al. 2024; Hägele et al. 2024): against its closed form at chosen steps."""
    import math

    from spanlm.train.optim import build_scheduler, lr_factor

    config = TrainConfig(max_steps=100, warmup_steps=10, schedule="wsd", decay_share=0.2, decay_shape=shape)
    decay = {
        "linear": lambda p: 1 - p,
        "cosine": lambda p: 0.5 * (1 + math.cos(math.pi * p)),
        "1-sqrt": lambda p: 1 - math.sqrt(p),
    }[shape]
    expected = {0: 0.1, 4: 0.5, 9: 1.0, 10: 1.0, 50: 1.0, 79: 1.0, 80: 1.0}
    expected.update({step: decay((step - 80) / 20) for step in (85, 90, 99)})
    expected[100] = 0.0
    for step, factor in expected.items():
        assert lr_factor(step, config) == pytest.approx(factor, abs=1e-12), step
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    scheduler = build_scheduler(optimizer, config)
    rates = []
    for _ in range(100):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert rates[90] == pytest.approx(0.5 * decay(0.5)) and rates[60] == 0.5


@pytest.mark.parametrize(
    "settings, message",
    [({"decay_share": 0.0}, r"decay_share must be in \(0, 1\]"), ({"decay_shape": "sqrt"}, "decay_shape")],
)
def test_bad_wsd_settings_are_one_line_config_errors(settings, message):
    from spanlm.config import from_dict
    from spanlm.errors import ConfigError
    from spanlm.pretrain.recipe import Recipe

    with pytest.raises(ConfigError, match=message):
        from_dict(Recipe, {"train": {"schedule": "wsd", **settings}})


class FineTuned(torch.nn.Module):
    """An encoder (a tiny BERT of 3 layers) and a task head, as a fine-tuning objective holds them."""

    def __init__(self):
        super().__init__()
        from transformers import BertConfig, BertModel

        config = BertConfig(
            vocab_size=50, hidden_size=8, num_hidden_layers=3, num_attention_heads=2, intermediate_size=16
        )
        self.encoder = BertModel(config)
        self.head = torch.nn.Linear(8, 2)


def test_layer_decay_gives_each_layer_its_rate_and_the_head_the_full_one():
    """ELECTRA's layer-wise decay: layer i of L at rate · d^(L + 1 − i), the embeddings at · d^(L + 2), the pooler
    above the layers at · d, the head at lr; with encoder_lr the encoder's rates start from it."""
    from spanlm.train.config import TrainConfig
    from spanlm.train.optim import build_optimizer

    model = FineTuned()
    for encoder_lr, base in ((None, 1e-3), (1e-4, 1e-4)):
        optimizer = build_optimizer(model, TrainConfig(lr=1e-3, encoder_lr=encoder_lr, layer_decay=0.5))
        rate = {id(p): group["lr"] for group in optimizer.param_groups for p in group["params"]}
        names = dict(model.named_parameters())
        assert rate[id(names["head.weight"])] == 1e-3
        assert rate[id(names["encoder.embeddings.word_embeddings.weight"])] == pytest.approx(base * 0.5**5)
        for layer in range(3):
            expected = base * 0.5 ** (3 + 1 - layer)
            assert rate[id(names[f"encoder.encoder.layer.{layer}.attention.self.query.weight"])] == pytest.approx(
                expected
            )
            assert rate[id(names[f"encoder.encoder.layer.{layer}.output.LayerNorm.bias"])] == pytest.approx(expected)
        assert rate[id(names["encoder.pooler.dense.weight"])] == pytest.approx(base * 0.5)
        assert len(rate) == len(names)  # every parameter once


def test_layer_decay_needs_an_encoder():
    from spanlm.errors import ConfigError
    from spanlm.train.config import TrainConfig
    from spanlm.train.optim import build_optimizer

    with pytest.raises(ConfigError, match="train.layer_decay and train.probe_steps apply to fine-tuning"):
        build_optimizer(torch.nn.Linear(2, 2), TrainConfig(layer_decay=0.8))
    with pytest.raises(ConfigError, match="probe_steps apply to fine-tuning"):
        build_optimizer(torch.nn.Linear(2, 2), TrainConfig(probe_steps=5))


def test_probe_steps_hold_the_encoder_back_then_give_it_its_own_warmup_and_decay():
    """LP-FT (Kumar et al. 2022): the head alone for probe_steps (the encoder's rate exactly 0, every layer under
    layer-wise decay too), then the encoder warms up from 0 and decays to 0 at max_steps; the head's schedule is
    the run's own."""
    from spanlm.train.config import TrainConfig
    from spanlm.train.optim import build_optimizer, build_scheduler, lr_factor

    model = FineTuned()
    config = TrainConfig(lr=1e-2, encoder_lr=1e-3, layer_decay=0.5, probe_steps=4, warmup_steps=2, max_steps=10)
    optimizer = build_optimizer(model, config)
    scheduler = build_scheduler(optimizer, config)
    names = {id(p): name for name, p in model.named_parameters()}
    rates = []
    for _ in range(config.max_steps):
        rates.append({names[id(group["params"][0])]: group["lr"] for group in optimizer.param_groups})
        optimizer.step()
        scheduler.step()
    query = "encoder.encoder.layer.2.attention.self.query.weight"
    peak = 1e-3 * 0.5**2  # the top layer's rate under layer-wise decay
    for step, at in enumerate(rates):
        assert at["head.weight"] == pytest.approx(1e-2 * lr_factor(step, config))
        encoder = [rate for name, rate in at.items() if name.startswith("encoder.")]
        if step < 4:
            assert encoder and all(rate == 0.0 for rate in encoder)
    # the encoder's own warmup over 2 steps from step 4, then linear decay to 0 over the 4 steps left of 6
    assert [rates[step][query] / peak for step in range(4, 10)] == pytest.approx([0.5, 1.0, 1.0, 0.75, 0.5, 0.25])


def test_probe_steps_must_leave_steps_to_fine_tune():
    from spanlm.train.config import TrainConfig

    with pytest.raises(ValueError, match="probe_steps 10 leaves none of max_steps 10"):
        TrainConfig(max_steps=10, probe_steps=10)
    with pytest.raises(ValueError, match="probe_steps must not be negative"):
        TrainConfig(probe_steps=-1)
