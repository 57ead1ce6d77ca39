# Shell helpers of the fixed-budget studies (study_issue20.sh, study_issue21.sh beside this file);
# sourced, not run. Both expect the repository root as the working directory and OUT set.

arm() {  # arm NAME CONFIG STEPS [key=value ...]: one resumable `dflash-jax train` run in $OUT/NAME
  local name=$1 cfg=$2 steps=$3
  shift 3
  # a finished arm (its final drafter written) is left as it is, whatever its config says now (the
  # configs' init_from moved to assets/smollm2-135m-instruct-dflash-stage5 after the arms ran, the
  # same files: a run's identity holds the path, so train would refuse to call it the same run)
  if [ -f "$OUT/$name/drafter/config.json" ]; then echo "$name: finished"; return; fi
  .venv/bin/dflash-jax train --config "$cfg" "out_dir=$OUT/$name" "train.steps=$steps" "eval.every=$steps" \
    ckpt.every=40 "$@"
}

median_step_s() {  # the median step time of a run's metrics.jsonl
  .venv/bin/python -c "import json, statistics, sys; rows = [json.loads(l) for l in open(sys.argv[1])]; \
print(statistics.median(r['step_s'] for r in rows if 'step_s' in r and r['step'] > 1))" "$1/metrics.jsonl"
}

equal_steps() {  # equal_steps STEPS RUN PROBE: steps of PROBE's kind costing STEPS steps of RUN
  .venv/bin/python -c "import sys; print(int(float(sys.argv[1]) * float(sys.argv[2]) / float(sys.argv[3])))" \
    "$1" "$(median_step_s "$2")" "$(median_step_s "$3")"
}
