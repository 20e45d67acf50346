"""The fine-tuning skeleton's shared pieces: loading a task model directory, the length check, the featurizer."""

from __future__ import annotations

import pytest

from spanlm.errors import ConfigError, InputError
from spanlm.finetune.task import check_max_length, encoder_featurizer, load_task_model


class Encoder:
    def max_length(self) -> int:
        return 64


def test_a_directory_of_another_task_is_named(tmp_path):
    (tmp_path / "recipe.yaml").write_text("seed: 0\n")

    def never(*_):
        raise AssertionError("nothing is built for a directory that is not the task's")

    with pytest.raises(InputError, match=r"not a spanlm cls model \(no cls.json\); .*`spanlm cls train`"):
        load_task_model(tmp_path, "cls", ("recipe.yaml", "cls.json"), "recipe.yaml", dict, never)


def test_a_length_beyond_the_encoders_positions_names_the_key():
    check_max_length(Encoder(), 64, "data.max_length", "enc")
    with pytest.raises(ConfigError, match="data.max_length 65 exceeds the 64 positions of enc"):
        check_max_length(Encoder(), 65, "data.max_length", "enc")


def test_only_an_encoder_with_a_featurizer_has_one():
    class WithChars(Encoder):
        def featurizer(self):
            return "chars"

    assert encoder_featurizer(Encoder()) is None and encoder_featurizer(WithChars()) == "chars"
