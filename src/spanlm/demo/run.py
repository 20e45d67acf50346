"""Running the demo: pretraining, the four NER arms through ``spanlm eval demo``, scoring, and the summary of
one seed or of several."""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import subprocess
import time
from pathlib import Path

from spanlm.demo.page import plots, seeds_table, summary_table, write_page, write_seeds_page
from spanlm.demo.plan import (
    ARMS,
    EXAMPLES,
    F1_KEYS,
    FILL_MASK,
    NER_DATA,
    NER_NAME,
    NER_RECIPE,
    QUICK,
    DemoPlan,
    ner_run_dir,
    ner_settings,
    pretrain_overrides,
)
from spanlm.recipes import find_recipe, shipped_root


def run_demo(
    out: str | Path = "runs/demo",
    quick: bool = False,
    seeds: tuple[int, ...] = (0,),
    log=print,
    plan: DemoPlan | None = None,
    pretrain_recipe: str | None = None,
) -> dict:
    """Run the comparison for each seed; returns the summary (also in ``out/summary.json``).

    One seed writes everything into ``out``; several write ``out/seed-N/`` each and, in ``out``, the
    per-seed table with the mean and spread. ``plan`` replaces the budgets of ``quick``; ``pretrain_recipe``
    (a shipped ``pretrain/…`` recipe) the encoder pretrained, a tiny CharBERT by default.
    """
    from spanlm.errors import ConfigError
    from spanlm.train.stop import StopSignal

    plan = plan or (QUICK if quick else DemoPlan())
    if pretrain_recipe is not None:
        plan = dataclasses.replace(plan, pretrain_recipe=pretrain_recipe)
    recipe = find_recipe(plan.pretrain_recipe)
    if not recipe.name.startswith("pretrain/"):
        raise ConfigError(f"--pretrain-recipe {plan.pretrain_recipe}: not a pretraining recipe (pretrain/…)")
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
                if runs[-1]["interrupted"] or runs[-1]["failed"]:
                    break
            summary = {**_aggregate(out, runs, seeds), "plan": dataclasses.asdict(plan)}
            write_seeds_page(out, summary)
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
    dev = data / "dev.conll"
    if plan.dev_sentences is not None:  # a quick plan's final scores: the first dev sentences only
        (out / "task_text").mkdir(parents=True, exist_ok=True)
        dev = _labelled_subset(dev, plan.dev_sentences, out / "task_text" / "dev.conll")
    base = load_config(root / NER_RECIPE, [f"data.train={data / 'train.conll'}", f"data.dev={dev}"], cls=NerRecipe)
    task_text = _unlabelled_text(base.data, out / "task_text" / "train_sentences.txt")
    stages, wall = {}, {}

    log(
        f"[1/3] seed {seed}: pretraining a tiny encoder with {plan.pretrain_recipe} ({plan.pretrain_steps} steps) "
        f"→ {out / 'pretrain'}"
    )
    pretrain_recipe = load_recipe(
        find_recipe(plan.pretrain_recipe).path,
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
        settings = {**ner_settings(plan), **({"data.dev": str(dev)} if plan.dev_sentences is not None else {})}
        results = run_suite(
            "demo",
            [f"pretrained={encoder_dir}", f"random=random:{encoder_dir}"],
            out / "eval",
            seeds=[seed],
            log=log,
            settings=settings,
        )
        wall["ner"] = time.monotonic() - clock
        stop.received = stop.received or results["stopped"]
        failed = {
            cell["encoder"] + ("-frozen" if cell["arm"] == "frozen" else ""): cell["error"]
            for cell in results["cells"]
            if cell.get("status") == "failed"
        }
    else:
        failed = {}
    ran = []
    for arm in ARMS:
        run_dir = ner_run_dir(out, arm, seed)
        stages[f"ner_{arm}"] = _stage(run_dir, plan.ner_steps)
        if arm in failed:  # the run's own error, not a stop: the report must not say "interrupted"
            stages[f"ner_{arm}"]["failed"] = failed[arm]
        if (run_dir / "eval.json").is_file():  # scored: a run stopped by a signal is not
            write_report(run_dir)
            ran.append(arm)

    log(f"[3/3] seed {seed}: scoring, fill-mask, predictions → {out / 'report.html'}")
    summary = _summarise(out, plan, seed, stages, base.data, pretrain_recipe, encoder_dir, ran)
    summary["run"]["wall_seconds"] = {
        **{k: round(v, 1) for k, v in wall.items()},
        "total": round(time.monotonic() - started, 1),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    plots(out, summary)
    write_page(out, summary)
    log(summary_table(summary))
    return summary


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
    interrupted = {name: stage for name, stage in stages.items() if not stage["complete"] and "failed" not in stage}
    return {
        "seeds": [seed],
        "mlm_accuracy": pretrain_final.get("mlm_accuracy"),
        "unigram_accuracy": unigram_accuracy(out / "pretrain"),
        **{f"ner_f1_{arm.replace('-', '_')}": ner.get(arm, {}).get("micro", {}).get("f1") for arm in ARMS},
        "interrupted": bool(interrupted),
        "failed": [name for name, stage in stages.items() if "failed" in stage],
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
            "encoder_family": pretrain_recipe.model.family,
            "objective": pretrain_recipe.objective.name,
            "tokenizer": f"WordPiece, {meta['vocab_size']} tokens, cased, trained on the pretraining text",
            "labelled_sentences": len(train_docs),
            "dev_sentences": len(dev_docs),  # the final scores' (plan.dev_sentences, or the whole dev set)
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
    """The pretrained encoder's top guesses for each FILL_MASK blank, and its parameter count: a fill-mask
    pipeline over a ``*ForMaskedLM`` export, CharBERT's own MLM head over a CharBERT export. Another export
    without a masked-LM head has no guesses: a pipeline would fill the blanks from a freshly initialised head."""
    from transformers import pipeline

    from spanlm.models.backbone import quiet_load_report
    from spanlm.models.charbert import is_charbert_directory

    if is_charbert_directory(encoder_dir):
        return _charbert_fill_mask(encoder_dir)
    config = json.loads((encoder_dir / "config.json").read_text(encoding="utf-8"))
    if not any(name.endswith("ForMaskedLM") for name in config.get("architectures") or []):
        from safetensors import safe_open

        with safe_open(encoder_dir / "model.safetensors", "pt") as weights:
            return [], sum(math.prod(weights.get_slice(name).get_shape()) for name in weights.keys())
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


def _charbert_fill_mask(encoder_dir: Path, top_k: int = 3) -> tuple[list[dict], int]:
    """A CharBERT export's guesses as pretraining made them: the MLM head it keeps in heads.safetensors over the
    token channel at the blank (which the char channel reads as one pad character, as it read every masked
    token); none when the export holds no such head. Also the parameters of both channels."""
    import torch
    from torch import nn
    from transformers import AutoConfig, AutoTokenizer

    from spanlm.models.backbone import mlm_head
    from spanlm.models.modeling_charbert import CharBertModel
    from spanlm.objectives.pretrained_heads import load_heads

    # The backbone's config with its charbert entry (CharBertModel serves every backbone family: no config class).
    model = CharBertModel.from_pretrained(str(encoder_dir), config=AutoConfig.from_pretrained(str(encoder_dir)))
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(str(encoder_dir))
    heads = nn.ModuleDict({"mlm_head": mlm_head(model.backbone)})  # the objective's head, under its name
    if not load_heads(heads, encoder_dir, {})["mlm_head"].startswith("loaded"):
        return [], int(model.num_parameters())
    head = heads["mlm_head"]
    encoding = tokenizer(FILL_MASK, padding=True, return_offsets_mapping=True, return_tensors="pt")
    with torch.no_grad():
        token = model(**model.char_featurizer(tokenizer).model_inputs(encoding, FILL_MASK)).token_hidden_state
        blanks = encoding["input_ids"] == tokenizer.mask_token_id  # (B, L): one blank per sentence
        scores, ids = head(token[blanks]).softmax(-1).topk(top_k)  # (B, top_k) each
    answers = [
        {
            "text": text,
            "top": [{"token": tokenizer.decode([i]), "score": round(s, 3)} for s, i in zip(row_scores, row_ids)],
        }
        for text, row_scores, row_ids in zip(FILL_MASK, scores.tolist(), ids.tolist())
    ]
    return answers, int(model.num_parameters())


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
    rows = [
        {
            "seed": run["seeds"][0],
            "mlm_accuracy": run["mlm_accuracy"],
            "unigram_accuracy": run["unigram_accuracy"],
            **{key: run[key] for key in F1_KEYS},
            "gap": (run["ner_f1_pretrained"] or 0.0) - (run["ner_f1_random"] or 0.0),
            "frozen_gap": (run["ner_f1_pretrained_frozen"] or 0.0) - (run["ner_f1_random_frozen"] or 0.0),
            "interrupted": run["interrupted"],
            "failed": run["failed"],
        }
        for run in runs
    ]
    complete = [row for row in rows if not row["interrupted"] and not row["failed"]]
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
        "interrupted": any(run["interrupted"] for run in runs) or len(runs) < len(seeds),
        "failed": sorted({name for run in runs for name in run["failed"]}),
    }
