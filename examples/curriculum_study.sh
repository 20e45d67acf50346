#!/usr/bin/env bash
# What did each phase of the modern encoder curriculum buy at this size? Runs configs/pretrain/ettin_modernbert.yaml
# (400 steps at 128 tokens, a context extension to 256 with the global RoPE base at 160k, a decay phase at 15%
# masking) and `spanlm eval` of its three phase exports and a random init of the same architecture on english-small
# (WNUT-17 NER fine-tuned, SST-2 fine-tuned and frozen, 3 seeds), each compared with the extension's export: the
# decay row is what the decay phase bought, the pretrain row minus what the extension bought.
#
#   bash examples/curriculum_study.sh runs/curriculum-study
#
# SUITE (default english-small), SEEDS and RECIPE (a curriculum with phases named pretrain, extend and decay) change
# the budget: tests/ runs it small. Rerunning with the same OUT keeps the run and every finished cell.
set -euo pipefail
OUT=${1:?usage: curriculum_study.sh OUT}
SPANLM=${SPANLM:-spanlm}
SUITE=${SUITE:-english-small}
SEEDS=${SEEDS:-0 1 2}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
RECIPE=${RECIPE:-$ROOT/configs/pretrain/ettin_modernbert.yaml}
RUN=$OUT/run
resume=()
[ -d "$RUN/checkpoints" ] && resume=(--resume auto)
"$SPANLM" pretrain "$RECIPE" "train.output_dir=$RUN" "logging.report_to=[]" "logging.progress=false" \
    ${resume[@]+"${resume[@]}"}
# shellcheck disable=SC2086
"$SPANLM" eval "$SUITE" --out "$OUT/eval" --seeds $SEEDS --baseline extend \
    --encoders "pretrain=$RUN/phase-pretrain" "extend=$RUN/phase-extend" "decay=$RUN/phase-decay" \
    "random=random:$RUN/phase-decay"
