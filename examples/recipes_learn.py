"""Does every shipped pretraining recipe learn at its defaults? Runs each `configs/pretrain/*.yaml` as it ships (its
embedded data, its steps) and reads what the run says of itself: the last held-out evaluation's accuracy of the
masked tokens (``mlm_accuracy``; CharBERT's token channel too) against its unigram line for that masking
(``mlm_unigram_accuracy``: always guessing the most frequent held-out target), and any learning-health line.

    python examples/recipes_learn.py runs/recipes-learn                 # every recipe (CPU: about half an hour)
    python examples/recipes_learn.py runs/recipes-learn mlm spanbert    # some of them
    STEPS=4 python examples/recipes_learn.py runs/quick mlm              # a smoke run (tests/examples)

A recipe learns when its last accuracy exceeds its line by the margin spanlm.train.health uses (a tenth of the line
and half a point). Rerunning with the same OUT keeps every finished run. Prints a Markdown table (RESULTS.md keeps
it) and writes OUT/table.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from spanlm.train.health import MARGIN_ABSOLUTE, MARGIN_RELATIVE  # noqa: E402
from spanlm.train.metrics import read_metrics  # noqa: E402


def run_recipe(recipe: Path, out: Path, steps: str | None) -> Path:
    """``spanlm pretrain RECIPE`` into ``out`` unless a finished run is there; returns the run directory."""
    done = out / "done"
    if done.is_file():
        return out
    overrides = [f"train.output_dir={out}", "logging.progress=false", "logging.report_to=[]"]
    if steps:
        overrides += [f"train.max_steps={steps}", f"train.eval_every={steps}", f"train.save_every={steps}"]
    command = [sys.executable, "-m", "spanlm", "pretrain", str(recipe), *overrides]
    if out.exists():
        command.append("--resume=auto")
    print(f"recipes_learn.py: {recipe.stem}", file=sys.stderr, flush=True)
    subprocess.run(command, check=True, cwd=ROOT, stdout=sys.stderr)  # stdout: the table alone
    done.write_text("", encoding="utf-8")
    return out


def row(name: str, run: Path) -> dict:
    records = read_metrics(run)
    evaluations = [r for r in records if r["kind"] == "eval" and "mlm_unigram_accuracy" in r]
    last = evaluations[-1] if evaluations else {}
    accuracy, line = last.get("mlm_accuracy"), last.get("mlm_unigram_accuracy")
    learns = accuracy is not None and accuracy > line * (1 + MARGIN_RELATIVE) + MARGIN_ABSOLUTE
    return {
        "recipe": f"pretrain/{name}",
        "steps": last.get("step"),
        "mlm_accuracy": accuracy,
        "unigram_line": line,
        "distinct_predictions": last.get("mlm_distinct_predictions"),
        "learns": learns,
        "health": [r["message"] for r in records if r["kind"] == "health"],
    }


def main() -> int:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    out, wanted = Path(sys.argv[1]), sys.argv[2:]
    recipes = sorted((ROOT / "configs" / "pretrain").glob("*.yaml"))
    recipes = [r for r in recipes if not wanted or r.stem in wanted]
    rows = [row(r.stem, run_recipe(r, out / r.stem, os.environ.get("STEPS"))) for r in recipes]
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.json").write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    print("| recipe | steps | held-out MLM accuracy | unigram line | distinct predictions | learns |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        accuracy = "–" if r["mlm_accuracy"] is None else f"{r['mlm_accuracy']:.4f}"
        line = "–" if r["unigram_line"] is None else f"{r['unigram_line']:.4f}"
        print(
            f"| {r['recipe']} | {r['steps']} | {accuracy} | {line} | {r['distinct_predictions']} | "
            f"{'yes' if r['learns'] else '**no**'} |"
        )
    return 0 if all(r["learns"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
