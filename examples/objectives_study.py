"""Pretraining objectives compared downstream: each objective pretrained on the demo's corpus and budget, then
the demo's four GermEval 2014 NER arms (pretrained / random init × fine-tuned / frozen) per seed; with
``--task qa``, each objective pretrained on Chinese text instead, then CMRC 2018 extractive QA per seed.

    python examples/objectives_study.py --out runs/objectives-study --seeds 0 1 2
    python examples/objectives_study.py --out /tmp/study --quick     # a few steps per stage, two objectives
    python examples/objectives_study.py --task qa --out runs/objectives-study-qa --seeds 0 1 2

Everything runs through the ``spanlm`` CLI (prepare, pretrain, export, ner train, qa train) as a user would;
this script only chooses the settings, those of ``spanlm demo`` (:class:`spanlm.demo.DemoPlan`): the text of
the 24,000 GermEval 2014 training sentences, cased WordPiece, the recipe's own model and objective settings,
one pretraining run per objective (seed 0), then 300 NER steps on the first 500 labelled sentences for each
seed. A random-init arm depends only on the architecture and tokenizer, so objectives whose exports have the
same model config and vocabulary share one. Writes ``OUT/study.json`` and prints a markdown table. Rerunning
with the same ``--out`` keeps every finished stage (a pretraining run continues from its last checkpoint).

``--task qa`` (needs ``external/``, data/README.md; ``--external`` names another copy): the only extractive-QA
data is CMRC 2018, Chinese, so each objective is pretrained again, with the same recipe settings and budget, on
the two classical novels and the contexts of the CMRC 2018 trial split (the QA training text, unlabelled; no
dev text), with the Chinese SpanBERT recipe's tokenizer (per-character WordPiece 6,000) and jieba words. Then
the same four arms per seed, as ``spanlm qa train`` runs (:class:`QAPlan`: trial → dev, windows of 128
tokens, 200 steps at lr 5e-4, fixed before any run; windows, stride and question length halved for CharBERT's
64 positions), each scored with CMRC 2018's EM / F1 on all dev questions at the end.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from spanlm.demo import (
    NER_DATA,
    NER_RECIPE,
    QUICK,
    DemoPlan,
    _labelled_subset,
    _unlabelled_text,
    ner_overrides,
    pretrain_overrides,
)
from spanlm.recipes import shipped_root

# objective → its pretraining recipe. ELECTRA-GDES is DeBERTa-V3's recipe: replaced-token detection with
# gradient-disentangled embedding sharing (objective.electra.sharing: gdes) on a DeBERTa-V2 backbone.
RECIPES = {
    "mlm": "configs/pretrain/mlm.yaml",
    "wwm": "configs/pretrain/wwm.yaml",
    "spanbert": "configs/pretrain/spanbert.yaml",
    "macbert": "configs/pretrain/macbert.yaml",
    "electra-gdes": "configs/pretrain/deberta_v3_gdes.yaml",
    "charbert": "configs/pretrain/charbert.yaml",
}
QUICK_OBJECTIVES = ("spanbert", "charbert")
ARMS = ("fine-tuned", "frozen")
INITS = ("pretrained", "random")
PRETRAIN_SEED = 0
QA_RECIPE = "configs/qa/cmrc2018.yaml"
QA_METRICS = ("em", "f1")  # CMRC 2018's, in percent
# The Chinese tokenizer and word segmentation of the QA half: those of the Chinese SpanBERT recipe.
CHINESE_RECIPE = "configs/pretrain/spanbert_chinese.yaml"


@dataclasses.dataclass(frozen=True)
class QAPlan:
    """CMRC 2018 fine-tuning, trial → dev: one of the two settings of RESULTS.md's CMRC 2018 section, chosen
    before any run of this study (the higher rate for encoders half as wide; 200 steps, not 300) and never
    tuned on dev. Batch size, weight decay and answer length are the recipe's."""

    max_length: int = 128  # tokens per window: the pretraining blocks' length
    doc_stride: int = 96
    max_query_length: int = 32
    steps: int = 200
    lr: float = 5e-4
    warmup_steps: int = 20
    dev_questions: int | None = None  # the first this many dev questions; None: all of them


