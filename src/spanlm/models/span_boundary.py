"""SpanBERT's Span Boundary Objective on a stock transformers ``*ForMaskedLM``, for the Hugging Face ``Trainer``.

:class:`SpanBoundaryModel` wraps any ``BertForMaskedLM`` / ``RobertaForMaskedLM`` / ... and adds
spanlm's SBO head (:class:`~spanlm.heads.sbo.SBOHead`, decoder tied to the model's word embedding).
Its ``forward`` takes a :class:`spanlm.collators.MaskingCollator` batch of ``scheme="span"`` and returns
SpanBERT's loss (Joshi et al. 2020; the authors' criterion, as spanlm's own objective)::

    loss = MLM_sum / n_mlm + sbo_weight · SBO_sum / (n_sbo + 1)

It is a ``PreTrainedModel`` so that ``Trainer`` checkpoints it with ``save_pretrained`` (which knows
the tied weights). :meth:`SpanBoundaryModel.export` writes what the rest of the ecosystem reads: the
stock model's directory (``AutoModelForMaskedLM`` loads it with its trained MLM head) and the SBO head
in ``heads.safetensors`` beside it, from which ``spanlm pretrain`` with ``model.path`` continues.
"""

from __future__ import annotations

from pathlib import Path

from torch.nn import functional as F
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import MaskedLMOutput

from spanlm.heads.hf import HEADS_FILE, head_state
from spanlm.heads.sbo import MAX_TARGETS, SBOHead


class SpanBoundaryModel(PreTrainedModel):
    config_class = PretrainedConfig
    base_model_prefix = "masked_lm"
    # Attention is the wrapped model's: let transformers keep whichever implementation it was loaded with.
    _supports_sdpa = _supports_flash_attn = _supports_flex_attn = _supports_attention_backend = True

    def __init__(self, masked_lm: PreTrainedModel, sbo_weight: float = 1.0, max_targets: int = MAX_TARGETS):
        super().__init__(masked_lm.config)
        self.masked_lm = masked_lm
        self.sbo_weight = sbo_weight
        config = masked_lm.config
        self.sbo_head = SBOHead(
            int(config.hidden_size),
            masked_lm.get_input_embeddings(),
            max_targets=max_targets,
            layer_norm_eps=float(getattr(config, "layer_norm_eps", 1e-12)),
            initializer_range=float(getattr(config, "initializer_range", 0.02)),
        )

    def forward(
        self,
        input_ids,
        attention_mask=None,
        labels=None,
        sbo_left=None,
        sbo_right=None,
        sbo_relative=None,
        sbo_labels=None,
        **inputs,
    ) -> MaskedLMOutput:
        outputs = self.masked_lm(
            input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, **inputs
        )
        logits = outputs.logits  # (B, L, V)
        if labels is None:
            return outputs
        # Sums over the targets in float32, normalised as SpanBERT's criterion does.
        mlm = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100, reduction="sum")
        n_mlm = (labels != -100).sum()
        loss = mlm / n_mlm.clamp(min=1)
        if sbo_labels is not None:
            hidden = outputs.hidden_states[-1]  # (B, L, H)
            sbo_logits = self.sbo_head(hidden, sbo_left, sbo_right, sbo_relative)  # (M, V)
            sbo = F.cross_entropy(sbo_logits.float(), sbo_labels, reduction="sum")
            loss = loss + self.sbo_weight * sbo / (sbo_labels.numel() + 1)
        return MaskedLMOutput(loss=loss, logits=logits)

    @classmethod
    def from_export(cls, directory: str | Path, sbo_weight: float = 1.0) -> SpanBoundaryModel:
        """A ``*ForMaskedLM`` directory (a spanlm export, a hub checkpoint) with the SBO head of its heads.safetensors
        when it has one (a fresh head otherwise)."""
        from safetensors.torch import load_file
        from transformers import AutoModelForMaskedLM

        directory = Path(directory)
        model = cls(AutoModelForMaskedLM.from_pretrained(str(directory)), sbo_weight=sbo_weight)
        if (directory / HEADS_FILE).is_file():
            saved = {
                key.removeprefix("sbo_head."): tensor
                for key, tensor in load_file(str(directory / HEADS_FILE)).items()
                if key.startswith("sbo_head.")
            }
            if saved:
                model.sbo_head.load_state_dict(saved)
        return model

    def export(self, directory: str | Path) -> None:
        """The stock model as its own Hugging Face directory, the SBO head beside it (spanlm's heads.safetensors)."""
        from safetensors.torch import save_file

        directory = Path(directory)
        self.masked_lm.save_pretrained(str(directory))
        save_file(head_state("sbo_head", self.sbo_head), str(directory / HEADS_FILE))

    def _init_weights(self, module) -> None:
        """Weights are the wrapped model's and the SBO head's own (initialised in its constructor)."""
