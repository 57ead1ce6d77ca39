"""Stage 2 of the shipped SmolLM2 drafter: the v1 recipe (configs/smollm2_135m_cpu.py) continued.

Starts from stage 1's best drafter (``init_from``; same drafter fields), on twice the data
(the first 8 shards, 1024 of the target's answers), supervising block offsets 1..8 only
(``train.loss_offsets=8``: the LM head runs on half the positions, a step costs about 7.3 s
instead of 9.3 s here; offsets past 8 are rarely reached at the tau this drafter has). A fresh
AdamW state and a new warmup + cosine schedule at a lower peak (1e-3). Resumable: rerun the
same command after an interruption.

    dflash-jax prepare-data ...          # as in configs/smollm2_135m_cpu.py, until 8 shards exist
    dflash-jax train --config configs/smollm2_135m_cpu.py       # stage 1 -> runs/smollm2_v1/best
    dflash-jax train --config configs/smollm2_135m_cpu_v2.py    # stage 2 -> runs/smollm2_v2/best
"""

from smollm2_135m_cpu import get_config as stage1


def get_config():
    c = stage1()
    c.init_from = "runs/smollm2_v1/best"
    c.data_shards = 8
    c.out_dir = "runs/smollm2_v2"
    c.train.steps = 900
    c.train.lr = 1e-3
    c.train.loss_offsets = 8
    return c
