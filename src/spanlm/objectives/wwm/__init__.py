"""Whole-word masking (BERT-wwm; Cui et al. 2019) as one folder. Importing it registers the objective ``wwm``: the
shared masked-LM model (:mod:`spanlm.objectives.masked_lm`) with the ``wwm`` masking scheme.

Its masker stays in :mod:`spanlm.masking.wwm`: CharBERT's noise masker selects its MLM words with it too."""

from spanlm.objectives import register

register("wwm", schemes=("wwm",), needs="whole words")("spanlm.objectives.wwm.objective:build")
