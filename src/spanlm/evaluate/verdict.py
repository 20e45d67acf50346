"""The verdict of a suite: per task and arm, each encoder's mean ± standard deviation over seeds and its paired
difference from the baseline with a 95% interval; an overall score per encoder (the mean over tasks, as GLUE
averages its tasks) beside them. ``results.json`` holds every cell; ``report.md`` and ``report.html`` the
tables; ``scores.png`` every seed's score (with matplotlib, the ``report`` extra)."""

from __future__ import annotations

import dataclasses
import html
import json
import statistics
from pathlib import Path

from spanlm.evaluate.cells import Encoder, Outcome
from spanlm.evaluate.stats import Spread, paired_bootstrap, paired_difference
from spanlm.evaluate.suite import Suite


def verdict(
    suite: Suite, encoders: list[Encoder], baselines: dict[str, str], seeds: tuple[int, ...], outcomes: list[Outcome]
):
    """results.json's content: the cells, then per task and arm the spread and each encoder's paired difference
    from its baseline (``baselines``: encoder → baseline; an encoder that is its own has none)."""
    scores: dict = {}  # task → arm → encoder → seed → score
    runs = {}  # (task, arm, encoder, seed) → the cell's run directory
    cells = []
    for outcome in sorted(outcomes, key=lambda o: o.cell.key):
        cell = outcome.cell
        runs[cell.task.name, cell.arm, cell.encoder.name, cell.seed] = cell.directory / "run"
        record = {"task": cell.task.name, "encoder": cell.encoder.name, "arm": cell.arm, "seed": cell.seed}
        if outcome.scores is not None:
            score = cell.task.score(outcome.scores)
            scores.setdefault(cell.task.name, {}).setdefault(cell.arm, {}).setdefault(cell.encoder.name, {})[
                cell.seed
            ] = score
            record |= {"score": score, "scores": outcome.scores, "seconds": round(outcome.seconds, 1)}
            record["kept"] = outcome.skipped
            if outcome.test_scores is not None:
                test = cell.task.score(outcome.test_scores)
                scores.setdefault(test_name(cell.task), {}).setdefault(cell.arm, {}).setdefault(cell.encoder.name, {})[
                    cell.seed
                ] = test
                record |= {"test_score": test, "test_scores": outcome.test_scores}
            if outcome.error:  # scored on dev, but its test split or predictions failed
                record |= {"status": "failed", "error": outcome.error}
        else:
            record["status"] = "failed" if outcome.error else "not run"
            if outcome.error:
                record["error"] = outcome.error
        record["directory"] = str(cell.directory)
        cells.append(record)

    tasks = []
    for task in suite.tasks:
        # dev, then the test split where the task names one (its own table: same seeds, no bootstrap)
        for name, split in [(task.name, "dev"), *([(test_name(task), "test")] if task.test else [])]:
            arms = []
            for arm in task.arms:
                by_encoder = scores.get(name, {}).get(arm, {})
                rows = []
                for encoder in encoders:
                    per_seed = by_encoder.get(encoder.name, {})
                    row = {"encoder": encoder.name, "seeds": {str(s): v for s, v in sorted(per_seed.items())}}
                    if per_seed:
                        row["spread"] = dataclasses.asdict(Spread.of(list(per_seed.values())))
                    baseline = baselines[encoder.name]
                    if encoder.name != baseline and per_seed:
                        row["difference"] = _difference(
                            task, arm, encoder.name, baseline, per_seed, by_encoder, runs if split == "dev" else None
                        )
                    rows.append(row)
                arms.append({"arm": arm, "encoders": rows})
            tasks.append({"task": name, "kind": task.kind, "metric": task.metric, "split": split, "arms": arms})

    overall = {}
    for arm in ("fine-tuned", "frozen"):
        means = {}
        for encoder in encoders:
            values = [
                statistics.fmean(per_seed.values())
                for task in suite.tasks
                if arm in task.arms and (per_seed := scores.get(task.name, {}).get(arm, {}).get(encoder.name))
            ]
            if values and len(values) == sum(arm in task.arms for task in suite.tasks):
                means[encoder.name] = statistics.fmean(values)
        if means:
            overall[arm] = means
    return {
        "suite": str(suite.path),
        "description": suite.description,
        "seeds": list(seeds),
        # the baseline of most encoders, and each encoder's own
        "baseline": most_common_baseline(baselines),
        "baselines": baselines,
        "encoders": [{"name": e.name, "path": str(e.path), "random_init": e.random} for e in encoders],
        "tasks": tasks,
        "overall": overall,
        "cells": cells,
    }


