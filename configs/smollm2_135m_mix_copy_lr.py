"""``smollm2_135m_mix_copy.py`` with the copy-bias table on its own learning rate (peak 0.03,
``train.copy_bias_lr``): at the run's 7e-4 Adam moved the table by under 0.1 logit in 100 steps,
so the copy arm's drafter could not learn how far to trust each matched length and offset.
Resumable: rerun the same command after an interruption.

    dflash-jax train --config configs/smollm2_135m_mix_copy_lr.py   # features: as smollm2_135m_mix.py
"""

from smollm2_135m_mix_copy import get_config as mix_copy


def get_config():
    c = mix_copy()
    c.out_dir = "runs/mix_copy_lr"
    c.train.copy_bias_lr = 0.03
    return c
