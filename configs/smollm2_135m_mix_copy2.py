"""Issue 20's long run: the shipped drafter reading prompt lookup, trained on the mixed answers.

It starts where ``launch/copy_drafter.py`` puts the shipped (mask-token) drafter without training:
the prompt-lookup continuation as the block input wherever the last 2 or more committed tokens
occurred before (``drafter.ngram_min=2``; the shorter matches are right a quarter of the time), a
copy bias of 30 on every matched length and offset (larger than the drafter's logit margins, so
it starts out keeping the continuation: a bias of 6 lost to prompt lookup on four sets of five,
docs/BENCHMARKS.md "A mask-token drafter reading prompt lookup"), and mask tokens where there is
no match, exactly the blocks the shipped drafter was trained on. From there it learns, with the
table on its own learning rate, how far to trust each matched length and offset, and what follows
a continuation: every offset 1..15 is supervised (the shipped drafter's offsets 9..15 never were),
since a block-16 copy needs all of them.

Data: the first 5 shards of ``data/smollm2-mix`` (kept in git; ``prepare-data`` adds shards) with
32 answers of the first 2 held out, as the fixed-budget study. Resumable: rerun the same command
after an interruption (a later stage on more shards continues it through ``init_from``).

    dflash-jax prepare-data ...               # the command in configs/smollm2_135m_mix.py (5 shards at least)
    dflash-jax prepare-features --config configs/smollm2_135m_mix_copy2.py   # about 3 min a shard here
    dflash-jax train --config configs/smollm2_135m_mix_copy2.py
    .venv/bin/python launch/study_tau.py --per-set 20 --blocks 4 8 16 \\
        --drafter copy2=runs/mix_copy2/best --out docs/bench/issue20/study_tau.jsonl
"""

from smollm2_135m_mix import get_config as mix


def get_config():
    c = mix()
    c.out_dir = "runs/mix_copy2"
    c.drafter.block_input = "ngram"
    c.drafter.ngram_min = 2
    c.drafter.copy_bias = 30.0
    c.train.copy_bias_lr = 0.03
    c.train.loss_offsets = 0  # all 15 offsets
    c.train.steps = 600
    c.eval.every = 100
    c.ckpt.every = 40
    return c
