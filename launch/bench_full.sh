#!/usr/bin/env bash
# The paper-shape table with the shipped SmolLM2 drafter: every prompt set, plain vs DFlash, greedy
# (block sizes 4, 8, 16: 4 is the best on this CPU, 8 and 16 are the paper's) and at temperature 1
# (blocks 4 and 16), up to 256 new tokens. Each run appends its per-turn records as it goes, so starting
# this script again resumes it, and a run with more prompts reuses the records of a run with fewer.
#   pass 1: issue 5's measurement (greedy: 100 GSM8K, all 164 HumanEval, all 80 MT-Bench first turns),
#           then 20 turns of every other set and temperature (MT-Bench: 10 questions, both turns), so
#           every cell of the table is filled early (about 5 h on 2 CPU cores in all);
#   pass 2: the full counts (100 prompts per set, all of HumanEval and MT-Bench; about 8.5 h more).
# docs/bench/full/paper_table.md is rewritten after every run (turn counts in its cells).
#   make bench-full            (background; log in runs/bench_full.log)
set -euo pipefail
cd "$(dirname "$0")/.."
out=docs/bench/full
mkdir -p "$out"

bench() {  # temperature, dataset, prompts, extra flags...
  local t=$1 d=$2 n=$3; shift 3
  local blocks="4 8 16"; [ "$t" = 0 ] || blocks="4 16"
  # shellcheck disable=SC2086
  .venv/bin/dflash-jax bench --dataset "$d" --max-samples "$n" --max-new-tokens 256 --block-size $blocks \
    --temperature "$t" --no-progress --json-out "$out/t${t}_$d.json" "$@"
  .venv/bin/python launch/paper_table.py "$out"
}

bench 0 gsm8k 100
bench 0 humaneval 164
bench 0 mt-bench 80 --max-turns 1
for t in 0 1; do
  for d in gsm8k humaneval mt-bench math500 mbpp; do
    n=20; [ "$d" = mt-bench ] && n=10
    case "$t/$d" in 0/gsm8k|0/humaneval) continue ;; esac  # already measured in full above
    bench "$t" "$d" "$n"
  done
done
for t in 0 1; do
  for d in gsm8k humaneval mt-bench math500 mbpp; do
    n=100; [ "$d" = humaneval ] && n=164; [ "$d" = mt-bench ] && n=80
    bench "$t" "$d" "$n"
  done
done
