"""`spanlm demo`: the whole toolkit on the embedded data, end to end, with one report.

corpus (data/corpus, public domain) → `prepare` → SpanBERT pretraining (configs/pretrain/spanbert.yaml)
→ export → GlobalPointer NER fine-tuning on WNUT-17 (configs/ner/wnut17.yaml, data/ner/wnut17, CC BY 4.0)
→ dev evaluation → predictions for a few sentences → ``report.html`` (pretraining loss parts, NER loss,
F1 per type, the summary table, the predictions) and the summary table printed at the end.

Every stage is the same code the CLI runs (``spanlm pretrain``, ``spanlm export``, ``spanlm ner
train``); the demo only chooses bounded step counts. ``--quick`` is a one-minute smoke version.
A second run continues the pretraining run (``--resume auto``) and retrains the NER stage. The recipes
and data come from the package (:func:`spanlm.recipes.shipped_root`), so it runs from any directory.
"""

from __future__ import annotations

import dataclasses
import html
import json
import shutil
from pathlib import Path

from spanlm.recipes import shipped_root

EXAMPLES = [
    "Sherlock Holmes took the train from London to Paris with Watson on Monday.",
    "I just watched Stranger Things on Netflix and now I want an iPhone.",
    "Apple and Google are opening new offices in New York next year.",
    "The Beatles played Hey Jude at Abbey Road Studios.",
]


@dataclasses.dataclass
class DemoPlan:
    pretrain_steps: int = 600
    ner_steps: int = 1500
    ner_lr: float = 2e-3  # a tiny encoder fine-tuned for minutes needs far more than BERT-base's 2e-5..5e-5
    eval_every: int = 300  # pretraining and NER
    eval_docs: int = 300  # dev sentences scored during NER training (the final score uses all)


QUICK = DemoPlan(pretrain_steps=12, ner_steps=12, eval_every=6, eval_docs=50)


