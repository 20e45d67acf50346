"""The modern families' (ModernBERT's, EuroBERT's) config names for a recipe's settings: a new model's, and the
settings of no weight a released checkpoint continues with. ``config`` is the recipe's model section (a
spanlm.models.backbone.BackboneConfig)."""

from __future__ import annotations

import copy
from typing import Any

MODERN_FAMILIES = ("modernbert", "eurobert")
DEFAULT_POSITIONS = 512  # BackboneConfig's max_position_embeddings: a recipe that states another states it


def modern_values(config, values: dict[str, Any], special: dict[str, int]) -> dict[str, Any]:
    """The BERT-named ``values`` under ModernBERT's / EuroBERT's config names, with their own settings."""
    renamed = {
        "modernbert": {
            "hidden_dropout_prob": ("embedding_dropout", "mlp_dropout"),
            "attention_probs_dropout_prob": ("attention_dropout",),
            "layer_norm_eps": ("norm_eps",),
        },
        # EuroBERT (Llama's layers) has no dropout but in its attention: hidden_dropout does not apply to it
        "eurobert": {"attention_probs_dropout_prob": ("attention_dropout",), "layer_norm_eps": ("rms_norm_eps",)},
    }[config.family]
    out = {
        key: value
        for key, value in values.items()
        if key not in ("hidden_dropout_prob", "attention_probs_dropout_prob")
    }
    out.pop("layer_norm_eps", None)
    for old, new_names in renamed.items():
        if old in values:
            out.update({new: values[old] for new in new_names})
    if config.family == "modernbert":
        out.update(cls_token_id=special["cls"], sep_token_id=special["sep"])
        if config.local_attention is not None:
            out["local_attention"] = config.local_attention
        if config.global_attention_every is not None:
            out["global_attn_every_n_layers"] = config.global_attention_every
        if config.rope_theta is not None:
            out["global_rope_theta"] = config.rope_theta
        if config.local_rope_theta is not None:
            out["local_rope_theta"] = config.local_rope_theta
    else:
        out["mask_token_id"] = special["mask"]
        if config.rope_theta is not None:
            out["rope_parameters"] = {"rope_type": "default", "rope_theta": config.rope_theta}
    return out


# What :func:`with_settings_of_no_weight` may change of a checkpoint's config
SETTINGS_OF_NO_WEIGHT = ("local_attention", "rope_parameters", "max_position_embeddings")


def replaced_settings(checkpoint_config: dict, config) -> list[str]:
    """``old → new`` for each setting of no weight that ``config`` (the model built) holds otherwise than the
    checkpoint's ``config.json`` (``checkpoint_config``): what a run continuing it should say it changed."""
    now = config.to_dict()
    return [
        f"{key} {checkpoint_config[key]} → {now[key]}"
        for key in SETTINGS_OF_NO_WEIGHT
        if key in checkpoint_config and key in now and checkpoint_config[key] != now[key]
    ]


def with_settings_of_no_weight(checkpoint_config, config):
    """A checkpoint's config with the recipe's settings that change no weight where the recipe states them: the RoPE
    bases (ModernBERT's global and local, EuroBERT's), ModernBERT's window and the positions a RoPE model numbers.
    What a context extension continuing a released model changes (Warner et al. 2024: 10k → 160k for the global
    layers); every other setting of a checkpoint is its own."""
    if config.family not in MODERN_FAMILIES:
        return checkpoint_config
    changes: dict[str, Any] = {}
    rope = copy.deepcopy(checkpoint_config.rope_parameters)
    if config.family == "modernbert":
        for layers, theta in (("full_attention", config.rope_theta), ("sliding_attention", config.local_rope_theta)):
            if theta is not None:
                rope[layers]["rope_theta"] = theta
        if config.local_attention is not None:
            changes["local_attention"] = config.local_attention
    elif config.rope_theta is not None:
        rope["rope_theta"] = config.rope_theta
    changes["rope_parameters"] = rope
    if config.max_position_embeddings != DEFAULT_POSITIONS:  # stated by the recipe
        changes["max_position_embeddings"] = config.max_position_embeddings
    # built again, not edited: a config derives some fields from others at its construction (the window's half)
    return type(checkpoint_config)(**{**checkpoint_config.to_dict(), **changes})