QA_QUICK = QAPlan(steps=6, warmup_steps=1, dev_questions=40)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--task", choices=("ner", "qa"), default="ner", help="qa: Chinese pretraining, CMRC 2018")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--objectives", nargs="+", choices=list(RECIPES), help="default: all (--quick: two)")
    parser.add_argument("--quick", action="store_true", help="the demo's --quick budgets")
    parser.add_argument("--jobs", type=int, default=2, help="spanlm processes at once")
    parser.add_argument(
        "--external", type=Path, default=Path("external"), help="--task qa: the datasets of data/README.md"
    )
    args = parser.parse_args(argv)
    # Each spanlm process gets its share of the cores unless OMP_NUM_THREADS says otherwise: processes side by
    # side with a thread per core each spin-wait on one another's cores and run several times slower.
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // args.jobs)))
    objectives = args.objectives or (list(QUICK_OBJECTIVES) if args.quick else list(RECIPES))
    plan = QUICK if args.quick else DemoPlan()
    if args.task == "qa":
        missing = _missing_chinese_data(args.external)
        if missing:
            parser.error(f"{missing}: not found; --task qa needs CMRC 2018 and the Chinese novels (data/README.md)")
        study = run_study(
            args.out, objectives, args.seeds, plan, args.jobs, QA_QUICK if args.quick else QAPlan(), args.external
        )
        print(qa_markdown_table(study))
    else:
        study = run_study(args.out, objectives, args.seeds, plan, args.jobs)
        print(markdown_table(study))
    return study


def run_study(
    out: Path,
    objectives: list[str],
    seeds: list[int],
    plan: DemoPlan,
    jobs: int,
    qa: QAPlan | None = None,
    external: Path = Path("external"),
) -> dict:
    """The NER study, or with ``qa`` the QA one: the same objectives pretrained on Chinese text instead."""
    root = shipped_root()
    out.mkdir(parents=True, exist_ok=True)
    corpus = _corpus(root, out, plan) if qa is None else _chinese_corpus(root, out, external, qa)

    # Objectives whose recipes name the same prepared directory share one (the same tokenizer); prepared
    # one after another, before the pretraining runs read them side by side.
    prepared = {
        name: out / "prepared" / _prepared_name(root / RECIPES[name], corpus["language"]) for name in objectives
    }
    for name in objectives:
        _spanlm(
            ["prepare", str(root / RECIPES[name]), *_pretrain_overrides(name, out, prepared, corpus, plan)],
            out / "logs" / f"prepare-{name}",
        )
    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(lambda name: _pretrain(root, name, out, prepared, corpus, plan), objectives))

    # Random init: one arm per distinct (model config, vocabulary), run from the first export that has it.
    architecture = {name: _architecture(out / "encoders" / name) for name in objectives}
    random_source = {}
    for name in objectives:
        random_source.setdefault(architecture[name], name)
    if qa is not None:
        return _qa_study(root, out, objectives, seeds, plan, jobs, qa, corpus, architecture, random_source)
    # One objective's arms after another (its random-init arms with the first objective that needs them),
    # in the order given: a study stopped part-way has whole objectives finished.
    runs = []
    for name in objectives:
        runs += [(name, "pretrained", arm, seed) for seed in seeds for arm in ARMS]
        if random_source[architecture[name]] == name:
            runs += [(name, "random", arm, seed) for seed in seeds for arm in ARMS]
    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(lambda run: _ner(root, out, corpus, plan, *run), runs))

    rows = {}
    for name in sorted(objectives, key=list(RECIPES).index):
        pretrained_run = out / "pretrain" / name
        random_name = random_source[architecture[name]]
        f1 = {
            f"{init}_{arm}": [_f1(out, name if init == "pretrained" else random_name, init, arm, s) for s in seeds]
            for init in INITS
            for arm in ARMS
        }
        rows[name] = {
            "recipe": RECIPES[name],
            "mlm_accuracy": _final_eval(pretrained_run).get("mlm_accuracy"),
            "unigram_accuracy": _unigram(pretrained_run),
            "random_init_from": random_name,
            "ner_max_len": _ner_max_len(root, out / "encoders" / name),
            "f1": f1,
            **{
                f"gap_{arm}": _spread([p - r for p, r in zip(f1[f"pretrained_{arm}"], f1[f"random_{arm}"])])
                for arm in ARMS
            },
            **{f"{key}_spread": _spread(values) for key, values in f1.items()},
        }
    study = {
        "seeds": seeds,
        "pretrain_seed": PRETRAIN_SEED,
        "plan": plan.__dict__,
        "threads_per_process": int(os.environ.get("OMP_NUM_THREADS", 0)) or None,  # None: torch's default
        "objectives": rows,
    }
    (out / "study.json").write_text(json.dumps(study, indent=2) + "\n", encoding="utf-8")
    return study


