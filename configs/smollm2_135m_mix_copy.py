"""``smollm2_135m_mix_ngram.py`` with a learned copy bias: a logit bonus for the token the n-gram
block input proposes, one per matched n-gram length (1..4) and offset, all starting at 4.0
(``drafter.copy_bias``, ``drafter.copy_prior``), so the drafter starts out keeping prompt lookup's
continuation unless its own logits disagree by more than the bonus, and learns per matched length
and offset how far to trust it. Same data, steps and starting weights (the table the mask-token
drafter lacks starts at 4.0). Resumable: rerun the same command after an interruption.

    dflash-jax train --config configs/smollm2_135m_mix_copy.py   # features: as smollm2_135m_mix.py
"""

from smollm2_135m_mix_ngram import get_config as mix_ngram


def get_config():
    c = mix_ngram()
    c.out_dir = "runs/mix_copy"
    c.drafter.copy_bias = 4.0
    return c
