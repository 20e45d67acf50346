"""spanlm: span-, word- and character-aware pretraining and span-extraction fine-tuning for BERT-family encoders."""

__version__ = "0.1.0"
