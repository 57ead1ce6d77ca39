"""Stage 3 of the shipped SmolLM2 drafter: stage 2 (configs/smollm2_135m_cpu_v2.py) continued.

Starts from stage 2's best drafter (``init_from``; same drafter fields) on the same 8 shards
(stage 2's validation loss was still falling, so more steps on the same answers still pay),
with a fresh AdamW state and a new warmup + cosine schedule at a lower peak (7e-4), and without
activation recomputation (``train.remat=False``: 5.9 s per step here instead of 7.0 s; memory is
not the limit at 4 x 384 tokens), 8 anchors at a time (fastest chunk without recomputation),
reading the target's features stored once by ``prepare-features`` (``train.stored_features``:
the step skips the target forward; the run is the same run either way, so the run that made
the shipped drafter computed them in the step for its first 300 steps and read them after).
Resumable: rerun the same command after an interruption.

    dflash-jax train --config configs/smollm2_135m_cpu.py       # stage 1 -> runs/smollm2_v1/best
    dflash-jax train --config configs/smollm2_135m_cpu_v2.py    # stage 2 -> runs/smollm2_v2/best
    dflash-jax prepare-features --config configs/smollm2_135m_cpu_v3.py   # 2.0 GiB, about 9 min here
    dflash-jax train --config configs/smollm2_135m_cpu_v3.py    # stage 3 -> runs/smollm2_v3/best
"""

from smollm2_135m_cpu_v2 import get_config as stage2


def get_config():
    c = stage2()
    c.init_from = "runs/smollm2_v2/best"
    c.out_dir = "runs/smollm2_v3"
    c.train.steps = 900
    c.train.lr = 7e-4
    c.train.remat = False
    c.train.anchor_chunk = 8
    c.train.stored_features = True
    return c
