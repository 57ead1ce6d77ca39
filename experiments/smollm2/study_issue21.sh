#!/usr/bin/env bash
# Issue 21's equal-budget comparison of DFlash and DFlash 2 for SmolLM2 on this 2-core CPU: the
# DFlash arm is issue 20's study arm "mask" (experiments/smollm2/study_issue20.sh: the shipped drafter continued
# for 305 steps on the first 5 mixed shards); the DFlash 2 arm continues the same drafter as a DFlash
# 2 drafter (experiments/smollm2/smollm2_135m_mix_dflash2.py) on the same data for the same wall-clock (its
# steps from a 6-step probe of its step time against the mask arm's probe), then both are measured by
# greedy tau on the recorded answers of the five benchmark sets at blocks 4, 8 and 16
# (experiments/study_tau.py, 20 answers a set). Resumable: rerun after an interruption.
#
# A second pair does the same for issue 20's copy2_off8 arm (the drafter reading prompt lookup,
# offsets 1..8) against experiments/smollm2/smollm2_135m_mix_copy2_dflash2.py on offsets 1..8.
#
#   bash experiments/smollm2/study_issue21.sh        # after experiments/smollm2/study_issue20.sh's mask and copy2_off8 arms
set -euo pipefail
cd "$(dirname "$0")/../.."
STEPS=${STEPS:-305}
OUT=runs/study
CFG=experiments/smollm2/smollm2_135m_mix_dflash2.py

source experiments/smollm2/study_common.sh  # arm, median_step_s, equal_steps

test -f "$OUT/mask/drafter/config.json" || { echo "run experiments/smollm2/study_issue20.sh's mask arm first" >&2; exit 1; }
arm probe_dflash2 "$CFG" 6 eval.decode_prompts=0
# probes against probes: both 6-step runs with nothing else on the machine (the mask arm's own
# median, 5.06 s, holds the steps that ran beside the test-suite; its probe's is 4.18 s)
D2_STEPS=$(equal_steps "$STEPS" $OUT/probe_mask $OUT/probe_dflash2)
echo "dflash2: $D2_STEPS steps (equal wall-clock with $STEPS of mask)"
arm dflash2 "$CFG" "$D2_STEPS"

mkdir -p docs/bench/issue21
# the mask arm's records that issue 20's study already has (study_tau keys them by the weights, so
# they are this arm's): seeded once, then only what is missing is measured
test -f docs/bench/issue21/study_tau.jsonl || grep '"arm": "mask"' docs/bench/issue20/study_tau.jsonl \
  > docs/bench/issue21/study_tau.jsonl || true
.venv/bin/python experiments/study_tau.py --per-set 20 --blocks 4 8 16 --drafter "mask=$OUT/mask/drafter" \
  "dflash2=$OUT/dflash2/drafter" --out docs/bench/issue21/study_tau.jsonl | tee docs/bench/issue21/study_tau.md

# The second pair (2026-12-02): the same question for the study's best recipe, the drafter reading
# prompt lookup trained on offsets 1..8 (issue 20's copy2_off8 arm, 282 steps) against it as a DFlash
# 2 drafter (experiments/smollm2/smollm2_135m_mix_copy2_dflash2.py, offsets 1..8) for the same wall-clock, probe
# against probe (both 6-step probes run alone).
C2=experiments/smollm2/smollm2_135m_mix_copy2_dflash2.py
test -f "$OUT/copy2_off8/drafter/config.json" || { echo "run experiments/smollm2/study_issue20.sh's copy2_off8 arm first" >&2; exit 1; }
arm probe_off8_dflash2 "$C2" 6 train.loss_offsets=8 eval.decode_prompts=0
C2_STEPS=$(equal_steps 282 $OUT/probe_off8 $OUT/probe_off8_dflash2)
echo "copy2_off8_dflash2: $C2_STEPS steps (equal wall-clock with 282 of copy2_off8)"
arm copy2_off8_dflash2 "$C2" "$C2_STEPS" train.loss_offsets=8
cp "$OUT/copy2_off8_dflash2/metrics.jsonl" docs/bench/issue20/study/copy2_off8_dflash2.metrics.jsonl
grep -q '"arm": "copy2_off8"' docs/bench/issue21/study_tau.jsonl || grep '"arm": "copy2_off8"' \
  docs/bench/issue20/study_tau.jsonl >> docs/bench/issue21/study_tau.jsonl || true
.venv/bin/python experiments/study_tau.py --per-set 20 --blocks 4 8 16 --drafter "mask=$OUT/mask/drafter" \
  "dflash2=$OUT/dflash2/drafter" "copy2_off8=$OUT/copy2_off8/drafter" \
  "copy2_off8_dflash2=$OUT/copy2_off8_dflash2/drafter" \
  --out docs/bench/issue21/study_tau.jsonl | tee docs/bench/issue21/study_tau.md
