"""The skeleton NER and QA fine-tuning share: an encoder plus a task head trained by the engine
(``model``: EncoderTask, the exported model directory and its checks), and the held-out batches of their
windows (``batches``). Each task adds its reader, windows, head, decoding and metrics.
"""
