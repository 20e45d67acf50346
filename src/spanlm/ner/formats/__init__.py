"""The NER input formats, each a reader of :class:`~spanlm.ner.formats.records.NerDocument` records
(:mod:`spanlm.ner.data` picks one and reports what it skipped): ``records`` (the record types and what every reader
shares), ``json_lines`` (CLUENER, spanlm's spans, nested token jsonlines), ``conll`` (columns with BIO / BIOES tags),
``hf`` (Hugging Face token-classification datasets)."""
