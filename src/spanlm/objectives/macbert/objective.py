"""The ``macbert`` objective: the shared masked-LM model over the recipe's masker."""

from spanlm.objectives.masked_lm import masked_lm_builder

build = masked_lm_builder("macbert")