def most_common_baseline(baselines: dict[str, str]) -> str:
    """The baseline most encoders have (the first encoder's among equals): the one a table's column names."""
    values = list(baselines.values())
    return max(dict.fromkeys(values), key=values.count)


def test_name(task) -> str:
    """The verdict's name for a task's test split."""
    return f"{task.name} (test)"


def _difference(task, arm: str, encoder: str, baseline: str, per_seed: dict, by_encoder: dict, runs: dict | None):
    """The paired difference from the baseline, with its interval: over seeds, or for one seed a bootstrap over
    the dev examples (``runs``: their per-example scores; None: no bootstrap, as for a test split)."""
    baseline_scores = by_encoder.get(baseline, {})
    difference = paired_difference(per_seed, baseline_scores)
    if difference is None:
        return None
    interval = f"t over {difference.n} seeds" if difference.n > 1 else None
    if difference.n == 1 and task.per_example_score is not None and runs is not None:
        (seed,) = set(per_seed) & set(baseline_scores)
        bounds = _bootstrap(task, runs[task.name, arm, encoder, seed], runs[task.name, arm, baseline, seed])
        if bounds is not None:
            difference = dataclasses.replace(difference, low=bounds[0], high=bounds[1])
            interval = "paired bootstrap over the dev examples"
    return dataclasses.asdict(difference) | {
        "baseline": baseline,
        "excludes_zero": difference.excludes_zero,
        "interval": interval,
    }


def _bootstrap(task, run: Path, baseline_run: Path) -> tuple[float, float] | None:
    """The paired bootstrap's 95% interval of one seed's difference, from both runs' per-example scores."""
    import numpy as np

    from spanlm.finetune.model import PER_EXAMPLE_FILE

    try:
        columns, baseline_columns = (
            {name: np.asarray(values) for name, values in json.loads((r / PER_EXAMPLE_FILE).read_text()).items()}
            for r in (run, baseline_run)
        )
    except (OSError, ValueError):
        return None  # a run from before spanlm wrote per-example scores: no interval
    return paired_bootstrap(task.per_example_score, columns, baseline_columns)


def _number(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:+.{digits}f}"


def markdown(results: dict) -> str:
    """One table per task and arm (mean ± sd per encoder, the paired difference from the baseline with its 95%
    interval, ✓ where it excludes 0), then the overall scores."""
    baseline = results["baseline"]
    own = [f"{name} − {base}" for name, base in results["baselines"].items() if base not in (baseline, name)]
    lines = [f"# {results['description'] or results['suite']}", ""]
    lines.append(
        f"Seeds {results['seeds']}; differences are encoder − {baseline}"
        + (f" (but {', '.join(own)})" if own else "")
        + " over the same seeds, with the 95% t-interval of the paired differences (with one seed: the paired "
        "bootstrap over the dev examples); ✓: the interval excludes 0."
    )
    column = f"− {baseline}" if not own else "− baseline"
    for task in results["tasks"]:
        for arm in task["arms"]:
            lines += ["", f"## {task['task']} ({task['kind']}, {task['metric']}), {arm['arm']}", ""]
            lines += [f"| encoder | {task['metric']} mean ± sd | per seed | {column} | 95% interval | |"]
            lines += ["|---|---|---|---|---|---|"]
            for row in arm["encoders"]:
                spread = row.get("spread")
                cell = f"{spread['mean']:.2f} ± {spread['std']:.2f}" if spread else "not run"
                per_seed = ", ".join(f"{v:.2f}" for v in row["seeds"].values())
                difference = row.get("difference")
                if difference:
                    gap = f"{difference['mean']:+.2f} ± {difference['std']:.2f}"
                    if difference["baseline"] != baseline:
                        gap += f" (− {difference['baseline']})"
                    interval = (
                        f"[{_number(difference['low'])}, {_number(difference['high'])}]"
                        if difference["low"] is not None
                        else "–"
                    )
                    mark = "✓" if difference["excludes_zero"] else ""
                else:
                    gap = interval = mark = ""
                lines.append(f"| {row['encoder']} | {cell} | {per_seed} | {gap} | {interval} | {mark} |")
    if results["overall"]:
        lines += ["", "## Overall (mean over tasks)", "", "| encoder | " + " | ".join(results["overall"]) + " |"]
        lines.append("|---|" + "---|" * len(results["overall"]))
        for encoder in results["encoders"]:
            values = [results["overall"][arm].get(encoder["name"]) for arm in results["overall"]]
            lines.append(
                f"| {encoder['name']} | " + " | ".join("–" if v is None else f"{v:.2f}" for v in values) + " |"
            )
    failed = [cell for cell in results["cells"] if cell.get("status") == "failed"]
    if failed:
        lines += ["", "## Failed cells", ""]
        lines += [f"- {c['task']}/{c['encoder']}/{c['arm']}/seed-{c['seed']}: {c['error']}" for c in failed]
    return "\n".join(lines) + "\n"


