"""Multi-host start-up through ``jax.distributed`` (never a home-made process group).

Every process of a job calls ``initialize`` before touching a device; afterwards
``jax.devices()`` lists the devices of all hosts, a ``Mesh`` spans them, and ``jax.jit``
with explicit shardings (``train_step.sharded_step``) runs one program across the cluster.
On TPU pods, SLURM and GKE the coordinator, process count and process id are detected by
JAX; elsewhere pass them (``launch/train_hosts.sh`` does it for a plain list of hosts).
"""

from __future__ import annotations

import jax


def initialize(coordinator: str | None = None, num_processes: int | None = None, process_id: int | None = None) -> None:
    """Join the job. With no arguments, JAX detects the cluster (TPU pod slice, SLURM, GKE).

    On CPU the cross-process collectives use gloo (the tests run two processes on one machine).

    Raises:
      RuntimeError: from JAX, when the coordinator cannot be reached within its timeout.
    """
    if jax.config.jax_platforms in (None, "", "cpu") or str(jax.config.jax_platforms).startswith("cpu"):
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes, process_id=process_id)


def is_main() -> bool:
    """True on the process that writes logs, metrics and exported drafters (process 0)."""
    return jax.process_index() == 0
