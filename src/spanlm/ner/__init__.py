"""Span NER: formats, char-token alignment, sliding windows, GlobalPointer decoding and metrics, train/eval/predict."""
