"""Extractive question answering (SQuAD format).

``config`` (QARecipe), ``data`` (SQuAD v1.1/v2.0 reader with offset repair), ``windows`` (doc-stride
windows with character offsets), ``head`` (start/end logits and loss), ``metrics`` (official SQuAD and
CMRC 2018 EM/F1, no-answer threshold), ``task`` (training-engine setup, export), ``predict`` (span
decoding, exported models), ``cli`` (``spanlm qa``). Nothing is imported here, so ``spanlm --help``
stays fast.
"""
