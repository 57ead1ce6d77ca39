#!/usr/bin/env bash
# Issue 21's equal-budget comparison of DFlash and DFlash 2 for SmolLM2 on this 2-core CPU: the
# DFlash arm is issue 20's study arm "mask" (launch/study_issue20.sh: the shipped drafter continued
# for 280 steps on the first 5 mixed shards); the DFlash 2 arm continues the same drafter as a DFlash
# 2 drafter (configs/smollm2_135m_mix_dflash2.py) on the same data for the same wall-clock (its
# steps from a 6-step probe of its step time against the mask arm's), then both are measured by
# greedy tau on the recorded answers of the five benchmark sets at blocks 4, 8 and 16
# (launch/study_tau.py, 20 answers a set). Resumable: rerun after an interruption.
#
#   bash launch/study_issue21.sh        # after launch/study_issue20.sh's mask arm
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-280}
OUT=runs/study
CFG=configs/smollm2_135m_mix_dflash2.py

arm() {  # arm NAME STEPS [key=value ...]
  local name=$1 steps=$2
  shift 2
  .venv/bin/dflash-jax train --config "$CFG" "out_dir=$OUT/$name" "train.steps=$steps" "eval.every=$steps" \
    ckpt.every=40 "$@"
}

median_step_s() {  # the median step time of a run's metrics.jsonl
  .venv/bin/python -c "import json, statistics, sys; rows = [json.loads(l) for l in open(sys.argv[1])]; \
print(statistics.median(r['step_s'] for r in rows if 'step_s' in r and r['step'] > 1))" "$1/metrics.jsonl"
}

test -f "$OUT/mask/drafter/config.json" || { echo "run launch/study_issue20.sh's mask arm first" >&2; exit 1; }
arm probe_dflash2 6 eval.decode_prompts=0
D2_STEPS=$(.venv/bin/python -c "import sys; print(int(float(sys.argv[1]) * float(sys.argv[2]) / float(sys.argv[3])))" \
  "$STEPS" "$(median_step_s $OUT/mask)" "$(median_step_s $OUT/probe_dflash2)")
echo "dflash2: $D2_STEPS steps (equal wall-clock with $STEPS of mask)"
arm dflash2 "$D2_STEPS"

mkdir -p docs/bench/issue21
.venv/bin/python launch/study_tau.py --per-set 20 --blocks 4 8 16 --drafter "mask=$OUT/mask/drafter" \
  "dflash2=$OUT/dflash2/drafter" --out docs/bench/issue21/study_tau.jsonl | tee docs/bench/issue21/study_tau.md
