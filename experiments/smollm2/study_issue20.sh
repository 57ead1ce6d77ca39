#!/usr/bin/env bash
# Issue 20's fixed-budget study (second plan, 2026-12-02): arms trained one after another at equal
# wall-clock on this 2-core CPU, all from the shipped drafter on the same first 5 mixed shards
# (experiments/smollm2/smollm2_135m_mix.py: 640 answers, 32 held out), then each arm's greedy tau on the recorded
# answers of the five benchmark sets at blocks 4, 8 and 16 (experiments/study_tau.py, 20 answers a set)
# beside prompt lookup's and the untrained copy reading's (experiments/copy_drafter.py). The copy reading
# beats prompt lookup everywhere without training (docs/BENCHMARKS.md, "A mask-token drafter reading
# prompt lookup"), so the arms ask what training adds to it, against today's recipe:
#
#   copy2       experiments/smollm2/smollm2_135m_mix_copy2.py: the n-gram continuation (n >= 2) as the block
#               input, copy bias starting at 30 on its own lr 0.03, all 15 offsets supervised;
#               STEPS steps, the budget every other arm matches in wall-clock
#   mask        today's recipe (mask tokens, offsets 1..8; its steps cost less, so it gets more)
#   copy2_b12   copy2 with the copy bias starting at 12 (the table has less to unlearn)
#   copy2_off8  copy2 supervising offsets 1..8 only (cheaper steps, more of them)
#   copy2_lr2   copy2 at twice the learning rate (1.4e-3); optional, LR2=1 (after the others' tau)
#
# Every step is resumable: rerun the script after an interruption and it continues where it stopped
# (a finished run returns at once, done tau records are skipped). Each finished arm's metrics are
# copied to docs/bench/issue20/study/ so that they outlive the machine (runs/ is not kept in git).
#
#   bash experiments/smollm2/study_issue20.sh            # STEPS=200 by default (copy2: median 6.4 s a step here)
set -euo pipefail
cd "$(dirname "$0")/../.."
STEPS=${STEPS:-200}
OUT=runs/study
KEEP=docs/bench/issue20/study
mkdir -p "$OUT" "$KEEP"

source experiments/smollm2/study_common.sh  # arm, median_step_s, equal_steps

COPY2=experiments/smollm2/smollm2_135m_mix_copy2.py
MASK=experiments/smollm2/smollm2_135m_mix.py
kept_arm() {  # kept_arm NAME CONFIG STEPS [key=value ...]: arm, then its metrics into $KEEP
  arm "$@"
  cp "$OUT/$1/metrics.jsonl" "$KEEP/$1.metrics.jsonl"
}
kept_arm copy2 "$COPY2" "$STEPS"
arm probe_mask "$MASK" 6 eval.decode_prompts=0
kept_arm mask "$MASK" "$(equal_steps "$STEPS" $OUT/copy2 $OUT/probe_mask)"
kept_arm copy2_b12 "$COPY2" "$STEPS" drafter.copy_bias=12.0
# probe against probe (6 steps each, nothing else running): a whole run's median holds whatever ran
# beside it (the mask arm's 305 steps came from copy2's median of 6.38 s against its probe's 4.18 s;
# copy2's 10th-30th percentile steps took 5.87-6.15 s, so mask had about 5-8% more than equal wall-clock)
arm probe_copy2 "$COPY2" 6 eval.decode_prompts=0
arm probe_off8 "$COPY2" 6 train.loss_offsets=8 eval.decode_prompts=0
kept_arm copy2_off8 "$COPY2" "$(equal_steps "$STEPS" $OUT/probe_copy2 $OUT/probe_off8)" train.loss_offsets=8

test -d runs/copy30_min2 || .venv/bin/python experiments/copy_drafter.py assets/smollm2-135m-instruct-dflash-stage5 \
  runs/copy30_min2 --copy-bias 30 --ngram-min 2
study_tau() {  # tau at blocks 4/8/16 on 20 recorded answers a set for copy30m2 and the given arms
  local args=(copy30m2=runs/copy30_min2) name
  for name in "$@"; do args+=("$name=$OUT/$name/drafter"); done
  .venv/bin/python experiments/study_tau.py --per-set 20 --blocks 4 8 16 --drafter "${args[@]}" \
    --out docs/bench/issue20/study_tau.jsonl | tee docs/bench/issue20/study_tau.md
}
study_tau copy2 mask copy2_b12 copy2_off8
# the learning-rate arm is optional (LR2=1): run after the others' tau, which decide the long run
if [ "${LR2:-0}" = 1 ]; then
  kept_arm copy2_lr2 "$COPY2" "$STEPS" train.lr=1.4e-3
  study_tau copy2 mask copy2_b12 copy2_off8 copy2_lr2
fi