# -- the data -----------------------------------------------------------------------------------------------
def _corpus(root: Path, out: Path, plan: DemoPlan) -> dict:
    """The demo's pretraining text (the unlabelled sentences and the labelled ones' text) and NER split."""
    from spanlm.config import load_config
    from spanlm.ner.config import NerRecipe

    data = root / NER_DATA
    train, dev = data / "train.conll", data / "dev.conll"
    ner = load_config(root / NER_RECIPE, [f"data.train={train}", f"data.dev={dev}"], cls=NerRecipe)
    task_text = _unlabelled_text(ner.data, out / "task_text" / "train_sentences.txt")
    return {
        "language": "english",  # the recipes' prepared directories keep their names (english-…)
        "inputs": [str(data / "unlabelled.txt.gz"), str(task_text)],
        "pretrain_overrides": ["tokenizer.lowercase=false"],  # cased, as BERT-cased for NER
        "ner_train": str(_labelled_subset(train, plan.labelled_sentences, out / "ner_train.conll")),
        # --quick: the demo's quick plan scores the first dev sentences only
        "ner_dev": str(
            dev if plan.dev_sentences is None else _labelled_subset(dev, plan.dev_sentences, out / "ner_dev.conll")
        ),
    }


def _missing_chinese_data(external: Path) -> Path | None:
    wanted = [external / "cmrc2018" / f"cmrc2018_{split}.squad.json" for split in ("trial", "dev")]
    wanted.append(external / "chinese_text" / "classical_novels")
    return next((path for path in wanted if not path.exists()), None)


def _chinese_corpus(root: Path, out: Path, external: Path, qa: QAPlan) -> dict:
    """The QA half's pretraining text: the two classical novels and the contexts of the CMRC 2018 trial
    split (the QA training text, task-adaptive; its questions and answers are not used, and no dev text is);
    the Chinese SpanBERT recipe's tokenizer (per-character WordPiece) and jieba words; the QA split."""
    import yaml

    cmrc = external / "cmrc2018"
    trial = json.loads((cmrc / "cmrc2018_trial.squad.json").read_text(encoding="utf-8"))
    contexts = out / "task_text" / "cmrc2018_trial_contexts.txt"
    contexts.parent.mkdir(parents=True, exist_ok=True)
    texts = dict.fromkeys(paragraph["context"] for article in trial["data"] for paragraph in article["paragraphs"])
    contexts.write_text("".join(text.strip() + "\n" for text in texts), encoding="utf-8")

    chinese = yaml.safe_load((root / CHINESE_RECIPE).read_text(encoding="utf-8"))
    dev = cmrc / "cmrc2018_dev.squad.json"
    return {
        "language": "chinese",
        "inputs": [*map(str, sorted((external / "chinese_text" / "classical_novels").glob("*.txt"))), str(contexts)],
        # Every objective gets the jieba words: the word-aware ones (wwm, spanbert, macbert, CharBERT's word
        # noise) mask or noise whole Chinese words; mlm and ELECTRA ignore them, and so can share one prepared
        # corpus (one tokenizer: mlm, wwm and spanbert share their random-init arms too).
        "pretrain_overrides": [
            *(f"tokenizer.{key}={value}" for key, value in chinese["tokenizer"].items()),
            f"data.words={chinese['data']['words']}",
        ],
        "qa_train": str(cmrc / "cmrc2018_trial.squad.json"),
        "qa_dev": str(dev if qa.dev_questions is None else _first_questions(dev, qa.dev_questions, out)),
    }


