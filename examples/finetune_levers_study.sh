#!/usr/bin/env bash
# Fine-tuning levers, one at a time: does any of them keep what a demo-size pretrained encoder learnt, where its
# fine-tuned start loses to a random init (TNEWS) or does not beat it (SST-2)? Each lever is one `spanlm eval` suite
# of both tasks (fine-tuned, 3 seeds, the pretrained SpanBERT against a random init of its architecture), the
# levers applied to every encoder alike:
#
#   bash examples/finetune_levers_study.sh runs/levers-study     # needs external/ (data/README.md): SST-2, TNEWS
#
# baseline      the classification study's settings (600 steps, batch 32, head lr 3e-3, encoder lr 1e-3, warmup 10%),
#               the head reading [CLS] (cls.pooling: cls, the stock BERT head's)
# layer-decay   train.layer_decay=0.8 (ELECTRA's layer-wise decay)
# reinit-1      model.reinit_layers=1 (the top layer drawn afresh: Zhang et al. 2021)
# one-rate      train.lr=5e-4 and no encoder rate of its own (every weight at one rate)
# warmup-30     30% of the steps warming up instead of 10%
# longer        3× the steps
# mean-pooling  cls.pooling: mean (the real tokens' mean; spanlm cls's default)
# longer-mean   3× the steps with the mean (the two levers that closed the TNEWS gap, together)
#
# The encoders are the classification study's (examples/classification_study.sh): pretrained for STEPS steps on the
# books and the tasks' own training text (task-adaptive), reused when OUT already holds them. Rerunning keeps every
# finished pretraining run and cell. LEVERS (names above) and SEEDS change what runs; tests/examples run it small.
set -euo pipefail
OUT=${1:?usage: finetune_levers_study.sh OUT}
EXTERNAL=${EXTERNAL:-external}
SPANLM=${SPANLM:-spanlm}
STEPS=${STEPS:-1500}
TASK_STEPS=${TASK_STEPS:-600}
SEEDS=${SEEDS:-0, 1, 2}
LEVERS=${LEVERS:-baseline layer-decay reinit-1 one-rate warmup-30 longer mean-pooling longer-mean}
DEV=${DEV:-}
for wanted in "$EXTERNAL/glue/SST-2/train.tsv" "$EXTERNAL/tnews/tnews_public.zip" "$EXTERNAL/tnews/dev.json"; do
    [ -e "$wanted" ] || { echo "finetune_levers_study.sh: $wanted: not found (data/README.md, external/)" >&2 && exit 2; }
done
mkdir -p "$OUT/text"

python - "$EXTERNAL" "$OUT" "$DEV" <<'PY'
import json, sys, zipfile
from pathlib import Path

external, out, dev = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
rows = [line.split("\t") for line in (external / "glue/SST-2/train.tsv").read_text(encoding="utf-8-sig").splitlines()[1:]]
(out / "text/english_tasks.txt").write_text("\n".join(r[0].strip() for r in rows if r) + "\n", encoding="utf-8")
with zipfile.ZipFile(external / "tnews/tnews_public.zip") as archive:
    train = archive.read("tnews_public/train.json").decode("utf-8")
(out / "text/tnews_train.json").write_text(train, encoding="utf-8")
titles = [json.loads(line)["sentence"] for line in train.splitlines() if line.strip()]
(out / "text/chinese_tasks.txt").write_text("\n".join(titles) + "\n", encoding="utf-8")
# The dev sets, whole or their first DEV lines (a smoke run)
keep = int(dev) if dev else None
sst2 = (external / "glue/SST-2/dev.tsv").read_text(encoding="utf-8-sig").splitlines()
(out / "text/sst2_dev.tsv").write_text("\n".join(sst2[: keep + 1 if keep else None]) + "\n", encoding="utf-8")
tnews = (external / "tnews/dev.json").read_text(encoding="utf-8").splitlines()
(out / "text/tnews_dev.json").write_text("\n".join(tnews[:keep]) + "\n", encoding="utf-8")
PY

