"""A tied decoder's weight gradient delivered by the lookup: the same gradients as nn.Embedding + logits."""

import pytest
import torch

from spanlm import accel
from spanlm.accel.tied_embedding import TiedEmbedding, TiedGradient
from spanlm.heads import TiedDecoder, VocabTarget, token_cross_entropy, vocab_cross_entropies

PAD = 0


def _model(tied: bool, seed: int = 0):
    """ids → embedding (padding row 0) → tanh(linear) → rows decoded through the tied table."""
    torch.manual_seed(seed)
    embedding = torch.nn.Embedding(40, 8, padding_idx=PAD)
    torch.nn.init.normal_(embedding.weight)
    mix = torch.nn.Linear(8, 8)
    decoder = TiedDecoder(embedding)
    torch.nn.init.normal_(decoder.bias)
    if tied:  # the CPU backend makes the embedding a TiedEmbedding; without it: nn.Embedding's own backward
        accel.apply(decoder, torch.device("cpu"))
    return embedding, mix, decoder


def _batch():
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 40, (3, 6), generator=generator)
    ids[:, -2:] = PAD  # padding: no gradient for row 0 from the lookup
    ids[0, 0] = ids[1, 0] = 7  # a repeated token: its rows add up
    labels = torch.randint(0, 40, (5,), generator=generator)
    return ids, labels


def _forward(embedding, mix, decoder, ids, labels, fused: bool):
    hidden = torch.tanh(mix(embedding(ids)))  # (B, L, E)
    rows = hidden.reshape(-1, 8)[:5]  # (5, E)
    if fused:
        return vocab_cross_entropies([VocabTarget(rows, decoder, labels)])[0].total
    return token_cross_entropy(decoder(rows), labels).total


def _gradients(embedding, mix, decoder):
    return [p.grad.clone() if p.grad is not None else None for p in (embedding.weight, decoder.bias, *mix.parameters())]


def _assert_same(got, expected):
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, atol=1e-6, rtol=1e-5)


def _reference(upstream: float, extra=None):
    embedding, mix, decoder = _model(tied=False)
    ids, labels = _batch()
    loss = upstream * _forward(embedding, mix, decoder, ids, labels, fused=False)
    if extra is not None:
        loss = loss + extra(embedding, ids)
    loss.backward()
    return _gradients(embedding, mix, decoder)


@pytest.fixture
def hand_overs(monkeypatch):
    """The data pointers of the gradients decoders hand over to a lookup."""
    handed, original = [], TiedGradient.hand_over
    monkeypatch.setattr(
        TiedGradient, "hand_over", lambda self, gradient: handed.append(gradient.data_ptr()) or original(self, gradient)
    )
    return handed


@pytest.mark.parametrize("upstream", [0.2, 0.05])
def test_the_lookup_delivers_the_decoders_gradient_as_the_tables_one_gradient(upstream, hand_overs):
    embedding, mix, decoder = _model(tied=True)
    assert isinstance(embedding, TiedEmbedding)
    ids, labels = _batch()
    loss = upstream * _forward(embedding, mix, decoder, ids, labels, fused=True)
    loss.backward()
    assert hand_overs == [embedding.weight.grad.data_ptr()]  # became .grad: no zero fill, no sum, no copy
    _assert_same(_gradients(embedding, mix, decoder), _reference(upstream))


def test_gradients_accumulate_over_micro_batches_and_survive_a_retained_graph():
    embedding, mix, decoder = _model(tied=True)
    ids, labels = _batch()
    for _ in range(2):  # two micro-batches into the same .grad
        (0.2 * _forward(embedding, mix, decoder, ids, labels, fused=True)).backward()
    _assert_same(_gradients(embedding, mix, decoder), [2 * g for g in _reference(0.2)])

    embedding, mix, decoder = _model(tied=True)
    loss = 0.2 * _forward(embedding, mix, decoder, ids, labels, fused=True)
    loss.backward(retain_graph=True)
    loss.backward()  # the second pass forms the gradients again from the kept G; the lookup delivers them again
    _assert_same(_gradients(embedding, mix, decoder), [2 * g for g in _reference(0.2)])


def test_a_backward_pass_that_does_not_reach_the_lookup_keeps_the_decoders_gradient():
    embedding, mix, decoder = _model(tied=True)
    ids, labels = _batch()
    loss = 0.2 * _forward(embedding, mix, decoder, ids, labels, fused=True)
    loss.backward(inputs=[decoder.bias, embedding.weight, mix.weight])  # the lookup is needed: delivered
    _assert_same(_gradients(embedding, mix, decoder)[:3], _reference(0.2)[:3])

    embedding, mix, decoder = _model(tied=True)
    loss = 0.2 * _forward(embedding, mix, decoder, ids, labels, fused=True)
    (weight_grad,) = torch.autograd.grad(loss, [embedding.weight], retain_graph=True)
    torch.testing.assert_close(weight_grad, _reference(0.2)[0], atol=1e-6, rtol=1e-5)
    (bias_grad,) = torch.autograd.grad(loss, [decoder.bias])  # does not run the lookup: nothing is lost
    torch.testing.assert_close(bias_grad, _reference(0.2)[1], atol=1e-6, rtol=1e-5)


