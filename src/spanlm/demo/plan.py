"""The demo's plan: its embedded data, example sentences, budgets, and the recipe overrides of each run."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

# Written as the data is: tokens separated by spaces, punctuation included.
EXAMPLES = [
    "Angela Merkel traf am Montag in Paris den französischen Präsidenten .",
    "Der FC Bayern München gewann in Dortmund gegen Borussia Dortmund .",
    "Siemens und die Deutsche Bank eröffnen neue Büros in Berlin und Hamburg .",
    "Die Beatles spielten in Hamburg , bevor sie in England berühmt wurden .",
]
# Blanks the pretraining text gives context for: what the pretrained encoder puts there shows what it learnt.
FILL_MASK = [
    "Die Stadt liegt im Süden von [MASK] .",
    "Er wurde 1950 in [MASK] geboren .",
    "Der Verein spielt in der [MASK] .",
    "Die [MASK] wurde im Jahr 1990 gegründet .",
]
INITS = ("pretrained", "random")
# The NER runs: each init fine-tuned whole, then with its encoder frozen (the head alone learns from the
# encoder's features: a probe of what pretraining put into them, which fine-tuning can wash out).
ARMS = (*INITS, *(f"{init}-frozen" for init in INITS))
F1_KEYS = tuple(
    f"ner_f1_{arm.replace('-', '_')}" for arm in ARMS
)  # summary.json: ner_f1_pretrained, …, ner_f1_random_frozen
NER_NAME = "GermEval 2014"
NER_RECIPE = "configs/ner/germeval2014.yaml"
NER_DATA = "data/ner/germeval2014"
EMBEDDED_LABELLED = 3000  # labelled sentences in NER_DATA/train.conll


@dataclasses.dataclass
class DemoPlan:
    # The shipped pretraining recipe (`spanlm recipes list`): the encoder's family, size and objective; the
    # demo sets its text, budget and evaluations (pretrain_overrides). CharBERT: of the objectives compared on
    # the shipped suites' tasks at this size, the one whose fine-tuned gain over a random init held across
    # seeds on most of them; its encoder numbers 64 positions, the demo suite's windows.
    pretrain_recipe: str = "pretrain/charbert"
    pretrain_steps: int = 1500
    pretrain_eval_every: int = 250
    # The first this many of the embedded training sentences keep their labels for NER; all 24,000 are
    # pretraining text either way. Few labels: where a pretrained start can matter.
    labelled_sentences: int = 500
    ner_steps: int = 300
    # The new head learns at ner_lr, the encoder at ner_encoder_lr (train.encoder_lr; None: ner_lr too). A
    # tiny encoder fine-tuned for minutes needs far more than BERT-base's 2e-5..5e-5, but above 1e-3 a
    # randomly initialised one sometimes never leaves the predict-nothing start.
    ner_lr: float = 3e-3
    ner_encoder_lr: float | None = 1e-3
    ner_eval_every: int = 50
    eval_docs: int = 300  # dev sentences scored during NER training (the final scores: dev_sentences)
    # The final NER scores on the first this many dev sentences; None: the whole dev set (the demo's figures).
    dev_sentences: int | None = None

    def __post_init__(self) -> None:
        from spanlm.errors import ConfigError

        if not 1 <= self.labelled_sentences <= EMBEDDED_LABELLED:
            raise ConfigError(f"labelled_sentences must be 1..{EMBEDDED_LABELLED}, got {self.labelled_sentences}")
        if self.dev_sentences is not None and self.dev_sentences < 1:
            raise ConfigError(f"dev_sentences must be at least 1 (None: all), got {self.dev_sentences}")


# A smoke run of every stage: a few steps each, the final scores on a fifth of the dev set.
QUICK = DemoPlan(
    pretrain_steps=12,
    pretrain_eval_every=6,
    labelled_sentences=500,
    ner_steps=12,
    ner_eval_every=6,
    eval_docs=50,
    dev_sentences=200,
)


def pretrain_overrides(
    plan: DemoPlan, seed: int, inputs: list[Path], prepared_dir: Path, output_dir: Path
) -> list[str]:
    """A pretraining recipe's overrides for the demo: its text, budget and evaluations; the rest (the tokenizer's
    casing included) as the recipe has it."""
    return [
        f"seed={seed}",
        f"data.inputs={json.dumps([str(path) for path in inputs])}",
        f"data.prepared_dir={prepared_dir}",
        f"train.output_dir={output_dir}",
        f"train.max_steps={plan.pretrain_steps}",
        "train.eval_at_start=true",
        f"train.eval_every={plan.pretrain_eval_every}",
        f"train.save_every={plan.pretrain_steps}",
        f"train.log_every={min(10, plan.pretrain_steps)}",
        "train.eval_blocks=64",
        "logging.report_to=[]",
    ]


def ner_overrides(
    plan: DemoPlan, seed: int, encoder: Path, arm: str, train: str, dev: str, output_dir: Path
) -> list[str]:
    """The NER recipe's overrides for one arm (``pretrained``, ``random``, ``…-frozen``) of the demo's comparison:
    its encoder start, data, budget and rates."""
    init, frozen = arm.removesuffix("-frozen"), arm.endswith("-frozen")
    return [
        f"seed={seed}",
        f"model.path={encoder}",
        f"model.init={init}",
        f"model.frozen={str(frozen).lower()}",
        f"data.train={train}",
        f"data.dev={dev}",
        f"data.eval_docs={plan.eval_docs}",
        f"train.output_dir={output_dir}",
        f"train.max_steps={plan.ner_steps}",
        f"train.eval_every={plan.ner_eval_every}",
        "train.eval_at_start=true",
        f"train.lr={plan.ner_lr}",
        f"train.save_every={plan.ner_steps}",
        f"train.warmup_steps={max(1, plan.ner_steps // 10)}",
        f"train.log_every={min(10, plan.ner_steps)}",
        "logging.report_to=[]",
        f"train.encoder_lr={'null' if plan.ner_encoder_lr is None else plan.ner_encoder_lr}",
    ]


def ner_settings(plan: DemoPlan) -> dict:
    """The plan's NER budget and rates, as settings of the demo suite's task (configs/eval/demo.yaml)."""
    return {
        "data.train_docs": plan.labelled_sentences,
        "data.eval_docs": plan.eval_docs,
        "train.max_steps": plan.ner_steps,
        "train.eval_every": plan.ner_eval_every,
        "train.save_every": plan.ner_steps,
        "train.warmup_steps": max(1, plan.ner_steps // 10),
        "train.log_every": min(10, plan.ner_steps),
        "train.lr": plan.ner_lr,
        "train.encoder_lr": plan.ner_encoder_lr,
    }


def ner_run_dir(out: Path, arm: str, seed: int) -> Path:
    """The NER run of an arm (``pretrained``, ``random-frozen``, …): its cell of the demo suite."""
    init, frozen = arm.removesuffix("-frozen"), arm.endswith("-frozen")
    return (
        out / "eval" / "cells" / "germeval2014" / init / ("frozen" if frozen else "fine-tuned") / f"seed-{seed}" / "run"
    )
