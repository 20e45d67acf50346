"""`spanlm demo`: does pretraining on a task's own text help? A controlled comparison on embedded data, one report.

The German NER data of GermEval 2014 (data/ner/germeval2014, CC BY 4.0) as a low-resource task: the first
``DemoPlan.labelled_sentences`` training sentences with their labels, and the text of all 24,000 training
sentences without them (task-adaptive pretraining: the task's own domain, the labelled sentences' text
included) → `prepare` → CharBERT pretraining (configs/pretrain/charbert.yaml) → export → the same
GlobalPointer NER fine-tuning (configs/ner/germeval2014.yaml) from the pretrained encoder and from a randomly
initialised copy of it (same architecture and tokenizer, same steps, data order and head initialisation),
each once fine-tuned whole and once with the encoder frozen (the head alone learns from its features: what
pretraining put into them) → dev scores of every arm, overall, per type and on entities seen / unseen in
training → fill-mask answers of the pretrained encoder, entities found in example sentences →
``report.html`` and ``summary.json``.

Every stage is the same code the CLI runs (``spanlm pretrain``, ``spanlm export``, then ``spanlm eval demo``
with the pretrained encoder and its random initialisation: the four NER runs are the suite's cells, in
``OUT/eval/cells/``, run side by side on a CPU); the demo only chooses the budgets. ``--quick`` is a
one-minute smoke version; ``--seeds 0 1 2`` repeats the whole comparison per seed (each in ``OUT/seed-N``)
and reports the mean and spread. A second run continues the pretraining run (``--resume auto``) and keeps
the NER runs that finished with the same encoder and settings. SIGTERM / SIGINT stop the running stage
after its current step (it saves and exports what it has) and skip the stages after it; the page and
``summary.json`` say which stages stopped early and at which step. The recipes and data come
from the package (:func:`spanlm.recipes.shipped_root`), so it runs from any directory.
"""

from spanlm.demo.page import seeds_table, summary_table
from spanlm.demo.plan import (
    ARMS,
    EMBEDDED_LABELLED,
    EXAMPLES,
    F1_KEYS,
    FILL_MASK,
    INITS,
    NER_DATA,
    NER_NAME,
    NER_RECIPE,
    QUICK,
    DemoPlan,
    ner_overrides,
    ner_run_dir,
    ner_settings,
    pretrain_overrides,
)
from spanlm.demo.run import _aggregate, _labelled_subset, _unlabelled_text, run_demo, seen_unseen_scores

__all__ = [
    "ARMS",
    "EMBEDDED_LABELLED",
    "EXAMPLES",
    "F1_KEYS",
    "FILL_MASK",
    "INITS",
    "NER_DATA",
    "NER_NAME",
    "NER_RECIPE",
    "QUICK",
    "DemoPlan",
    "_aggregate",
    "_labelled_subset",
    "_unlabelled_text",
    "ner_overrides",
    "ner_run_dir",
    "ner_settings",
    "pretrain_overrides",
    "run_demo",
    "seeds_table",
    "seen_unseen_scores",
    "summary_table",
]
