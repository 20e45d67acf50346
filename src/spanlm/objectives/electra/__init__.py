"""ELECTRA replaced-token detection (Clark et al. 2020) and DeBERTa-V3's embedding sharing (He et al. 2021) as one
folder: its ``objective.electra`` section and the masking schemes it trains with (``config``), the RTD heads,
sampling and loss (``rtd``, which also names ELECTRA's head in transformers: ``ElectraForPreTraining``) and the
generator-discriminator objective (``objective``). Importing it registers the objective ``electra``; its masking
scheme is its generator's (``mlm``, ``wwm`` or ``span``).

The generator's SpanBERT head, when ``objective.electra.generator_head`` is ``sbo``, is the shared
:mod:`spanlm.heads.sbo`."""

from spanlm.objectives import register
from spanlm.objectives.electra.config import generator_schemes

register("electra", schemes=generator_schemes, needs="for its objective.electra.generator_head")(
    "spanlm.objectives.electra.objective:build_electra"
)
