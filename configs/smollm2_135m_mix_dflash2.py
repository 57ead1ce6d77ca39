"""Issue 21's equal-budget pair: ``smollm2_135m_mix.py`` (DFlash, mask-token blocks) as a DFlash 2
drafter: the shipped DFlash drafter's backbone continued with grouped dynamic causal convolutions
(kernel 2, groups of 16 channels, from the identity) and a candidate selector (rank 64 over the
head's top 16, from random), trained with the selector loss beside the block loss (alpha 1), on the
same 5 mixed shards with the same held-out answers. ``launch/study_issue21.sh`` trains it for the
wall-clock of the study's DFlash arm and compares both by tau on the five benchmark sets.
Resumable: rerun the same command after an interruption.

    dflash-jax train --config configs/smollm2_135m_mix_dflash2.py   # features: as smollm2_135m_mix.py
"""

from smollm2_135m_mix import get_config as mix


def as_dflash2(c):
    """``c`` as a DFlash 2 run (the studies' DFlash 2 settings; also ``smollm2_135m_mix_copy2_dflash2.py``)."""
    c.drafter.conv_kernel_size = 2
    c.drafter.conv_group_size = 16
    c.drafter.selector_rank = 64
    c.drafter.selector_top_k = 16
    c.train.selector_alpha = 1.0
    return c


def get_config():
    c = as_dflash2(mix())
    c.out_dir = "runs/mix_dflash2"
    return c
