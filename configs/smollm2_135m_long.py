"""Issue 20's long run, stage 1: the recipe that won the fixed-budget studies, on the mixed answers.

The studies (docs/BENCHMARKS.md, "Fixed-budget study, second plan" and "DFlash against DFlash 2 at
equal budget") picked a DFlash 2 drafter that reads prompt lookup (the n-gram continuation, n >= 2,
as the block input; a learned copy bias from 30 on its own lr 0.03) trained on offsets 1..8
(``smollm2_135m_mix_copy2_dflash2.py``). This stage continues the drafter shipped from that study
(``init_from`` the asset) on every mixed shard made so far (6: 768 answers, the same 32 of the first
2 held out), for 1500 steps with checkpoints every 40 and an evaluation (held-out loss, tau from
held-out blocks, decoded tau on 4 held-out prompts) every 100, keeping as ``best/`` the drafter with
the highest tau from the held-out blocks (``eval.best_by``: a wrong forced copy costs about 30 of
loss, so this drafter's loss and tau can move apart; the 4 decoded prompts are too few to rank by).
Resumable: rerun the same command after an interruption (SIGKILL included). It ended no better than
the shipped drafter (docs/BENCHMARKS.md, "The long run's end"), so stage 2
(``smollm2_135m_long2.py``, on more shards) starts from the shipped drafter again, not from it.

    .venv/bin/dflash-jax prepare-features --config configs/smollm2_135m_long.py   # shard 5's features (3 min)
    .venv/bin/dflash-jax train --config configs/smollm2_135m_long.py              # about 5 s a step here
"""

from smollm2_135m_mix_copy2_dflash2 import get_config as recipe


def get_config():
    c = recipe()
    c.init_from = "dflash_jax/assets/smollm2-135m-instruct-dflash"
    c.data_shards = 6
    c.out_dir = "runs/long1"
    c.train.steps = 1500
    c.eval.every = 100
    c.eval.best_by = "tau_blocks"
    c.ckpt.every = 40
    return c
