#!/usr/bin/env bash
# Multi-host training on a plain list of hosts (no scheduler): one process per host, started over
# ssh, joined through jax.distributed with host 0 as the coordinator.
#
#   launch/train_hosts.sh "host0 host1 host2 host3" configs/qwen3_8b.py mesh='(1, 8, 4)'
#   PORT=12400 launch/train_hosts.sh "localhost localhost" configs/smollm2_135m.py ...   # one machine
#
# Every host needs this repository at the same path with `make install` done, the converted
# target and the data at the paths the config names (a shared filesystem is simplest), and
# out_dir on a filesystem all hosts see (orbax writes checkpoints collectively).
set -euo pipefail
HOSTS=($1); CONFIG=$2; shift 2
PORT=${PORT:-12355}
COORD="${HOSTS[0]}:${PORT}"
REPO=$(cd "$(dirname "$0")/.." && pwd)
pids=()
ARGS=$(printf '%q ' "$@")
for i in "${!HOSTS[@]}"; do
  CMD="cd $REPO && .venv/bin/dflash-jax train --config $CONFIG $ARGS --coordinator $COORD \
       --num-processes ${#HOSTS[@]} --process-id $i"
  if [[ "${HOSTS[$i]}" == localhost ]]; then
    bash -c "$CMD" &  # several processes on this machine (how the tests run it)
  else
    ssh "${HOSTS[$i]}" "$CMD" &
  fi
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=$?; done
exit $status
