"""`spanlm demo`: does span-aware pretraining help? A controlled comparison on the embedded data, one report.

The German NER data of GermEval 2014 (data/ner/germeval2014, CC BY 4.0) as a low-resource task: the first
``DemoPlan.labelled_sentences`` training sentences with their labels, and the text of all 24,000 training
sentences without them (task-adaptive pretraining: the task's own domain, the labelled sentences' text
included) → `prepare` → SpanBERT pretraining (configs/pretrain/spanbert.yaml) → export → the same
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

from __future__ import annotations

import dataclasses
import html
import json
import statistics
import subprocess
import time
from pathlib import Path

from spanlm.recipes import shipped_root

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
    eval_docs: int = 300  # dev sentences scored during NER training (the final scores use all)

    def __post_init__(self) -> None:
        from spanlm.errors import ConfigError

        if not 1 <= self.labelled_sentences <= EMBEDDED_LABELLED:
            raise ConfigError(f"labelled_sentences must be 1..{EMBEDDED_LABELLED}, got {self.labelled_sentences}")


QUICK = DemoPlan(
    pretrain_steps=12, pretrain_eval_every=6, labelled_sentences=500, ner_steps=12, ner_eval_every=6, eval_docs=50
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


def run_demo(
    out: str | Path = "runs/demo",
    quick: bool = False,
    seeds: tuple[int, ...] = (0,),
    log=print,
    plan: DemoPlan | None = None,
) -> dict:
    """Run the comparison for each seed; returns the summary (also in ``out/summary.json``).

    One seed writes everything into ``out``; several write ``out/seed-N/`` each and, in ``out``, the
    per-seed table with the mean and spread. ``plan`` replaces the budgets of ``quick``.
    """
    from spanlm.errors import ConfigError
    from spanlm.train.loop import StopSignal

    plan = plan or (QUICK if quick else DemoPlan())
    out = Path(out)
    seeds = tuple(seeds)
    if not seeds or len(set(seeds)) < len(seeds):
        raise ConfigError(f"--seeds must name one or more different seeds, got {list(seeds)}")
    with StopSignal() as stop:  # a signal between training loops (export, scoring) stops the demo too
        if len(seeds) == 1:
            summary = _run_seed(out, plan, seeds[0], stop, log)
        else:
            runs = []
            for seed in seeds:
                runs.append(_run_seed(out / f"seed-{seed}", plan, seed, stop, log))
                if runs[-1]["interrupted"]:
                    break
            summary = _aggregate(out, runs, seeds)
            _write_seeds_page(out, summary)
            (out / "summary.json").write_text(
                json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
            )
            log(seeds_table(summary))
    return summary


# -- one seed -----------------------------------------------------------------------------------------
def _run_seed(out: Path, plan: DemoPlan, seed: int, stop, log) -> dict:
    from spanlm.config import load_config
    from spanlm.evaluate import run_suite
    from spanlm.ner.config import NerRecipe
    from spanlm.pretrain.export import export_checkpoint
    from spanlm.pretrain.recipe import load_recipe
    from spanlm.pretrain.run import pretrain
    from spanlm.report import write_report

    started = time.monotonic()
    root = shipped_root()  # the recipes and data installed with this spanlm, whatever the working directory
    out.mkdir(parents=True, exist_ok=True)
    data = root / NER_DATA
    base = load_config(
        root / NER_RECIPE, [f"data.train={data / 'train.conll'}", f"data.dev={data / 'dev.conll'}"], cls=NerRecipe
    )
    task_text = _unlabelled_text(base.data, out / "task_text" / "train_sentences.txt")
    stages, wall = {}, {}

    log(f"[1/3] seed {seed}: pretraining a tiny SpanBERT encoder ({plan.pretrain_steps} steps) → {out / 'pretrain'}")
    pretrain_recipe = load_recipe(
        root / "configs/pretrain/spanbert.yaml",
        [
            *pretrain_overrides(
                plan, seed, [data / "unlabelled.txt.gz", task_text], out / "prepared", out / "pretrain"
            ),
            "tokenizer.lowercase=false",  # cased, as BERT-cased for NER
        ],
    )
    clock = time.monotonic()
    pretrain(pretrain_recipe, resume="auto", log=log)
    wall["pretrain"] = time.monotonic() - clock
    stages["pretrain"] = _stage(out / "pretrain", plan.pretrain_steps)
    write_report(out / "pretrain")
    encoder_dir = export_checkpoint(out / "pretrain", out / "encoder")

    if not _stopped(stages, stop):
        log(
            f"[2/3] seed {seed}: NER on {NER_NAME} from the pretrained and the randomly initialised encoder, each "
            f"fine-tuned and frozen ({plan.ner_steps} steps) → {out / 'eval'}"
        )
        clock = time.monotonic()
        results = run_suite(
            "demo",
            [f"pretrained={encoder_dir}", f"random=random:{encoder_dir}"],
            out / "eval",
            seeds=[seed],
            log=log,
            settings=ner_settings(plan),
        )
        wall["ner"] = time.monotonic() - clock
        stop.received = stop.received or results["stopped"]
    ran = []
    for arm in ARMS:
        run_dir = ner_run_dir(out, arm, seed)
        stages[f"ner_{arm}"] = _stage(run_dir, plan.ner_steps)
        if (run_dir / "eval.json").is_file():  # scored, if stopped early with what it had
            write_report(run_dir)
            ran.append(arm)

    log(f"[3/3] seed {seed}: scoring, fill-mask, predictions → {out / 'report.html'}")
    summary = _summarise(out, plan, seed, stages, base.data, pretrain_recipe, encoder_dir, ran)
    summary["run"]["wall_seconds"] = {
        **{k: round(v, 1) for k, v in wall.items()},
        "total": round(time.monotonic() - started, 1),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    _plots(out, summary)
    _write_page(out, summary)
    log(summary_table(summary))
    return summary


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


def _unlabelled_text(data, path: Path) -> Path:
    """The NER training sentences without their labels, one per line: the task's own text for pretraining."""
    from spanlm.ner.data import read_documents

    documents, _ = read_documents(data.train, data)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(document.text + "\n" for document in documents if document.text.strip()), encoding="utf-8")
    return path


