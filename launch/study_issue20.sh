#!/usr/bin/env bash
# Issue 20's fixed-budget study: five arms trained one after another at equal wall-clock on this
# 2-core CPU (about 45 minutes each), all from the shipped drafter on the same first 5 mixed
# shards (configs/smollm2_135m_mix.py: 640 answers, 32 held out), then each arm's greedy tau on
# the recorded answers of the five benchmark sets at blocks 4, 8 and 16 (launch/study_tau.py)
# beside prompt lookup's. Every step is resumable: rerun the script after an interruption and it
# continues where it stopped (a finished run returns at once, done records are skipped).
#
#   mask        today's recipe: mask tokens after the anchor (stage 5's settings)
#   copy        the n-gram continuation as the block input, plus a learned copy bias per matched
#               length and offset (drafter.copy_bias 4.0, its own lr 0.03)
#   copy_min2   copy, with continuations of matched suffixes of 2 or more tokens only
#   copy_all    copy, supervising all 15 offsets instead of 1..8 (fewer steps: a step costs more)
#   copy_lr2    copy at twice the learning rate (1.4e-3)
#
#   bash launch/study_issue20.sh            # STEPS=280 by default (~9.5 s a step here)
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-280}
OUT=runs/study
mkdir -p "$OUT"

source launch/study_common.sh  # arm, median_step_s, equal_steps

COPY=configs/smollm2_135m_mix_copy_lr.py
arm mask configs/smollm2_135m_mix.py "$STEPS"
arm copy "$COPY" "$STEPS"
arm copy_min2 "$COPY" "$STEPS" drafter.ngram_min=2
arm copy_lr2 "$COPY" "$STEPS" train.lr=1.4e-3
# equal wall-clock: copy_all's steps from its step time against copy's (a 6-step probe run)
arm probe_all "$COPY" 6 train.loss_offsets=0 eval.decode_prompts=0
ALL_STEPS=$(equal_steps "$STEPS" $OUT/copy $OUT/probe_all)
echo "copy_all: $ALL_STEPS steps (equal wall-clock with $STEPS of copy)"
arm copy_all "$COPY" "$ALL_STEPS" train.loss_offsets=0

args=()
for name in mask copy copy_min2 copy_lr2 copy_all; do args+=("$name=$OUT/$name/drafter"); done
.venv/bin/python launch/study_tau.py --per-set 20 --blocks 4 8 16 --drafter "${args[@]}" \
  --out docs/bench/issue20/study_tau.jsonl | tee docs/bench/issue20/study_tau.md
