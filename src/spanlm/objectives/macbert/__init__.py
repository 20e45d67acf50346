"""MacBERT (Cui et al. 2020) as one folder: its N-gram masker with similar-word correction (``masker``, the
``ngram`` masking scheme). Importing it registers the objective ``macbert``: the shared masked-LM model
(:mod:`spanlm.objectives.masked_lm`) with that masker.

The similar-word table it reads is built by ``spanlm prepare`` (:mod:`spanlm.data.similar_words`)."""

from spanlm.objectives import register

register("macbert", schemes=("ngram",), needs="N-grams with similar-word replacements")(
    "spanlm.objectives.macbert.objective:build"
)