def _labelled_subset(conll: Path, sentences: int, path: Path) -> Path:
    """The first ``sentences`` records of a CoNLL file (records end at a blank line), written to ``path``."""
    records = [record for record in conll.read_text(encoding="utf-8").split("\n\n") if record.strip()]
    path.write_text("\n\n".join(records[:sentences]) + "\n", encoding="utf-8")
    return path


def _stage(run_dir: Path, planned: int) -> dict:
    """Steps the run's last checkpoint reached against the plan: fewer means it was stopped by a signal."""
    from spanlm.train.checkpoint import latest_checkpoint, step_of

    checkpoint = latest_checkpoint(run_dir)
    ran = step_of(checkpoint) if checkpoint is not None else 0
    return {"planned": planned, "ran": ran, "complete": ran >= planned}


def _stopped(stages: dict, stop) -> bool:
    return stop.received is not None or not all(stage["complete"] for stage in stages.values())


def _summarise(
    out: Path, plan: DemoPlan, seed: int, stages: dict, data, pretrain_recipe, encoder_dir: Path, inits: list[str]
) -> dict:
    from spanlm.ner.data import read_documents
    from spanlm.ner.predict import NerModel
    from spanlm.report import unigram_accuracy
    from spanlm.train.metrics import read_metrics

    evals = [r for r in read_metrics(out / "pretrain") if r.get("kind") == "eval"]
    pretrain_final = {k: v for k, v in (evals[-1] if evals else {}).items() if k not in ("kind", "time", "elapsed")}
    train_docs = read_documents(data.train, data)[0][: plan.labelled_sentences]
    dev_docs = read_documents(data.dev, data)[0]
    seen_names = {document.text[e.start : e.end] for document in train_docs for e in document.entities}
    ner, predictions = {}, {}
    for init in inits:
        model = NerModel(ner_run_dir(out, init, seed) / "model")
        scores = json.loads((ner_run_dir(out, init, seed) / "eval.json").read_text(encoding="utf-8"))
        predicted = [document for document, _ in model.predict(dev_docs)]
        ner[init] = {
            "micro": scores["micro"],
            "per_type": scores["per_type"],
            **seen_unseen_scores(dev_docs, predicted, seen_names),
        }
        predictions[init] = [
            {
                "text": document.text,
                "entities": [
                    {
                        "text": document.text[e.start : e.end],
                        "label": e.label,
                        "start": e.start,
                        "end": e.end,
                        "score": round(float(s), 3),
                    }
                    for e, s in zip(document.entities, entity_scores)
                ],
            }
            for document, entity_scores in model.predict_texts(EXAMPLES)
        ]
    fill_mask, parameters = _fill_mask(encoder_dir)
    meta = json.loads((out / "prepared" / "meta.json").read_text(encoding="utf-8"))
    interrupted = {name: stage for name, stage in stages.items() if not stage["complete"]}
    return {
        "seeds": [seed],
        "mlm_accuracy": pretrain_final.get("mlm_accuracy"),
        "unigram_accuracy": unigram_accuracy(out / "pretrain"),
        **{f"ner_f1_{arm.replace('-', '_')}": ner.get(arm, {}).get("micro", {}).get("f1") for arm in ARMS},
        "interrupted": bool(interrupted),
        "stages": stages,
        "pretrain": pretrain_final,
        "ner": ner,
        "predictions": predictions,
        "fill_mask": fill_mask,
        "plan": dataclasses.asdict(plan),
        "run": {
            "seed": seed,
            "commit": _commit(),
            "encoder_parameters": parameters,
            "tokenizer": f"WordPiece, {meta['vocab_size']} tokens, cased, trained on the pretraining text",
            "labelled_sentences": len(train_docs),
            "pretraining_corpus_tokens": meta["n_tokens"],
            # Blocks of whole sentences, at most data.max_len tokens each.
            "pretraining_blocks_seen": stages["pretrain"]["ran"] * pretrain_recipe.train.batch_size,
            "block_tokens_max": pretrain_recipe.data.max_len,
        },
    }


