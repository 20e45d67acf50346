"""BERT's masked language modelling (Devlin et al. 2019) as one folder: its masker (``masker``, the ``mlm``
masking scheme: 15% of tokens, 80/10/10 per token). Importing it registers the objective ``mlm``: the shared
masked-LM model (:mod:`spanlm.objectives.masked_lm`) over whichever masker the recipe chooses."""

from spanlm.objectives import register

register("mlm", schemes=("mlm", "wwm", "ngram", "span"))("spanlm.objectives.mlm.objective:build")
