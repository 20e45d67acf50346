"""`spanlm report RUN_DIR`: PNG plots of a run's metrics.jsonl and an HTML summary page (a phased run's phases
listed from its curriculum.yaml, their boundaries marked on the plots)."""

from __future__ import annotations

import html
import json
import os
from pathlib import Path

from spanlm.errors import InputError
from spanlm.files import full_disk_is_an_input_error, read_metadata, require_file_to_write, write_text_atomically
from spanlm.pretrain.curriculum import CURRICULUM, read_curriculum
from spanlm.train.metrics import NOT_METRICS, read_metrics

# Which columns go on which figure; a figure is drawn when the run logged any of its columns.
PLOTS = {
    "loss.png": ("Training loss", lambda key: key == "loss" or key.endswith("_loss"), "train"),
    "lr.png": ("Learning rate", lambda key: key == "lr" or key.startswith("lr_"), "train"),
    "throughput.png": (
        "Speed: tokens/s, MFU, share of time waiting for data",
        lambda key: key in ("tokens_per_s", "mfu", "data_wait"),
        "train",
    ),
    "grad_norm.png": ("Gradient norm", lambda key: key == "grad_norm", "train"),
    "eval.png": ("Held-out evaluation", lambda key: key not in NOT_METRICS, "eval"),
}
RATE_WORDS = ("accuracy", "precision", "recall", "f1")
KEPT = "the run's metrics and checkpoints are untouched (a plot is written whole or not at all)"


def is_count(key: str) -> bool:
    """Target and token counts (``n_mlm``, ``n_replaced``): table entries, never drawn beside losses."""
    return key.startswith("n_")


def panels(keys: list[str]) -> list[tuple[str, list[str]]]:
    """A figure's panels: each loss alone (an MLM and an SBO line of similar values would hide each other),
    the rates (accuracy, precision, recall, F1: one scale within a run, fractions in pretraining and percent in
    NER) together, any other value alone; counts never."""
    losses = [key for key in keys if key == "loss" or key.endswith("_loss")]
    rates = [key for key in keys if key not in losses and any(word in key for word in RATE_WORDS)]
    rest = [key for key in keys if key not in losses and key not in rates and not is_count(key)]
    return (
        [(key, [key]) for key in losses]
        + ([("accuracy / precision / recall / F1", rates)] if rates else [])
        + [(key, [key]) for key in rest]
    )


def unigram_accuracy(run_dir: Path) -> float | None:
    """The masked-token accuracy of always guessing the corpus's most frequent token: the level an MLM
    reaches from token frequencies alone, before it learns anything from context.

    From the tokenizer copy a pretraining run keeps (its corpus token counts and special ids); None for
    runs without one (fine-tuning, runs from before runs kept their tokenizer). It is the share of the most
    frequent normal token among normal tokens: exact for token-level MLM, which picks tokens uniformly;
    whole-word and span masking pick fewer of the short, frequent words, so their baseline is lower and
    this line is a conservative bar for them.
    """
    import numpy as np

    from spanlm.pretrain.kept_tokenizer import KEPT_ROOT

    kept = sorted((Path(run_dir) / KEPT_ROOT).glob("*/token_counts.npy"), key=lambda path: path.stat().st_mtime)
    if not kept:
        return None
    counts = np.load(kept[-1]).astype(np.float64)
    meta = read_metadata(kept[-1].parent / "meta.json", "the run's copy of its tokenizer is damaged") or {}
    counts[[i for i in meta.get("all_special_ids", []) if i < len(counts)]] = 0
    return float(counts.max() / counts.sum()) if counts.sum() > 0 else None


