#!/usr/bin/env bash
# Pretraining objectives compared downstream, on `spanlm eval`. Pretrains one tiny encoder per objective with the
# demo's budget (its recipe's model, 1,500 steps, seed 0), then fine-tunes each, and a randomly initialised copy
# of each architecture, fine-tuned and frozen, over 3 seeds:
#
#   bash examples/objectives_study.sh runs/objectives-study       # GermEval 2014 NER (embedded data)
#   bash examples/objectives_study.sh runs/objectives-study-qa qa # CMRC 2018 QA (needs external/, data/README.md)
#
# NER: every objective reads the demo's pretraining text (the 24,000 GermEval 2014 training sentences, cased),
# then the demo's NER comparison (configs/eval/demo.yaml: 500 labelled sentences, 300 steps) is scored on the
# whole dev set. QA: every objective reads the two classical novels and the contexts of the CMRC 2018 trial split
# (the QA training text, unlabelled; no dev text) with the Chinese SpanBERT recipe's tokenizer and jieba words;
# then chinese-small's CMRC 2018 task (trial → the whole dev split, 200 steps at lr 5e-4).
#
# Windows are CharBERT's 64 positions for every encoder (NER: 64 tokens; QA: 64 with 16 for the question and a
# stride of 48), so that one suite compares them all. Each objective is compared with a random init of its own
# architecture and vocabulary (ELECTRA-GDES is DeBERTa-V3's recipe on a DeBERTa-V2 backbone; MacBERT's corpus,
# prepared with its similar-word table, has its own token ids). The settings were fixed before any run. Rerunning with the same OUT keeps every finished
# pretraining run and cell. STEPS, SEEDS, NER_STEPS, QA_STEPS, DEV (the first DEV dev sentences or questions),
# OBJECTIVES, ARMS (fine-tuned, frozen or both) and JOBS (processes at once) change the budget: tests/examples run
# it with a few steps.
set -euo pipefail
OUT=${1:?usage: objectives_study.sh OUT [ner|qa]}
TASK=${2:-ner}
SPANLM=${SPANLM:-spanlm}
EXTERNAL=${EXTERNAL:-external}
STEPS=${STEPS:-1500}
SEEDS=${SEEDS:-0 1 2}
NER_STEPS=${NER_STEPS:-300}
QA_STEPS=${QA_STEPS:-200}
DEV=${DEV:-}
OBJECTIVES=${OBJECTIVES:-mlm wwm spanbert macbert electra-gdes charbert}
ARMS=${ARMS:-fine-tuned frozen}
JOBS=${JOBS:-2}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} # one thread per process: JOBS processes side by side
ROOT=$(cd "$(dirname "$0")/.." && pwd)
case $TASK in
ner) ;;
qa)
    for wanted in "$EXTERNAL/cmrc2018/cmrc2018_dev.squad.json" "$EXTERNAL/chinese_text/classical_novels"; do
        [ -e "$wanted" ] || { echo "objectives_study.sh: $wanted: not found; qa needs external/ (data/README.md)" >&2 && exit 2; }
    done
    ;;
*) echo "objectives_study.sh: the task is ner or qa, got $TASK" >&2 && exit 2 ;;
esac
mkdir -p "$OUT/text" "$OUT/logs"

# The text and splits: written once, by the same code whatever the budget.
python - "$ROOT" "$OUT" "$TASK" "$EXTERNAL" "$DEV" <<'PY'
import json, sys
from pathlib import Path

root, out, task, external, dev = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], Path(sys.argv[4]), sys.argv[5]
if task == "ner":
    records = (root / "data/ner/germeval2014/train.conll").read_text(encoding="utf-8").split("\n\n")
    sentences = [" ".join(line.split("\t")[0] for line in r.splitlines() if line.strip()) for r in records]
    (out / "text/train_sentences.txt").write_text("".join(s + "\n" for s in sentences if s), encoding="utf-8")
    dev_records = [r for r in (root / "data/ner/germeval2014/dev.conll").read_text(encoding="utf-8").split("\n\n")]
    dev_records = [r for r in dev_records if r.strip()][: int(dev) if dev else None]
    (out / "text/dev.conll").write_text("\n\n".join(dev_records) + "\n", encoding="utf-8")
