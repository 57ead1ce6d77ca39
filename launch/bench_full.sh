#!/usr/bin/env bash
# The paper-shape table: every prompt set (100 prompts each; MT-Bench's 80 with both turns), plain vs
# DFlash at block sizes 8 and 16, at temperature 0 and 1, with the shipped SmolLM2 drafter.
# Each run appends its per-turn records as it goes, so starting this script again resumes it.
#   make bench-full            (background; log in runs/bench_full.log)
set -euo pipefail
cd "$(dirname "$0")/.."
for t in 0 1; do
  .venv/bin/dflash-jax bench --dataset all --max-samples 100 --max-new-tokens 256 --block-size 8 16 \
    --temperature "$t" --no-progress --json-out "docs/bench/full_t$t.json"
done
