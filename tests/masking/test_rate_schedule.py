"""masking.rate_schedule: the rate by step, each masker's budget following it from the batch key alone."""

from __future__ import annotations

import numpy as np
import pytest

from spanlm.config import from_dict
from spanlm.data.blocks import BlockDataset
from spanlm.errors import ConfigError
from spanlm.masking.base import MaskingConfig, RateSchedule, build_masker, with_rate
from spanlm.masking.ops import Words, ceil_budget, round_budget
from spanlm.pretrain.batches import EVAL_EPOCH, MaskedBatches, ScheduledRate
from spanlm.pretrain.recipe import Recipe
from spanlm.train.loader import BatchKeySampler


def test_piecewise_and_linear_rates_at_chosen_steps():
    phases = RateSchedule(kind="piecewise", steps=[0, 100, 250], rates=[0.3, 0.15, 0.05])  # mmBERT's phases
    assert [phases.rate_at(s) for s in (0, 99, 100, 249, 250, 10**6)] == [0.3, 0.3, 0.15, 0.15, 0.05, 0.05]
    decay = RateSchedule(kind="linear", steps=[10, 110], rates=[0.3, 0.15])
    for step in (0, 10, 35, 60, 109, 110, 500):
        expected = 0.3 + (0.15 - 0.3) * min(max((step - 10) / 100, 0), 1)
        assert decay.rate_at(step) == pytest.approx(expected, abs=1e-12)
    assert decay.final_rate == 0.15 and not RateSchedule().active


@pytest.mark.parametrize(
    "schedule, message",
    [
        (
            {"kind": "linear", "steps": [0, 10], "rates": [0.3, 1.0]},
            r"rate_schedule.rates must be in \(0, 1\), got 1.0",
        ),
        ({"kind": "linear", "steps": [0, 10], "rates": [0.0, 0.15]}, r"must be in \(0, 1\), got 0.0"),
        ({"kind": "piecewise", "steps": [0, 10, 5], "rates": [0.3, 0.2, 0.1]}, "must increase, got 5 after 10"),
        ({"kind": "linear", "steps": [0], "rates": [0.3, 0.15]}, "as many steps as rates"),
        ({"kind": "constant", "rates": [0.3]}, "constant takes no steps or rates"),
        ({"kind": "cubic"}, "kind' must be one of"),
    ],
)
def test_bad_schedules_are_one_line_config_errors(schedule, message):
    with pytest.raises(ConfigError, match=message) as error:
        from_dict(Recipe, {"masking": {"rate_schedule": schedule}})
    assert "\n" not in str(error.value)


def scheduled_batches(corpus, scheme: str, grad_accum: int, schedule: RateSchedule):
    blocks = BlockDataset(corpus, 64)
    sampler = BatchKeySampler(np.arange(len(blocks)), 8, seed=3, rank=0, world_size=1)
    masker = build_masker(MaskingConfig(scheme=scheme), corpus)
    rate = ScheduledRate(schedule, sampler, grad_accum)
    return blocks, sampler, MaskedBatches(blocks, masker, corpus.special_ids["pad"], 3, 0, rate=rate)


@pytest.mark.parametrize("scheme", ["mlm", "wwm", "span", "ngram"])
def test_every_block_budget_follows_the_schedule_by_step(english, scheme):
    schedule = RateSchedule(kind="linear", steps=[0, 6], rates=[0.4, 0.1])
    grad_accum = 2
    blocks, sampler, dataset = scheduled_batches(english, scheme, grad_accum, schedule)
    per_epoch = sampler.batches_per_epoch()
    keys = iter(sampler)
    masked_total = budget_total = 0
    for number in range(per_epoch + 3):  # into the second epoch: the step counts on across epochs
        epoch, batch, indices = next(keys)
        assert sampler.number(epoch, batch) == number
        rate = schedule.rate_at(number // grad_accum)
        masked = dataset[(epoch, batch, indices)]
        index = masked["target_index"].numpy()
        rows = index // masked["input_ids"].shape[1]
        counts = np.bincount(rows, minlength=len(indices))
        special = blocks_special(blocks, indices)
        content = (~special).sum(axis=1)
        if scheme == "mlm":
            np.testing.assert_array_equal(counts, round_budget(rate, content))
        elif scheme == "span":
            np.testing.assert_array_equal(counts, ceil_budget(rate, content))
        elif scheme == "wwm":  # words until the budget: never over it, within one word of it
            budget = round_budget(rate, content)
            assert (counts <= budget).all() and (counts >= budget - 8).all()
        else:  # MacBERT's budget is in words, met in expectation (the last n-gram kept with a probability)
            words = Words.of(blocks_word_starts(blocks, indices), special)
            budget = round_budget(rate, words.row_count)
            masked_words = np.bincount(rows[np.isin(index, words.start)], minlength=len(indices))
            assert (masked_words <= budget + 3).all()
            masked_total, budget_total = masked_total + masked_words.sum(), budget_total + budget.sum()
    if scheme == "ngram":
        assert abs(masked_total / budget_total - 1) < 0.05


def blocks_special(blocks, indices) -> np.ndarray:
    from spanlm.data.blocks import collate_blocks

    return collate_blocks([blocks[int(i)] for i in indices], 0).special_mask


def blocks_word_starts(blocks, indices) -> np.ndarray:
    from spanlm.data.blocks import collate_blocks

    return collate_blocks([blocks[int(i)] for i in indices], 0).word_starts


def test_a_batch_is_a_function_of_its_key_and_held_out_batches_take_the_last_rate(english):
    schedule = RateSchedule(kind="piecewise", steps=[0, 2], rates=[0.3, 0.1])
    _, sampler, dataset = scheduled_batches(english, "mlm", 1, schedule)
    keys = [key for _, key in zip(range(4), iter(sampler))]
    again = dataset[keys[3]]
    first = [dataset[key] for key in keys]
    assert all(np.array_equal(np.asarray(again[name]), np.asarray(first[3][name])) for name in again)
    assert len(first[0]["target_index"]) > 2 * len(first[3]["target_index"])
    assert dataset.rate(EVAL_EPOCH, 0) == 0.1


def test_the_noise_masker_takes_the_rate_as_its_mlm_rate():
    from spanlm.objectives.charbert.masker import NoiseMasker

    masker = NoiseMasker.__new__(NoiseMasker)
    masker.config = MaskingConfig().noise
    scheduled = with_rate(masker, 0.3)
    assert scheduled.config.mlm.rate == 0.3 and scheduled.config.word_prob == masker.config.word_prob
    assert masker.config.mlm.rate == 0.10  # the original is untouched
