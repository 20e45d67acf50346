"""The pretraining recipe: one section per component, each its own small dataclass."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from spanlm.config import apply_overrides, check_seed, from_dict, read_yaml
from spanlm.data.corpus import TOKENIZER_KEY, DataConfig
from spanlm.data.tokenizer import TokenizerConfig, settings_key
from spanlm.masking.base import MaskingConfig
from spanlm.models.backbone import BackboneConfig
from spanlm.objectives.config import ObjectiveConfig
from spanlm.pretrain.phases import PhaseConfig, check_phases, check_planned, check_run_length
from spanlm.train.config import LoggingConfig, TrainConfig


@dataclasses.dataclass
class Recipe:
    """Everything one spanlm run needs; every section has defaults so a recipe only states differences."""

    seed: int = 0
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = dataclasses.field(default_factory=TokenizerConfig)
    model: BackboneConfig = dataclasses.field(default_factory=BackboneConfig)
    masking: MaskingConfig = dataclasses.field(default_factory=MaskingConfig)
    objective: ObjectiveConfig = dataclasses.field(default_factory=ObjectiveConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    logging: LoggingConfig = dataclasses.field(default_factory=LoggingConfig)
    # A curriculum: phases run one after another in one output directory (spanlm.pretrain.phases)
    phases: list[PhaseConfig] = dataclasses.field(default_factory=list)
    # The phase a resolved phase recipe is (set by spanlm.pretrain.phases; every record of the run carries it)
    phase: str | None = None

    def input_paths(self) -> dict[str, str | list[str] | None]:
        """What a run of this recipe reads, by key: its output may be none of them, nor inside nor around one."""
        data = self.data
        return {
            "data.inputs": data.inputs,
            "data.prepared_dir": data.prepared_dir,
            "data.prepared_shards": data.prepared_shards,
            "data.similar_words_file": data.similar_words_file,
            "model.path": self.model.path,
            "tokenizer.path": self.tokenizer.path,
        }

    def __post_init__(self) -> None:
        check_seed(self.seed)
        if self.phases:
            check_phases(self)
            self.train.max_steps = sum(phase.steps for phase in self.phases)
        # "{tokenizer}" in data.prepared_dir names the tokenizer the directory holds, so recipes with
        # other tokenizers never prepare the same directory (each would replace the other's ids).
        if TOKENIZER_KEY in self.data.prepared_dir:
            self.data.prepared_dir = self.data.prepared_dir.replace(TOKENIZER_KEY, settings_key(self.tokenizer))
        if self.phases:
            check_planned(self)


def load_recipe(path: str | Path | None, overrides: list[str] = ()) -> Recipe:
    """Read a YAML pretraining recipe (or start from defaults when ``path`` is None) and apply dotted overrides."""
    data = apply_overrides(read_yaml(path) if path is not None else {}, list(overrides))
    recipe = from_dict(Recipe, data)
    # check_phases cannot tell a stated 200 from TrainConfig's default: what the recipe and overrides state can
    train = data.get("train")
    stated = train.get("max_steps") if isinstance(train, dict) else None
    if recipe.phases and stated is not None:
        check_run_length(stated, recipe.train.max_steps)
    return recipe