pretrain() { # NAME RECIPE INPUTS_JSON [OVERRIDES...]
    local name=$1 recipe=$2 inputs=$3
    shift 3
    if [ ! -f "$OUT/export/$name/config.json" ]; then
        "$SPANLM" pretrain "$recipe" "data.inputs=$inputs" "data.prepared_dir=$OUT/prepared/$name" \
            "train.output_dir=$OUT/pretrain/$name" "train.max_steps=$STEPS" "train.eval_every=500" \
            "train.save_every=500" "logging.report_to=[]" "logging.progress=false" "$@" --resume auto
        "$SPANLM" export "$OUT/pretrain/$name" --out "$OUT/export/$name"
    fi
}
ENGLISH='["data/corpus/alice_in_wonderland.txt", "data/corpus/adventures_of_sherlock_holmes.txt", "data/corpus/frankenstein.txt", "'$OUT'/text/english_tasks.txt"]'
CHINESE='["data/corpus/hongloumeng_ch1-5.txt", "'$OUT'/text/chinese_tasks.txt"]'
pretrain spanbert configs/pretrain/spanbert.yaml "$ENGLISH"
pretrain spanbert-chinese configs/pretrain/spanbert_chinese.yaml "$CHINESE"

task() { # NAME RECIPE TRAIN DEV (the lever's settings follow, from $SETTINGS)
    cat <<YAML
  - name: $1
    kind: cls
    recipe: $2
    metric: accuracy
    arms: [fine-tuned]
    settings:
      data.train: $3
      data.dev: $4
      data.max_length: 64
      train.batch_size: 32
      train.eval_every: 0
$SETTINGS
YAML
}
for lever in $LEVERS; do
    steps=$TASK_STEPS lr=3.0e-3 encoder_lr=1.0e-3 warmup=$((TASK_STEPS / 10)) pooling=cls extra=""
    case $lever in
    baseline) ;;
    layer-decay) extra="train.layer_decay: 0.8" ;;
    reinit-1) extra="model.reinit_layers: 1" ;;
    one-rate) lr=5.0e-4 encoder_lr=null ;;
    warmup-30) warmup=$((TASK_STEPS * 3 / 10)) ;;
    longer) steps=$((TASK_STEPS * 3)) warmup=$((TASK_STEPS * 3 / 10)) ;;
    mean-pooling) pooling=mean ;;
    longer-mean) steps=$((TASK_STEPS * 3)) warmup=$((TASK_STEPS * 3 / 10)) pooling=mean ;;
    *) echo "finetune_levers_study.sh: unknown lever $lever" >&2 && exit 2 ;;
    esac
    SETTINGS="      train.max_steps: $steps
      train.save_every: $steps
      train.lr: $lr
      train.encoder_lr: $encoder_lr
      train.warmup_steps: $warmup
      cls.pooling: $pooling${extra:+
      $extra}"
    for language in english chinese; do
        if [ $language = english ]; then
            encoder=spanbert
            body=$(task sst2 cls/sst2 "$EXTERNAL/glue/SST-2/train.tsv" "$OUT/text/sst2_dev.tsv")
        else
            encoder=spanbert-chinese
            body=$(task tnews cls/tnews "$OUT/text/tnews_train.json" "$OUT/text/tnews_dev.json")
        fi
        printf '# Fine-tuning lever %s, %s\nseeds: [%s]\ntasks:\n%s\n' "$lever" "$language" "$SEEDS" "$body" \
            >"$OUT/$lever-$language.yaml"
        "$SPANLM" eval "$OUT/$lever-$language.yaml" --out "$OUT/eval/$lever-$language" \
            --encoders "pretrained=$OUT/export/$encoder" "random=random:$OUT/export/$encoder"
    done
done

python - "$OUT" $LEVERS <<'PY'
import json, sys
from pathlib import Path

out, levers = Path(sys.argv[1]), sys.argv[2:]
print("| lever | task | pretrained | random | pretrained − random | 95% interval |")
print("|---|---|---|---|---|---|")
for lever in levers:
    for language in ("english", "chinese"):
        results = json.loads((out / "eval" / f"{lever}-{language}" / "results.json").read_text(encoding="utf-8"))
        for task in results["tasks"]:
            rows = {row["encoder"]: row for row in task["arms"][0]["encoders"]}
            difference = rows["pretrained"].get("difference", {})
            mean = lambda name: rows[name].get("spread", {}).get("mean", float("nan"))
            low, high = difference.get("low", float("nan")), difference.get("high", float("nan"))
            print(f"| {lever} | {task['task']} | {mean('pretrained'):.2f} | {mean('random'):.2f} | "
                  f"{difference.get('mean', float('nan')):+.2f} | [{low:+.2f}, {high:+.2f}] |")
PY
