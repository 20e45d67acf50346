"""CharBERT (Ma et al. 2020) as one folder: its ``objective.charbert`` section (``config``), its noise masker
(``masker``, the ``noise`` masking scheme: misspelt words with their NLM targets, whole-word MLM on the others),
its NLM head (``nlm``) and its two-channel model and loss (``objective``). Importing it registers the objective
``charbert``, which trains with the ``noise`` scheme.

The char channel's model (:mod:`spanlm.models.charbert`) and its Hugging Face remote code stay with the models:
fine-tuning and export load them without this objective."""

from spanlm.objectives import register

register("charbert", schemes=("noise",), needs="NLM targets")("spanlm.objectives.charbert.objective:build_charbert")
