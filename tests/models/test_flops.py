"""The training FLOPs a run's MFU counts: the dense formula from the encoders' dimensions, exactly."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from spanlm.models.flops import TrainingFlops, segment_lengths, training_flops

H, L, I, V, HEADS = 32, 3, 48, 100, 2  # noqa: E741


def bert_dense(hidden: int, layers: int, intermediate: int) -> int:
    """A BERT layer's matmul weights: Q, K, V and the output projection, the two feed-forward matrices."""
    return layers * (4 * hidden * hidden + 2 * hidden * intermediate)


def test_bert_masked_lm_counts_its_layers_and_head_transform_not_its_tied_decoder():
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(
        vocab_size=V, hidden_size=H, num_hidden_layers=L, num_attention_heads=HEADS, intermediate_size=I
    )
    flops = training_flops(BertForMaskedLM(config))
    # + the head's transform H²; the decoder shares the word embeddings (a lookup's table, no dense weight of its own)
    assert flops.dense_weights == bert_dense(H, L, I) + H * H
    assert flops.attention == {None: L * H}


def test_an_untied_decoder_is_a_dense_weight():
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(
        vocab_size=V,
        hidden_size=H,
        num_hidden_layers=L,
        num_attention_heads=HEADS,
        intermediate_size=I,
        tie_word_embeddings=False,
    )
    assert training_flops(BertForMaskedLM(config)).dense_weights == bert_dense(H, L, I) + H * H + H * V


def test_modernbert_local_layers_reach_their_window_only():
    from transformers import ModernBertConfig, ModernBertModel

    config = ModernBertConfig(
        vocab_size=V,
        hidden_size=H,
        num_hidden_layers=6,
        num_attention_heads=HEADS,
        intermediate_size=I,
        pad_token_id=0,
        local_attention=16,  # a sliding window of half-width 8: at most 17 keys
        global_attn_every_n_layers=3,
    )
    flops = training_flops(ModernBertModel(config))
    # Wqkv, Wo; GeGLU's Wi (H → 2I) and Wo (I → H); no biases counted (weights only)
    assert flops.dense_weights == 6 * (3 * H * H + H * H + H * 2 * I + I * H)
    assert flops.attention == {None: 2 * H, 17: 4 * H}


def test_two_encoders_in_one_objective_are_both_counted_once():
    """ELECTRA: a generator and a discriminator, each an outermost PreTrainedModel (neither counted twice)."""
    from transformers import BertConfig, BertModel

    class TwoEncoders(nn.Module):
        def __init__(self):
            super().__init__()
            make = lambda layers: BertModel(  # noqa: E731
                BertConfig(
                    vocab_size=V,
                    hidden_size=H,
                    num_hidden_layers=layers,
                    num_attention_heads=HEADS,
                    intermediate_size=I,
                ),
                add_pooling_layer=False,
            )
            self.generator, self.discriminator = make(1), make(L)
            self.head = nn.Linear(H, 1)  # a task head outside the encoders: not credited

    flops = training_flops(TwoEncoders())
    assert flops.dense_weights == bert_dense(H, 1, I) + bert_dense(H, L, I)
    assert flops.attention == {None: (1 + L) * H}


def test_the_formula_on_segments_packed_or_padded():
    flops = TrainingFlops(dense_weights=1000, attention={None: 10, 5: 20})
    lengths = torch.tensor([3, 8])
    # 6·N per token; 12·width·n·min(n, reach) per segment and reach
    expected = 6 * 1000 * 11 + 12 * 10 * (9 + 64) + 12 * 20 * (9 + 8 * 5)
    assert flops.of(torch.tensor(11), lengths).item() == expected
    packed = {"attention_mask": torch.ones(1, 11), "cu_seq_lens": torch.tensor([0, 3, 11], dtype=torch.int32)}
    padded = {"attention_mask": torch.tensor([[1, 1, 1, 0, 0, 0, 0, 0], [1] * 8])}
    assert flops(packed).item() == flops(padded).item() == expected
    assert segment_lengths(padded).tolist() == segment_lengths(packed).tolist() == [3, 8]


@pytest.mark.parametrize("objective", ["spanbert", "electra-gdes"])
def test_a_pretraining_setup_hands_the_loop_its_objectives_flops(embedded_prepared, tmp_path, objective):
    from helpers import embedded_recipe
    from spanlm.pretrain.run import pretraining_setup
    from spanlm.train.dist import init_distributed

    name = {"spanbert": "spanbert", "electra-gdes": "deberta_v3_gdes"}[objective]
    env = init_distributed("cpu")
    env.packs_by_default = True
    setup = pretraining_setup(embedded_recipe(name, embedded_prepared, tmp_path / "run"), env, lambda *_: None)
    assert setup.flops == training_flops(setup.objective) and setup.flops.dense_weights > 0
    batch = next(iter(setup.loader))
    assert setup.flops(batch).item() >= 6 * setup.flops.dense_weights * int(batch["attention_mask"].sum())