def write_report(run_dir: str | Path) -> Path:
    """Write the plots and ``report.html`` into ``run_dir``; returns the HTML path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    check_run_directory(run_dir)
    records = read_metrics(run_dir)
    if not records:
        raise InputError(f"{run_dir}: no metrics.jsonl records (is this a spanlm run directory?)")
    baseline = unigram_accuracy(run_dir)
    phases = read_curriculum(run_dir)  # a phased run's (config.yaml holds only its last phase's recipe)
    plots = []
    for filename, (title, wanted, kind) in PLOTS.items():
        rows = [r for r in records if r.get("kind", "train") == kind]
        keys = sorted({k for r in rows for k, v in r.items() if wanted(k) and isinstance(v, (int, float))})
        layout = panels(keys)
        if not layout:
            continue
        columns = min(3, len(layout))
        lines = -(-len(layout) // columns)
        figure, axes = plt.subplots(lines, columns, figsize=(4.2 * columns, 3.0 * lines), dpi=100, squeeze=False)
        for axis, (panel_title, panel_keys) in zip(axes.flat, layout):
            for key in panel_keys:
                points = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
                axis.plot(
                    [p[0] for p in points], [p[1] for p in points], marker="." if len(points) < 30 else None, label=key
                )
            if baseline is not None and any(key.endswith("mlm_accuracy") for key in panel_keys):
                axis.axhline(baseline, color="grey", linestyle="--", linewidth=1, label="unigram baseline")
                axis.legend(fontsize=8)
            if phases:
                mark_phases(axis, phases, max(r["step"] for r in rows))
            axis.set_title(panel_title, fontsize=10)
            axis.set_xlabel("step")
            axis.grid(alpha=0.3)
            if len(panel_keys) > 1:
                axis.legend(fontsize=8)
        for axis in list(axes.flat)[len(layout) :]:
            axis.set_visible(False)
        figure.suptitle(title)
        figure.tight_layout()
        save_figure(figure, run_dir / filename, KEPT)
        plt.close(figure)
        plots.append((title, filename))

    final = {
        kind: next((r for r in reversed(records) if r.get("kind", "train") == kind), None) for kind in ("train", "eval")
    }
    if baseline is not None and final["eval"] is not None:
        final["eval"] = {
            **final["eval"],
            "unigram_accuracy": baseline,
        }  # beside mlm_accuracy in the table and summary.json
    recipe_file = run_dir / (CURRICULUM if phases else "config.yaml")
    config = recipe_file.read_text(encoding="utf-8") if recipe_file.is_file() else "(no config.yaml)"
    page = [
        "<!doctype html><html><head><meta charset='utf-8'><title>spanlm run report</title>",
        "<style>body{font-family:sans-serif;max-width:1000px;margin:2em auto}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:.3em .6em;text-align:right}img{max-width:100%}</style></head><body>",
        f"<h1>spanlm run: {html.escape(str(run_dir))}</h1>",
    ]
    # What the run said of its learning (spanlm.train.health), first: a run that is not learning says so here
    health = [r for r in records if r.get("kind") == "health"]
    if health:
        items = "".join(f"<li>step {r['step']}: {html.escape(str(r.get('message', '')))}</li>" for r in health)
        page.append(f"<h2>Learning health</h2><ul>{items}</ul>")
    listed = [phase_summary(run_dir, phase) for phase in phases or []]
    if listed:
        cells = "".join(
            f"<tr><td>{html.escape(p['name'])}</td><td>{p['steps'][0]}–{p['steps'][1]}</td>"
            f"<td>{html.escape(sets_of(p))}</td><td>{html.escape(p['export'] or '—')}</td></tr>"
            for p in listed
        )
        page.append(
            "<h2>Phases</h2><table><tr><th>phase</th><th>steps</th><th>sets</th><th>export</th></tr>"
            f"{cells}</table><p>Dotted lines on the plots mark where each next phase starts.</p>"
        )
    page.append("<h2>Final metrics</h2>")
    for kind, record in final.items():
        if record:
            cells = "".join(
                f"<tr><th>{html.escape(k)}</th><td>{_format(v)}</td></tr>" for k, v in record.items() if k != "kind"
            )
            page.append(f"<h3>{kind}</h3><table>{cells}</table>")
    page.append("<h2>Plots</h2>")
    page += [
        f"<h3>{html.escape(title)}</h3><img src='{filename}' alt='{html.escape(title)}'>" for title, filename in plots
    ]
    about = (
        f"<p>The recipe as given, with its phases ({CURRICULUM}); each phase ran it resolved on top of the phases "
        "before (the last phase's in config.yaml).</p>"
        if phases
        else ""
    )
    page.append(f"<h2>Configuration</h2>{about}<pre>{html.escape(config)}</pre></body></html>")
    out = run_dir / "report.html"
    write_text_atomically(out, "\n".join(page))
    summary = {**final, "health": [{"step": r["step"], "message": r.get("message")} for r in health]}
    if listed:
        summary["phases"] = listed
    write_text_atomically(run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    return out


def phase_summary(run_dir: Path, phase) -> dict:
    """A phase as the report lists it: its name, first and last step (numbered as the records are, from 1), the
    recipe keys it sets, whether it is the learning rate's decay, and its export (None until the phase has ended)."""
    export = run_dir / f"phase-{phase.config.name}"  # the run directory's, wherever it has been moved since
    return {
        "name": phase.config.name,
        "steps": [phase.start + 1, phase.end],
        "set": dict(phase.config.set),
        "decay": phase.config.decay,
        "export": str(export) if (export / "config.json").is_file() else None,
    }