else:
    trial = json.loads((root / "data/qa/cmrc2018/train.json").read_text(encoding="utf-8"))
    contexts = dict.fromkeys(p["context"].strip() for a in trial["data"] for p in a["paragraphs"])
    (out / "text/cmrc2018_trial_contexts.txt").write_text("".join(c + "\n" for c in contexts), encoding="utf-8")
    data = json.loads((external / "cmrc2018/cmrc2018_dev.squad.json").read_text(encoding="utf-8"))
    left, articles = int(dev) if dev else None, []
    for article in data["data"]:  # the first DEV questions, or all
        paragraphs = []
        for paragraph in article["paragraphs"]:
            qas = paragraph["qas"] if left is None else paragraph["qas"][: max(left, 0)]
            if qas:
                paragraphs.append({**paragraph, "qas": qas})
                left = None if left is None else left - len(qas)
        if paragraphs:
            articles.append({**article, "paragraphs": paragraphs})
    (out / "text/cmrc2018_dev.json").write_text(json.dumps({**data, "data": articles}, ensure_ascii=False), "utf-8")
PY

declare -A RECIPE=(
    [mlm]=mlm [wwm]=wwm [spanbert]=spanbert [macbert]=macbert [electra-gdes]=deberta_v3_gdes [charbert]=charbert
)
if [ "$TASK" = ner ]; then
    INPUTS='["'$ROOT'/data/ner/germeval2014/unlabelled.txt.gz", "'$OUT'/text/train_sentences.txt"]'
    TEXT_SETTINGS=(tokenizer.lowercase=false) # cased, as BERT-cased for NER