def seen_unseen_scores(gold: list, predicted: list, seen_names: set[str]) -> dict:
    """P/R/F1 (percent) on dev entities whose text occurs as an entity in the training data and on the
    rest. A predicted span is put on the side its own text falls on, so each side has its precision too."""
    from spanlm.ner.metrics import span_prf

    def tuples(documents, seen: bool):
        return [
            (d.id, e.label, e.start, e.end)
            for d in documents
            for e in d.entities
            if (d.text[e.start : e.end] in seen_names) == seen
        ]

    return {
        side: span_prf(tuples(gold, seen), tuples(predicted, seen))["micro"]
        for side, seen in (("seen", True), ("unseen", False))
    }


def _fill_mask(encoder_dir: Path) -> tuple[list[dict], int]:
    """The pretrained encoder's top guesses for each FILL_MASK blank, and its parameter count."""
    from transformers import pipeline

    from spanlm.models.backbone import quiet_load_report

    with quiet_load_report():  # the export's unused pooler is no news
        fill = pipeline("fill-mask", model=str(encoder_dir), device="cpu")
    answers = [
        {
            "text": text,
            "top": [{"token": a["token_str"], "score": round(float(a["score"]), 3)} for a in fill(text, top_k=3)],
        }
        for text in FILL_MASK
    ]
    return answers, int(fill.model.base_model.num_parameters())


