"""``smollm2_135m_mix.py`` with the prompt-lookup continuation of the committed tokens in each
block in place of the first mask tokens (``drafter.block_input="ngram"``, n-gram lengths 4..1):
the drafter sees what prompt lookup would propose and learns when to keep it. Same data, steps
and starting weights (what fills a block is no parameter, so ``init_from`` takes the mask-token
drafter). Resumable: rerun the same command after an interruption.

    dflash-jax train --config configs/smollm2_135m_mix_ngram.py   # features: as smollm2_135m_mix.py
"""

from smollm2_135m_mix import get_config as mix


def get_config():
    c = mix()
    c.out_dir = "runs/mix_ngram"
    c.drafter.block_input = "ngram"
    return c
