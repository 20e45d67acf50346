"""SplitMix64 words: the generator's definition exactly, and balanced bits."""

import numpy as np
import pytest

from spanlm.models.splitmix import splitmix64

MASK = 2**64 - 1


def _reference(seed: int, count: int) -> list[int]:
    """Steele, Lea & Flood's SplitMix64, written out with Python integers."""
    out, state = [], seed
    for _ in range(count):
        state = (state + 0x9E3779B97F4A7C15) & MASK
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        out.append(z ^ (z >> 31))
    return out


@pytest.mark.parametrize("seed", [0, 1234567, 2**63 - 1, MASK])  # the last ones wrap around 2⁶⁴
def test_outputs_are_splitmix64(seed):
    words = splitmix64(seed, 37)
    assert words.dtype == np.uint64 and words.shape == (37,)
    assert [int(w) for w in words] == _reference(seed, 37)
    assert splitmix64(seed, 0).shape == (0,)


def test_every_bit_is_set_half_the_time():
    words = splitmix64(42, 1 << 16)
    bits = (words[:, None] >> np.arange(64, dtype=np.uint64)) & np.uint64(1)  # (words, 64)
    frequency = bits.mean(axis=0)
    assert np.all(np.abs(frequency - 0.5) < 4 * 0.5 / 2**8)  # 4σ of a fair coin over 2¹⁶ draws
    assert not np.array_equal(words, splitmix64(43, 1 << 16))