else
    INPUTS=$(python -c 'import json, sys; from pathlib import Path
novels = sorted(str(p) for p in Path(sys.argv[1], "chinese_text/classical_novels").glob("*.txt"))
print(json.dumps([*novels, sys.argv[2] + "/text/cmrc2018_trial_contexts.txt"]))' "$EXTERNAL" "$OUT")
    # The Chinese SpanBERT recipe's tokenizer (per-character WordPiece) and jieba words for every objective: the
    # word-aware ones mask or noise whole Chinese words; mlm and ELECTRA ignore them.
    mapfile -t TEXT_SETTINGS < <(python -c 'import sys, yaml
recipe = yaml.safe_load(open(sys.argv[1], encoding="utf-8"))
settings = [f"tokenizer.{key}={value}" for key, value in recipe["tokenizer"].items()]
print("\n".join([*settings, "data.words=" + recipe["data"]["words"]]))' \
        "$ROOT/configs/pretrain/spanbert_chinese.yaml")
fi

settings() { # NAME → SETTINGS: the demo's pretraining settings on this study's text. Objectives whose recipes name
    # the same prepared directory share one (one tokenizer: they can share a random init too).
    local recipe=$ROOT/configs/pretrain/${RECIPE[$1]}.yaml
    local prepared
    prepared=$(python -c 'import sys, yaml; from pathlib import Path
print(Path(yaml.safe_load(open(sys.argv[1], encoding="utf-8"))["data"]["prepared_dir"]).name)' "$recipe")
    SETTINGS=("$recipe" seed=0 "data.inputs=$INPUTS" "data.prepared_dir=$OUT/prepared/$prepared"
        "train.output_dir=$OUT/pretrain/$1" "train.max_steps=$STEPS" train.eval_at_start=true
        "train.eval_every=$(((STEPS + 5) / 6))" "train.save_every=$STEPS" train.log_every=10 train.eval_blocks=64
        "logging.report_to=[]" logging.progress=false "${TEXT_SETTINGS[@]}")
}
pretrain() { # NAME, then its export
    local name=$1
    [ -f "$OUT/export/$name/config.json" ] && return
    settings "$name"
    "$SPANLM" pretrain "${SETTINGS[@]}" --resume auto \
        >"$OUT/logs/pretrain-$name.log" 2>&1 || failed "pretraining $name" "$OUT/logs/pretrain-$name.log"
    "$SPANLM" export "$OUT/pretrain/$name" --out "$OUT/export/$name" >"$OUT/logs/export-$name.log" 2>&1 ||
        failed "exporting $name" "$OUT/logs/export-$name.log"
}
failed() { # WHAT LOG
    echo "objectives_study.sh: $1 failed: $(tail -n 1 "$2") (all of it: $2)" >&2
    return 1
}
for name in $OBJECTIVES; do # prepared one after another, before the pretraining runs read them side by side
    [ -n "${RECIPE[$name]:-}" ] || { echo "objectives_study.sh: unknown objective $name" >&2 && exit 2; }
    [ -f "$OUT/export/$name/config.json" ] && continue
    settings "$name"
    "$SPANLM" prepare "${SETTINGS[@]}" >"$OUT/logs/prepare-$name.log" 2>&1 ||
        failed "preparing $name" "$OUT/logs/prepare-$name.log"
done
for name in $OBJECTIVES; do
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
    echo "pretraining $name → $OUT/pretrain/$name" >&2
    pretrain "$name" &
done
while [ "$(jobs -rp | wc -l)" -gt 0 ]; do wait -n; done

# The encoders, and the baseline each is compared with: a random init of its own architecture and vocabulary,
# one per distinct (model config, vocabulary), named after the first objective that has it (`random-mlm` for
# the BERT objectives that share one tokenizer).
PLAN=$(python - "$OUT/export" $OBJECTIVES <<'PY'
import hashlib, json, sys
from pathlib import Path

def architecture(encoder: Path) -> str:
    config = json.loads((encoder / "config.json").read_text(encoding="utf-8"))
    config = {k: v for k, v in config.items() if k not in ("architectures", "_name_or_path", "transformers_version", "dtype", "torch_dtype")}
    vocab = sorted(encoder.glob("vocab.*")) or sorted(encoder.glob("tokenizer.json"))
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode() + vocab[0].read_bytes()).hexdigest()

exports, names = Path(sys.argv[1]), sys.argv[2:]
first = {}
for name in names:
    first.setdefault(architecture(exports / name), name)
randoms = [f"random-{name}" for name in first.values()]
print(" ".join([*(f"{name}={exports / name}" for name in names), *(f"random-{n}=random:{exports / n}" for n in first.values())]))
print(" ".join([*(f"{name}=random-{first[architecture(exports / name)]}" for name in names), *(f"{r}={r}" for r in randoms)]))
PY
)
read -ra ENCODERS <<<"$(sed -n 1p <<<"$PLAN")"
read -ra BASELINES <<<"$(sed -n 2p <<<"$PLAN")"

{
    echo "# Pretraining objectives compared downstream ($TASK): written by examples/objectives_study.sh"
    echo "seeds: [${SEEDS// /, }]"
    echo "tasks:"
    if [ "$TASK" = ner ]; then
        cat <<YAML
  - name: germeval2014
    kind: ner
    recipe: ner/germeval2014
    metric: f1
    arms: [${ARMS// /, }]
    settings:  # the demo's (configs/eval/demo.yaml), 64-token windows, scored once at the end
      data.train_docs: 500
      data.dev: $OUT/text/dev.conll
      data.max_len: 64
      data.stride: 16
      train.max_steps: $NER_STEPS
      train.eval_every: 0
      train.save_every: $NER_STEPS
      train.log_every: 10
      train.lr: 3.0e-3
      train.encoder_lr: 1.0e-3
      train.warmup_steps: $((NER_STEPS / 10 > 0 ? NER_STEPS / 10 : 1))
YAML
    else
        cat <<YAML
  - name: cmrc2018
    kind: qa
    recipe: qa/cmrc2018
    metric: f1
    arms: [${ARMS// /, }]
    settings:  # chinese-small's (configs/eval/chinese-small.yaml), CharBERT's 64-token windows
      data.train: $ROOT/data/qa/cmrc2018/train.json
      data.dev: $OUT/text/cmrc2018_dev.json
      data.max_length: 64
      data.doc_stride: 48
      data.max_query_length: 16
      train.max_steps: $QA_STEPS
      train.warmup_steps: $((QA_STEPS / 10 > 0 ? QA_STEPS / 10 : 1))
      train.lr: 5.0e-4
      train.eval_every: 0
      train.save_every: $QA_STEPS
YAML
    fi
} >"$OUT/suite.yaml"

"$SPANLM" eval "$OUT/suite.yaml" --out "$OUT/eval" --jobs "$JOBS" --encoders "${ENCODERS[@]}" \
    --baseline "${BASELINES[@]}"