def write_report(results: dict, out: Path) -> list[Path]:
    """results.json, report.md, report.html and, with matplotlib, scores.png in ``out``."""
    from spanlm.files import write_text_atomically

    written = [out / "results.json", out / "report.md", out / "report.html"]
    write_text_atomically(written[0], json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    table = markdown(results)
    write_text_atomically(written[1], table)
    plot = _plot(results, out / "scores.png")
    image = f'<p><img src="{plot.name}" alt="every seed\'s score"></p>' if plot else ""
    write_text_atomically(written[2], _page(table, image, results))
    return written + ([plot] if plot else [])


def _page(table: str, image: str, results: dict) -> str:
    """The markdown tables as an HTML page (no markdown library: headings, one paragraph and pipe tables)."""
    body = []
    for block in table.strip().split("\n\n"):
        rows = block.splitlines()
        if rows[0].startswith("|"):
            cells = [[html.escape(c.strip()) for c in row.strip("|").split("|")] for row in rows if not _rule(row)]
            head = "".join(f"<th>{c}</th>" for c in cells[0])
            rest = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in cells[1:])
            body.append(f"<table><tr>{head}</tr>{rest}</table>")
        elif rows[0].startswith("#"):
            level = len(rows[0]) - len(rows[0].lstrip("#"))
            body.append(f"<h{level}>{html.escape(rows[0].lstrip('#').strip())}</h{level}>")
        elif rows[0].startswith("- "):
            body.append("<ul>" + "".join(f"<li>{html.escape(r[2:])}</li>" for r in rows) + "</ul>")
        else:
            body.append(f"<p>{html.escape(' '.join(rows))}</p>")
    style = "body{font-family:sans-serif;max-width:60em;margin:2em auto}td,th{padding:.2em .6em;text-align:right}"
    return (
        f"<!doctype html><meta charset='utf-8'><title>spanlm eval</title><style>{style}</style>"
        + "\n".join(body[:1] + [image] + body[1:])
        + "\n"
    )


def _rule(row: str) -> bool:
    """Whether a pipe table's row is the line under its header (``|---|---|``), not a row of cells."""
    return all(cell.strip() and set(cell.strip()) <= set("-:") for cell in row.strip().strip("|").split("|"))


def _plot(results: dict, path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot
    except ImportError:
        return None
    panels = [(task, arm) for task in results["tasks"] for arm in task["arms"]]
    figure, axes = pyplot.subplots(1, len(panels), figsize=(3.2 * len(panels), 3.2), squeeze=False)
    for axis, (task, arm) in zip(axes[0], panels):
        for x, row in enumerate(arm["encoders"]):
            values = list(row["seeds"].values())
            axis.scatter([x] * len(values), values, s=14)
            if values:
                axis.hlines(statistics.fmean(values), x - 0.25, x + 0.25)
        axis.set_xticks(range(len(arm["encoders"])), [row["encoder"] for row in arm["encoders"]], rotation=30)
        axis.set_title(f"{task['task']}, {arm['arm']}", fontsize=9)
        axis.set_ylabel(task["metric"])
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    pyplot.close(figure)
    return path
