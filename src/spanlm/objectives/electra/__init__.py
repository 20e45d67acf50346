"""ELECTRA replaced-token detection (Clark et al. 2020) and DeBERTa-V3's embedding sharing (He et al. 2021) as one
folder: the RTD heads, sampling and loss (``rtd``) and the generator-discriminator objective (``objective``).
Importing it registers the objective ``electra`` (its masking scheme is its generator's: ``mlm`` or ``span``) and
names ELECTRA's RTD head in transformers (``ElectraForPreTraining``) for export and continued pretraining.

The generator's SpanBERT head, when ``objective.electra.generator_head`` is ``sbo``, is the shared
:mod:`spanlm.heads.sbo`."""

from spanlm.heads.hf import register_task_head
from spanlm.objectives import register
from spanlm.objectives.electra.objective import (
    GENERATOR_DIR,
    Electra,
    build_electra,
    generator_config,
    generator_schemes,
)
from spanlm.objectives.electra.rtd import TRANSFORMERS_RTD_HEADS, ElectraRTDHead

register("electra", schemes=generator_schemes, needs="for its objective.electra.generator_head")(build_electra)
register_task_head("rtd", ElectraRTDHead, TRANSFORMERS_RTD_HEADS)

__all__ = ["GENERATOR_DIR", "Electra", "build_electra", "generator_config"]