def sets_of(phase: dict) -> str:
    settings = [f"{key}={value}" for key, value in phase["set"].items()]
    settings += ["the learning rate's decay"] if phase["decay"] else []
    return ", ".join(settings) or "the recipe's own settings"


def mark_phases(axis, phases, last_step: int) -> None:
    """A dotted line where each next phase starts (between the last step of the one before and its first), named by
    it; only within the steps drawn, so that a run stopped early keeps its scale."""
    for phase in phases[1:]:
        if phase.start < last_step:
            axis.axvline(phase.start + 0.5, color="grey", linestyle=":", linewidth=1)
            axis.text(
                phase.start + 0.5,
                0.98,
                f" {phase.config.name}",
                transform=axis.get_xaxis_transform(),
                fontsize=7,
                color="grey",
                va="top",
            )


def save_figure(figure, path: Path, kept: str) -> None:
    """``figure`` as ``path`` (its suffix the format), whole or not at all: a full disk is one line saying what is
    ``kept``."""
    require_file_to_write(path)
    partial = path.with_name(f".{path.stem}.tmp-{os.getpid()}{path.suffix}")
    try:
        with full_disk_is_an_input_error(path, kept):
            figure.savefig(partial)
            os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def _format(value) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return html.escape(str(value))


def check_run_directory(run: Path) -> None:
    """A run directory given to report or compare is one, else one line saying what it is."""
    if not run.is_dir():
        raise InputError(f"{run}: no such run directory" if not run.exists() else f"{run}: not a run directory")


def run_labels(runs: list[Path]) -> list[str]:
    """Each run's shortest trailing path that no other run ends with (``seed0/mlm`` beside ``seed1/mlm``): one
    curve per run, however many share a directory name."""
    parts = [run.resolve().parts for run in runs]
    labels = []
    for index, own in enumerate(parts):
        for length in range(1, len(own) + 1):
            label = own[-length:]
            if all(other[-length:] != label for j, other in enumerate(parts) if j != index):
                break
        labels.append(str(Path(*label)))
    return labels


def compare_runs(run_dirs: list[str | Path], metrics: list[str], out: str | Path, kind: str = "eval") -> Path:
    """One PNG with a panel per metric, one curve per run (labelled by its directory name, or as much of its path
    as tells it from the others)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for run in map(Path, run_dirs):  # each run named, the first one missing or empty too
        check_run_directory(run)
        if not (run / "metrics.jsonl").is_file():
            raise InputError(f"{run}: not a run directory (no metrics.jsonl)")
    labels = run_labels([Path(d) for d in run_dirs])
    runs = {
        label: [r for r in read_metrics(Path(d)) if r.get("kind", "train") == kind]
        for d, label in zip(run_dirs, labels)
    }
    for run, label in zip(map(Path, run_dirs), labels):
        if not runs[label]:
            raise InputError(f"{run}: no '{kind}' records in its metrics.jsonl")
    figure, axes = plt.subplots(1, len(metrics), figsize=(5.2 * len(metrics), 3.6), dpi=100, squeeze=False)
    for axis, metric in zip(axes[0], metrics):
        drawn = 0
        for name, rows in runs.items():
            points = [(r["step"], r[metric]) for r in rows if isinstance(r.get(metric), (int, float))]
            if points:
                axis.plot(
                    [p[0] for p in points], [p[1] for p in points], marker="." if len(points) < 30 else None, label=name
                )
                drawn += 1
        if not drawn:
            raise InputError(f"no run logged '{metric}' in its '{kind}' records")
        axis.set_title(f"{metric} ({kind})")
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_figure(figure, out, "nothing else was written")
    plt.close(figure)
    return out
