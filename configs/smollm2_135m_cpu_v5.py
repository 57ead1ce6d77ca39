"""Stage 5 of the shipped SmolLM2 drafter: stage 4 (configs/smollm2_135m_cpu_v4.py) on more answers.

Stage 4's validation loss was still falling when its schedule ended, and every batch of new
answers has paid so far (stage 4's 1536 new answers: validation loss 3.46 -> 3.20), so stage 5
starts from stage 4's best drafter (``init_from``) on the first 37 shards (4736 answers, 2176 of
them new), holding out the same 32 answers as stages 2-4 (``eval.val_within_shards=8``, the same
seed and ``val_size``). Fresh AdamW state, warmup + cosine schedule at stage 4's peak (7e-4).
500 steps (about 32 min here) read 2000 answers: 43% of the training split, the most one
session's time allowed after generating the new shards.
Resumable: rerun the same command after an interruption.

    dflash-jax prepare-data ...          # as in configs/smollm2_135m_cpu.py, until 37 shards exist
    dflash-jax train --config configs/smollm2_135m_cpu.py       # stage 1 -> runs/smollm2_v1/best
    dflash-jax train --config configs/smollm2_135m_cpu_v2.py    # stage 2 -> runs/smollm2_v2/best
    dflash-jax train --config configs/smollm2_135m_cpu_v3.py    # stage 3 -> runs/smollm2_v3/best
    dflash-jax prepare-features --config configs/smollm2_135m_cpu_v4.py   # about 70 s per shard here
    dflash-jax train --config configs/smollm2_135m_cpu_v4.py    # stage 4 -> runs/smollm2_v4/best
    dflash-jax prepare-features --config configs/smollm2_135m_cpu_v5.py   # the new shards' features
    dflash-jax train --config configs/smollm2_135m_cpu_v5.py    # stage 5 -> runs/smollm2_v5/best
"""

from smollm2_135m_cpu_v4 import get_config as stage4


def get_config():
    c = stage4()
    c.init_from = "runs/smollm2_v4/best"
    c.out_dir = "runs/smollm2_v5"
    c.data_shards = 37  # held-out split, lr and the rest: stage 4's
    c.train.steps = 500
    return c
