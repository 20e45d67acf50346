"""Reading heads from a Hugging Face checkpoint directory: a weights file that is not one is named, safely."""

import pytest
import torch

from spanlm.errors import InputError
from spanlm.heads.hf import checkpoint_tensors


class _Tampered:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_a_tampered_pytorch_model_bin_is_refused_without_torchs_unsafe_hint(tmp_path):
    marker = tmp_path / "code-ran"
    torch.save({"cls.predictions.bias": torch.zeros(2), "x": _Tampered(marker)}, tmp_path / "pytorch_model.bin")
    with pytest.raises(InputError) as error:
        checkpoint_tensors(tmp_path, ["cls.predictions.bias"])
    message = str(error.value)
    assert message.startswith(f"{tmp_path / 'pytorch_model.bin'}: damaged or not a weights file")
    assert "weights_only" not in message and "succeed" not in message and not marker.exists()