def run_demo(out: str | Path = "runs/demo", quick: bool = False, log=print) -> dict:
    """Run every stage into ``out``; returns the summary (also in ``out/summary.json``)."""
    from spanlm.config import load_recipe
    from spanlm.ner.config import NerRecipe
    from spanlm.ner.predict import NerModel
    from spanlm.ner.task import train_ner
    from spanlm.train.export import export_checkpoint
    from spanlm.train.loop import pretrain
    from spanlm.train.metrics import read_metrics
    from spanlm.train.report import write_report

    plan = QUICK if quick else DemoPlan()
    out = Path(out)
    root = shipped_root()  # the recipes and data installed with this spanlm, whatever the working directory
    corpus = [str(p) for p in sorted((root / "data" / "corpus").glob("*.txt")) if "hongloumeng" not in p.name]

    log(f"[1/4] pretraining a tiny SpanBERT encoder ({plan.pretrain_steps} steps) → {out / 'pretrain'}")
    pretrain_recipe = load_recipe(root / "configs/pretrain/spanbert.yaml", [
        f"data.inputs={json.dumps(corpus)}", f"data.prepared_dir={out / 'prepared'}",
        "tokenizer.lowercase=false",  # cased, as BERT-cased for NER: capitals are the strongest entity cue
        f"train.output_dir={out / 'pretrain'}", f"train.max_steps={plan.pretrain_steps}",
        f"train.eval_every={plan.eval_every}", f"train.save_every={plan.pretrain_steps}",
        f"train.log_every={min(10, plan.pretrain_steps)}", "train.eval_blocks=32",
    ])
    pretrain(pretrain_recipe, resume="auto", log=log)
    write_report(out / "pretrain")
    encoder_dir = export_checkpoint(out / "pretrain", out / "encoder")

    log(f"[2/4] fine-tuning GlobalPointer NER on WNUT-17 ({plan.ner_steps} steps) → {out / 'ner'}")
    ner_dir = out / "ner"
    if ner_dir.exists():  # the encoder above may have changed: fine-tune afresh
        shutil.rmtree(ner_dir)
    ner_recipe = load_recipe(root / "configs/ner/wnut17.yaml", [
        f"model.path={encoder_dir}", f"data.train={root / 'data/ner/wnut17/train.conll'}",
        f"data.dev={root / 'data/ner/wnut17/dev.conll'}", f"data.eval_docs={plan.eval_docs}",
        f"train.output_dir={ner_dir}", f"train.max_steps={plan.ner_steps}", f"train.eval_every={plan.eval_every}",
        f"train.lr={plan.ner_lr}",
        f"train.save_every={plan.ner_steps}", f"train.warmup_steps={max(1, plan.ner_steps // 10)}",
        f"train.log_every={min(10, plan.ner_steps)}",
    ], cls=NerRecipe)
    _, scores = train_ner(ner_recipe, log=log)
    write_report(ner_dir)

    log("[3/4] predicting entities for example sentences")
    model = NerModel(ner_dir / "model")
    predictions = [
        {"text": document.text, "entities": [
            {"text": document.text[e.start:e.end], "label": e.label, "start": e.start, "end": e.end, "score": round(float(s), 3)}
            for e, s in zip(document.entities, entity_scores)]}
        for document, entity_scores in model.predict_texts(EXAMPLES)
    ]

    log(f"[4/4] writing {out / 'report.html'}")
    pretrain_eval = [r for r in read_metrics(out / "pretrain") if r.get("kind") == "eval"]
    summary = {
        "pretrain": {k: v for k, v in (pretrain_eval[-1] if pretrain_eval else {}).items() if k not in ("kind", "time", "elapsed")},
        "ner": {"micro": scores["micro"], "per_type": scores["per_type"]},
        "predictions": predictions,
        "steps": dataclasses.asdict(plan),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    _f1_plot(scores["per_type"], out / "ner_f1_per_type.png")
    _write_page(out, summary)
    log(summary_table(summary))
    return summary


def summary_table(summary: dict) -> str:
    """The demo's headline numbers as a fixed-width text table."""
    rows = [("stage", "metric", "value")]
    for key in ("mlm_loss", "mlm_accuracy", "sbo_loss", "sbo_accuracy"):
        if key in summary["pretrain"]:
            rows.append(("pretraining (held-out)", key, f"{summary['pretrain'][key]:.4f}"))
    micro = summary["ner"]["micro"]
    for key in ("precision", "recall", "f1"):
        rows.append(("NER WNUT-17 dev (micro)", key, f"{micro[key]:.4f}"))
    for label, values in sorted(summary["ner"]["per_type"].items()):
        rows.append(("NER WNUT-17 dev", f"F1 {label}", f"{values['f1']:.4f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)) for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def _f1_plot(per_type: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = sorted(per_type)
    figure, axis = plt.subplots(figsize=(6.4, 3.6), dpi=100)
    axis.bar(labels, [per_type[label]["f1"] for label in labels])
    axis.set_title("NER F1 per type (WNUT-17 dev)")
    axis.set_ylim(0, 1)
    axis.tick_params(axis="x", labelrotation=30)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def _write_page(out: Path, summary: dict) -> None:
    plots = [("Pretraining loss (MLM and SBO parts)", "pretrain/loss.png"), ("Pretraining held-out evaluation", "pretrain/eval.png"),
             ("NER training loss", "ner/loss.png"), ("NER dev evaluation during training", "ner/eval.png"),
             ("NER F1 per type", "ner_f1_per_type.png")]
    page = ["<!doctype html><html><head><meta charset='utf-8'><title>spanlm demo</title>",
            "<style>body{font-family:sans-serif;max-width:1000px;margin:2em auto}table{border-collapse:collapse}"
            "td,th{border:1px solid #ccc;padding:.3em .6em}img{max-width:100%}</style></head><body>",
            "<h1>spanlm demo</h1>",
            "<p>Embedded English books → SpanBERT pretraining (MLM + Span Boundary Objective) → GlobalPointer NER "
            "fine-tuning on WNUT-17 → evaluation and predictions. Run reports: "
            "<a href='pretrain/report.html'>pretraining</a>, <a href='ner/report.html'>NER</a>.</p>",
            "<h2>Summary</h2>", f"<pre>{html.escape(summary_table(summary))}</pre>", "<h2>Plots</h2>"]
    page += [f"<h3>{html.escape(title)}</h3><img src='{src}' alt='{html.escape(title)}'>"
             for title, src in plots if (out / src).is_file()]
    page.append("<h2>Predictions</h2><table><tr><th>text</th><th>entities</th></tr>")
    for item in summary["predictions"]:
        entities = ", ".join(f"{e['text']} ({e['label']}, {e['score']:.2f})" for e in item["entities"]) or "—"
        page.append(f"<tr><td>{html.escape(item['text'])}</td><td>{html.escape(entities)}</td></tr>")
    page.append("</table></body></html>")
    (out / "report.html").write_text("\n".join(page), encoding="utf-8")
