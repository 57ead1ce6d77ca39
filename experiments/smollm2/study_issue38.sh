#!/usr/bin/env bash
# Issue 38's fixed-budget study of training objectives for SmolLM2 on this 2-core CPU: stage 6 (shipped then)
# continued on the 48 made shards of data/smollm2-mix (experiments/smollm2/smollm2_135m_objectives.py), one
# arm per objective at equal wall-clock (each arm's steps from a 6-step probe of its step time against
# the ce arm's probe, probes run alone), then greedy tau on the recorded answers of the five benchmark
# sets at block 16 (experiments/study_tau.py, 20 answers a set; stage 6 as the baseline).
# Arms: ce (the answer's tokens, today's), kl (the target's next-token distribution), kl_tv (KL mixed with
# total variation), ce_reach and kl_reach (each offset weighted by the block's chance of reaching it),
# kl_sel (kl, and DFlash 2's selector learns the target's distribution over its candidates too: the
# others train it on the answer's token, and a sampled draft is drawn from the selector's softmax).
# Resumable: rerun after an interruption (a finished arm is kept; a cut one resumes from its checkpoint).
#
#   bash experiments/smollm2/study_issue38.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
STEPS=${STEPS:-160}  # the ce arm's steps; the others get its wall-clock
OUT=runs/study38
CFG=experiments/smollm2/smollm2_135m_objectives.py
source experiments/smollm2/study_common.sh  # arm, median_step_s, equal_steps

declare -A FLAGS=(
  [ce]="train.objective=ce"
  [kl]="train.objective=kl"
  [kl_tv]="train.objective=kl_tv"
  [ce_reach]="train.objective=ce train.position_weights=reach"
  [kl_reach]="train.objective=kl train.position_weights=reach"
  [kl_sel]="train.objective=kl train.selector_objective=kl"
)
ARMS=(ce kl kl_tv ce_reach kl_reach kl_sel)
for a in "${ARMS[@]}"; do
  # shellcheck disable=SC2086
  arm "probe_$a" "$CFG" 6 eval.decode_prompts=0 ${FLAGS[$a]}
done
for a in "${ARMS[@]}"; do
  n=$(equal_steps "$STEPS" "$OUT/probe_ce" "$OUT/probe_$a")
  echo "$a: $n steps (equal wall-clock with $STEPS of ce)"
  # shellcheck disable=SC2086
  arm "$a" "$CFG" "$n" ${FLAGS[$a]}
  mkdir -p docs/bench/issue38/study && cp "$OUT/$a/metrics.jsonl" "docs/bench/issue38/study/$a.metrics.jsonl"
done
drafters=("shipped=assets/smollm2-135m-instruct-dflash-stage6")  # stage 6: shipped when the study ran
for a in "${ARMS[@]}"; do drafters+=("$a=$OUT/$a/drafter"); done
.venv/bin/python experiments/study_tau.py --per-set 20 --blocks 16 --drafter "${drafters[@]}" \
  --out docs/bench/issue38/study_tau.jsonl | tee docs/bench/issue38/study_tau.md
# temperature 1: decoded tau at block 16 (the numbered row; prompt lookup's own row and the default settings
# off), 10 first turns a set, resumable per prompt. About 22 min a drafter here, so the drafters that differ
# most go first: the shipped one, the KL arm with the selector's KL (what sampled acceptance rewards), the
# greedy study's best (ce_reach), the total-variation arm, the KL arm; ce and kl_reach last (level with
# ce_reach and kl when greedy).
T1=${T1:-shipped kl_sel ce_reach kl_tv kl ce kl_reach}
for name in $T1; do
  d=$(printf '%s\n' "${drafters[@]}" | grep "^$name=")
  .venv/bin/dflash-jax bench --drafter "${d#*=}" --dataset all --max-samples 10 --max-turns 1 --max-new-tokens 256 \
    --block-size 16 --temperature 1 --ngram-arm off --default-arm off --no-progress \
    --json-out "docs/bench/issue38/t1_$name.json"
done