def _commit() -> str:
    """The git commit of the spanlm checkout running the demo, or "unknown" for an installed wheel."""
    try:
        found = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=shipped_root(), capture_output=True, text=True, timeout=10
        )
    except OSError:
        return "unknown"
    return found.stdout.strip() if found.returncode == 0 else "unknown"


# -- several seeds ------------------------------------------------------------------------------------
def _spread(values: list[float]) -> dict:
    return {
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
    }


def _aggregate(out: Path, runs: list[dict], seeds: tuple[int, ...]) -> dict:
    finished = [run for run in runs if not run["interrupted"]]
    rows = [
        {
            "seed": run["seeds"][0],
            "mlm_accuracy": run["mlm_accuracy"],
            "unigram_accuracy": run["unigram_accuracy"],
            **{key: run[key] for key in F1_KEYS},
            "gap": (run["ner_f1_pretrained"] or 0.0) - (run["ner_f1_random"] or 0.0),
            "frozen_gap": (run["ner_f1_pretrained_frozen"] or 0.0) - (run["ner_f1_random_frozen"] or 0.0),
            "interrupted": run["interrupted"],
        }
        for run in runs
    ]
    complete = [row for row in rows if not row["interrupted"]]
    keys = ("mlm_accuracy", "unigram_accuracy", *F1_KEYS, "gap", "frozen_gap")
    spread = {key: _spread([row[key] for row in complete]) for key in keys} if complete else {}
    return {
        "seeds": [row["seed"] for row in rows],
        "planned_seeds": list(seeds),
        **{key: spread[key]["mean"] for key in keys if key in spread and key not in ("gap", "frozen_gap")},
        "ner_f1_gap": spread.get("gap"),
        "ner_f1_frozen_gap": spread.get("frozen_gap"),
        "spread": spread,
        "per_seed": rows,
        "interrupted": len(finished) < len(seeds),
    }


def seeds_table(summary: dict) -> str:
    rows = [
        ("seed", "MLM acc", "unigram", "F1 pretrained", "F1 random", "gap", "frozen: F1 pretrained", "F1 random", "gap")
    ]
    for row in summary["per_seed"]:
        rows.append(
            (
                str(row["seed"]) + (" (interrupted)" if row["interrupted"] else ""),
                f"{row['mlm_accuracy']:.3f}",
                f"{row['unigram_accuracy']:.3f}",
                f"{row['ner_f1_pretrained'] or 0:.2f}",
                f"{row['ner_f1_random'] or 0:.2f}",
                f"{row['gap']:+.2f}",
                f"{row['ner_f1_pretrained_frozen'] or 0:.2f}",
                f"{row['ner_f1_random_frozen'] or 0:.2f}",
                f"{row['frozen_gap']:+.2f}",
            )
        )
    spread = summary["spread"]
    if spread:
        f1 = [f"{spread[k]['mean']:.2f} ± {spread[k]['std']:.2f}" for k in F1_KEYS]
        rows.append(
            (
                "mean ± sd",
                *(f"{spread[k]['mean']:.3f} ± {spread[k]['std']:.3f}" for k in ("mlm_accuracy", "unigram_accuracy")),
                *f1[:2],
                f"{spread['gap']['mean']:+.2f} ± {spread['gap']['std']:.2f}",
                *f1[2:],
                f"{spread['frozen_gap']['mean']:+.2f} ± {spread['frozen_gap']['std']:.2f}",
            )
        )
    return _text_table(rows)


def _write_seeds_page(out: Path, summary: dict) -> None:
    page = [
        _HEAD,
        f"<h1>spanlm demo: {len(summary['per_seed'])} seeds</h1>",
        f"<p>The same comparison per seed (pretraining, data order and head initialisation all follow the seed); "
        f"F1 in percent on the whole {NER_NAME} dev set; gap = pretrained − random init. Spread: sample standard "
        "deviation over the seeds.</p>",
        f"<pre>{html.escape(seeds_table(summary))}</pre>",
        "<ul>",
    ]
    page += [f"<li><a href='seed-{row['seed']}/report.html'>seed {row['seed']}</a></li>" for row in summary["per_seed"]]
    page.append("</ul></body></html>")
    (out / "report.html").write_text("\n".join(page), encoding="utf-8")


