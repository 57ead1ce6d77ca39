#!/usr/bin/env bash
# The paper-shape table with the shipped SmolLM2 drafter: every prompt set, plain vs DFlash, greedy
# (block sizes 4, 8, 16: 4 is the best on this CPU, 8 and 16 are the paper's) and at temperature 1
# (blocks 4 and 16). 100 prompts per set, all 164 of HumanEval, all 80 of MT-Bench (both turns),
# up to 256 new tokens. Greedy GSM8K, HumanEval and MT-Bench come first (issue 5's measurement).
# Each run appends its per-turn records as it goes, so starting this script again resumes it.
# About 9-10 h on 2 CPU cores (0.5 min per turn greedy, 0.4 min sampled).
#   make bench-full            (background; log in runs/bench_full.log)
set -euo pipefail
cd "$(dirname "$0")/.."
out=docs/bench/full
mkdir -p "$out"
for t in 0 1; do
  if [ "$t" = 0 ]; then blocks="4 8 16"; else blocks="4 16"; fi
  for d in gsm8k humaneval mt-bench math500 mbpp; do
    n=100; [ "$d" = humaneval ] && n=164
    # shellcheck disable=SC2086
    .venv/bin/dflash-jax bench --dataset "$d" --max-samples "$n" --max-new-tokens 256 --block-size $blocks \
      --temperature "$t" --no-progress --json-out "$out/t${t}_$d.json"
    .venv/bin/python launch/paper_table.py "$out"
  done
done
