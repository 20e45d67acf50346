#!/usr/bin/env bash
# Does pretraining help sentence classification at the demo's size? Pretrains the demo-size encoders (the
# recipes' hidden 128, 2 layers; the demo's 1,500 steps) with SpanBERT and with MLM, English and Chinese, then
# fine-tunes each and a randomly initialised copy on SST-2 and MRPC (English) and TNEWS (Chinese), 3 seeds, with
# `spanlm eval`. Needs the real datasets under external/ (data/README.md); MRPC and the full TNEWS are not shipped.
#
#   bash examples/classification_study.sh runs/cls-study
#
# The pretraining text is the embedded books plus the unlabelled training text of the tasks themselves
# (task-adaptive pretraining, Gururangan et al. 2020): the English encoders read the three embedded English books
# and the sentences of SST-2's and MRPC's training splits, the Chinese ones the embedded Hongloumeng chapters and
# TNEWS's training titles. No dev text is read. The fine-tuning settings (the suites written below) were fixed before
# any run: the english-small suite's rates (new head 3e-3, encoder 1e-3), batch 32, 10% warmup, 600 steps (345 for
# MRPC, three epochs as BERT's), scored once at the end on the whole dev set; for TNEWS also a second setting (below). Rerunning with the same OUT keeps every
# finished run and cell.
set -euo pipefail
OUT=${1:?usage: classification_study.sh OUT}
EXTERNAL=${EXTERNAL:-external}
SPANLM=${SPANLM:-spanlm}
STEPS=${STEPS:-1500}
mkdir -p "$OUT/text"

# The unlabelled text: one sentence (or title) per line.
python - "$EXTERNAL" "$OUT" <<'PY'
import json, sys, zipfile
from pathlib import Path

external, out = Path(sys.argv[1]), Path(sys.argv[2])
def tsv_rows(path):
    lines = path.read_text(encoding="utf-8-sig").splitlines()
    return [line.split("\t") for line in lines[1:] if line.strip()]
english = [row[0].strip() for row in tsv_rows(external / "glue/SST-2/train.tsv")]
english += [text.strip() for row in tsv_rows(external / "glue/MRPC/train.tsv") for text in row[3:5]]
(out / "text/english_tasks.txt").write_text("\n".join(english) + "\n", encoding="utf-8")
with zipfile.ZipFile(external / "tnews/tnews_public.zip") as archive:
    train = archive.read("tnews_public/train.json").decode("utf-8")
(out / "text/tnews_train.json").write_text(train, encoding="utf-8")
titles = [json.loads(line)["sentence"] for line in train.splitlines() if line.strip()]
(out / "text/chinese_tasks.txt").write_text("\n".join(titles) + "\n", encoding="utf-8")
PY

pretrain() {  # NAME RECIPE INPUTS_JSON [OVERRIDES...]
    local name=$1 recipe=$2 inputs=$3
    shift 3
    if [ ! -f "$OUT/export/$name/config.json" ]; then
        "$SPANLM" pretrain "$recipe" "data.inputs=$inputs" "data.prepared_dir=$OUT/prepared/$name" \
            "train.output_dir=$OUT/pretrain/$name" "train.max_steps=$STEPS" "train.eval_every=500" \
            "train.save_every=500" "logging.report_to=[]" "$@" --resume auto
        "$SPANLM" export "$OUT/pretrain/$name" --out "$OUT/export/$name"
    fi
}
ENGLISH='["data/corpus/alice_in_wonderland.txt", "data/corpus/adventures_of_sherlock_holmes.txt", "data/corpus/frankenstein.txt", "'$OUT'/text/english_tasks.txt"]'
CHINESE='["data/corpus/hongloumeng_ch1-5.txt", "'$OUT'/text/chinese_tasks.txt"]'
pretrain spanbert configs/pretrain/spanbert.yaml "$ENGLISH"
pretrain mlm configs/pretrain/mlm.yaml "$ENGLISH"
pretrain spanbert-chinese configs/pretrain/spanbert_chinese.yaml "$CHINESE"
pretrain mlm-chinese configs/pretrain/spanbert_chinese.yaml "$CHINESE" masking.scheme=mlm objective.name=mlm

suite() {  # NAME METRIC RECIPE TRAIN DEV STEPS MAX_LENGTH [LR ENCODER_LR]: one task, fine-tuned, 3 seeds
    cat <<YAML
  - name: $1
    kind: cls
    recipe: $3
    metric: $2
    arms: [fine-tuned]
    settings:
      data.train: $4
      data.dev: $5
      data.max_length: $7
      train.max_steps: $6
      train.batch_size: 32
      train.lr: ${8:-3.0e-3}
      train.encoder_lr: ${9:-1.0e-3}
      train.warmup_steps: $(($6 / 10))
      train.eval_every: 0
      train.save_every: $6
YAML
}
{
    echo "seeds: [0, 1, 2]"
    echo "tasks:"
    suite sst2 accuracy cls/sst2 "$EXTERNAL/glue/SST-2/train.tsv" "$EXTERNAL/glue/SST-2/dev.tsv" 600 64
    suite mrpc f1 cls/mrpc "$EXTERNAL/glue/MRPC/train.tsv" "$EXTERNAL/glue/MRPC/dev.tsv" 345 128
} >"$OUT/english.yaml"
{
    echo "seeds: [0, 1, 2]"
    echo "tasks:"
    suite tnews accuracy cls/tnews "$OUT/text/tnews_train.json" "$EXTERNAL/tnews/dev.json" 600 64
    # A second setting, added after the first had run (the pretrained starts lost): the chinese-small suite's
    # single rate for every weight.
    suite tnews-lr5e-4 accuracy cls/tnews "$OUT/text/tnews_train.json" "$EXTERNAL/tnews/dev.json" 600 64 5.0e-4 null
} >"$OUT/chinese.yaml"

"$SPANLM" eval "$OUT/english.yaml" --out "$OUT/eval-english" \
    --encoders "spanbert=$OUT/export/spanbert" "mlm=$OUT/export/mlm" "random=random:$OUT/export/spanbert"
"$SPANLM" eval "$OUT/chinese.yaml" --out "$OUT/eval-chinese" \
    --encoders "spanbert=$OUT/export/spanbert-chinese" "mlm=$OUT/export/mlm-chinese" \
    "random=random:$OUT/export/spanbert-chinese"