# -- the page -----------------------------------------------------------------------------------------
def summary_table(summary: dict) -> str:
    """The demo's headline numbers as a fixed-width text table (F1 in percent)."""
    rows = [("stage", "metric", "value")]
    if summary.get("mlm_accuracy") is not None:
        rows.append(("pretraining (held-out)", "MLM accuracy", f"{summary['mlm_accuracy']:.4f}"))
    if summary.get("unigram_accuracy") is not None:
        rows.append(("pretraining (held-out)", "unigram baseline", f"{summary['unigram_accuracy']:.4f}"))
    for arm, scores in summary["ner"].items():
        where = f"NER {NER_NAME} dev, {_arm_label(arm)}"
        rows.append((where, "F1 (micro)", f"{scores['micro']['f1']:.2f}"))
        rows.append((where, "F1 seen / unseen", f"{scores['seen']['f1']:.2f} / {scores['unseen']['f1']:.2f}"))
    for name, stage in summary["stages"].items():
        if not stage["complete"]:
            rows.append((name, "INTERRUPTED", f"{stage['ran']} of {stage['planned']} steps"))
    return _text_table(rows)


def _arm_label(arm: str) -> str:
    """ "pretrained" → "pretrained init"; "random-frozen" → "random init, frozen (head only)"."""
    return f"{arm.removesuffix('-frozen')} init" + (", frozen (head only)" if arm.endswith("-frozen") else "")