def _first_questions(squad: Path, questions: int, out: Path) -> Path:
    """The first ``questions`` questions of a SQuAD-format file (--quick's dev set), in ``out``."""
    data = json.loads(squad.read_text(encoding="utf-8"))
    articles, left = [], questions
    for article in data["data"]:
        paragraphs = []
        for paragraph in article["paragraphs"]:
            if left > 0:
                paragraphs.append({**paragraph, "qas": paragraph["qas"][:left]})
                left -= len(paragraphs[-1]["qas"])
        if paragraphs:
            articles.append({**article, "paragraphs": paragraphs})
    path = out / f"{squad.stem}.first{questions}.json"
    path.write_text(json.dumps({**data, "data": articles}, ensure_ascii=False), encoding="utf-8")
    return path


def _prepared_name(recipe: Path, language: str) -> str:
    import yaml

    name = Path(yaml.safe_load(recipe.read_text(encoding="utf-8"))["data"]["prepared_dir"]).name
    return name.replace("english", language)


# -- the stages ---------------------------------------------------------------------------------------------
def _pretrain_overrides(name: str, out: Path, prepared: dict, corpus: dict, plan: DemoPlan) -> list[str]:
    """The demo's pretraining overrides (spanlm.demo) and the corpus's tokenizer settings, the rest as the recipe
    has it."""
    return [
        *pretrain_overrides(plan, PRETRAIN_SEED, corpus["inputs"], prepared[name], out / "pretrain" / name),
        *corpus["pretrain_overrides"],
        "logging.progress=false",
    ]


def _pretrain(root: Path, name: str, out: Path, prepared: dict, corpus: dict, plan: DemoPlan) -> None:
    overrides = _pretrain_overrides(name, out, prepared, corpus, plan)
    _spanlm(["pretrain", str(root / RECIPES[name]), *overrides, "--resume", "auto"], out / "logs" / f"pretrain-{name}")
    encoder = out / "encoders" / name
    if encoder.exists():  # the run may have gone on since: export its last checkpoint afresh
        shutil.rmtree(encoder)
    _spanlm(["export", str(out / "pretrain" / name), "--out", str(encoder)], out / "logs" / f"export-{name}")


def _finished_or_cleared(run_dir: Path, steps: int) -> bool:
    """True when the fine-tuning run in ``run_dir`` reached ``steps`` and was scored; else it is removed, to be
    run afresh (a run stopped part-way scored an early checkpoint)."""
    from spanlm.train.checkpoint import latest_checkpoint, step_of

    checkpoint = latest_checkpoint(run_dir) if run_dir.exists() else None
    if (run_dir / "eval.json").is_file() and checkpoint is not None and step_of(checkpoint) >= steps:
        return True
    if run_dir.exists():
        shutil.rmtree(run_dir)
    return False


def _ner_dir(out: Path, name: str, init: str, arm: str, seed: int) -> Path:
    return out / "ner" / f"{name}-{init}-{arm}-seed{seed}"


def _ner(root: Path, out: Path, corpus: dict, plan: DemoPlan, name: str, init: str, arm: str, seed: int) -> None:
    """One arm of the demo's NER fine-tuning (spanlm.demo's overrides), skipped when it finished before."""
    ner_dir = _ner_dir(out, name, init, arm, seed)
    if _finished_or_cleared(ner_dir, plan.ner_steps):
        return
    demo_arm = init if arm != "frozen" else f"{init}-frozen"
    overrides = [
        *ner_overrides(plan, seed, out / "encoders" / name, demo_arm, corpus["ner_train"], corpus["ner_dev"], ner_dir),
        f"data.max_len={_ner_max_len(root, out / 'encoders' / name)}",
        "logging.progress=false",
    ]
    _spanlm(["ner", "train", str(root / NER_RECIPE), *overrides], out / "logs" / ner_dir.name)


def _ner_max_len(root: Path, encoder: Path) -> int:
    """The NER recipe's window, or the encoder's positions where it has fewer (CharBERT's short blocks)."""
    import yaml

    window = yaml.safe_load((root / NER_RECIPE).read_text(encoding="utf-8"))["data"]["max_len"]
    positions = json.loads((encoder / "config.json").read_text(encoding="utf-8")).get("max_position_embeddings")
    return min(window, positions) if positions else window


