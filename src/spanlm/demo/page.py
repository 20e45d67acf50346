"""The demo's report: the text tables, the plots and the HTML pages of one seed and of several."""

from __future__ import annotations

import html
from pathlib import Path

from spanlm.demo.plan import EXAMPLES, F1_KEYS, NER_NAME, ner_run_dir


def seeds_table(summary: dict) -> str:
    rows = [
        ("seed", "MLM acc", "unigram", "F1 pretrained", "F1 random", "gap", "frozen: F1 pretrained", "F1 random", "gap")
    ]
    for row in summary["per_seed"]:
        rows.append(
            (
                str(row["seed"])
                + (" (interrupted)" if row["interrupted"] else "")
                + (" (failed)" if row["failed"] else ""),
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


def write_seeds_page(out: Path, summary: dict) -> None:
    dev_sentences = summary["plan"]["dev_sentences"]
    dev = "the whole" if dev_sentences is None else f"the first {dev_sentences:,} sentences of the"
    page = [
        _HEAD,
        f"<h1>spanlm demo: {len(summary['per_seed'])} seeds</h1>",
        f"<p>The same comparison per seed (pretraining, data order and head initialisation all follow the seed); "
        f"F1 in percent on {dev} {NER_NAME} dev set; gap = pretrained − random init. Spread: sample standard "
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
        if "failed" in stage:
            rows.append((name, "FAILED", stage["failed"]))
        elif not stage["complete"]:
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


def plots(out: Path, summary: dict) -> None:
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
    if axis.get_legend_handles_labels()[0]:  # no curve when every NER run failed
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
        if axis.get_legend_handles_labels()[0]:
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


def write_page(out: Path, summary: dict) -> None:
    run = summary["run"]
    page = [_HEAD, "<h1>spanlm demo: does pretraining help?</h1>"]
    if summary["interrupted"]:
        stopped = "; ".join(
            f"{name}: {stage['ran']} of {stage['planned']} steps"
            for name, stage in summary["stages"].items()
            if not stage["complete"] and "failed" not in stage
        )
        page.append(
            f"<p class='warning'><b>Interrupted run.</b> These stages stopped early: {html.escape(stopped)}. "
            "The numbers below are those of the steps that ran.</p>"
        )
    if summary["failed"]:
        failures = "; ".join(f"{name}: {summary['stages'][name]['failed']}" for name in summary["failed"])
        page.append(f"<p class='warning'><b>Failed runs.</b> {html.escape(failures)}.</p>")
    page += [
        f"<p>A tiny {html.escape(run['encoder_family'])} encoder is pretrained with the "
        f"<code>{html.escape(run['objective'])}</code> objective (the shipped recipe "
        f"<code>{html.escape(summary['plan']['pretrain_recipe'])}</code>) on the text of the {NER_NAME} training "
        "sentences, without their labels (24,000 sentences of German Wikipedia and news). "
        f"Then NER is learnt from only {run['labelled_sentences']:,} labelled sentences: the same "
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
        ("encoder", f"{run['encoder_family']}, {run['encoder_parameters']:,} parameters"),
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
        (
            "NER final scores",
            f"{'the whole dev set' if summary['plan']['dev_sentences'] is None else 'the first dev sentences'}: "
            f"{run['dev_sentences']:,}",
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
        ("Pretraining losses (each objective part)", "pretrain/loss.png"),
    ]
    page += [
        f"<h3>{html.escape(title)}</h3><img src='{src}' alt='{html.escape(title)}'>"
        for title, src in plots
        if (out / src).is_file()
    ]
    page.append("<h2>Fill-mask: the pretrained encoder's top 3 guesses</h2>")
    if summary["fill_mask"]:
        page.append("<table><tr><th>text</th><th>guesses</th></tr>")
        for item in summary["fill_mask"]:
            guesses = ", ".join(f"{a['token']} ({a['score']:.2f})" for a in item["top"])
            page.append(f"<tr><td>{html.escape(item['text'])}</td><td>{html.escape(guesses)}</td></tr>")
        page.append("</table>")
    else:
        page.append("<p>None: the export has no masked-LM head that a fill-mask pipeline loads.</p>")
    page.append("<h2>Entities found in example sentences</h2>")
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
