"""Sequence classification and regression (`spanlm cls`): single sentences and sentence pairs, GLUE- and CLUE-style,
on the fine-tuning skeleton (spanlm.finetune)."""
