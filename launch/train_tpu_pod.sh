#!/usr/bin/env bash
# Multi-host training on a Cloud TPU pod slice: the same command on every worker; JAX detects
# the slice (coordinator, process count, rank) by itself.
#
#   launch/train_tpu_pod.sh my-tpu us-central2-b configs/qwen3_8b.py mesh='(1, 16, 4)'
#
# The repository must be cloned and installed (`make install`, with jax[tpu]) on every worker,
# and out_dir should be a gs:// path or a shared disk.
set -euo pipefail
# Each worker runs from ~/dflash-jax (REPO=... to change it).
TPU=$1; ZONE=$2; CONFIG=$3; shift 3
REPO=${REPO:-'~/dflash-jax'}  # expanded by the workers' shell
ARGS=$(printf '%q ' "$@")  # quoted for the workers' shell: mesh='(1, 16, 4)' stays one argument
gcloud compute tpus tpu-vm ssh "$TPU" --zone "$ZONE" --worker=all \
  --command "cd $REPO && .venv/bin/dflash-jax train --config $CONFIG $ARGS --distributed"
