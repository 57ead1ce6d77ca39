"""Stage 4 of the shipped SmolLM2 drafter: stage 3 (configs/smollm2_135m_cpu_v3.py) on more answers.

Stage 3's validation loss flattened on its 8 shards (1024 answers, each seen about 9 times by
then), so stage 4 starts from stage 3's best drafter (``init_from``) on the first 20 shards
(2560 of the target's answers), holding out the same 32 answers as stages 2 and 3
(``eval.val_within_shards=8``: its validation loss is comparable with theirs and never scores
an answer stage 2 or 3 trained on; stage 1 drew its split from 5 shards, and 19 of these 32
answers, among them the 4 decoded for the validation tau, were in its training set). A fresh
AdamW state and warmup + cosine schedule at stage 3's peak (7e-4); the validation decode runs
256-token answers, as the benchmark does.
Resumable: rerun the same command after an interruption.

    dflash-jax prepare-data ...          # as in configs/smollm2_135m_cpu.py, until 20 shards exist
    dflash-jax train --config configs/smollm2_135m_cpu.py       # stage 1 -> runs/smollm2_v1/best
    dflash-jax train --config configs/smollm2_135m_cpu_v2.py    # stage 2 -> runs/smollm2_v2/best
    dflash-jax train --config configs/smollm2_135m_cpu_v3.py    # stage 3 -> runs/smollm2_v3/best
    dflash-jax prepare-features --config configs/smollm2_135m_cpu_v4.py   # about 70 s per shard here
    dflash-jax train --config configs/smollm2_135m_cpu_v4.py    # stage 4 -> runs/smollm2_v4/best
"""

from smollm2_135m_cpu_v3 import get_config as stage3


def get_config():
    c = stage3()
    c.init_from = "runs/smollm2_v3/best"
    c.out_dir = "runs/smollm2_v4"
    c.data_shards = 20
    c.eval.val_within_shards = 8
    c.eval.every = 150
    c.eval.decode_max_new_tokens = 256
    c.ckpt.every = 50
    c.train.steps = 1000
    c.train.lr = 7e-4
    return c
