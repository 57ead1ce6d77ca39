"""Issue 21's second equal-budget pair: ``smollm2_135m_mix_copy2.py`` (the shipped drafter reading
prompt lookup, block input = the n-gram continuation, copy bias 30) on offsets 1..8 (issue 20's study
arm ``copy2_off8``, the best of its arms) as a DFlash 2 drafter: the
backbone continued with grouped dynamic causal convolutions (kernel 2, groups of 16 channels, from
the identity) and a candidate selector (rank 64 over the head's top 16, from random), trained with
the selector loss beside the block loss (alpha 1), on the same 5 mixed shards and held-out answers.
The copy bias acts on the head's logits, so a matched continuation's token enters the selector's
candidates with its bonus. ``launch/study_issue21.sh`` trains it for the wall-clock of the study's
``copy2_off8`` arm (launch/study_issue20.sh) and compares both by tau on the five benchmark sets.
Resumable: rerun the same command after an interruption.

    dflash-jax train --config configs/smollm2_135m_mix_copy2_dflash2.py   # features: as smollm2_135m_mix_copy2.py
"""

from smollm2_135m_mix_copy2 import get_config as copy2
from smollm2_135m_mix_dflash2 import as_dflash2


def get_config():
    c = as_dflash2(copy2())
    c.out_dir = "runs/mix_copy2_dflash2"
    c.train.loss_offsets = 8
    return c
