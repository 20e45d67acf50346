"""A toy span objective added as one folder: its masking scheme (section, masker, batch arrays, preview lines,
collator) in ``masker.py`` and its model and section in ``objective.py``; importing this package registers both.

Nothing outside this folder names it: a recipe selects it with ``masking.scheme: toy_span`` and
``objective.name: toy_span`` and sets ``masking.toy_span.*`` and ``objective.toy_span.*``; the loaders,
packing, ``spanlm preview`` and ``spanlm.collators.MaskingCollator`` read the registries
(tests/objectives/test_objective_folder.py).
"""

from spanlm.masking.base import register_scheme
from spanlm.objectives import register
from toy_span.masker import ToySpanConfig, ToySpanMasker
from toy_span.objective import ToySpanObjectiveConfig, build_toy_span

NAME = "toy_span"

register_scheme(NAME, ToySpanConfig, ToySpanMasker)
register(NAME, schemes=(NAME,), needs="its boundary targets", config=ToySpanObjectiveConfig)(build_toy_span)