def _qa_study(
    root: Path,
    out: Path,
    objectives: list[str],
    seeds: list[int],
    plan: DemoPlan,
    jobs: int,
    qa: QAPlan,
    corpus: dict,
    architecture: dict,
    random_source: dict,
) -> dict:
    """The QA arms (pretrained / random init × fine-tuned / frozen) per objective and seed, then ``OUT/study.json``."""
    runs = []
    for name in objectives:  # as the NER arms: whole objectives in the order given
        runs += [(name, "pretrained", arm, seed) for seed in seeds for arm in ARMS]
        if random_source[architecture[name]] == name:
            runs += [(name, "random", arm, seed) for seed in seeds for arm in ARMS]
    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(lambda run: _qa(root, out, corpus, qa, *run), runs))

    rows = {}
    for name in sorted(objectives, key=list(RECIPES).index):
        pretrained_run = out / "pretrain" / name
        source = {"pretrained": name, "random": random_source[architecture[name]]}
        scores = {
            f"{init}_{arm}": [_qa_scores(out, source[init], init, arm, seed) for seed in seeds]
            for init in INITS
            for arm in ARMS
        }
        metrics = {
            metric: {key: [run[metric] for run in per_seed] for key, per_seed in scores.items()}
            for metric in QA_METRICS
        }
        rows[name] = {
            "recipe": RECIPES[name],
            "mlm_accuracy": _final_eval(pretrained_run).get("mlm_accuracy"),
            "unigram_accuracy": _unigram(pretrained_run),
            "random_init_from": source["random"],
            "qa_windows": _qa_windows(out / "encoders" / name, qa),
            **metrics,
            **{
                f"gap_{metric}_{arm}": _spread(
                    [p - r for p, r in zip(values[f"pretrained_{arm}"], values[f"random_{arm}"])]
                )
                for metric, values in metrics.items()
                for arm in ARMS
            },
            **{
                f"{metric}_{key}_spread": _spread(per_seed)
                for metric, values in metrics.items()
                for key, per_seed in values.items()
            },
        }
    study = {
        "task": "qa",
        "seeds": seeds,
        "pretrain_seed": PRETRAIN_SEED,
        "plan": plan.__dict__,
        "qa": {**dataclasses.asdict(qa), "recipe": QA_RECIPE, "train": corpus["qa_train"], "dev": corpus["qa_dev"]},
        "threads_per_process": int(os.environ.get("OMP_NUM_THREADS", 0)) or None,  # None: torch's default
        "objectives": rows,
    }
    (out / "study.json").write_text(json.dumps(study, indent=2) + "\n", encoding="utf-8")
    return study


def _qa_dir(out: Path, name: str, init: str, arm: str, seed: int) -> Path:
    """``qa/NAME-INIT-seedN`` fine-tuned, ``qa/NAME-INIT-frozen-seedN`` frozen (the demo's arm names)."""
    return out / "qa" / f"{name}-{init}{'-frozen' if arm == 'frozen' else ''}-seed{seed}"


def _qa(root: Path, out: Path, corpus: dict, qa: QAPlan, name: str, init: str, arm: str, seed: int) -> None:
    """One CMRC 2018 fine-tuning run (trial → dev), skipped when it finished before."""
    qa_dir = _qa_dir(out, name, init, arm, seed)
    if _finished_or_cleared(qa_dir, qa.steps):
        return
    windows = _qa_windows(out / "encoders" / name, qa)
    overrides = [
        f"seed={seed}",
        f"model.path={out / 'encoders' / name}",
        f"model.init={init}",
        f"model.frozen={str(arm == 'frozen').lower()}",
        f"data.train={corpus['qa_train']}",
        f"data.dev={corpus['qa_dev']}",
        *(f"data.{key}={value}" for key, value in windows.items()),
        f"train.output_dir={qa_dir}",
        f"train.max_steps={qa.steps}",
        f"train.warmup_steps={qa.warmup_steps}",
        f"train.lr={qa.lr}",
        "train.eval_every=0",  # scored once, at the end of the schedule: no checkpoint is picked on dev
        f"train.save_every={qa.steps}",
        f"train.log_every={min(10, qa.steps)}",
        "logging.report_to=[]",
        "logging.progress=false",
    ]
    _spanlm(["qa", "train", str(root / QA_RECIPE), *overrides], out / "logs" / qa_dir.name)


