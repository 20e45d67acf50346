"""SpanBERT (Joshi et al. 2020) as one folder: its span masker with SBO targets (``masker``, the ``span`` masking
scheme) and its model and loss (``objective``: MLM + the Span Boundary Objective). Importing it registers the
objective ``spanbert``, which trains with the ``span`` scheme.

The SBO head itself (:mod:`spanlm.heads.sbo`) is shared: ELECTRA's SpanBERT generator and the Hugging Face
``SpanBoundaryModel`` use it too.
"""

from spanlm.objectives import register

register("spanbert", schemes=("span",), needs="SBO targets")("spanlm.objectives.spanbert.objective:build_spanbert")
