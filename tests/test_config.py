import dataclasses
from typing import Literal

import pytest

from spanlm.config import apply_overrides, from_dict, save_config
from spanlm.errors import ConfigError
from spanlm.pretrain.recipe import Recipe, load_recipe


def test_recipe_with_overrides(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("data:\n  inputs: [a.txt]\n  max_len: 64\ntokenizer:\n  kind: bpe\n")
    recipe = load_recipe(
        path, ["data.max_len=256", "tokenizer.vocab_size=16000", "seed=0", "data.inputs=[x.txt, y.txt]"]
    )
    assert recipe.data.max_len == 256 and recipe.tokenizer.vocab_size == 16000
    assert recipe.tokenizer.kind == "bpe" and recipe.data.inputs == ["x.txt", "y.txt"] and recipe.seed == 0


def test_defaults_without_a_file():
    assert load_recipe(None) == Recipe()


def test_unknown_key_names_full_path_and_allowed_keys():
    with pytest.raises(ConfigError) as error:
        load_recipe(None, ["data.max_lenn=3"])
    message = str(error.value)
    assert "data.max_lenn" in message and "data.max_len" in message and "data.inputs" in message


def test_unknown_section_is_rejected():
    with pytest.raises(ConfigError, match="unknown config key 'trian'.*allowed: seed, data, tokenizer"):
        load_recipe(None, ["trian.max_steps=3"])


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("data.max_len=abc", "'data.max_len' must be int"),
        ("data.max_len=true", "'data.max_len' must be int"),
        ("tokenizer.lowercase=1", "'tokenizer.lowercase' must be bool"),
        ("tokenizer.kind=sentencepiece", "'tokenizer.kind' must be one of 'wordpiece' | 'bpe' | 'unigram'"),
        ("data.inputs=a.txt", "'data.inputs' must be a list"),
        ("data.inputs=[1]", "'data.inputs[0]' must be str"),
        ("data=3", "'data' must be a mapping"),
        ("data.max_len=2", "data"),  # __post_init__ validation, named by section
        ("nodots", "section.key=value"),
    ],
)
def test_wrong_values_are_rejected(override, fragment):
    with pytest.raises(ConfigError, match=None) as error:
        load_recipe(None, [override])
    assert fragment in str(error.value)


def test_float_accepts_int_and_optional_accepts_none():
    @dataclasses.dataclass
    class Section:
        rate: float = 0.5
        path: str | None = "x"
        mode: Literal["a", "b"] = "a"

    section = from_dict(Section, {"rate": 1, "path": None, "mode": "b"})
    assert section.rate == 1.0 and isinstance(section.rate, float) and section.path is None


def test_a_bare_yaml_off_is_the_string_where_a_choice_has_it(tmp_path):
    assert load_recipe(None, ["train.accel=off"]).train.accel == "off"  # YAML reads `off` as False
    (tmp_path / "recipe.yaml").write_text("train:\n  accel: off\n")
    assert load_recipe(tmp_path / "recipe.yaml").train.accel == "off"
    with pytest.raises(ConfigError, match="train.accel"):
        load_recipe(None, ["train.accel=on"])  # not one of the choices: still refused
    with pytest.raises(ConfigError, match="train.compile"):
        load_recipe(None, ["train.compile=auto"])


def test_override_creates_nested_keys_and_rejects_scalar_parent():
    assert apply_overrides({}, ["a.b.c=1"]) == {"a": {"b": {"c": 1}}}
    with pytest.raises(ConfigError, match="not a section"):
        apply_overrides({"a": 3}, ["a.b=1"])


def test_saved_config_loads_back(tmp_path):
    recipe = load_recipe(None, ["data.inputs=[a.txt]", "tokenizer.kind=unigram"])
    save_config(recipe, tmp_path / "config.yaml")
    assert load_recipe(tmp_path / "config.yaml") == recipe


def test_bad_recipe_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_recipe(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_recipe(tmp_path / "list.yaml")
    (tmp_path / "broken.yaml").write_text("data: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_recipe(tmp_path / "broken.yaml")


def test_float_in_exponent_notation_without_a_dot():
    from spanlm.config import load_config
    from spanlm.pretrain.recipe import Recipe

    recipe = load_config(None, ["train.lr=1e-4", "train.eps=2E-8"], cls=Recipe)
    assert recipe.train.lr == 1e-4 and recipe.train.eps == 2e-8
    with pytest.raises(ConfigError, match="train.lr"):
        load_config(None, ["train.lr=fast"], cls=Recipe)


def float_keys(cls: type, prefix: str = "") -> list[str]:
    """Every float-valued key of recipe class ``cls`` (optional floats too), dotted."""
    import types
    import typing

    keys = []
    for name, tp in typing.get_type_hints(cls).items():
        args = typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)
        if float in args:
            keys.append(prefix + name)
        for arg in args:
            if dataclasses.is_dataclass(arg):
                keys += float_keys(arg, f"{prefix}{name}.")
    return keys


def recipe_classes():
    from spanlm.cls.config import ClsRecipe
    from spanlm.ner.config import NerRecipe
    from spanlm.qa.config import QARecipe

    return [Recipe, NerRecipe, QARecipe, ClsRecipe]


@pytest.mark.parametrize("cls", recipe_classes(), ids=lambda cls: cls.__name__)
def test_no_float_key_takes_nan(cls):
    """NaN passes every range check (it compares false with any bound), so it is refused by type, for every key."""
    from spanlm.config import load_config

    keys = float_keys(cls)
    assert len(keys) > 5
    for key in keys:
        with pytest.raises(ConfigError, match=f"'{key}' must be a number, got nan"):
            load_config(None, [f"{key}=nan"], cls=cls)


@pytest.mark.parametrize("task", ["ner", "cls"])
def test_a_label_set_naming_a_label_twice_is_refused_at_load(task):
    """Before training, not after it: the exported model's labels.json would be unreadable."""
    from spanlm.config import load_config

    cls = {recipe.__name__: recipe for recipe in recipe_classes()}[f"{task.capitalize()}Recipe"]
    with pytest.raises(ConfigError, match="labels names a label twice"):
        load_config(None, ["data.labels=[person, person, location]"], cls=cls)


@pytest.mark.parametrize("value", ["inf", "-inf"])
def test_the_ner_threshold_is_finite(value):
    from spanlm.config import load_config
    from spanlm.ner.config import NerRecipe

    with pytest.raises(ConfigError, match="threshold must be a finite number"):
        load_config(None, [f"ner.threshold={value}"], cls=NerRecipe)