def test_a_decoder_outside_the_loss_and_a_second_lookup_change_nothing():
    embedding, mix, decoder = _model(tied=True)
    ids, labels = _batch()
    _forward(embedding, mix, decoder, ids, labels, fused=True)  # decoded with gradient, never backpropagated
    second = embedding(ids).sum()  # a fresh lookup: only its own rows
    second.backward()
    expected = torch.zeros_like(embedding.weight).index_add_(0, ids[ids != PAD], torch.ones(int((ids != PAD).sum()), 8))
    torch.testing.assert_close(embedding.weight.grad, expected)

    # ELECTRA's ES: the generator's decoder and a second lookup of the same table in one forward pass
    embedding, mix, decoder = _model(tied=True)
    discriminator_lookup = lambda table, ids: 0.3 * table(ids.flip(0)).pow(2).sum()  # noqa: E731
    loss = 0.2 * _forward(embedding, mix, decoder, ids, labels, fused=True) + discriminator_lookup(embedding, ids)
    loss.backward()
    _assert_same(_gradients(embedding, mix, decoder), _reference(0.2, extra=discriminator_lookup))


def test_no_hand_over_without_gradient_or_under_no_grad():
    embedding, mix, decoder = _model(tied=True)
    ids, labels = _batch()
    with torch.no_grad():
        embedding(ids)
    assert embedding.gradient_slot is None
    embedding.weight.requires_grad_(False)
    embedding(ids)
    assert embedding.gradient_slot is None


def test_a_lookup_off_the_decoders_path_leaves_the_gradient_with_the_decoder():
    embedding, _, decoder = _model(tied=True)
    ids, labels = _batch()
    unused = embedding(ids)  # a live lookup of this forward pass, but the loss does not depend on it
    rows = torch.randn(5, 8, generator=torch.Generator().manual_seed(4), requires_grad=True)
    vocab_cross_entropies([VocabTarget(rows, decoder, labels)])[0].total.backward()
    assert unused.grad_fn is not None
    reference, _, reference_decoder = _model(tied=False)
    token_cross_entropy(reference_decoder(rows.detach()), labels).total.backward()
    torch.testing.assert_close(embedding.weight.grad, reference.weight.grad, atol=1e-6, rtol=1e-5)


class _TiedModel(torch.nn.Module):
    def __init__(self, tied: bool):
        super().__init__()
        self.embedding, self.mix, self.decoder = _model(tied)

    def forward(self, ids, labels, fused: bool):
        return 0.2 * _forward(self.embedding, self.mix, self.decoder, ids, labels, fused)

    def gradients(self):
        return [
            g.full_tensor() if hasattr(g, "full_tensor") else g
            for g in _gradients(self.embedding, self.mix, self.decoder)
        ]


def _distributed_worker(rank: int, init_file: str, strategy: str, results: str) -> None:
    import torch.distributed as dist

    from spanlm.train.dist import DistEnv, shutdown

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    env = DistEnv(rank=rank, world_size=2)
    try:
        ids, labels = _batch()
        batches = [(ids, labels), (ids.flip(1), labels.flip(0))]  # each rank's own tokens and labels
        reference = _TiedModel(tied=False)  # on this process alone: the mean of both ranks' gradients
        for batch in batches:
            (reference(*batch, fused=False) / 2).backward()
        model = _TiedModel(tied=True)
        if strategy == "ddp":
            wrapped = torch.nn.parallel.DistributedDataParallel(model)
        else:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            env.mesh = init_device_mesh("cpu", (2,))
            wrapped = fully_shard(model, mesh=env.mesh)
        handed, original = [], TiedGradient.hand_over
        TiedGradient.hand_over = lambda self, gradient: handed.append(1) or original(self, gradient)
        loss = wrapped(*batches[rank], fused=True)
        loss.backward()
        TiedGradient.hand_over = original
        torch.save(
            {"got": model.gradients(), "expected": reference.gradients(), "handed": bool(handed)},
            f"{results}-{rank}.pt",
        )
    finally:
        shutdown(env)  # the group released while the interpreter is whole (spanlm.train.dist.shutdown)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_data_parallel_training_sees_the_delivered_gradient(strategy, tmp_path):
    """DDP's and FSDP2's gradient hooks fire on the table's one gradient, which includes the decoder's."""
    import torch.multiprocessing as mp

    mp.spawn(_distributed_worker, args=(str(tmp_path / "init"), strategy, str(tmp_path / "grads")), nprocs=2)
    for rank in range(2):
        saved = torch.load(tmp_path / f"grads-{rank}.pt", weights_only=True)
        assert saved["handed"]  # the decoder did hand its gradient to the lookup
        _assert_same(saved["got"], saved["expected"])


def test_the_lookups_gradient_is_the_same_in_every_run_on_two_threads():
    # A repeated token's rows are added in a fixed order: index_put_ with accumulation adds them atomically
    # in whatever order two threads reach them, and runs of the same steps then differ in the last bits.
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        generator = torch.Generator().manual_seed(0)
        weight = torch.randn(5000, 64, generator=generator)
        ids = torch.randint(1, 20, (64, 128), generator=generator)  # every token repeated hundreds of times
        upstream = torch.randn(64, 128, 64, generator=generator)
        gradients = []
        for _ in range(8):
            table = TiedEmbedding(5000, 64, padding_idx=PAD, _weight=weight.clone())
            table(ids).backward(upstream)
            gradients.append(table.weight.grad)
        assert all(torch.equal(gradients[0], g) for g in gradients[1:])
        reference = weight.clone().requires_grad_()
        torch.nn.functional.embedding(ids, reference, padding_idx=PAD).backward(upstream)  # nn.Embedding's own
        torch.testing.assert_close(gradients[0], reference.grad)
    finally:
        torch.set_num_threads(threads)
