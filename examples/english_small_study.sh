#!/usr/bin/env bash
# Does task-adaptive pretraining help english-small's NER and classification tasks at the demo's size? Pretrains
# a demo-size CharBERT and SpanBERT (the recipes' model, 1,500 steps, seed 0) on the three embedded English books
# plus the unlabelled training text of WNUT-17 and of the embedded SST-2 sample (cased), then `spanlm eval` of
# english-small's two tasks, fine-tuned, 3 seeds, each encoder against a random init of its own architecture.
#
#   bash examples/english_small_study.sh runs/english-small-study
#
# The suite is english-small's (configs/eval/english-small.yaml: NER 1,500 steps, SST-2 300, head lr 3e-3, encoder
# 1e-3), fine-tuned arm only, in CharBERT's 64-token windows for both encoders (NER stride 16), fixed before any
# run. Rerunning with the same OUT keeps every finished run and cell.
set -euo pipefail
OUT=${1:?usage: english_small_study.sh OUT}
SPANLM=${SPANLM:-spanlm}
STEPS=${STEPS:-1500}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT/text" "$OUT/logs"

python - "$ROOT" "$OUT" <<'PY'
import sys
from pathlib import Path

root, out = Path(sys.argv[1]), Path(sys.argv[2])
records = (root / "data/ner/wnut17/train.conll").read_text(encoding="utf-8").split("\n\n")
lines = [" ".join(line.split("\t")[0] for line in record.splitlines() if line.strip()) for record in records]
rows = (root / "data/cls/sst2/train.tsv").read_text(encoding="utf-8").splitlines()[1:]
lines += [row.split("\t")[0].strip() for row in rows]
(out / "text/tasks.txt").write_text("".join(line + "\n" for line in lines if line), encoding="utf-8")
PY

BOOKS=$ROOT/data/corpus
INPUTS='["'$BOOKS'/alice_in_wonderland.txt", "'$BOOKS'/adventures_of_sherlock_holmes.txt", "'$BOOKS'/frankenstein.txt", "'$OUT'/text/tasks.txt"]'
for name in charbert spanbert; do
    [ -f "$OUT/export/$name/config.json" ] && continue
    echo "pretraining $name → $OUT/pretrain/$name" >&2
    "$SPANLM" pretrain "$ROOT/configs/pretrain/$name.yaml" seed=0 "data.inputs=$INPUTS" \
        "data.prepared_dir=$OUT/prepared/$name-{tokenizer}" "train.output_dir=$OUT/pretrain/$name" \
        "train.max_steps=$STEPS" "train.eval_every=$(((STEPS + 5) / 6))" "train.save_every=$STEPS" train.log_every=10 \
        train.eval_blocks=64 "logging.report_to=[]" logging.progress=false tokenizer.lowercase=false --resume auto \
        >"$OUT/logs/pretrain-$name.log" 2>&1
    "$SPANLM" export "$OUT/pretrain/$name" --out "$OUT/export/$name" >"$OUT/logs/export-$name.log" 2>&1
done

cat >"$OUT/suite.yaml" <<YAML
# english-small's NER and classification tasks, fine-tuned, in CharBERT's 64-token windows
seeds: [0, 1, 2]
tasks:
  - name: wnut17
    kind: ner
    recipe: ner/wnut17
    metric: f1
    arms: [fine-tuned]
    settings:
      data.max_len: 64
      data.stride: 16
      train.max_steps: 1500
      train.eval_every: 500
      train.save_every: 1500
      train.lr: 3.0e-3
      train.encoder_lr: 1.0e-3
      train.warmup_steps: 150
  - name: sst2
    kind: cls
    recipe: cls/sst2
    metric: accuracy
    arms: [fine-tuned]
    settings:
      data.max_length: 64
      train.max_steps: 300
      train.batch_size: 32
      train.eval_every: 0
      train.save_every: 300
      train.lr: 3.0e-3
      train.encoder_lr: 1.0e-3
      train.warmup_steps: 30
YAML

"$SPANLM" eval "$OUT/suite.yaml" --out "$OUT/eval" --jobs 2 \
    --encoders "charbert=$OUT/export/charbert" "random-charbert=random:$OUT/export/charbert" \
    "spanbert=$OUT/export/spanbert" "random-spanbert=random:$OUT/export/spanbert" \
    --baseline charbert=random-charbert random-charbert=random-charbert spanbert=random-spanbert \
    random-spanbert=random-spanbert