def _text_table(rows: list[tuple]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)) for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def _plots(out: Path, summary: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from spanlm.train.metrics import read_metrics

    colours = {
        "pretrained": "tab:blue",
        "random": "tab:orange",
        "pretrained-frozen": "tab:cyan",
        "random-frozen": "tab:red",
    }
    # Dev F1 during fine-tuning, both inits on one axis, from the step-0 evaluation on.
    figure, axis = plt.subplots(figsize=(6.4, 3.8), dpi=100)
    for init in summary["ner"]:
        points = [
            (r["step"], r["f1"])
            for r in read_metrics(ner_run_dir(out, init, summary["run"]["seed"]))
            if r.get("kind") == "eval" and "f1" in r
        ]
        axis.plot(
            [p[0] for p in points],
            [p[1] for p in points],
            marker=".",
            color=colours[init],
            label=_arm_label(init),
            linestyle="--" if init.endswith("-frozen") else "-",
        )
    axis.set(
        title=f"NER dev F1 during fine-tuning (first {summary['plan']['eval_docs']} dev sentences)",
        xlabel="step",
        ylabel="F1 (%)",
    )
    axis.set_ylim(bottom=0)
    axis.grid(alpha=0.3)
    axis.legend()
    _save(figure, out / "ner_f1_curves.png")

    # Held-out MLM accuracy against the unigram line.
    points = [
        (r["step"], r["mlm_accuracy"])
        for r in read_metrics(out / "pretrain")
        if r.get("kind") == "eval" and "mlm_accuracy" in r
    ]
    figure, axis = plt.subplots(figsize=(6.4, 3.4), dpi=100)
    axis.plot([p[0] for p in points], [p[1] for p in points], marker=".", label="held-out MLM accuracy")
    if summary["unigram_accuracy"] is not None:
        axis.axhline(
            summary["unigram_accuracy"], color="grey", linestyle="--", label="unigram baseline (most frequent token)"
        )
    axis.set(title="Pretraining: masked-token accuracy", xlabel="step", ylabel="accuracy")
    axis.set_ylim(bottom=0)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    _save(figure, out / "mlm_accuracy.png")

    # Seen / unseen and per-type F1, the arms side by side: each bar with its value, each group with its
    # support (the dev set's gold entities, the same for every arm) under its name.
    groups = [("seen in training", "seen"), ("unseen", "unseen")]
    types = sorted({label for scores in summary["ner"].values() for label in scores["per_type"]})
    arms = len(summary["ner"])
    for filename, title, keys in (
        ("ner_f1_seen_unseen.png", "Dev F1 on entities seen / unseen in training", groups),
        ("ner_f1_per_type.png", "Dev F1 per type", [(t, t) for t in types]),
    ):
        figure, axis = plt.subplots(figsize=(min(12.0, max(6.4, 0.3 * arms * len(keys) + 2)), 4.2), dpi=100)
        width, top, support = 0.8 / max(1, arms), 0.0, {}
        for offset, (init, scores) in enumerate(summary["ner"].items()):
            values = [
                (scores[key] if key in ("seen", "unseen") else scores["per_type"].get(key, {})) for _, key in keys
            ]
            xs = [i + offset * width for i in range(len(keys))]
            bars = axis.bar(xs, [v.get("f1", 0.0) for v in values], width, color=colours[init], label=_arm_label(init))
            # upright values would overlap their neighbours once more than two arms share a group
            labels = [f"{v.get('f1', 0.0):.1f}" for v in values]
            axis.bar_label(bars, labels, fontsize=6, rotation=90 if arms > 2 else 0)
            top = max([top] + [v.get("f1", 0.0) for v in values])
            support.update({key: v.get("n_gold", 0) for (_, key), v in zip(keys, values) if v})
        axis.set_xticks(
            [i + width * (arms - 1) / 2 for i in range(len(keys))],
            [f"{name}\n(n={support.get(key, 0)})" for name, key in keys],
            rotation=20 if len(keys) > 3 else 0,
            fontsize=8,
        )
        axis.set(title=title, ylabel="F1 (%)")
        axis.set_ylim(0, max(10.0, 1.3 * top))  # room for the labels; a 0..10 axis when nothing scores
        axis.legend(fontsize=7)
        _save(figure, out / filename)


def _save(figure, path: Path) -> None:
    import matplotlib.pyplot as plt

    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


_HEAD = (
    "<!doctype html><html><head><meta charset='utf-8'><title>spanlm demo</title>"
    "<style>body{font-family:sans-serif;max-width:1000px;margin:2em auto}table{border-collapse:collapse}"
    "td,th{border:1px solid #ccc;padding:.3em .6em}img{max-width:100%}.warning{background:#fee;border:1px solid #c00;"
    "padding:.5em}</style></head><body>"
)


def _rates(plan: dict) -> str:
    if plan["ner_encoder_lr"] is None:
        return f"{plan['ner_lr']:g}"
    return f"{plan['ner_lr']:g} for the head, {plan['ner_encoder_lr']:g} for the encoder"


def _write_page(out: Path, summary: dict) -> None:
    run = summary["run"]
    page = [_HEAD, "<h1>spanlm demo: does span-aware pretraining help?</h1>"]
    if summary["interrupted"]:
        stopped = "; ".join(
            f"{name}: {stage['ran']} of {stage['planned']} steps"
            for name, stage in summary["stages"].items()
            if not stage["complete"]
        )
        page.append(
            f"<p class='warning'><b>Interrupted run.</b> These stages stopped early: {html.escape(stopped)}. "
            "The numbers below are those of the steps that ran.</p>"
        )
    page += [
        f"<p>A tiny BERT encoder is pretrained with SpanBERT's objective (span masking, MLM + Span Boundary Objective) "
        f"on the text of the {NER_NAME} training sentences, without their labels (24,000 sentences of German Wikipedia "
        f"and news). Then NER is learnt from only {run['labelled_sentences']:,} labelled sentences: the same "
        f"GlobalPointer NER fine-tuning runs twice with one budget: from that encoder and from a randomly initialised "
        "copy (same architecture and tokenizer, same data order and head initialisation). Only the encoder's starting "
        "weights differ. Then both again with the encoder frozen: the head alone learns from the encoder's features, "
        "which shows what pretraining put into them. Run reports: <a href='pretrain/report.html'>pretraining</a>, "
        + ", ".join(
            f"<a href='{ner_run_dir(out, a, run['seed']).relative_to(out).as_posix()}/report.html'>"
            f"NER, {html.escape(_arm_label(a))}</a>"
            for a in summary["ner"]
        )
        + ", <a href='eval/report.html'>the verdict of <code>spanlm eval demo</code></a>"
        + ".</p>",
        "<h2>Summary</h2>",
        f"<pre>{html.escape(summary_table(summary))}</pre>",
        "<h2>Run</h2><table>",
    ]
    steps = summary["stages"]
    facts = [
        ("seed", run["seed"]),
        ("commit", run["commit"]),
        ("encoder", f"BERT, {run['encoder_parameters']:,} parameters"),
        ("tokenizer", run["tokenizer"]),
        (
            "pretraining",
            f"{steps['pretrain']['ran']} of {steps['pretrain']['planned']} steps; {run['pretraining_blocks_seen']:,} "
            f"blocks of ≤ {run['block_tokens_max']} tokens from a {run['pretraining_corpus_tokens']:,}-token corpus",
        ),
        (
            "NER fine-tuning",
            f"{run['labelled_sentences']:,} labelled sentences; learning rate {_rates(summary['plan'])}",
        ),
        *(
            (f"NER, {_arm_label(name[4:])}", f"{stage['ran']} of {stage['planned']} steps")
            for name, stage in steps.items()
            if name != "pretrain"
        ),
        ("wall time", ", ".join(f"{k} {v:.0f} s" for k, v in run["wall_seconds"].items())),
    ]
    page += [f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in facts]
    page.append("</table><h2>Plots</h2>")
    plots = [
        ("NER dev F1 during fine-tuning: pretrained vs random init, whole and frozen", "ner_f1_curves.png"),
        ("Dev F1 on entities seen / unseen in training", "ner_f1_seen_unseen.png"),
        ("Dev F1 per type (the value on each bar, gold entities n under each type)", "ner_f1_per_type.png"),
        ("Pretraining: held-out MLM accuracy and the unigram baseline", "mlm_accuracy.png"),
        ("Pretraining losses (MLM and SBO parts)", "pretrain/loss.png"),
    ]
    page += [
        f"<h3>{html.escape(title)}</h3><img src='{src}' alt='{html.escape(title)}'>"
        for title, src in plots
        if (out / src).is_file()
    ]
    page.append(
        "<h2>Fill-mask: the pretrained encoder's top 3 guesses</h2><table><tr><th>text</th><th>guesses</th></tr>"
    )
    for item in summary["fill_mask"]:
        guesses = ", ".join(f"{a['token']} ({a['score']:.2f})" for a in item["top"])
        page.append(f"<tr><td>{html.escape(item['text'])}</td><td>{html.escape(guesses)}</td></tr>")
    page.append("</table><h2>Entities found in example sentences</h2>")
    page.append(
        "<table><tr><th>text</th>"
        + "".join(f"<th>{html.escape(_arm_label(a))}</th>" for a in summary["predictions"])
        + "</tr>"
    )
    for index, text in enumerate(EXAMPLES):
        cells = []
        for init, items in summary["predictions"].items():
            found = ", ".join(f"{e['text']} ({e['label']}, {e['score']:.2f})" for e in items[index]["entities"]) or "—"
            cells.append(f"<td>{html.escape(found)}</td>")
        page.append(f"<tr><td>{html.escape(text)}</td>{''.join(cells)}</tr>")
    page.append("</table></body></html>")
    (out / "report.html").write_text("\n".join(page), encoding="utf-8")