def _qa_windows(encoder: Path, qa: QAPlan) -> dict:
    """The plan's window, stride and question length; scaled down together to the encoder's positions where it
    has fewer (CharBERT's 64), so a window keeps the same shares of question and context."""
    positions = json.loads((encoder / "config.json").read_text(encoding="utf-8")).get("max_position_embeddings")
    length = min(qa.max_length, positions) if positions else qa.max_length
    return {
        "max_length": length,
        "doc_stride": qa.doc_stride * length // qa.max_length,
        "max_query_length": qa.max_query_length * length // qa.max_length,
    }


def _qa_scores(out: Path, name: str, init: str, arm: str, seed: int) -> dict:
    scores = json.loads((_qa_dir(out, name, init, arm, seed) / "eval.json").read_text(encoding="utf-8"))
    return {metric: float(scores[metric]) for metric in QA_METRICS}


def _spanlm(arguments: list[str], log: Path) -> None:
    """``spanlm ARGUMENTS`` in a subprocess, its output in ``LOG.log``; a failure raises with its last lines."""
    log = log.with_suffix(".log") if log.suffix != ".log" else log
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w", encoding="utf-8") as stream:
        done = subprocess.run([sys.executable, "-m", "spanlm", *arguments], stdout=stream, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        tail = "".join(log.read_text(encoding="utf-8").splitlines(keepends=True)[-20:])
        raise RuntimeError(f"spanlm {' '.join(arguments[:2])} failed (exit {done.returncode}; {log}):\n{tail}")


# -- the results --------------------------------------------------------------------------------------------
def _architecture(encoder: Path) -> str:
    """A digest of the export's model config and vocabulary: equal digests give equal random inits."""
    config = json.loads((encoder / "config.json").read_text(encoding="utf-8"))
    for key in ("transformers_version", "architectures", "_name_or_path", "dtype", "torch_dtype"):
        config.pop(key, None)
    vocab = sorted(encoder.glob("vocab.*")) + sorted(encoder.glob("tokenizer.json"))
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode())
    for path in vocab[:1]:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _f1(out: Path, name: str, init: str, arm: str, seed: int) -> float:
    scores = json.loads((_ner_dir(out, name, init, arm, seed) / "eval.json").read_text(encoding="utf-8"))
    return float(scores["micro"]["f1"])


def _final_eval(run_dir: Path) -> dict:
    from spanlm.train.metrics import read_metrics

    evals = [record for record in read_metrics(run_dir) if record.get("kind") == "eval"]
    return evals[-1] if evals else {}


def _unigram(run_dir: Path) -> float | None:
    from spanlm.report import unigram_accuracy

    return unigram_accuracy(run_dir)


def _spread(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values), "sd": statistics.stdev(values) if len(values) > 1 else 0.0}


def _comparison_cells(pretrained: dict, random: dict, gap: dict) -> list[str]:
    """A table's two cells for one comparison: "pretrained / random" (mean ± sd each) and the gap."""
    return [
        f"{pretrained['mean']:.2f} ± {pretrained['sd']:.2f} / {random['mean']:.2f} ± {random['sd']:.2f}",
        f"{gap['mean']:+.2f} ± {gap['sd']:.2f}",
    ]


def markdown_table(study: dict) -> str:
    lines = [
        "| objective | MLM acc (unigram) | F1 fine-tuned pretrained / random | gap mean ± sd "
        "| F1 frozen pretrained / random | gap mean ± sd |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in study["objectives"].items():
        cells = [name, f"{row['mlm_accuracy']:.3f} ({row['unigram_accuracy']:.3f})"]
        for arm in ARMS:
            cells += _comparison_cells(row[f"pretrained_{arm}_spread"], row[f"random_{arm}_spread"], row[f"gap_{arm}"])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def qa_markdown_table(study: dict) -> str:
    header = [f"{arm} {metric.upper()} pretrained / random | gap mean ± sd" for arm in ARMS for metric in QA_METRICS]
    lines = [
        "| objective | MLM acc (unigram) | " + " | ".join(header) + " |",
        "|---|---|" + "---|---|" * len(header),
    ]
    for name, row in study["objectives"].items():
        cells = [name, f"{row['mlm_accuracy']:.3f} ({row['unigram_accuracy']:.3f})"]
        for arm in ARMS:
            for metric in QA_METRICS:
                cells += _comparison_cells(
                    row[f"{metric}_pretrained_{arm}_spread"],
                    row[f"{metric}_random_{arm}_spread"],
                    row[f"gap_{metric}_{arm}"],
                )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
